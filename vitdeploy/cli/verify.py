"""`vitdeploy verify`: prove that artifacts still answer like the reference on real images."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.text import Text

from vitdeploy.cli.app import app, console, err_console, handle_errors, next_step, print_json, styled, text_column
from vitdeploy.cli.options import bounded
from vitdeploy.core.errors import EXIT_PARTIAL

if TYPE_CHECKING:
    from rich.table import Table

    from vitdeploy.checks.verify import EmbeddingVerifyReport, VerifyReport


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:.2%}"


@app.command()
@handle_errors
def verify(
    reference: Path = typer.Argument(..., help="The artifact the others must answer like (usually the checkpoint)."),
    candidates: list[Path] = typer.Argument(..., help="Artifacts to compare: checkpoints, .onnx models, engines."),
    images: Path = typer.Option(..., "--images", "-i", help="Images: an ImageFolder (class sub-folders) gives accuracy too; a flat folder agreement only."),
    tolerance: Optional[str] = typer.Option(None, help="A classifier's limits instead of its precision's: RTOL (e.g. 1e-4) or rtol=R,agreement=A (rtol=none to skip the logit check). Default: fp32 max|Δ| ≤ 1e-4·max(1,max|logit|) and 100% agreement; fp16 1e-2 and 99.9%; int8 99%."),
    min_cosine: Optional[float] = typer.Option(None, "--min-cosine", **bounded("fraction"), help="An embedding model's least mean per-image cosine to the reference, instead of its precision's (fp32 0.9999, fp16 0.999, int8 0.99; with 1st percentile 0.9999/0.995/0.97 and nearest-neighbour agreement 99/97/97%)."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", **bounded("batch"), help="Images per model call."),
    backend: str = typer.Option("auto", help="auto (each artifact's fastest installed backend), or a backend for the candidates that can run on it (e.g. openvino for ONNX)."),
    json_out: Optional[Path] = typer.Option(None, "--json", help="Write {\"results\": [...]} (reference first) to FILE ('-': stdout, without the table)."),
    threads: Optional[int] = typer.Option(None, **bounded("threads"), help="Inference threads (default: one per core)."),
    report_dir: Optional[Path] = typer.Option(None, "--report", help="Also write an HTML report with plots (index.html + PNGs) into DIR."),
) -> None:
    """Compare artifacts on the same images: accuracy, top-1 agreement, |Δlogit|, cosine; exit 1 outside tolerance.

    An embedding model: per-image cosine to the reference (mean, 1st percentile, minimum), relative Frobenius error,
    nearest-neighbour agreement, and on class sub-folders kNN top-1 (k=20, T=0.07, leave-one-out) beside the
    reference's."""
    from rich import box
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn
    from rich.table import Table

    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.core.fileio import check_output, names_stdout, strict_json, write_text_atomic

    to_stdout = names_stdout(json_out)
    if json_out is not None and not to_stdout:
        check_output(json_out, [reference, *candidates], option="--json")
    if report_dir is not None:
        check_output(report_dir, [reference, *candidates, images], kind="dir", option="--report")
        from vitdeploy.checks.report import check_report_dir

        check_report_dir(report_dir)  # a user's index.html there is never written over
    from vitdeploy.checks.verify import EmbeddingVerifyReport
    from vitdeploy.checks.verify import verify as run_verify  # numpy, the runners: after the light refusals

    with Progress(
        text_column("verify", "bold"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=err_console, transient=True, disable=not err_console.is_terminal,
    ) as prog:
        task = prog.add_task("verify", total=None)

        def on_progress(kind: str, d: dict) -> None:
            if kind == "start":
                prog.update(task, total=d["total"])
            else:
                prog.advance(task, d["n"])

        report = run_verify(reference, candidates, images, tolerance=tolerance, batch_size=batch_size,
                            backend=backend, progress=on_progress, threads=threads, min_cosine=min_cosine)
    for p, why in report.skipped:
        err_console.print(f"skipped {p}: {why}", highlight=False)
    for n in report.notes:
        err_console.print(f"note: {n}", highlight=False)
    t = Table(title=f"verify on {len(report.paths)} images from {report.images}", box=box.SIMPLE_HEAD,
              show_edge=False, pad_edge=False, collapse_padding=True)
    t.add_column("artifact", overflow="fold", min_width=12)
    if isinstance(report, EmbeddingVerifyReport):
        _embedding_rows(t, report)
    else:
        _classifier_rows(t, report)
    if to_stdout:
        print_json(report.to_dict())
    else:
        console.print(t)
    if json_out is not None and not to_stdout:
        write_text_atomic(json_out, strict_json(report.to_dict()) + "\n")
        console.print(f"results → {json_out}", highlight=False)
    if report_dir is not None:
        from vitdeploy.checks.report import write_report

        console.print(f"report → {write_report(report, report_dir)}", highlight=False)
    if report.passed and not to_stdout:
        next_step(f"vitdeploy bundle {' '.join(str(c) for c in candidates if str(c).endswith('.onnx')) or reference} -i {images}")
    if not report.passed:
        for f in report.failures[1:]:
            err_console.print(styled("outside tolerance:", "red", f), highlight=False)
        raise VitdeployError(f"outside tolerance: {report.failures[0]}")
    if report.skipped:
        raise VitdeployError(f"{len(report.skipped)} unreadable image(s) skipped; the rest verified", EXIT_PARTIAL)


def _classifier_rows(t: Table, report: VerifyReport) -> None:
    labeled = report.labels is not None
    top5 = labeled and len(report.class_labels) >= 5
    heads = (["top-1"] if labeled else []) + (["top-5"] if top5 else [])
    for c in heads + ["agreement", "max |Δlogit|", "mean |Δlogit|", "cosine"]:
        t.add_column(c, justify="right")
    t.add_column("pass", no_wrap=True)
    for r in report.results:
        row: list[str | Text] = [Text.assemble(f"{r.artifact}\n", (f"{r.backend} · {r.precision}", "dim"))]
        row += ([_pct(r.top1)] if labeled else []) + ([_pct(r.top5)] if top5 else [])
        verdict = "ref" if r.is_reference else ("ok" if r.passed else Text("FAIL", "bold red"))
        row += [_pct(r.agreement), f"{r.max_abs_diff:.2e}", f"{r.mean_abs_diff:.2e}", f"{r.cosine:.6f}", verdict]
        t.add_row(*row)


def _embedding_rows(t: Table, report: EmbeddingVerifyReport) -> None:
    """The embedding figures (checks/judge.py): kNN top-1 on class folders, per-image cosine, relative Frobenius
    error, nearest-neighbour agreement, and the patch-token cosine where the artifacts have patch tokens."""
    from vitdeploy.checks.verify import NN_MIN_IMAGES

    labeled = report.labels is not None
    patches = any(r.patches is not None for r in report.candidates)
    heads = (["kNN top-1"] if labeled else []) + ["cos mean", "cos p1", "cos min", "rel. Frob.", "NN agree"]
    for head in heads + (["patch cos min"] if patches else []):
        t.add_column(head, justify="right")
    t.add_column("pass", no_wrap=True)
    for r in report.results:
        c = r.comparison
        row: list[str | Text] = [Text.assemble(f"{r.artifact}\n", (f"{r.backend} · {r.precision}", "dim"))]
        row += [_pct(r.knn_top1)] if labeled else []
        row += [f"{c.cosine_mean:.6f}", f"{c.cosine_p1:.6f}", f"{c.cosine_min:.6f}", f"{c.rel_frobenius:.2e}",
                _pct(c.nn_agreement if c.rows >= NN_MIN_IMAGES else None)]  # one image: no neighbour, undefined
        if patches:
            row.append(f"{float(r.patches.cosine.min()):.6f}" if r.patches is not None else "—")
        row.append("ref" if r.is_reference else ("ok" if r.passed else Text("FAIL", "bold red")))
        t.add_row(*row)
