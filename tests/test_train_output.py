"""`vitdeploy train … | cat` says what is happening: the preset and size it chose, one line per epoch with its time
and an ETA, and the next step; on a folder of photos, plainly that it trains at the default preset's size."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from vitdeploy.cli.train import EpochClock, _hms

VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def photos(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two classes of 64x48 'photos' (solid colours with noise): larger than the default preset's 32x32."""
    import numpy as np

    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(0)
    for c, base in (("red", (200, 30, 30)), ("blue", (30, 30, 200))):
        (root / c).mkdir()
        for i in range(8):
            arr = np.clip(np.array(base) + rng.normal(0, 25, (48, 64, 3)), 0, 255).astype("uint8")
            Image.fromarray(arr).save(root / c / f"{i}.png")
    return root


def test_train_piped_prints_a_line_per_epoch_and_says_what_it_chose(photos: Path, tmp_path: Path) -> None:
    # piped: stdout and stderr are pipes, not a terminal (what `| cat` and a log see)
    r = subprocess.run([str(VENV_BIN / "vitdeploy"), "train", str(photos), "--epochs", "2", "--image-size", "16",
                        "--patch-size", "4", "--batch-size", "8", "-o", str(tmp_path / "c.pth")],
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    epochs = [ln for ln in r.stdout.splitlines() if ln.startswith("epoch ")]
    assert [ln.split()[1] for ln in epochs] == ["1/2", "2/2"], r.stdout
    for ln in epochs:
        assert re.search(r"loss \d+\.\d{3}  val top-1 \d+\.\d+%  best \d+\.\d+%  \d+\.\d s  ETA \S+", ln), ln
    assert epochs[-1].endswith("ETA 0s")
    assert "training vit-digits at 16x16: 14 train / 2 val images, 2 epochs" in r.stdout, r.stdout
    assert "the vit-digits preset (the default) at 16x16: your images (64x48)" in r.stderr, r.stderr
    assert f"next: vitdeploy export {tmp_path / 'c.pth'}" in r.stdout


def test_epoch_clock_counts_steps_and_estimates_what_is_left() -> None:
    t = iter([0.0, 10.0, 20.0])
    c = EpochClock()
    c._now = lambda: next(t)
    c.begin(epochs=4, start=0, steps=5)
    assert c.total_steps == 20 and c.step() == 1
    line = c.epoch_line({"epoch": 0, "loss": 1.0, "val_accuracy": 0.5, "best": 0.5})
    assert line.startswith("epoch 1/4 ") and "10.0 s" in line and line.endswith("ETA 30s") and c.done_steps == 5
    line = c.epoch_line({"epoch": 1, "loss": 1.0, "val_accuracy": 0.5, "best": 0.5})
    assert line.endswith("ETA 20s")
    assert (_hms(75), _hms(3725)) == ("1m 15s", "1h 02m")
