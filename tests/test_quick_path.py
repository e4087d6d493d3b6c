"""The quick path in an empty folder: export, then build-engine --int8, with no calibration/ folder anywhere near —
a model trained on the embedded digits calibrates on them, says so, writes model.int8.onnx and exits 3 where there is
no TensorRT (0 where there is)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path


def test_export_then_build_engine_int8_in_an_empty_folder(digits_ckpt: Path, tmp_path: Path) -> None:
    work = tmp_path / "empty"
    work.mkdir()
    shutil.copy(digits_ckpt, work / "ckpt.pth")
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    vitdeploy = [sys.executable, "-m", "vitdeploy"]
    exp = subprocess.run([*vitdeploy, "export", "ckpt.pth"], cwd=work, env=env, capture_output=True, text=True)
    assert exp.returncode == 0, exp.stderr
    be = subprocess.run([*vitdeploy, "build-engine", "--int8"], cwd=work, env=env, capture_output=True, text=True)
    assert be.returncode in (0, 3), be.stderr
    assert (work / "model.int8.onnx").is_file()
    assert "no calibration/ folder here: calibrating on digits" in be.stderr
    assert "Traceback" not in be.stderr
    assert not (work / "calibration").exists()
