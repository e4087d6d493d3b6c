"""`vitdeploy index`: a gallery of embeddings as a FAISS index under a memory budget (tools/index.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, check_json_dest, console, emit_json, err_console, handle_errors, next_step
from vitdeploy.cli.options import JSON_HELP, bounded


@app.command()
@handle_errors
def index(
    embeddings: Path = typer.Argument(..., help="infer's output: a shard folder (-o DIR/), FILE.npy (with FILE.files.txt) or FILE.parquet (an `embedding` column; `path`, `id`, `class` where present)."),
    out: Path = typer.Option(Path("gallery.faiss"), "--out", "-o", help="The index (FILE.faiss), with FILE.json (key, N, D, bytes, recall, latency, checkpoint) and FILE.ids.parquet (id, path, class) beside it."),
    memory: str = typer.Option("2GB", "--memory", help="Most bytes the index may take (256MB, 2GB, 1GiB): the index is chosen to fit (Flat, HNSW, IVF-SQ8, IVF-PQ)."),
    recall: float = typer.Option(0.95, "--recall", **bounded("fraction"), help="10-recall@10 against exact search to reach on held-out queries (nprobe / efSearch tuned to it)."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="The model the embeddings were made with (a .npy or .parquet records none): recorded, so that infer --gallery refuses another checkpoint's."),
    classes_from_folders: bool = typer.Option(False, "--classes-from-folders", help="Each vector's class is its file's folder name (an ImageFolder embedded to .npy/.parquet)."),
    threads: Optional[int] = typer.Option(None, **bounded("threads"), help="faiss threads (default: one per core); the latency is measured at these."),
    json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE", help=JSON_HELP),
) -> None:
    """Build a FAISS index of an embedding gallery for `infer --gallery FILE.faiss`, its recall measured against exact search."""
    from vitdeploy.core.fileio import check_output
    from vitdeploy.core.outputs import check_side_outputs
    from vitdeploy.tools.index import build_index, human, parse_bytes

    budget = parse_bytes(memory)
    inputs = [embeddings, model]
    check_output(out, inputs, suffixes=(".faiss",))
    check_side_outputs(out, ["gallery record", "gallery ids"], inputs)
    check_json_dest(json_out, inputs)
    res = build_index(embeddings, out, budget, recall, model, classes_from_folders, threads,
                      say=lambda s: err_console.print(s, highlight=False, soft_wrap=True) if err_console.is_terminal else None)
    for n in res.notes:
        err_console.print(f"note: {n}", highlight=False, soft_wrap=True)
    m = res.meta
    if emit_json(m, json_out, inputs):
        return
    param = ", ".join(f"{k} {v}" for k, v in m["search"].items()) or "exact"
    console.print(f"{m['key']} index of {m['n']} {m['dim']}-d vectors → {' + '.join(str(f) for f in res.files)}: "
                  f"{human(m['bytes'])} (budget {human(m['memory_budget'])}), 10-recall@10 {m['recall_at_10']:.4f} on "
                  f"{m['recall_queries']} held-out queries ({param}), median query {m['latency_ms_median']:.3f} ms on "
                  f"{m['latency_threads']} thread(s)", highlight=False, soft_wrap=True)
    if m["classes"]:
        next_step(f"vitdeploy infer IMAGES -m MODEL --gallery {out}")
