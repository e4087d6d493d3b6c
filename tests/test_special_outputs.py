"""An output that is a channel (a FIFO, a character device, a /proc link such as /dev/stdout) is written to in place,
never renamed over; a symlink to a regular file is replaced, never written through (issue 40); an output inside an
input is refused."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from vitdeploy.core.errors import UsageError
from vitdeploy.core.fileio import check_output, write_text_atomic

VENV_BIN = Path(sys.executable).parent


def read_fifo(path: Path, into: list[bytes]) -> threading.Thread:
    """A reader on the FIFO, so a writer's open() returns."""

    def run() -> None:
        with open(path, "rb") as f:
            into.append(f.read())

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_a_fifo_named_by_json_is_still_a_fifo_and_gets_the_json(tmp_path: Path) -> None:
    fifo = tmp_path / "out.json"
    os.mkfifo(fifo)
    got: list[bytes] = []
    t = read_fifo(fifo, got)
    r = subprocess.run([str(VENV_BIN / "vitdeploy"), "doctor", "--json", str(fifo)], capture_output=True, text=True,
                       timeout=300, cwd=tmp_path)
    t.join(timeout=30)
    assert r.returncode == 0, r.stderr
    assert stat.S_ISFIFO(fifo.lstat().st_mode), "the FIFO was replaced by a regular file"
    assert "python" in json.loads(got[0])
    assert [p.name for p in tmp_path.iterdir()] == ["out.json"]  # no temp file left beside it


def test_doctor_json_dev_stdout_prints_json_to_stdout(tmp_path: Path) -> None:
    was_link = os.path.islink("/dev/stdout")
    r = subprocess.run([str(VENV_BIN / "vitdeploy"), "doctor", "--json", "/dev/stdout"], capture_output=True,
                       text=True, timeout=300, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "python" in json.loads(r.stdout)
    assert os.path.islink("/dev/stdout") == was_link  # not renamed over (as root, the old writer replaced it)


def test_a_link_to_proc_fd_is_written_in_place_and_stays_a_link(tmp_path: Path) -> None:
    sink = tmp_path / "sink.txt"
    link = tmp_path / "stdout.json"
    from vitdeploy.core.fileio import output_kind

    with open(sink, "w") as f:
        link.symlink_to(f"/proc/{os.getpid()}/fd/{f.fileno()}")
        assert output_kind(link) == "channel"
        check_output(link, option="--json")
        write_text_atomic(link, '{"a": 1}\n')
    assert link.is_symlink()
    assert sink.read_text() == '{"a": 1}\n'


def test_a_character_device_is_written_in_place(tmp_path: Path) -> None:
    from vitdeploy.core.fileio import output_kind

    dev = tmp_path / "null"
    try:
        os.mknod(dev, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the same device as /dev/null
    except (PermissionError, OSError) as e:
        pytest.skip(f"cannot make a device node here: {e}")
    assert output_kind(dev) == "channel"
    write_text_atomic(dev, "{}\n")
    assert stat.S_ISCHR(dev.lstat().st_mode)
    assert [p.name for p in tmp_path.iterdir()] == ["null"]


def test_a_symlink_to_a_json_file_is_replaced_and_its_target_kept(tmp_path: Path) -> None:
    """Issue 40 reversed issue 23's rule (the link followed, its target replaced): the target may be an input, and
    a link left where a side file goes turned --init weights into a features cache. Nothing is written through."""
    target = tmp_path / "real.json"
    target.write_text("old\n")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    write_text_atomic(link, "new\n")
    assert not link.is_symlink() and link.read_text() == "new\n"
    assert target.read_text() == "old\n"


def test_a_socket_is_refused(tmp_path: Path) -> None:
    import socket

    path = tmp_path / "s.json"
    s = socket.socket(socket.AF_UNIX)
    try:
        s.bind(str(path))
        with pytest.raises(UsageError, match="socket"):
            check_output(path, option="--json")
    finally:
        s.close()


def test_a_file_inside_an_input_folder_is_refused(tmp_path: Path) -> None:
    hf = tmp_path / "hf"
    hf.mkdir()
    (hf / "model.safetensors").write_bytes(b"weights")
    with pytest.raises(UsageError, match="input folder"):
        check_output(hf / "model.safetensors", [hf])
    check_output(tmp_path / "elsewhere.pth", [hf])  # outside: fine


def test_strict_json_writes_null_and_a_note_for_nan() -> None:
    import numpy as np

    from vitdeploy.core.fileio import strict_json

    text = strict_json({"passed": False, "max_abs_diff": float("nan"), "rows": [np.float32("inf"), 1.0]})
    doc = json.loads(text, parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    assert doc["max_abs_diff"] is None and doc["rows"] == [None, 1.0]
    assert "max_abs_diff" in doc["non_finite"]
