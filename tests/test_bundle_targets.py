"""A bundle made with no target builds as intended on every TensorRT line: build_engine.sh --dry-run --trt V names,
for each version, a model that passes check-target for that version, with trtexec options that version knows."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
from pathlib import Path

import pytest

from vitdeploy.checks import conformance as cf
from vitdeploy.core import trt_table
from vitdeploy.core.targets import target_of_version

VERSIONS = ("8.5.2", "8.6.1", "10.3.0", "11.4.1")


def dry_run(bundle: Path, tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    """build_engine.sh with neither vitdeploy nor trtexec on PATH: it prints the trtexec line it would run."""
    (tmp_path / "bin").mkdir(exist_ok=True)
    env = {"PATH": f"{tmp_path / 'bin'}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["bash", str(bundle / "build_engine.sh"), "--dry-run", *args], capture_output=True,
                          text=True, env=env, timeout=60)


def printed_line(out: str) -> list[str]:
    (line,) = [ln for ln in out.splitlines() if ln.startswith("+ ")]
    return shlex.split(line[2:])


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("extra", [(), ("--precision", "fp16"), ("--precision", "fp32"), ("--normalized",), ("--deepstream",)])
def test_no_target_bundle_builds_as_intended_on_every_tensorrt(digits_bundle: Path, tmp_path: Path, version: str,
                                                                extra: tuple[str, ...]) -> None:
    assert json.loads((digits_bundle / "manifest.json").read_text()).get("target") is None
    r = dry_run(digits_bundle, tmp_path, "--trt", version, *extra)
    assert r.returncode == 0, r.stderr
    argv = printed_line(r.stdout)
    assert argv[0] == "trtexec"
    onnx_file = next(a.split("=", 1)[1] for a in argv if a.startswith("--onnx="))
    line = target_of_version(version)
    row = trt_table.row_of(version)
    model = digits_bundle / onnx_file
    found = cf.check_onnx(model, line).findings + cf.check_int8_intent(model, line).findings
    found += cf.check_trtexec_flags(cf.trtexec_flags_of(" ".join(argv)), row)
    assert not found, [f.line() for f in found]


def test_the_variants_are_only_where_the_shipped_model_does_not_conform(digits_bundle: Path, tmp_path: Path) -> None:
    """8.5 gets LayerNorm spelled out, 10/11 the float16-scale INT8; 8.6 builds the shipped files as they are."""
    picks = {}
    for v in VERSIONS:
        r = dry_run(digits_bundle, tmp_path, "--trt", v)
        picks[v] = next(a.split("=", 1)[1] for a in printed_line(r.stdout) if a.startswith("--onnx="))
    assert picks["8.6.1"] == "model.int8.raw.onnx"
    assert re.fullmatch(r"model\.int8\.trt8\.5\.raw\.onnx", picks["8.5.2"])
    assert picks["10.3.0"] == picks["11.4.1"] == "model.int8.trt10.raw.onnx"  # one file serves both lines
    man = json.loads((digits_bundle / "manifest.json").read_text())["bundle"]
    assert man["tensorrt"]["matrix"]["trt8.5"]["int8"] == "model.int8.trt8.5.onnx"
    v10 = man["artifacts"]["model.int8.trt10.onnx"]
    assert v10["variant_of"] == "model.int8.onnx" and v10["vs_source"]["agreement"] >= 0.9
    assert "| 8.5 (JetPack 5.1) |" in (digits_bundle / "README.md").read_text()


def test_a_targeted_bundle_refuses_another_tensorrt(digits_bundle: Path, tmp_path: Path) -> None:
    """A bundle's build_engine.sh never builds a model on a line it was not made or checked for; a bad --trt is one
    line."""
    text = (digits_bundle / "build_engine.sh").read_text()
    b = tmp_path / "b"
    b.mkdir()
    (b / "build_engine.sh").write_text(re.sub(r"    trt8\.5:\w+\) echo [^\n]*\n", "", text))
    for f in digits_bundle.glob("*.onnx"):
        os.symlink(f, b / f.name)
    r = dry_run(b, tmp_path, "--trt", "8.5")
    assert r.returncode == 1 and "no int8 model in this bundle builds as intended on TensorRT 8.5" in r.stderr
    r = dry_run(b, tmp_path, "--trt", "ten")
    assert r.returncode == 1 and "--trt ten" in r.stderr
