from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from vitdeploy.cli import app

runner = CliRunner()


def test_help_does_not_import_torch() -> None:
    code = (
        "import sys; from vitdeploy.cli import app\n"
        "try:\n    app(['--help'])\nexcept SystemExit:\n    pass\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert 'onnxruntime' not in sys.modules\nprint('clean')"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "clean" in out.stdout and "train" in out.stdout


def test_every_command_has_help() -> None:
    res = runner.invoke(app, ["--help"])
    assert res.exit_code == 0
    import typer.main

    group = typer.main.get_command(app)
    for name in group.list_commands(None):  # type: ignore[arg-type]
        r = runner.invoke(app, [name, "--help"])
        assert r.exit_code == 0, name
        assert "Usage" in r.output


def test_presets_json() -> None:
    res = runner.invoke(app, ["presets", "--json", "-"])
    assert res.exit_code == 0
    rows = json.loads(res.stdout)
    by = {r["name"]: r["params"] for r in rows}
    assert by["vit-base"] == 86_567_656 and by["vit-tiny"] == 5_717_416


def _one_line_error(res, code: int, *words: str) -> None:
    assert res.exit_code == code, res.output
    err = res.stderr.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("error:") and "Traceback" not in res.output
    for w in words:
        assert w in err[0], err[0]


def test_train_bad_inputs_are_one_line(tmp_path: Path) -> None:
    _one_line_error(runner.invoke(app, ["train", str(tmp_path / "nope")]), 1, "does not exist")
    _one_line_error(runner.invoke(app, ["train", "--preset", "vit-nope"]), 2, "vit-tiny")  # a bad option value
    bad = tmp_path / "x.pth"
    bad.write_text("junk")
    _one_line_error(runner.invoke(app, ["train", "--init", str(bad)]), 1, "not a PyTorch checkpoint")
    _one_line_error(runner.invoke(app, ["train", "--image-size", "30"]), 2, "not divisible")
    _one_line_error(runner.invoke(app, ["datasets", "cifar", str(tmp_path)]), 2, "digits")


def test_debug_shows_traceback(tmp_path: Path) -> None:
    res = runner.invoke(app, ["--debug", "train", str(tmp_path / "nope")])
    assert res.exit_code == 1 and "Traceback" in res.output


def test_datasets_digits_writes_imagefolder(tmp_path: Path) -> None:
    res = runner.invoke(app, ["datasets", "digits", str(tmp_path / "d")])
    assert res.exit_code == 0
    train = list((tmp_path / "d" / "train").rglob("*.png"))
    val = list((tmp_path / "d" / "val").rglob("*.png"))
    assert len(train) + len(val) == 1797 and len(val) == 360
    assert sorted(p.name for p in (tmp_path / "d" / "val").iterdir()) == [str(i) for i in range(10)]


def test_train_cli_on_folder(mixed_mode_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "c.pth"
    res = runner.invoke(app, ["train", str(mixed_mode_folder), "--preset", "vit-digits", "--image-size", "16",
                              "--epochs", "1", "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert out.exists() and "best validation top-1" in res.stdout
