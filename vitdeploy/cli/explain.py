"""`vitdeploy explain`: attention maps over images."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, text_column
from vitdeploy.cli.options import bounded
from vitdeploy.core.errors import EXIT_PARTIAL

SHOW = 20  # images listed one per line; the rest are counted


@app.command()
@handle_errors
def explain(
    images: list[Path] = typer.Argument(..., help="Image files or folders of them."),
    model: Optional[Path] = typer.Option(None, "--model", "-m", help="A checkpoint, or an ONNX model (FP32, FP16 or INT8: its own "
                                         "attention). Default: ckpt.pth here, else the ONNX model infer would pick."),
    out_dir: Path = typer.Option(Path("attention"), "--out", "-o", help="Folder for the PNGs (<image name>.attention.png)."),
    method: str = typer.Option("rollout", help="rollout (all blocks, Abnar & Zuidema 2020) or last-layer."),
    head_fusion: str = typer.Option("mean", help="How the heads of a block combine: mean, max or min."),
    discard_ratio: float = typer.Option(0.0, **bounded("fraction"), help="Share of the lowest attention weights zeroed per block, in [0, 1)."),
    top_k: int = typer.Option(3, **bounded("top_k"), help="Predictions shown in the caption."),
    threads: Optional[int] = typer.Option(None, **bounded("threads"), help="ONNX Runtime threads (default: one per core)."),
    compare: Optional[list[Path]] = typer.Option(None, "--compare", help="Also explain this copy (e.g. model.int8.onnx; repeatable) into DIR/<its name>/ and measure how closely its maps follow --model's."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="With --compare: write the comparison to FILE."),
) -> None:
    """Draw where the model looked: the image, its attention map, and the top predictions, one PNG per image.

    Works on a checkpoint (PyTorch) and on its ONNX copies, quantized ones included
    (ONNX Runtime, the attention of the deployed graph); unreadable images are listed
    and skipped (exit 3).
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from vitdeploy.core.preprocess import list_images
    from vitdeploy.tools.explain import check_comparable, compare_maps
    from vitdeploy.tools.explain import explain as run_explain

    model = model or default_model()
    total = sum(len(list_images(p)) or (1 if p.is_file() else 0) for p in images if p.exists())
    from vitdeploy.core.fileio import check_output

    others = list(compare or [])
    if json_out is not None and not others:  # before any map is written: --json has nothing to write without it
        from vitdeploy.core.errors import UsageError

        raise UsageError("--json writes the --compare results: pass --compare MODEL too")
    check_output(out_dir, [model, *images, *others], kind="dir")
    if json_out is not None:
        check_output(json_out, [model, *images, *others], option="--json")
    check_comparable(model, others)
    dirs = [out_dir / (c.name[: -len(c.suffix)] if c.suffix else c.name) for c in others]
    with Progress(
        text_column("explain", "bold"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True, disable=not err_console.is_terminal,
    ) as prog:
        task = prog.add_task("explain", total=(total * (1 + len(others))) or None)
        run = functools.partial(
            run_explain, images, method=method, head_fusion=head_fusion, discard_ratio=discard_ratio,
            top_k=top_k, threads=threads, on_image=lambda _e: prog.advance(task),
        )
        result = run(model=model, out_dir=out_dir)
        copies = [run(model=c, out_dir=d) for c, d in zip(others, dirs, strict=True)]
    for ex in result.explanations[:SHOW]:
        best = f"  ({ex.top[0][0]} {ex.top[0][1]:.1%})" if ex.top else ""  # an embedding model names no class
        console.print(f"{ex.source} → {ex.output}{best}", highlight=False)
    if len(result.explanations) > SHOW:
        console.print(f"… and {len(result.explanations) - SHOW} more", highlight=False)
    for path, why in result.skipped:
        err_console.print(f"skipped {path}: {why}", highlight=False)
    console.print(f"{len(result.explanations)} attention map(s) in {out_dir}/ ({result.note}; {result.task})",
                  highlight=False)
    if copies:
        from rich.table import Table

        rows = [compare_maps(result, c) for c in copies]
        t = Table(title=f"{method} maps (scaled to [0, 1]) against {model.name}", show_edge=False)
        for col in ("model", "images", "top-1 agree", "max |Δ|", "mean |Δ|", "min corr"):
            t.add_column(col, justify="left" if col == "model" else "right", no_wrap=col == "model")
        for r in rows:
            agree = "—" if r.top1_agreement is None else f"{r.top1_agreement:.1%}"
            t.add_row(Path(r.model).name, str(r.images), agree,
                      f"{r.max_abs_diff:.2e}", f"{r.mean_abs_diff:.2e}", f"{r.min_correlation:.5f}")
        console.print(t)
        for r, d in zip(rows, dirs, strict=True):
            console.print(f"maps of {r.model} in {d}/", highlight=False)
        if json_out is not None:
            import json

            from vitdeploy.core.fileio import write_text_atomic

            doc = {"reference": str(model), "method": method, "head_fusion": head_fusion,
                   "discard_ratio": discard_ratio, "results": [r.to_dict() for r in rows]}
            write_text_atomic(json_out, json.dumps(doc, indent=2) + "\n")
    if result.skipped:
        err_console.print(f"{len(result.skipped)} unreadable image(s) skipped")
        raise typer.Exit(EXIT_PARTIAL)


def default_model() -> Path:
    """What explain reads without --model, like the other commands pick: ckpt.pth, else the folder's ONNX model."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.tools.infer import candidate_models

    if Path("ckpt.pth").is_file():
        return Path("ckpt.pth")
    onnx = [p for p in candidate_models(".", "onnxruntime") if not p.name.endswith(".raw.onnx")]
    if onnx:
        err_console.print(f"model: {onnx[0]} (the one here)", highlight=False)
        return onnx[0]
    raise UsageError("no model here: pass --model (a checkpoint or ONNX model), or run where ckpt.pth or model.onnx is")
