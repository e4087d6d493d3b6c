"""Every `vitdeploy` process registers all commands; registering them, and printing any --help, imports typer, rich
and light vitdeploy.core modules only (DESIGN: heavy imports where they are used). A command imports what it needs
in its body, so a refusal of a bad option value or `vitdeploy --help` costs about 0.1 CPU-s, not 0.25 (numpy, onnx,
the stages and checks) or 1.4 (torch).

Each check runs in a fresh interpreter: this test's own process has imported everything long ago.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

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

PROBE = """
import contextlib, io, json, sys

def loaded():  # heavy packages by their top-level name, vitdeploy modules by their own
    return sorted({m if m.startswith("vitdeploy") else m.split(".")[0]
                   for m in sys.modules if m.split(".")[0] in HEAVY or m.startswith(WORK)})

HEAVY, WORK, REFUSALS = tuple(json.loads(sys.argv[1])), tuple(json.loads(sys.argv[2])), json.loads(sys.argv[3])
import vitdeploy.cli
rows = [["import vitdeploy.cli", loaded()]]
import typer.main
import vitdeploy.__main__ as m
commands = sorted(typer.main.get_command(vitdeploy.cli.app).commands)
for argv in [["--help"]] + [[c, "--help"] for c in commands] + REFUSALS:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = m.main(argv)
    rows.append([" ".join(["vitdeploy", *argv]) + f" (exit {code})", loaded()])
print(json.dumps({"rows": rows, "commands": commands}))
"""


def _probe(cwd: Path) -> dict:
    r = subprocess.run([sys.executable, "-c", PROBE, json.dumps(HEAVY), json.dumps(WORK), json.dumps(LIGHT_REFUSALS)], cwd=cwd,
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout)


def test_registering_the_commands_every_help_and_light_refusals_import_no_heavy_module(tmp_path: Path) -> None:
    got = _probe(tmp_path)  # not in the checkout: `python -c` puts the working folder first on sys.path
    assert len(got["commands"]) >= 15, got["commands"]  # every command registered, train and export among them
    assert {"train", "export", "calibrate", "numerics", "benchmark", "verify", "infer"} <= set(got["commands"])
    for what, mods in got["rows"]:
        assert mods == [], f"{what} imported {', '.join(mods)}"
    refusals = got["rows"][-len(LIGHT_REFUSALS):]
    assert all(what.endswith("(exit 2)") for what, _ in refusals), refusals  # each refused, as a usage error
