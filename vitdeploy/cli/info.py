"""`vitdeploy info ARTIFACT…`: an artifact's manifest in human form (or JSON) and its lineage, each link checked."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, check_json_dest, console, emit_json, handle_errors
from vitdeploy.cli.options import JSON_HELP


@app.command()
@handle_errors
def info(
    artifacts: Optional[list[Path]] = typer.Argument(None, help="Checkpoints, ONNX models, engines (or their .json sidecar) and "
                                                     "bundle folders. Default: the artifacts in this folder."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE", help=JSON_HELP),
) -> None:
    """Show what an artifact says about itself: name, precision, target, labels, preprocessing, what it was made from,
    and its lineage: each recorded source SHA-256 against the file beside it (current, stale or missing)."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.tools.info import describe
    from vitdeploy.tools.info import info as read_info

    paths = list(artifacts or [])
    if not paths:
        here = Path(".")
        paths = sorted(p for p in here.iterdir() if p.suffix in (".pth", ".onnx", ".engine", ".plan")
                       or (p.is_dir() and (p / "manifest.json").is_file()))
        if not paths:
            raise UsageError("no artifacts here: name one (e.g. vitdeploy info model.onnx)")
    check_json_dest(json_out, list(paths))
    infos = [read_info(p) for p in paths]
    if emit_json([i.to_dict() for i in infos], json_out, list(paths)):
        return
    for n, i in enumerate(infos):
        if n:
            console.print("")
        for line in describe(i):
            console.print(line, highlight=False, soft_wrap=True)
