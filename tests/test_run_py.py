"""The bundle's run.py keeps its promise: every failure is one line and exit 1 (2 for a wrong option), no traceback.

One real bundle is made (``vitdeploy.stages.bundle`` over a small linear ONNX model, seeded noise as reference
images), then copied and tampered with each way a device copy can go wrong. run.py is run from the tampered copy
(in this process, as ``main``; one case as its own process to show what a user's terminal gets). TensorRT cases
use tests/trt_mock.py (generated from NVIDIA's compiled bindings) and host memory for libcudart.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import HostCuda, load_run_py, tiny_bundle, write_plan
from trt_mock import fake_tensorrt


@pytest.fixture(scope="module")
def made_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _tiny_bundle(tmp_path_factory.mktemp("runpy"), None)


def _tiny_bundle(d: Path, target: str | None) -> Path:
    return tiny_bundle(d, target)


@pytest.fixture
def copy(made_bundle: Path, tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(made_bundle, b)
    return b


def run(bundle: Path, *argv: str, capsys: pytest.CaptureFixture) -> tuple[int, list[str], str]:
    """run.py's main from ``bundle`` as a process would end: (exit code, stderr lines, stdout)."""
    mod = load_run_py(bundle / "run.py")
    return _ended(lambda: mod.main(list(argv)), capsys)


def _ended(fn: Any, capsys: pytest.CaptureFixture) -> tuple[int, list[str], str]:
    try:
        code = fn()
        msg = None
    except SystemExit as e:
        code, msg = (e.code, None) if isinstance(e.code, int) or e.code is None else (1, str(e.code))
    out = capsys.readouterr()
    err = out.err.splitlines() + ([msg] if msg else [])
    return int(code or 0), err, out.out


def one_line(err: list[str]) -> str:
    assert len(err) == 1 and err[0].startswith("error: ") and "Traceback" not in err[0], err
    return err[0]


