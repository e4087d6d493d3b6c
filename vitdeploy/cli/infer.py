"""`vitdeploy infer`: classify image files and folders with any artifact; an embedding model's vectors."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer

from vitdeploy.cli.app import app, check_json_dest, console, emit_json, err_console, handle_errors, text_column
from vitdeploy.cli.options import JSON_HELP, bounded
from vitdeploy.core.errors import EXIT_PARTIAL

if TYPE_CHECKING:
    from vitdeploy.tools.infer import EmbedResult


@app.command()
@handle_errors
def infer(
    images: list[Path] = typer.Argument(..., help="Image files and folders (recursive; .jpg .jpeg .png .bmp .gif .tif .tiff .webp, any case; other and hidden files are ignored)."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="Checkpoint, ONNX model or engine. Default: the newest usable one here (engine where TensorRT and a GPU are, else model.int8.onnx, model.onnx, model.fp16.onnx, else ckpt.pth)."),
    backend: str = typer.Option("auto", help="auto (the fastest installed for the artifact: OpenVINO for ONNX on a CPU where installed), torch, onnxruntime, openvino or tensorrt."),
    batch_size: int = typer.Option(8, "--batch-size", "-b", **bounded("batch"), help="Images per model call."),
    top_k: int = typer.Option(5, "--top-k", "-k", **bounded("top_k"), help="Classes to report per image (clamped to the number of classes)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Write the results to FILE.csv or FILE.json instead of a table. An embedding model's vectors: FILE.npy (with FILE.files.txt, one file name per line in the rows' order, a backslash written \\\\ and a line feed \\n), FILE.json, or FILE.parquet (needs pyarrow); with --gallery also FILE.csv (the kNN labels)."),
    gallery: Optional[Path] = typer.Option(None, "--gallery", help="An embedding model only: a labelled folder (one sub-folder of images per class) whose nearest images label each image, by DINOv2's weighted kNN vote (k=20, T=0.07), unreadable gallery images named and skipped (exit 3); or an index built by `vitdeploy index` (FILE.faiss) of the same checkpoint's embeddings."),
    threads: Optional[int] = typer.Option(None, **bounded("threads"), help="Inference threads (default: one per core)."),
    workers: Optional[int] = typer.Option(None, **bounded("reader_threads"), help="Reader threads decoding images ahead of the model (default: cores, at most 4)."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE", help=JSON_HELP),
    shard_size: Optional[int] = typer.Option(None, "--shard-size", **bounded("shard_size"), help="-o DIR/ only: images per Parquet shard (default 10000); the same cut on every run, so the same command resumes."),
    ray: bool = typer.Option(False, "--ray", help="-o DIR/ only: run on Ray Data: a new local Ray, or the cluster RAY_ADDRESS names (the variable alone never switches)."),
    ray_address: Optional[str] = typer.Option(None, "--ray-address", metavar="HOST:PORT", help="-o DIR/ only: run on the Ray cluster at HOST:PORT (what `ray start --head` prints); implies --ray."),
    actors: Optional[int] = typer.Option(None, "--actors", **bounded("actors"), help="With --ray: model actors (default: one per GPU for a GPU model, else the CPUs left after decoding, at least 2)."),
    force: bool = typer.Option(False, "--force", help="-o DIR/ only: replace shards of another model found in DIR (otherwise refused)."),
) -> None:
    """Classify images: top-k labels and scores per image; unreadable files are named and skipped (exit 3).

    An embedding model answers a vector per image: written with the file names (-o FILE.npy, .json, .parquet, or
    --json), and with --gallery DIR labelled by the nearest gallery images.

    -o DIR/ (no suffix, or a trailing /) writes a folder of Parquet shards (part-NNNNN.parquet, errors.parquet) from a
    folder, a .txt list or a .parquet with a `path` column, in-process or on Ray (--ray); the same command resumes."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from vitdeploy.cli.corpus import corpus_options_without_dir, is_shard_dir, run_corpus
    from vitdeploy.core.task import task_of
    from vitdeploy.core.text import printable
    from vitdeploy.tools.infer import (
        EMBEDDING_SUFFIXES,
        EmbedResult,
        check_embedding_output,
        gather_images,
        open_model,
        write_predictions,
    )
    from vitdeploy.tools.infer import infer as run_infer

    if out is not None and is_shard_dir(out):
        run_corpus(images, out, model, backend, batch_size, top_k, threads, workers, json_out, gallery, shard_size,
                   ray, ray_address, actors, force)
        return
    corpus_options_without_dir(shard_size, ray, ray_address, actors, force)
    inputs = [model, *images, gallery]
    if out is not None:
        from vitdeploy.core.fileio import check_output

        check_output(out, inputs)
        if out.suffix.lower() not in EMBEDDING_SUFFIXES:
            from vitdeploy.core.errors import UsageError

            raise UsageError(f"-o {out}: the name must end in .csv or .json (an embedding model's vectors: .npy, "
                             ".json or .parquet)")
        if out.suffix.lower() == ".npy":
            from vitdeploy.core.outputs import check_side_outputs

            check_side_outputs(out, ["files list"], inputs)
    check_json_dest(json_out, inputs)
    paths = gather_images(images)
    runner, notes = open_model(model, backend, threads)
    try:
        check_embedding_output(out, task_of(runner.manifest), gallery, runner.artifact)
    except BaseException:
        runner.close()
        raise
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
                prog.update(task, completed=done + skipped, total=total,
                            info=f"{rate:.1f} images/s" + (f"  {skipped} skipped" if skipped else ""))

            result = run_infer(paths, batch_size=batch_size, top_k=top_k, workers=workers,
                               progress=on_progress, runner=runner, gallery=gallery)
    finally:
        runner.close()
    for n in result.notes:
        err_console.print(f"note: {n}", highlight=False, soft_wrap=True)
    if isinstance(result, EmbedResult):
        _show_embeddings(result, out, json_out, inputs)
        return
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
    _summary(result.skipped, f"{len(result.predictions)} image(s) classified with {result.model} ({result.backend}, "
             f"{result.precision}) at {result.images_per_second:.1f} images/s")


