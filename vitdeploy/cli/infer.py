"""`vitdeploy infer`: classify image files and folders with any artifact."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, check_json_dest, console, emit_json, err_console, handle_errors, text_column
from vitdeploy.cli.options import JSON_HELP, bounded
from vitdeploy.core.errors import EXIT_PARTIAL


@app.command()
@handle_errors
def infer(
    images: list[Path] = typer.Argument(..., help="Image files and folders (recursive; .jpg .jpeg .png .bmp .gif .tif .tiff .webp, any case; other and hidden files are ignored)."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="Checkpoint, ONNX model or engine. Default: the newest usable one here (engine where TensorRT and a GPU are, else model.int8.onnx, model.onnx, model.fp16.onnx, else ckpt.pth)."),
    backend: str = typer.Option("auto", help="auto (the fastest installed for the artifact: OpenVINO for ONNX on a CPU where installed), torch, onnxruntime, openvino or tensorrt."),
    batch_size: int = typer.Option(8, "--batch-size", "-b", **bounded("batch"), help="Images per model call."),
    top_k: int = typer.Option(5, "--top-k", "-k", **bounded("top_k"), help="Classes to report per image (clamped to the number of classes)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the results to FILE.csv or FILE.json instead of a table."),
    threads: Optional[int] = typer.Option(None, **bounded("threads"), help="Inference threads (default: one per core)."),
    workers: Optional[int] = typer.Option(None, **bounded("reader_threads"), help="Reader threads decoding images ahead of the model (default: cores, at most 4)."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE", help=JSON_HELP),
) -> None:
    """Classify images: top-k labels and scores per image; unreadable files are named and skipped (exit 3)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from vitdeploy.core.text import printable
    from vitdeploy.tools.infer import gather_images, open_model, write_predictions
    from vitdeploy.tools.infer import infer as run_infer

    if out is not None:
        from vitdeploy.core.fileio import check_output

        check_output(out, [model, *images], suffixes=(".csv", ".json", ".CSV", ".JSON"))
    check_json_dest(json_out, [model, *images])
    paths = gather_images(images)
    runner, notes = open_model(model, backend, threads)
    for n in notes:
        err_console.print(n, highlight=False, soft_wrap=True)
    try:
        with Progress(
            text_column("infer", "bold"), BarColumn(), MofNCompleteColumn(), text_column("{task.fields[info]}"),
            TimeElapsedColumn(), console=err_console, transient=True, disable=not err_console.is_terminal,
        ) as prog:
            task = prog.add_task("infer", total=len(paths), info="")
            t0 = [0.0]

            def on_progress(done: int, skipped: int, total: int) -> None:
                import time

                now = time.perf_counter()
                if not t0[0]:
                    t0[0] = now
                rate = done / (now - t0[0]) if now > t0[0] else 0.0
                prog.update(task, completed=done + skipped,
                            info=f"{rate:.1f} images/s" + (f"  {skipped} skipped" if skipped else ""))

            result = run_infer(paths, batch_size=batch_size, top_k=top_k, workers=workers,
                               progress=on_progress, runner=runner)
    finally:
        runner.close()
    for n in result.notes:
        err_console.print(f"note: {n}", highlight=False, soft_wrap=True)
    doc = {"model": str(result.model), "backend": result.backend, "precision": result.precision,
           "images_per_second": result.images_per_second, "predictions": [pr.row() for pr in result.predictions],
           "skipped": [{"path": str(p), "why": why} for p, why in result.skipped]}
    if emit_json(doc, json_out, [model, *images]):
        pass  # stdout carries the JSON alone
    elif out is not None:
        write_predictions(result, out)
        console.print(f"{len(result.predictions)} predictions → {out}", highlight=False, soft_wrap=True)
    else:
        import os

        common = Path(os.path.commonpath([str(pr.path.parent) for pr in result.predictions]))
        t = Table(show_edge=False, title=f"in {printable(common)}" if str(common) not in ("", ".") else None, title_justify="left")
        t.add_column("path", overflow="fold")
        t.add_column("label")
        t.add_column("score", justify="right")
        if result.top_k > 1:
            t.add_column(f"next {result.top_k - 1}")
        for pr in result.predictions:
            cells = [printable(pr.path.relative_to(common) if common != Path() else pr.path), printable(pr.label), f"{pr.score:.3f}"]
            if result.top_k > 1:
                cells.append("  ".join(f"{printable(lab)} {sc:.3f}" for lab, sc in zip(pr.labels[1:], pr.scores[1:], strict=True)))
            t.add_row(*cells)
        console.print(t)
    for p, why in result.skipped:
        err_console.print(f"skipped {printable(p)}: {why}", highlight=False, soft_wrap=True)
    err_console.print(
        f"{len(result.predictions)} image(s) classified with {result.model} ({result.backend}, {result.precision}) "
        f"at {result.images_per_second:.1f} images/s"
        + (f"; {len(result.skipped)} unreadable file(s) skipped" if result.skipped else ""),
        highlight=False, soft_wrap=True,
    )
    if result.skipped:
        raise typer.Exit(EXIT_PARTIAL)
