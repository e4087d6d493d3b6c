"""Building and feeding the bundle's C++ example without a GPU (not a test module: test modules import it).

The example's classify.cpp + vitclassify.cpp are linked with tests/cpp/stub_engine.cpp (Classifier::open without
TensorRT: a key=value "engine" file that answers, for each exact image, the row the test computed with ONNX Runtime)
and Debian's libopencv-dev. Skips, with the reason, where g++ or the OpenCV headers are missing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[1]
STUB = REPO / "tests" / "cpp" / "stub_engine.cpp"
OPENCV_INCLUDE = Path("/usr/include/opencv4")


def gxx() -> str:
    g = shutil.which("g++")
    if g is None:
        pytest.skip("g++ is not installed (Debian: apt-get install g++)")
    return g


def build_with_stub(src: Path, out: Path) -> Path:
    """The example in ``src`` (a bundle's cpp/) built with the stub engine into ``out``."""
    g = gxx()
    if not (OPENCV_INCLUDE / "opencv2" / "imgcodecs.hpp").exists():
        pytest.skip("libopencv-dev is not installed (Debian: apt-get install libopencv-dev; .ci/run installs it)")
    cmd = [g, "-std=c++17", "-O2", "-Wall", "-Wextra", "-Werror", f"-I{src}", "-isystem", str(OPENCV_INCLUDE),
           str(src / "classify.cpp"), str(src / "vitclassify.cpp"), str(STUB), "-lopencv_imgcodecs", "-lopencv_core", "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-4000:]
    return out


def stub_engine(folder: Path, h: int, w: int, classes: int, lo: int = 1, hi: int = 100000,
                table: Path | None = None) -> tuple[Path, Path]:
    """A stub "engine" file (profile lo..hi, ``classes`` values per image) and the folder it dumps each batch to."""
    dump = folder / "dump"
    shutil.rmtree(dump, ignore_errors=True)
    dump.mkdir(parents=True)
    eng = folder / "stub.engine"
    eng.write_text(f"stub=1\nmin={lo}\nmax={hi}\nheight={h}\nwidth={w}\nclasses={classes}\ndump={dump}\n"
                   + (f"table={table}\n" if table else ""))
    return eng, dump


def write_table(path: Path, images: np.ndarray, rows: np.ndarray) -> Path:
    """The stub's answer table: per image its uint8 HWC bytes, then its row of float32 values."""
    with path.open("wb") as fh:
        for img, z in zip(images, rows, strict=True):
            fh.write(np.ascontiguousarray(img, np.uint8).tobytes() + np.asarray(z, np.float32).tobytes())
    return path


def dumped(dump: Path, h: int, w: int) -> list[np.ndarray]:
    calls = sorted(dump.iterdir(), key=lambda p: int(p.name.split("_")[1]))
    return [np.fromfile(c, np.uint8).reshape(int(c.stem.split("_")[2]), h, w, 3) for c in calls]