def _show_embeddings(result: EmbedResult, out: Optional[Path], json_out: Optional[str], inputs: list) -> None:
    """An embedding model's answer: the vectors written (-o, --json) or shown (norm and first values), with a gallery
    the kNN label, its vote share and the nearest gallery image per image."""
    import numpy as np
    from rich.table import Table

    from vitdeploy.core.text import printable
    from vitdeploy.tools.infer import write_embeddings

    dim = result.vectors.shape[1]
    if emit_json(result.to_dict(), json_out, inputs):
        pass  # stdout carries the JSON alone
    elif out is not None:
        files = write_embeddings(result, out)
        console.print(f"{len(result.paths)} embeddings ({dim}-d) → {' + '.join(str(f) for f in files)}",
                      highlight=False, soft_wrap=True)
    else:
        t = Table(show_edge=False)
        t.add_column("path", overflow="fold")
        if result.predictions is not None and result.neighbours is not None:
            t.add_column("kNN label")
            t.add_column("vote", justify="right")
            t.add_column("next")
            t.add_column("nearest in the gallery", overflow="fold")
            for p, pr, nb in zip(result.paths, result.predictions, result.neighbours, strict=True):
                nxt = "  ".join(f"{printable(lab)} {sc:.2f}" for lab, sc in zip(pr.labels[1:], pr.scores[1:], strict=True))
                near = f"{printable(nb[0].path)} ({printable(nb[0].label)}, cos {nb[0].cosine:.3f})" if nb else "—"
                t.add_row(printable(p), printable(pr.label), f"{pr.score:.2f}", nxt, near)
        else:
            t.add_column("‖v‖", justify="right")
            t.add_column(f"first values of {dim}")
            for p, v in zip(result.paths, result.vectors, strict=True):
                t.add_row(printable(p), f"{float(np.linalg.norm(v)):.4g}", " ".join(f"{x:+.3f}" for x in v[:6]) + " …")
        console.print(t)
    what = f"labelled by {result.k} neighbours in {result.gallery} ({result.gallery_size} images)" if result.gallery else "embedded"
    _summary(result.skipped, f"{len(result.paths)} image(s) {what} with {result.model} ({result.backend}, "
             f"{result.precision}; {result.task.describe()}) at {result.images_per_second:.1f} images/s",
             gallery_skipped=len(result.gallery_skipped))


def _summary(skipped: list[tuple[Path, str]], line: str, gallery_skipped: int = 0) -> None:
    """The unreadable files, one line each, then the run's line; partly done (exit 3) when any were skipped, input
    images or --gallery images (each named in a note): a label voted by fewer gallery images than the folder holds is
    not the whole answer asked for."""
    from vitdeploy.core.text import printable

    for p, why in skipped:
        err_console.print(f"skipped {printable(p)}: {why}", highlight=False, soft_wrap=True)
    tail = (f"; {len(skipped)} unreadable file(s) skipped" if skipped else "") + (
        f"; {gallery_skipped} unreadable gallery image(s) skipped" if gallery_skipped else "")
    err_console.print(line + tail, highlight=False, soft_wrap=True)
    if skipped or gallery_skipped:
        raise typer.Exit(EXIT_PARTIAL)
