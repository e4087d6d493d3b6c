"""What the bundle's run.py reads is bounded and refused in one line (issue 37: P7, P9, run.py's share of P1/P5).

run.py runs on a device without vitdeploy, so it keeps its own copies of a few rules: it must not hang on a FIFO
named as an image (vitdeploy infer refuses one), must not reserve its 8 GiB file bound up front (a 4 GB Jetson, or
any process under an address-space limit), must cap --batch as core/limits.py caps batches, and must say a broken
manifest.json in one line naming the file. One real bundle is made (tests/helpers.tiny_bundle) and copied per case.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import load_run_py, tiny_bundle

RUN_PY = Path(__file__).resolve().parents[1] / "vitdeploy" / "stages" / "bundle_files" / "run.py"


@pytest.fixture(scope="module")
def made_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_bundle(tmp_path_factory.mktemp("runpy_reads"))


@pytest.fixture
def copy(made_bundle: Path, tmp_path: Path) -> Path:
    b = tmp_path / "bundle"
    shutil.copytree(made_bundle, b)
    return b


def run_py(bundle: Path, *argv: str, limit_as: int | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    """run.py as the user's terminal runs it: its own process (optionally under an address-space limit)."""
    def limit() -> None:
        if limit_as is not None:
            resource.setrlimit(resource.RLIMIT_AS, (limit_as, limit_as))

    env = {k: v for k, v in os.environ.items() if k != "RUN_PY_DEBUG"}
    return subprocess.run([sys.executable, str(bundle / "run.py"), *argv], capture_output=True, text=True,
                          timeout=timeout, preexec_fn=limit, env=env)


def one_line(r: subprocess.CompletedProcess) -> str:
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr, r.stderr
    return lines[0]


def test_run_py_caps_batch_at_the_bound_vitdeploy_uses() -> None:
    """run.py cannot import vitdeploy: its copy of the batch ceiling must be core/limits.py's."""
    from vitdeploy.core.limits import BATCH_MAX, RANGES

    mod = load_run_py(RUN_PY)
    assert mod.BATCH_MAX == BATCH_MAX == RANGES["batch"]["max"]


def test_check_runs_under_an_address_space_limit_far_below_the_file_bound(copy: Path) -> None:
    """P9: a 70 KB model must not need the 8 GiB bound reserved: --check passes under an 8 GiB RLIMIT_AS (on main,
    f.read(limit + 1) asked for 8 GiB + 1 up front and died with MemoryError)."""
    r = run_py(copy, "--check", limit_as=8 << 30, timeout=120)
    assert r.returncode == 0 and r.stdout.startswith("OK: "), (r.stdout, r.stderr)


def test_read_bounded_reads_a_file_that_grew_past_its_size_up_to_the_bound(tmp_path: Path) -> None:
    """The one allocation is the size fstat gave; bytes appended after it are still read, and stop at limit + 1."""
    mod = load_run_py(RUN_PY)
    f = tmp_path / "f.bin"
    f.write_bytes(b"x" * 100)
    with f.open("rb") as fh:
        assert mod.read_bounded(fh, 1000, 40) == b"x" * 100  # fstat said 40; the file holds 100
    with f.open("rb") as fh:
        assert len(mod.read_bounded(fh, 50, 100)) == 51  # one past the bound: the caller refuses it


def _deep(copy: Path) -> None:
    (copy / "manifest.json").write_text("[" * 200_000 + "]" * 200_000)


def _default_model_out(copy: Path) -> None:
    man = json.loads((copy / "manifest.json").read_text())
    man["bundle"]["default_model"] = "../../outside.onnx"
    (copy / "manifest.json").write_text(json.dumps(man))


def _default_model_not_text(copy: Path) -> None:
    man = json.loads((copy / "manifest.json").read_text())
    man["bundle"]["default_model"] = 7
    (copy / "manifest.json").write_text(json.dumps(man))


def _fifo(copy: Path) -> str:
    os.mkfifo(copy / "fifo.png")
    return str(copy / "fifo.png")


@pytest.mark.parametrize(("case", "argv", "code", "says"), [
    # P7: a FIFO named as an image hung for ever on main; now refused before it is opened
    ("fifo", ("FIFO",), 1, ["fifo.png", "a FIFO", "not an image file"]),
    ("devzero", ("/dev/zero",), 1, ["/dev/zero", "a character device"]),
    # P5: a billion images per call: a usage error naming the ceiling (main: error: MemoryError)
    ("batch", ("--check", "--batch", "1000000000"), 2, ["--batch", "at most 4096"]),
    # P1: a deeply nested manifest.json: its name, not RecursionError
    ("deep", ("--check",), 1, ["manifest.json", "nested too deeply"]),
    # the manifest's default model out of the bundle: said as the manifest's field, never as "--model None"
    ("default_out", ("--check",), 1, ["manifest.json's bundle.default_model", "../../outside.onnx"]),
    ("default_int", ("--check",), 1, ["manifest.json's bundle.default_model is 7"]),
])
def test_a_hostile_read_is_one_line_with_its_exit_code(copy: Path, case: str, argv: tuple[str, ...], code: int,
                                                       says: list[str]) -> None:
    args = list(argv)
    if case == "fifo":
        args = [_fifo(copy)]
    elif case == "deep":
        _deep(copy)
    elif case == "default_out":
        _default_model_out(copy)
    elif case == "default_int":
        _default_model_not_text(copy)
    r = run_py(copy, *args, timeout=30)
    line = one_line(r)
    assert r.returncode == code and r.stdout == "", (r.returncode, r.stdout, line)
    assert all(s in line for s in says), line
    assert "None" not in line and "RecursionError" not in line and "MemoryError" not in line, line


def test_a_fifo_swapped_in_after_listing_is_skipped_not_waited_on(copy: Path, capsys: pytest.CaptureFixture) -> None:
    """The image is opened without blocking and checked to be a regular file before it is decoded."""
    mod = load_run_py(copy / "run.py")
    os.mkfifo(copy / "late.png")
    with pytest.raises(ValueError, match="a FIFO, not an image file"):
        mod.load_resized(copy / "late.png", {"input_size": [16, 16], "resize_mode": "squash"})
