"""File names are bytes: a name that is not UTF-8 (b'bad\\xff.png', legal on Linux) is read, named with escapes, and
written to CSV and JSON safely, by infer and calibrate."""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

VENV_BIN = Path(sys.executable).parent
BAD = b"bad\xff.png"


def vitdeploy(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(VENV_BIN / "vitdeploy"), *args], capture_output=True, cwd=cwd, timeout=600)


@pytest.fixture(scope="module")
def work(digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random-weight vit-digits ONNX and a folder of digits, one of them under a name that is not UTF-8."""
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.tools.bench import _random_checkpoint

    d = tmp_path_factory.mktemp("bytes")
    _random_checkpoint("vit-digits", d, seed=0)
    export_onnx(d / "ckpt.pth", d / "model.onnx", check=False)
    (d / "img").mkdir()
    val = sorted((digits_folder / "val").rglob("*.png"))
    for i, f in enumerate(val[:3]):
        shutil.copy(f, d / "img" / f"ok{i}.png")
    shutil.copy(val[3], os.path.join(os.fsencode(d / "img"), BAD))
    return d


def test_printable_name_escapes_bytes_that_are_not_utf8() -> None:
    from vitdeploy.core.fileio import printable_name, strict_json

    assert printable_name(os.fsdecode(BAD)) == "bad\\xff.png"
    assert printable_name(BAD) == "bad\\xff.png"
    assert printable_name("café.png") == "café.png"
    assert json.loads(strict_json({"path": os.fsdecode(BAD)})) == {"path": "bad\\xff.png"}


def test_infer_writes_csv_and_json_rows_for_a_non_utf8_name(work: Path) -> None:
    for out in ("p.csv", "p.json"):
        r = vitdeploy("infer", "img", "--model", "model.onnx", "-o", out, cwd=work)
        assert r.returncode == 0, r.stderr.decode(errors="replace")
        text = (work / out).read_text(encoding="utf-8")  # valid UTF-8 throughout
        paths = ([row["path"] for row in csv.DictReader(text.splitlines())] if out.endswith(".csv")
                 else [row["path"] for row in json.loads(text)])
        assert "img/bad\\xff.png" in paths and len(paths) == 4


def test_infer_table_names_it_with_escapes(work: Path) -> None:
    r = vitdeploy("infer", "img", "--model", "model.onnx", cwd=work)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    assert b"bad\\xff.png" in r.stdout


def test_calibrate_reads_a_folder_with_a_non_utf8_name(work: Path) -> None:
    r = vitdeploy("calibrate", "model.onnx", "--images", "img", "-o", "m.int8.onnx", "--batch-size", "2", cwd=work)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    cache = json.loads((work / "m.int8.calib.json").read_text(encoding="utf-8"))
    assert any(os.fsencode(n).endswith(BAD) for n in cache["images"])  # the name's own bytes, round-tripped
