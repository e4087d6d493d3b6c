"""`vitdeploy numerics`: where the FP32 model's activations sit against FP16's range and INT8's levels."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, print_json, styled
from vitdeploy.cli.options import bounded
from vitdeploy.core.defaults import SAFETY, SPREAD_LIMIT
from vitdeploy.core.errors import EXIT_PARTIAL


def _num(v: float | None, fmt: str) -> str:
    return "—" if v is None else format(v, fmt)


@app.command()
@handle_errors
def numerics(
    model: Path = typer.Argument(Path("model.onnx"), help="FP32 ONNX model from `vitdeploy export`."),
    images: Path = typer.Option(..., "--images", "-i", help="Folder of images like the deployment's (preprocessed as the manifest says)."),
    num_images: int = typer.Option(256, **bounded("images"), help="Images sampled from --images (all when fewer)."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", **bounded("batch"), help="Images per model call."),
    safety: float = typer.Option(SAFETY, **bounded("factor"), help="Flag FP16 overflow when 65504 / max|x| is under this margin."),
    spread_limit: float = typer.Option(SPREAD_LIMIT, "--spread-limit", **bounded("factor"), help="Flag INT8 collapse when a quantized tensor's widest channel exceeds the median channel by more than this."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON to FILE ('-': stdout, without the table)."),
    show_all: bool = typer.Option(False, "--all", help="List every watched tensor, not only the flagged ones."),
) -> None:
    """Max |x| and FP16 headroom at every LayerNorm input, its squared term, residual Add and Softmax input, and of
    every other float tensor (role activation); the inter-channel spread and range use of every activation INT8 would
    quantize. Flags what would overflow or collapse."""
    from rich import box
    from rich.table import Table

    from vitdeploy.checks.numerics import fp16_unsafe_tensors
    from vitdeploy.checks.numerics import numerics as run_numerics
    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.core.fileio import check_output, write_text_atomic

    to_stdout = json_out is not None and str(json_out) == "-"
    if json_out is not None and not to_stdout:
        check_output(json_out, [model, images], option="--json")
    report = run_numerics(model, images, num_images=num_images, batch_size=batch_size, safety=safety,
                          spread_limit=spread_limit)
    for p, why in report.skipped:
        err_console.print(f"skipped {p}: {why}", highlight=False)
    if to_stdout:
        print_json(report.to_dict())
    else:
        rows = report.tensors if show_all else report.flagged
        t = Table(title=f"numerics of {model} on {report.images} images", box=box.SIMPLE_HEAD, show_edge=False)
        for c in ("tensor", "role", "max |x|", "FP16 headroom", "spread", "p99.99 / max", "flags"):
            t.add_column(c, justify="left" if c in ("tensor", "role", "flags") else "right", overflow="fold")
        for s in rows:
            t.add_row(s.tensor, s.role, f"{s.max_abs:.4g}", _num(s.fp16_headroom, ".3g"), _num(s.spread, ".3g"),
                      _num(s.range_used, ".3f"), ", ".join(s.flags) or "ok")
        if rows:
            console.print(t)
        n16 = len(fp16_unsafe_tensors(report))
        n8 = sum("int8_spread" in s.flags for s in report.tensors)
        console.print(styled("FP16:" if n16 else "FP16: ok", "red" if n16 else "green",
                             f"{n16} tensor(s) within {safety:g}× of 65504" if n16 else
                             f"every watched tensor has at least {safety:g}× headroom"), highlight=False)
        console.print(styled("INT8:" if n8 else "INT8: ok", "red" if n8 else "green",
                             f"{n8} quantized tensor(s) with a channel spread over {spread_limit:g}" if n8 else
                             f"no quantized tensor's channel spread exceeds {spread_limit:g}"), highlight=False)
    if json_out is not None and not to_stdout:
        write_text_atomic(json_out, json.dumps(report.to_dict(), indent=2) + "\n")
        console.print(f"report → {json_out}", highlight=False)
    if report.skipped:
        raise VitdeployError(f"{len(report.skipped)} unreadable image(s) skipped; the report covers the rest", EXIT_PARTIAL)
