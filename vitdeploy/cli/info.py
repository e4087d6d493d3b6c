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
    if not emit_json([i.to_dict() for i in infos], json_out, list(paths)):
        for n, i in enumerate(infos):
            if n:
                console.print("")
            for line in describe(i):
                console.print(line, highlight=False, soft_wrap=True)
    _judge_bundles(infos)


def _judge_bundles(infos: list) -> None:
    """A bundle's models and reference files must be the bytes its manifest.json records before anything in it is
    called current: one changed or missing fails (exit 1), naming it; a file a user may edit (README, Triton and
    DeepStream configs, scripts) changed is a warning naming it."""
    from vitdeploy.cli.app import err_console
    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.core.text import printable

    for i in infos:
        for lk in i.edited:
            err_console.print(f"warning: {printable(i.path / lk.source)} was edited since the bundle was packed (a file "
                              "you may edit; its SHA-256 is not the one manifest.json records)", highlight=False,
                              soft_wrap=True, markup=False)
    bad = [(i, lk) for i in infos for lk in i.damaged]
    if bad:
        i, lk = bad[0]
        what = "is missing" if lk.state == "missing" else "is not the file manifest.json records (its SHA-256 differs)"
        more = f" (and {len(bad) - 1} more, named above)" if len(bad) > 1 else ""
        raise VitdeployError(f"{printable(i.path / lk.source)} {what}{more}: the bundle's models and references changed "
                             "since it was packed; make the bundle again (vitdeploy bundle … -o DIR --force)")
