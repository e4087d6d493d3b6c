"""`vitdeploy explain`: attention maps over images."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors
from vitdeploy.errors import EXIT_PARTIAL


@app.command()
@handle_errors
def explain(
    images: list[Path] = typer.Argument(..., help="Image files or folders of them."),
    model: Path = typer.Option(Path("ckpt.pth"), "--model", "-m", help="A checkpoint, or an ONNX model (FP32, FP16 or INT8: its own attention)."),
    out_dir: Path = typer.Option(Path("attention"), "--out", "-o", help="Folder for the PNGs (<image name>.attention.png)."),
    method: str = typer.Option("rollout", help="rollout (all blocks, Abnar & Zuidema 2020) or last-layer."),
    head_fusion: str = typer.Option("mean", help="How the heads of a block combine: mean, max or min."),
    discard_ratio: float = typer.Option(0.0, help="Share of the lowest attention weights zeroed per block, in [0, 1)."),
    top_k: int = typer.Option(3, help="Predictions shown in the caption."),
    threads: Optional[int] = typer.Option(None, help="ONNX Runtime threads (default: one per core)."),
) -> None:
    """Draw where the model looked: the image, its attention map, and the top predictions, one PNG per image.

    Works on a checkpoint (PyTorch) and on its ONNX copies, quantized ones included
    (ONNX Runtime, the attention of the deployed graph); unreadable images are listed
    and skipped (exit 3).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vitdeploy.explain import explain as run_explain
    from vitdeploy.preprocess import list_images

    total = sum(len(list_images(p)) or (1 if p.is_file() else 0) for p in images if p.exists())
    with Progress(
        TextColumn("[bold]explain"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True,
    ) as prog:
        task = prog.add_task("explain", total=total or None)
        result = run_explain(
            images, model=model, out_dir=out_dir, method=method, head_fusion=head_fusion,
            discard_ratio=discard_ratio, top_k=top_k, threads=threads, on_image=lambda _e: prog.advance(task),
        )
    for ex in result.explanations:
        best, score = ex.top[0]
        console.print(f"{ex.source} → {ex.output}  ({best} {score:.1%})", highlight=False)
    for path, why in result.skipped:
        err_console.print(f"skipped {path}: {why}", highlight=False)
    console.print(f"{len(result.explanations)} attention map(s) in {out_dir}/", highlight=False)
    if result.skipped:
        err_console.print(f"{len(result.skipped)} unreadable image(s) skipped")
        raise typer.Exit(EXIT_PARTIAL)
