"""One set of CLI conventions: --json FILE|- wherever a command reports, the same names and short options for the same
ideas, no `<bool>` beside a flag in any --help, and a one-line error for `--int8 True`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import typer.main
from typer.testing import CliRunner

from vitdeploy.cli import app

VENV_BIN = Path(sys.executable).parent
runner = CliRunner()
COMMANDS = typer.main.get_command(app).commands  # type: ignore[attr-defined]


def _opt(cmd: str, name: str) -> object | None:
    return next((p for p in COMMANDS[cmd].params if name in getattr(p, "opts", ())), None)


def test_no_command_help_shows_a_bool_metavar() -> None:
    for name in [None, *COMMANDS]:
        r = runner.invoke(app, ([name] if name else []) + ["--help"], terminal_width=200)
        assert r.exit_code == 0, (name, r.output)
        assert "<bool>" not in r.output, name


def test_a_truth_word_after_a_flag_is_one_line_exit_2(tmp_path: Path) -> None:
    r = subprocess.run([str(VENV_BIN / "vitdeploy"), "build-engine", "--int8", "True"], capture_output=True, text=True,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 2 and r.stderr == "error: --int8 is a flag and takes no value: write --int8, not --int8 True\n"
    assert list(tmp_path.iterdir()) == []


def test_every_json_option_takes_a_file_or_dash() -> None:
    with_json = [c for c in COMMANDS if _opt(c, "--json") is not None]
    assert {"infer", "presets", "check-target", "verify", "benchmark", "explain", "info", "bundle"} <= set(with_json)
    for c in with_json:
        p = _opt(c, "--json")
        assert not getattr(p, "is_flag", False), f"{c} --json is a bare flag"


def test_presets_json_to_a_file_and_to_stdout(tmp_path: Path) -> None:
    r = runner.invoke(app, ["presets", "--json", "-"])
    assert r.exit_code == 0 and json.loads(r.stdout)[0]["name"] == "vit-digits"
    out = tmp_path / "p.json"
    r = runner.invoke(app, ["presets", "--json", str(out)])
    assert r.exit_code == 0 and json.loads(out.read_text())[0]["name"] == "vit-digits"


def test_images_is_the_one_name_for_the_image_folder_old_names_hidden() -> None:
    for c in ("export", "calibrate", "verify", "build-engine", "bundle"):
        p = _opt(c, "--images")
        assert p is not None and "-i" in p.opts, c  # type: ignore[attr-defined]
    for c, old in (("build-engine", "--calib"), ("bundle", "--check-images")):
        p = _opt(c, old)
        assert p is not None and p.hidden, (c, old)  # type: ignore[attr-defined]


def test_the_same_short_option_means_the_same_idea_everywhere() -> None:
    meaning = {"-o": "--out", "-i": "--images", "-m": "--model", "-t": "--target", "-b": "--batch-size"}
    for c in COMMANDS:
        for p in COMMANDS[c].params:
            for short, long in meaning.items():
                if short in getattr(p, "opts", ()):
                    assert long in p.opts, (c, p.opts)
    for c in ("export", "calibrate", "convert-fp16", "build-engine", "bundle", "check-target"):
        assert "-t" in _opt(c, "--target").opts, c  # type: ignore[union-attr]
