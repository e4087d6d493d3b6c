"""Issue 31, the CLI's share (defects 7, 8, 11, 12b, 13, 15, 16, 17): every numeric option has a range that --help
shows and the CLI checks before any work; DataLoader workers die with their parent; labels and file names print as
text, never as terminal controls or rich markup; CSV cells cannot start a formula; a label file's BOM is not a
label; a batch too big for memory is refused; Python warnings are one line each.

Refusals run in one process (tests/cli_cases.py); the model tests use the session's digits ONNX model.
"""

from __future__ import annotations

import csv
import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from cli_cases import run_cli_cases

from vitdeploy.core.host import available_cores

# --- 15, 11, 7: one range table, on every numeric option -----------------------------------------------------------


def _numeric_options() -> list[tuple[str, object]]:
    import typer.main

    from vitdeploy.cli import app

    group = typer.main.get_command(app)
    out = []
    for name, cmd in sorted(group.commands.items()):  # type: ignore[attr-defined]
        for p in cmd.params:
            desc = getattr(p, "type_descriptor", None)
            if desc is not None and desc.annotation in (int, float):
                out.append((name, p))
    return out


def test_every_numeric_option_of_every_command_has_a_range_shown_in_its_help() -> None:
    opts = _numeric_options()
    assert len(opts) >= 40, len(opts)  # the walk found the options (43 when written)
    unbounded = [f"{c} {p.opts[0]}" for c, p in opts if p.min is None or p.max is None]  # type: ignore[attr-defined]
    assert unbounded == [], unbounded
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    helped = CliRunner().invoke(app, ["infer", "--help"], terminal_width=200).output
    assert f"1<=x<={available_cores()}" in helped and "1<=x<=4096" in helped, helped


OUT_OF_RANGE = [
    ["train", "--workers", "99999999999999999999", "-o", "t.pth"],  # 852 processes in 30 s before
    ["train", "--epochs", "99999999999999999999", "-o", "t.pth"],  # ran for ever
    ["train", "--epochs", "1e20", "-o", "t.pth"],
    ["train", "--weight-decay", "inf", "-o", "t.pth"],  # wrote a NaN checkpoint, exit 0
    ["train", "--weight-decay", "nan", "-o", "t.pth"],
    ["train", "--seed", "-1", "-o", "t.pth"],  # numpy's raw exception, exit 1
    ["bundle", "model.onnx", "--max-batch", "99999999999999999999"],  # a config.pbtxt Triton rejects, exit 0
    ["benchmark", "model.onnx", "--iterations", "100000000000000000000"],  # ran for ever
    ["benchmark", "model.onnx", "--warmup", "1e20"],
    ["build-engine", "model.onnx", "--workspace", "inf"],  # a raw exception, exit 1
    ["verify", "model.onnx", "model.onnx", "-i", "img", "--threads", "100000"],  # SIGSEGV, exit 139
    ["infer", "img", "-m", "model.onnx", "--backend", "onnxruntime", "--threads", "100000"],  # hung
    ["explain", "img/a.png", "-m", "model.onnx", "--threads", "100000"],  # hung
    ["benchmark", "model.onnx", "--threads", "100000"],  # hung
    ["calibrate", "model.onnx", "-i", "img", "--seed", "-1"],
    ["infer", "img", "-m", "model.onnx", "-b", "100000"],
]


def test_values_past_an_options_range_are_refused_in_one_line_before_any_work(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"never read: the range check comes first")
    (tmp_path / "img").mkdir()
    (tmp_path / "img" / "a.png").write_bytes(b"never read")
    rows = run_cli_cases(OUT_OF_RANGE, tmp_path, timeout=120)
    for argv, r in zip(OUT_OF_RANGE, rows, strict=True):
        assert r.code == 2 and len(r.lines()) == 1, (argv, r.code, r.stderr[-1500:])
        line = r.lines()[0]
        assert line.startswith("error: --") and ("must be at" in line or " from " in line), (argv, line)
        assert r.changed == [] and r.seconds < 10, (argv, r.changed, r.seconds)
        assert not r.loaded("torch", "onnxruntime"), (argv, "imported a runtime before refusing")


def test_library_callers_get_the_same_ceilings() -> None:
    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.host import thread_count
    from vitdeploy.model.train_options import TrainOptions, check_options

    for bad in ({"weight_decay": math.inf}, {"seed": -1}, {"epochs": 10**20}, {"workers": 10**20}):
        with pytest.raises(UsageError, match="must be at"):
            check_options(TrainOptions(out="never.pth", **bad))  # type: ignore[arg-type]
    assert thread_count(100_000) == available_cores() and thread_count(None) == available_cores()


