"""run.py, build_engine.sh --dry-run and the C++ example on the oldest userland the bundle README promises, on arm64.

A Debian bullseye arm64 chroot run under qemu-user-static (scripts/arm64_chroot.sh, which .ci/run calls, best
effort): Python 3.9, numpy 1.19.5, Pillow 8.1, OpenCV 4.5, and ONNX Runtime's aarch64 wheel where pip had one that
imports with that numpy. Where the chroot is not there (not root, no binfmt_misc, no network), every test skips with
the reason. The bundle is a small real one (vitdeploy.stages.bundle over a linear ONNX model with a
LayerNormalization, so TensorRT 8.5 gets a variant of its own), copied into the chroot's /tmp.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
ROOT = Path(os.environ.get("VITDEPLOY_ARM64_ROOT", "/var/cache/vitdeploy-arm64/bullseye"))


def _why_not() -> str | None:
    if not (ROOT / ".ready").is_file():
        return f"no arm64 bullseye chroot at {ROOT} (scripts/arm64_chroot.sh makes it, as root; .ci/run tries)"
    if not Path("/proc/sys/fs/binfmt_misc/qemu-aarch64").exists():
        return "qemu-aarch64 is not registered with binfmt_misc (Debian: qemu-user-static)"
    if os.geteuid() != 0:
        return "chroot needs root"
    return None


pytestmark = pytest.mark.skipif(_why_not() is not None, reason=str(_why_not()))


def chroot(*argv: str, timeout: float = 600, cwd: str = "/") -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "LANG": "C.UTF-8", "OMP_NUM_THREADS": "1"}
    return subprocess.run([shutil.which("chroot") or "/usr/sbin/chroot", str(ROOT), "/bin/sh", "-c", f'cd "{cwd}" && exec "$@"', "sh", *argv],
                          capture_output=True, text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def arm_bundle(tmp_path_factory: pytest.TempPathFactory) -> str:
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from vitdeploy.core.manifest import Manifest, set_onnx_manifest
    from vitdeploy.core.preprocess import Preprocess
    from vitdeploy.stages.bundle import BundleOptions, bundle

    d = tmp_path_factory.mktemp("arm64")
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(0, 0.02, (768, 5)).astype(np.float32), "W"),
             numpy_helper.from_array(np.ones(768, np.float32), "g"),
             numpy_helper.from_array(np.zeros(768, np.float32), "b")]
    g = helper.make_graph([helper.make_node("Flatten", ["pixel_values"], ["f"], axis=1),
                           helper.make_node("LayerNormalization", ["f", "g", "b"], ["n"], axis=-1),
                           helper.make_node("MatMul", ["n", "W"], ["logits"])], "ln",
                          [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 16, 16])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])], inits)
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    set_onnx_manifest(m, Manifest(model={"num_classes": 5, "image_size": [16, 16]}, labels=list("abcde"),
                                  preprocess=Preprocess(input_size=(16, 16), resize_mode="squash").to_dict(),
                                  name="tiny", precision="fp32"))
    onnx.save(m, str(d / "model.onnx"))
    bundle([d / "model.onnx"], d / "bundle", BundleOptions(references=4))
    inside = f"/tmp/vitdeploy-test-{uuid.uuid4().hex[:8]}"
    shutil.copytree(d / "bundle", ROOT / inside.lstrip("/"))
    yield inside
    shutil.rmtree(ROOT / inside.lstrip("/"), ignore_errors=True)


def test_the_chroot_is_the_promised_userland() -> None:
    r = chroot("python3", "-c", "import sys, numpy, PIL, platform; print(platform.machine(), sys.version_info[:2], "
               "numpy.__version__, PIL.__version__)")
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("aarch64 (3, 9) 1.19.5 8.1"), r.stdout  # OpenCV is the C++ example's (test below)


def test_run_py_help_and_check_on_arm64(arm_bundle: str) -> None:
    r = chroot("python3", "run.py", "--help", cwd=arm_bundle)
    assert r.returncode == 0 and "--check" in r.stdout and not r.stderr, r.stderr
    has_ort = chroot("python3", "-c", "import onnxruntime").returncode == 0
    r = chroot("python3", "run.py", "--check", cwd=arm_bundle)
    if has_ort:
        assert r.returncode == 0 and r.stdout.startswith("OK: model.raw.onnx on onnxruntime"), r.stderr
        r = chroot("python3", "run.py", "reference/images", "--json", cwd=arm_bundle)
        assert r.returncode == 0 and len(r.stdout.splitlines()) == 4, r.stderr
        assert all(json.loads(ln)["label"] in "abcde" for ln in r.stdout.splitlines())
    else:  # no aarch64 wheel of ONNX Runtime imports with bullseye's numpy: the one line that says what to do
        assert r.returncode == 1 and r.stderr.strip() == ("error: neither an engine nor onnxruntime here: run "
                                                           "./build_engine.sh, or pip install onnxruntime"), r.stderr


def test_run_py_names_the_engine_build_engine_sh_writes_on_arm64(arm_bundle: str) -> None:
    """build_engine.sh on bullseye's bash and coreutils, with a trtexec stand-in; run.py (no TensorRT) names it."""
    bindir = ROOT / arm_bundle.lstrip("/") / "fakebin"
    bindir.mkdir()
    (bindir / "trtexec").write_text('#!/bin/bash\n[ "$1" = --help ] && exit 0\nfor a in "$@"; do case "$a" in '
                                    '--saveEngine=*) echo plan > "${a#--saveEngine=}" ;; esac; done\n')
    (bindir / "trtexec").chmod(0o755)
    man = json.loads((ROOT / arm_bundle.lstrip("/") / "manifest.json").read_text())["bundle"]
    for version, line in (("8.5", "trt8.5"), ("8.6", "trt8.6"), ("10.3", "trt10"), ("11.4", "trt11")):
        engine = man["tensorrt"]["engines"][line]["model.raw.onnx"]["engine"]
        r = chroot("/bin/bash", "-c", f"PATH={arm_bundle}/fakebin:$PATH ./build_engine.sh --trt {version} && "
                   "python3 run.py --check; echo rc=$?", cwd=arm_bundle)
        assert f"wrote {engine}" in r.stdout and r.stdout.strip().endswith("rc=1"), (r.stdout, r.stderr)
        assert r.stderr.strip().startswith(f"error: {engine} is here but TensorRT's Python module"), r.stderr
        os.unlink(ROOT / arm_bundle.lstrip("/") / engine)


