"""`vitdeploy bundle CKPT` checks every option of the whole path before its first artifact is touched (issue 37, P8).

On main, ``bundle ckpt.pth -t trt8.6 --min-batch 8 --max-batch 2`` exited 2 only after replacing model.onnx,
model.int8.onnx, model.fp16.onnx and the calibration cache already beside the checkpoint; ``-t trt10 --quantizer
nncf`` re-exported model.onnx before refusing; too few calibration images were found after model.onnx was written,
with advice (raise --num-images) that cannot help. Each case runs the CLI in a folder holding the cached digits
checkpoint and the artifacts the pipeline made from it, and asserts one line, the exit code, and every file as it was.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

FILES = ("ckpt.pth", "model.onnx", "model.int8.onnx", "model.int8.calib.json", "model.fp16.onnx")


@pytest.fixture
def folder(digits_ckpt: Path, digits_artifacts: Path, digits_val10: Path, tmp_path: Path) -> Path:
    """ckpt.pth with the artifacts made from it (for no target), and a folder of 5 images beside them."""
    d = tmp_path / "work"
    d.mkdir()
    shutil.copy2(digits_ckpt, d / "ckpt.pth")
    for f in FILES[1:]:
        shutil.copy2(digits_artifacts / f, d / f)
    few = d / "few"
    few.mkdir()
    for p in sorted(digits_val10.rglob("*.png"))[:5]:
        shutil.copy2(p, few / p.name)
    return d


def snapshot(d: Path) -> dict[str, tuple[bytes, int]]:
    return {f: ((d / f).read_bytes(), (d / f).stat().st_mtime_ns) for f in FILES}


@pytest.mark.parametrize(("argv", "code", "says", "not_says"), [
    (("-t", "trt8.6", "--min-batch", "8", "--max-batch", "2"), 2, "batch profile", None),
    (("-t", "trt10", "--quantizer", "nncf"), 2, "--quantizer nncf makes an INT8 for a CPU", None),
    (("-t", "cpu", "--images", "few"), 1, "add images to few", "--num-images"),
    (("-t", "cpu", "--int8", "--precision", "fp16"), 2, "--precision fp16", None),
], ids=["batch-profile", "nncf-for-trt10", "too-few-images", "precision-not-made"])
def test_bundle_from_a_checkpoint_refuses_before_touching_an_artifact(folder: Path, argv: tuple[str, ...], code: int,
                                                                       says: str, not_says: str | None) -> None:
    before = snapshot(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                        os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run([sys.executable, "-m", "vitdeploy", "bundle", "ckpt.pth", "-o", "out", *argv], cwd=folder,
                       capture_output=True, text=True, timeout=300, env=env)
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert r.returncode == code, (r.returncode, r.stdout, r.stderr)
    assert len(lines) == 1 and says in lines[0] and "Traceback" not in r.stderr, r.stderr
    assert not_says is None or not_says not in lines[0], lines[0]
    assert snapshot(folder) == before  # nothing replaced, not even rewritten with the same bytes
    assert not (folder / "out").exists()