def test_dataloader_workers_die_with_the_training_process(tmp_path: Path) -> None:
    """Defect 7: a killed run left orphans (ppid 1) holding 1 GB. Here a worker is stuck decoding a file (a slow
    decoder stands in for a network file system or a FIFO) when its parent is killed with SIGKILL."""
    script = textwrap.dedent(
        """
        import os, sys, time
        from pathlib import Path
        import vitdeploy.model.train as t
        from vitdeploy.core.preprocess import Preprocess

        def slow(path):
            # one write, one line: under PYTHONUNBUFFERED print() writes "worker", " ", pid and "\\n" apart,
            # and two workers' pieces interleave on the pipe (seen in CI: no line started with "worker ")
            os.write(1, f"worker {os.getpid()}\\n".encode())  # one batch of 32 files per worker: once each
            time.sleep(120)

        t.load_image = slow  # the forked workers inherit it
        t._decode_in_workers([(Path("x.png"), 0)] * 64, Preprocess(input_size=(8, 8)), 2)
        """
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parents[1]), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env)
    workers: set[int] = set()
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + 90
        while len(workers) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith("worker "):
                workers.add(int(line.split()[1]))
        assert len(workers) == 2, workers
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)

    def alive(pid: int) -> bool:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
        except OSError:
            return False
        return state != "Z"

    deadline = time.monotonic() + 10
    while any(alive(p) for p in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [p for p in workers if alive(p)]
    for p in left:  # never leave them behind, even when the test fails
        os.kill(p, signal.SIGKILL)
    assert left == [], f"DataLoader workers outlived their killed parent: {left}"


# --- 8, 13: one sanitiser; markup printed as written ---------------------------------------------------------------

HOSTILE = ["\x1b[2Jcleared", "two\nlines", "\u202eexe.doc", "=HYPERLINK(\"http://x\")", "+1", "-2", "@sum", "\ufeffcat",
           "ok", "[/]"]


def test_printable_escapes_controls_bidi_and_separators_and_keeps_letters() -> None:
    from vitdeploy.core.text import csv_cell, printable

    assert printable("\x1b[2J") == "\\x1b[2J" and printable("a\nb\rc\td") == "a\\nb\\rc\\td"
    assert printable("\u202eexe\u2028\u2029\x85\ufeff") == "\\u202eexe\\u2028\\u2029\\x85\\ufeff"
    assert printable("bad\udcff.png") == "bad\\xff.png"  # a non-UTF-8 byte of a file name
    assert printable("Zürich 東京 🐱 [/]") == "Zürich 東京 🐱 [/]"
    assert printable("a\nb", keep_newlines=True) == "a\nb"
    assert [csv_cell(v) for v in ("=1+1", "+1", "-2", "@x", "\tx", "ok", 0.5)] == ["'=1+1", "'+1", "'-2", "'@x", "\\tx", "ok", 0.5]


def test_the_clis_consoles_print_no_terminal_control_whatever_the_text() -> None:
    import io

    from rich.text import Text

    from vitdeploy.cli.app import SafeConsole, text_column

    buf = io.StringIO()
    con = SafeConsole(file=buf, markup=False, width=200, force_terminal=True)
    con.print("label \x1b[2J and \u202eevil", highlight=False)
    con.print(Text.assemble(("error:", "bold red"), " \x1b]0;title\x07"))
    out = buf.getvalue()
    assert "\\x1b[2J" in out and "\\u202e" in out and "\\x1b]0;title" in out
    assert "\x1b[2J" not in out and "\u202e" not in out and "\x07" not in out
    assert "\x1b[1;31m" in out  # rich's own styling still reaches a terminal
    from rich.progress import Progress

    with Progress(text_column("{task.description}"), console=con, auto_refresh=False) as prog:
        prog.add_task("calibrating e[/]x/[bold]y")  # MarkupError before (defect 13)
        prog.refresh()
    assert "e[/]x/[bold]y" in buf.getvalue()


def test_no_progress_column_of_the_cli_parses_markup() -> None:
    """Defect 13: the CLI's progress text columns come from cli.app.text_column (markup off), none from rich's default."""
    src = Path(__file__).parents[1] / "vitdeploy" / "cli"
    offenders = [p.name for p in src.glob("*.py") if "TextColumn(" in p.read_text() and p.name != "app.py"]
    assert offenders == [], offenders


@pytest.fixture(scope="module")
def hostile_model(digits_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The digits model whose manifest names its classes with escapes, newlines, bidi overrides and formulas."""
    import onnx

    m = onnx.load(str(digits_onnx))
    for prop in m.metadata_props:
        if prop.key == "vitdeploy.manifest":
            man = json.loads(prop.value)
            man["labels"] = HOSTILE
            prop.value = json.dumps(man)
    d = tmp_path_factory.mktemp("hostile")
    onnx.save(m, str(d / "model.onnx"))
    from PIL import Image

    (d / "img").mkdir()
    Image.new("RGB", (32, 32), (250, 250, 250)).save(d / "img" / "\x1b[31mred\u202e.png")
    return d / "model.onnx"


def test_info_and_infer_print_hostile_labels_and_names_as_escapes(hostile_model: Path) -> None:
    d = hostile_model.parent
    rows = run_cli_cases([["info", "model.onnx"], ["infer", "img", "-m", "model.onnx", "-k", "10", "-o", "p.csv"],
                          ["infer", "img", "-m", "model.onnx", "-k", "10"]], d, timeout=120)
    for r in rows:
        assert r.code == 0, r.stderr
        for text in (r.stdout, r.stderr):
            assert not any(c in text for c in "\x1b\u202e\ufeff"), repr(text[:400])
    info, _, table = (r.stdout for r in rows)
    classes = [ln for ln in info.splitlines() if ln.strip().startswith("classes")]
    assert len(classes) == 1 and "\\x1b[2Jcleared" in classes[0] and "two\\nlines" in classes[0], info
    assert "\\ufeffcat" in classes[0]  # the invisible BOM is visible: 'cat' and '\ufeffcat' no longer print the same
    assert "\\x1b[31mred\\u202e.png" in table
    with (d / "p.csv").open(newline="", encoding="utf-8") as f:
        cells = [c for row in csv.reader(f) for c in row]
    assert not any(c.startswith(("=", "+", "-", "@")) for c in cells), cells  # defect 8: formula cells neutralised
    assert "'=HYPERLINK(\"http://x\")" in cells and "'-2" in cells


# --- 16: a BOM is not part of a label ------------------------------------------------------------------------------


def test_a_label_file_with_a_bom_gives_the_labels_as_written(tmp_path: Path) -> None:
    from vitdeploy.model.importers import read_labels

    f = tmp_path / "labels.txt"
    f.write_bytes("cat\ndog\n".encode("utf-8-sig"))
    assert read_labels(f) == ["cat", "dog"]


# --- 12b: a batch that cannot fit is refused, naming one that does --------------------------------------------------


def test_infer_refuses_a_batch_too_big_for_memory(digits_onnx: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    import vitdeploy.tools.bench as bench
    from vitdeploy.__main__ import main

    Image.new("RGB", (32, 32)).save(tmp_path / "a.png")
    monkeypatch.setattr(bench, "available_memory", lambda: 1 << 30)  # this machine with 1 GiB free
    code = main(["infer", str(tmp_path / "a.png"), "-m", str(digits_onnx), "-b", "4096"])
    err = capsys.readouterr().err
    assert code == 2 and "GiB" in err and "use --batch-size" in err and len(err.strip().splitlines()) == 1, err
    fit = int(err.split("use --batch-size ")[1].split()[0])
    from vitdeploy.core.artifact import read_manifest
    from vitdeploy.tools.infer import batch_bytes

    m = read_manifest(digits_onnx)
    assert batch_bytes(m, fit) <= 1 << 30 < batch_bytes(m, fit + 1)


# --- 17: warnings are one line each -----------------------------------------------------------------------------------


def test_python_warnings_print_as_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    import warnings

    import numpy as np
    from PIL import Image

    from vitdeploy.__main__ import main

    with warnings.catch_warnings():
        assert main(["presets", "--json", "-"]) == 0  # the CLI's entry sets the display up
        capsys.readouterr()
        warnings.warn("Image size (100000000 pixels) exceeds limit of 89478485 pixels,\ncould be decompression bomb",
                      Image.DecompressionBombWarning, stacklevel=1)
        warnings.warn("Glyph 26481 (\\N{CJK}) missing from font(s) DejaVu Sans.", UserWarning, stacklevel=1)
        np.float32(3e38) * np.float32(10)  # overflow: numpy's RuntimeWarning  # noqa: B018
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines and all(ln.startswith("warning: ") for ln in lines), err
    assert any("decompression bomb" in ln for ln in lines) and not any("Glyph" in ln for ln in lines), err
    assert ".py:" not in err  # no file:line dump


# --- also recorded: an animated image is classified by its first frame, and that is said once ------------------------


def test_an_animated_image_says_once_that_its_first_frame_is_used(tmp_path: Path) -> None:
    import warnings

    from PIL import Image

    import vitdeploy.core.preprocess as pre

    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 255, 0), (0, 0, 255))]
    for name in ("a.gif", "b.gif"):
        frames[0].save(tmp_path / name, save_all=True, append_images=frames[1:], duration=50, loop=0)
    pre._FIRST_FRAME_SAID.clear()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first = pre.load_image(tmp_path / "a.gif")
        pre.load_image(tmp_path / "b.gif")
    said = [str(w.message) for w in seen if "animated" in str(w.message)]
    assert len(said) == 1 and "a.gif is animated (3 frames): its first frame is used" in said[0], said
    assert first.getpixel((0, 0))[0] > 200  # the first (red) frame