def test_a_model_made_for_a_cpu_runs_on_openvino_where_installed_else_onnxruntime(
        tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("openvino")
    cpu = _tiny_bundle(tmp_path, "cpu")
    code, err, out = run(cpu, "--check", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["backend"] == "openvino" and json.loads(out)["ok"], (err, out)
    code, err, out = run(cpu, "--check", "--json", "--backend", "onnxruntime", capsys=capsys)
    assert code == 0 and json.loads(out)["backend"] == "onnxruntime", (err, out)
    monkeypatch.setitem(sys.modules, "openvino", None)  # not installed: auto falls back, --backend openvino says so
    code, err, out = run(cpu, "--check", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["backend"] == "onnxruntime", (err, out)
    code, err, _ = run(cpu, "--check", "--backend", "openvino", capsys=capsys)
    assert code == 1 and "pip install openvino" in one_line(err)


def test_a_cpu_int8_runs_on_onnxruntime_on_a_cpu_without_vnni_unless_made_for_openvino(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py's auto choice as vitdeploy's (runners.default_backend): by the CPU's flags and the model's record."""
    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):  # a lowered oneDNN ISA overrides the flags (test_lowered_isa)
        monkeypatch.delenv(var, raising=False)
    mod = load_run_py(Path(__file__).resolve().parents[1] / "vitdeploy" / "stages" / "bundle_files" / "run.py")
    avx2, vnni = tmp_path / "avx2", tmp_path / "vnni"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 fma\n")
    vnni.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx avx2 avx512f avx512_vnni\n")
    cpu8, ov8, cpu32 = ({"target": t, "precision": p} for t, p in (("cpu", "int8"), ("openvino", "int8"), ("cpu", "fp32")))
    assert [mod.openvino_for(a, "auto", str(avx2)) for a in (cpu8, ov8, cpu32)] == ["no", "auto", "auto"]
    assert [mod.openvino_for(a, "auto", str(vnni)) for a in (cpu8, ov8, cpu32)] == ["auto", "auto", "auto"]
    assert mod.openvino_for({"target": "trt10", "precision": "int8"}, "auto", str(vnni)) == "no"
    assert mod.openvino_for(cpu8, "openvino", str(avx2)) == "yes"
    assert mod.openvino_for(cpu8, "onnxruntime", str(vnni)) == "no"


def test_a_model_made_for_no_target_stays_on_onnxruntime(copy: Path, capsys: pytest.CaptureFixture) -> None:
    code, err, out = run(copy, "--check", "--json", capsys=capsys)
    assert code == 0 and json.loads(out)["backend"] == "onnxruntime", (err, out)


def test_the_untouched_bundle_passes_its_check(copy: Path, capsys: pytest.CaptureFixture) -> None:
    code, err, out = run(copy, "--check", capsys=capsys)
    assert code == 0 and out.startswith("OK: ") and not err


def test_a_truncated_model_is_one_line_in_the_users_terminal(copy: Path) -> None:
    model = copy / "model.raw.onnx"
    model.write_bytes(model.read_bytes()[: model.stat().st_size // 2])
    r = subprocess.run([sys.executable, str(copy / "run.py"), "--check"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stdout == ""
    line = one_line(r.stderr.splitlines())
    assert "model.raw.onnx" in line and "SHA-256" in line and "copy the bundle again" in line


def test_a_truncated_model_without_a_recorded_hash_is_one_line(copy: Path, capsys: pytest.CaptureFixture) -> None:
    man = json.loads((copy / "manifest.json").read_text())
    del man["bundle"]["artifacts"]["model.raw.onnx"]["sha256"]
    (copy / "manifest.json").write_text(json.dumps(man))
    model = copy / "model.raw.onnx"
    model.write_bytes(model.read_bytes()[:100])
    code, err, _ = run(copy, "--check", capsys=capsys)
    assert code == 1 and "ONNX Runtime cannot load it" in one_line(err)


@pytest.mark.parametrize("args", [("--check",), ("IMAGES",)])
def test_a_corrupted_copy_of_the_same_size_is_refused(copy: Path, capsys: pytest.CaptureFixture,
                                                      args: tuple[str, ...]) -> None:
    model = copy / "model.raw.onnx"
    data = bytearray(model.read_bytes())
    data[-5] ^= 0xFF  # one flipped byte in the weights: still a loadable model, not the bundle's
    model.write_bytes(bytes(data))
    argv = [str(copy / "reference" / "images") if a == "IMAGES" else a for a in args]
    code, err, out = run(copy, *argv, capsys=capsys)
    assert code == 1 and "SHA-256" in one_line(err) and out == ""


def test_check_refuses_any_changed_model_file_of_the_bundle(copy: Path, capsys: pytest.CaptureFixture) -> None:
    (copy / "deepstream" / "model.ds.onnx").write_bytes(b"not the model")
    assert run(copy, str(copy / "reference" / "images"), capsys=capsys)[0] == 0  # a run checks the model it runs
    code, err, _ = run(copy, "--check", capsys=capsys)
    assert code == 1 and "deepstream/model.ds.onnx" in one_line(err)


@pytest.mark.parametrize("text", ["{", "[]", '{"bundle": {}}', ""])
def test_a_broken_manifest_is_one_line(copy: Path, capsys: pytest.CaptureFixture, text: str) -> None:
    (copy / "manifest.json").write_text(text)
    code, err, _ = run(copy, "--check", capsys=capsys)
    assert code == 1 and "manifest.json" in one_line(err)


def test_labels_that_do_not_name_every_class_are_one_line(copy: Path, capsys: pytest.CaptureFixture) -> None:
    images = str(copy / "reference" / "images")
    (copy / "labels.txt").write_text("a\nb\n")
    code, err, out = run(copy, images, capsys=capsys)
    assert code == 1 and "labels.txt has 2 labels, the model gives 5 classes" in one_line(err) and out == ""
    shutil.copy(copy / "triton" / "tiny" / "labels.txt", copy / "labels.txt")
    man = json.loads((copy / "manifest.json").read_text())
    man["labels"] = ["a"]
    (copy / "manifest.json").write_text(json.dumps(man))
    code, err, _ = run(copy, images, capsys=capsys)
    assert code == 1 and "manifest.json lists 1 labels, the model gives 5 classes" in one_line(err)


def test_reference_logits_of_another_shape_are_one_line(copy: Path, capsys: pytest.CaptureFixture) -> None:
    np.save(copy / "reference" / "logits.fp32.npy", np.zeros((4, 3), np.float32))
    code, err, _ = run(copy, "--check", capsys=capsys)
    assert code == 1 and "reference/logits.fp32.npy is not the file this bundle was made with" in one_line(err)
    # with manifest.json's SHA-256 re-written to agree (a bundle made wrong, not damaged): the shape is named
    import hashlib

    m = json.loads((copy / "manifest.json").read_text())
    m["bundle"]["files"]["reference/logits.fp32.npy"] = hashlib.sha256((copy / "reference" / "logits.fp32.npy").read_bytes()).hexdigest()
    (copy / "manifest.json").write_text(json.dumps(m))
    code, err, _ = run(copy, "--check", capsys=capsys)
    assert code == 1 and "shape (4, 3)" in one_line(err) and "(4, 5)" in err[0]


@pytest.mark.parametrize("argv", [("--check", "--batch", "0"), ("--check", "--batch", "x"), ("--top", "-1", "a.png"),
                                  ("--no-such-option",)])
def test_a_wrong_option_is_one_line_and_exit_2(copy: Path, capsys: pytest.CaptureFixture, argv: tuple[str, ...]) -> None:
    code, err, _ = run(copy, *argv, capsys=capsys)
    assert code == 2 and "--help" in one_line(err)


def test_a_garbage_engine_under_a_tensorrt_that_is_not_tensorrts_is_one_line(
        copy: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    (copy / "model.raw.engine").write_bytes(b"\x00garbage plan")
    monkeypatch.setitem(sys.modules, "tensorrt", types.ModuleType("tensorrt"))  # no Logger, no Runtime
    code, err, _ = run(copy, "--check", capsys=capsys)
    line = one_line(err)
    assert code == 1 and "model.raw.engine: TensorRT cannot load it (AttributeError" in line


@pytest.mark.parametrize("version", ["8.6.1", "10.3.0", "11.4.0.106"])
def test_tensorrt_that_cannot_start_cuda_is_one_line_naming_cuda_and_the_driver(
        copy: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, version: str) -> None:
    write_plan(copy / "model.raw.engine", copy / "model.raw.onnx", version, 1, 4, 8)
    mod = load_run_py(copy / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version))
    code, err, out = _ended(lambda: mod.main(["--check", "--json"]), capsys)
    assert code == 0 and json.loads(out)["backend"] == "tensorrt", err  # the mock engine runs as shipped
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, fail={"Runtime"}))
    code, err, _ = _ended(lambda: mod.main(["--check"]), capsys)
    line = one_line(err)
    assert code == 1 and "CUDA" in line and "driver" in line and "nullptr" in line
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, no_context=True))
    code, err, _ = _ended(lambda: mod.main(["--check"]), capsys)
    line = one_line(err)
    assert code == 1 and "execution context" in line and "driver" in line


def test_check_on_an_engine_prints_its_precision_receipt(copy: Path, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """run.py --check reads the engine's layer information with the parser the bundle ships (receipt.py); an engine
    whose inspector gives NVIDIA's published FP16 ResNet-18 layers is FP16; a TensorRT without a modelled inspector
    (the mock) is 'unknown', said why, never guessed."""
    version = "10.3.0"
    assert (copy / "receipt.py").is_file()
    write_plan(copy / "model.raw.engine", copy / "model.raw.onnx", version, 1, 4, 8)
    mod = load_run_py(copy / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version))
    code, err, out = _ended(lambda: mod.main(["--check", "--json"]), capsys)
    receipt = json.loads(out)["receipt"]
    assert code == 0 and receipt["status"] == "unknown" and "inspector" in receipt["reason"], err
    published = (Path(__file__).parent / "data" / "inspector" / "trex-resnet18-A100-fp16.graph.json").read_text()

    class Inspector:
        def get_engine_information(self, fmt: Any) -> str:
            return published

    import importlib.util

    spec = importlib.util.spec_from_file_location("shipped_receipt", copy / "receipt.py")
    assert spec is not None and spec.loader is not None
    shipped = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = shipped
    spec.loader.exec_module(shipped)
    monkeypatch.setattr(mod.TrtModel, "receipt", lambda self: shipped.receipt_from_json(
        self.engine and Inspector().get_engine_information(None)).to_dict())
    code, err, out = _ended(lambda: mod.main(["--check"]), capsys)
    assert code == 0 and "precision receipt: GEMM FLOPs FP16 100%" in out, (err, out)
    assert str(copy) not in sys.path  # the bundle (it holds triton/) never lands on the import path


@pytest.mark.parametrize("pp", [
    {"input_size": [32, 32], "resize_mode": "squash_crop", "crop_pct": 0.8, "interpolation": "bicubic"},
    {"input_size": [32, 32], "resize_mode": "squash_crop", "crop_pct": 0.8, "interpolation": "bicubic", "crop_offset": "floor"},
    {"input_size": [31, 31], "resize_mode": "shorter", "crop_pct": 0.875, "interpolation": "bilinear", "crop_offset": "floor"},
    {"input_size": [24, 40], "resize_mode": "shorter", "crop_pct": 0.9, "interpolation": "bicubic"},
])
def test_run_py_resizes_as_vitdeploy_does_for_every_resize_mode(pp: dict, tmp_path: Path) -> None:
    """The Hugging Face processors' geometries (squash then crop; a crop offset rounded down) reach the device:
    run.py's resize and crop give vitdeploy's bytes on photos of odd sizes."""
    from PIL import Image
    from skimage import data

    from vitdeploy.core.preprocess import Preprocess, resize_crop

    mod = load_run_py(Path(__file__).resolve().parents[1] / "vitdeploy" / "stages" / "bundle_files" / "run.py")
    ours = Preprocess.from_dict({**pp, "mean": [0.5] * 3, "std": [0.5] * 3, "channel_order": "RGB"})
    for name, size in (("astronaut", (97, 61)), ("coffee", (120, 83)), ("chelsea", (45, 70))):
        img = Image.fromarray(getattr(data, name)()).convert("RGB").resize(size)
        want = np.asarray(resize_crop(img, ours))
        got = np.asarray(mod.resize_crop(img, pp))
        assert got.shape == want.shape and np.array_equal(got, want), (name, pp)
