"""Every `vitdeploy` process registers all commands; registering them, and printing any --help, imports typer, rich
and light vitdeploy.core modules only (DESIGN: heavy imports where they are used). A command imports what it needs
in its body, so a refusal of a bad option value or `vitdeploy --help` costs about 0.1 CPU-s, not 0.25 (numpy, onnx,
the stages and checks) or 1.4 (torch).

Each check runs in a fresh interpreter: this test's own process has imported everything long ago.
"""

from __future__ import annotations

from pathlib import Path

from cli_cases import run_cli_cases

# Never imported by registering the commands or by a --help.
HEAVY = ("torch", "onnx", "onnxruntime", "openvino", "tensorrt", "numpy", "PIL", "onnxslim", "safetensors")
# The vitdeploy packages below cli that hold the work (core is the light one the CLI may use).
WORK = ("vitdeploy.model", "vitdeploy.graph", "vitdeploy.runners", "vitdeploy.checks", "vitdeploy.stages",
        "vitdeploy.tools")
# Refusals whose check needs only core (Typer's own bounds, a target name, an output name, a list's spelling): exit 2
# before the command imports its stage or tool. Run in an empty folder: no check reads a file.
LIGHT_REFUSALS = [
    ["infer", "img", "--top-k", "0"],
    ["calibrate", "model.onnx", "-o", "x.txt"],
    ["export", "ckpt.pth", "--target", "nosuch"],
    ["build-engine", "model.onnx", "--target", "trt7"],
    ["benchmark", "model.onnx", "--batch-sizes", "1,,8"],
]

def _commands() -> list[str]:
    """Every command the app registers (read in this process, which has imported everything anyway)."""
    import typer.main

    from vitdeploy.cli import app

    return sorted(typer.main.get_command(app).commands)


def test_registering_the_commands_every_help_and_light_refusals_import_no_heavy_module(tmp_path: Path) -> None:
    commands = _commands()
    assert len(commands) >= 15, commands  # every command registered, train and export among them
    assert {"train", "export", "calibrate", "numerics", "benchmark", "verify", "infer"} <= set(commands)
    cases = [["--help"]] + [[c, "--help"] for c in commands] + LIGHT_REFUSALS
    rows = run_cli_cases(cases, tmp_path, timeout=120)  # in an empty folder: no check reads a file
    for r in rows:  # --help first: what registering the commands imports is in its row
        assert r.loaded(*HEAVY, *WORK) == [], f"vitdeploy {' '.join(r.argv)} imported {', '.join(r.loaded(*HEAVY, *WORK))}"
    assert all(r.code == 0 and r.stdout.strip() for r in rows[: -len(LIGHT_REFUSALS)])
    refusals = rows[-len(LIGHT_REFUSALS):]
    assert all(r.code == 2 for r in refusals), [(r.argv, r.code, r.stderr) for r in refusals]  # usage errors