@pytest.mark.parametrize("version", ["8.5", "8.6", "10.3", "11.4"])
def test_build_engine_sh_dry_run_on_arm64(arm_bundle: str, version: str) -> None:
    r = chroot("/bin/bash", "build_engine.sh", "--dry-run", "--trt", version, cwd=arm_bundle)
    assert r.returncode == 0 and r.stdout.startswith("+ trtexec --onnx=model"), r.stderr
    assert ("--buildOnly" in r.stdout) == (version == "8.5")


def test_cpp_example_builds_and_runs_its_gpu_free_part_on_arm64(arm_bundle: str) -> None:
    """classify.cpp + vitclassify.cpp (+ the tests' engine stub) with bullseye's g++ 10 and OpenCV 4.5, -Werror."""
    if chroot("g++", "--version").returncode != 0 or not (ROOT / "usr/include/opencv4/opencv2/imgcodecs.hpp").is_file():
        pytest.skip("the chroot has no working g++ or OpenCV headers (g++, libopencv-dev not fully installed)")
    work = ROOT / arm_bundle.lstrip("/") / "cpp"
    shutil.copy(REPO / "tests" / "cpp" / "stub_engine.cpp", work / "stub_engine.cpp")
    r = chroot("g++", "-std=c++17", "-O1", "-Wall", "-Wextra", "-Werror", "-I.", "-I/usr/include/opencv4",
               "classify.cpp", "vitclassify.cpp", "stub_engine.cpp", "-lopencv_imgcodecs", "-lopencv_core",
               "-o", "classify", cwd=f"{arm_bundle}/cpp", timeout=1200)
    assert r.returncode == 0, r.stderr[-3000:]
    (work / "stub.engine").write_text("stub=1\nmin=1\nmax=4\nheight=16\nwidth=16\nclasses=5\ndump=\ntable=\n")
    r = chroot("./cpp/classify", "cpp/stub.engine", "reference/images", cwd=arm_bundle, timeout=300)
    assert r.returncode in (0, 1) and "Traceback" not in r.stderr and (r.stdout or r.stderr), (r.stdout, r.stderr)
