"""One command from a checkpoint to a verified bundle: `vitdeploy bundle CKPT --target JETPACK --images DIR` exports,
calibrates with the accuracy guard, converts to FP16, verifies on DIR's labels and packs; a re-run reuses what is
current. (A timm ViT-Ti is not installable here: timm needs torchvision, which does not import beside the CPU torch;
the digits ViT stands in.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

from vitdeploy.checks import conformance as cf
from vitdeploy.cli import app

# `make test` leaves these out (`make test-all` and CI run them): the whole path from a checkpoint for each JetPack (200 test-s of 3500 under load)
pytestmark = pytest.mark.slow


def bundle_findings(b: Path, line: str) -> list[str]:
    out = []
    for f in sorted(b.rglob("*.onnx")):
        if "triton" in f.parts:
            continue
        out += [f"{f.name}: {x.line()}" for x in cf.check_onnx(f, line).findings + cf.check_int8_intent(f, line).findings]
    return out


@pytest.mark.parametrize(("device", "line", "extra"), [("jetpack6.1", "trt10", []), ("jetpack5.1", "trt8.5", ["--int8"])])
def test_bundle_from_a_checkpoint_for_a_jetpack(digits_ckpt: Path, digits_folder: Path, tmp_path: Path, device: str,
                                                line: str, extra: list[str]) -> None:
    work = tmp_path / "w"
    work.mkdir()
    shutil.copy2(digits_ckpt, work / "ckpt.pth")
    args = ["bundle", str(work / "ckpt.pth"), "--target", device, "--images", str(digits_folder), "-o", str(work / "b"),
            "--references", "4", "--opt-batch", "2", "--max-batch", "4", *extra]
    r = CliRunner().invoke(app, args, terminal_width=200)
    assert r.exit_code == 0, r.output
    for col in ("artifact", "target", "top-1", "drop", "agreement", "size"):
        assert col in r.output
    assert "./build_engine.sh" in r.output and "made" in r.output
    made = {p.name for p in work.glob("*.onnx")}
    assert {"model.onnx", "model.int8.onnx"} <= made and ("model.fp16.onnx" in made) == (not extra)
    assert not bundle_findings(work / "b", line), bundle_findings(work / "b", line)
    # a re-run reuses every current artifact and makes nothing
    before = {p.name: p.stat().st_mtime_ns for p in work.glob("*.onnx")}
    r = CliRunner().invoke(app, [*args, "--force"], terminal_width=200)
    assert r.exit_code == 0, r.output
    assert {p.name: p.stat().st_mtime_ns for p in work.glob("*.onnx")} == before
    assert "reused (current)" in r.output and " made" not in r.output.replace("made for", "")
