"""`vitdeploy infer SOURCE -o DIR/`: a corpus into a folder of Parquet shards (vitdeploy/tools/corpus), printed."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import check_json_dest, emit_json, err_console, text_column
from vitdeploy.core.errors import EXIT_PARTIAL, UsageError


def is_shard_dir(out: Path) -> bool:
    """-o names a shard folder: no suffix, a trailing / (as typed: Typer's Path drops it), or a folder already."""
    if out.is_dir():
        return True
    typed = [a.split("=", 1)[1] if a.startswith("--out=") else a for a in sys.argv[1:]]
    if any(a.endswith("/") and a.rstrip("/") == str(out).rstrip("/") for a in typed):
        return True
    return out.suffix == ""


def corpus_options_without_dir(shard_size: Optional[int], ray: bool, ray_address: Optional[str],
                               actors: Optional[int], force: bool) -> None:
    """Options of the shard folder, given with a file output or none: one line (exit 2)."""
    given = [name for name, v in (("--shard-size", shard_size), ("--ray", ray or None), ("--ray-address", ray_address),
                                  ("--actors", actors), ("--force", force or None)) if v is not None]
    if given:
        raise UsageError(f"{given[0]} writes a folder of Parquet shards: pass -o DIR/ (a name without a suffix, or "
                         "ending in /)")


def run_corpus(images: list[Path], out: Path, model: Optional[Path], backend: str, batch_size: int, top_k: int,
               threads: Optional[int], workers: Optional[int], json_out: Optional[str], gallery: Optional[Path],
               shard_size: Optional[int], ray: bool, ray_address: Optional[str], actors: Optional[int],
               force: bool) -> None:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from vitdeploy.tools.corpus.run import DEFAULT_SHARD_SIZE, infer_corpus

    if gallery is not None:
        raise UsageError("--gallery labels images into a table: write -o FILE.csv/.json, or drop --gallery to write "
                         "the vectors into the shard folder")
    check_json_dest(json_out, [model, *images])

    def note(line: str) -> None:
        err_console.print(f"note: {line}", highlight=False, soft_wrap=True)

    with Progress(
        text_column("infer", "bold"), BarColumn(), MofNCompleteColumn(), text_column("{task.fields[info]}"),
        TimeElapsedColumn(), TimeRemainingColumn(), console=err_console, transient=True,
        disable=not err_console.is_terminal,
    ) as prog:
        task = prog.add_task("infer", total=None, info="")
        t0 = [0.0, 0]

        def on_progress(done: int, skipped: int, total: int) -> None:
            import time

            now = time.perf_counter()
            if not t0[0]:
                t0[0], t0[1] = now, done + skipped
            rate = (done + skipped - t0[1]) / (now - t0[0]) if now > t0[0] else 0.0
            prog.update(task, completed=done + skipped, total=total,
                        info=f"{rate:.1f} images/s" + (f"  {skipped} unreadable" if skipped else ""))

        res = infer_corpus(images, out, model, backend, batch_size, top_k, threads, workers,
                           shard_size or DEFAULT_SHARD_SIZE, ray, ray_address, actors, force, on_progress, note)
    if emit_json(res.to_dict(), json_out, [model, *images]):
        pass
    where = f"on Ray ({len(res.nodes)} node(s))" if res.executor == "ray" else "in-process"
    kept = f"; {res.kept} kept from an earlier run" if res.kept else ""
    line = (f"{res.rows} rows in {res.shards} shard(s) → {out}/ ({res.made} made {where}{kept}) with {res.model} "
            f"({res.backend}, {res.precision}) at {res.images_per_second:.1f} images/s")
    if res.errors:
        line += f"; {len(res.errors)} unreadable file(s) listed in {res.errors_path}"
    err_console.print(line, highlight=False, soft_wrap=True)
    if res.errors:
        raise typer.Exit(EXIT_PARTIAL)
