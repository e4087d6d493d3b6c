"""`vitdeploy benchmark`: latency and throughput of artifacts on backends, side by side, with ratios."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, print_json, text_column
from vitdeploy.cli.options import bounded


def _ints(text: str, what: str) -> list[int]:
    import re

    from vitdeploy.core.errors import UsageError

    # ASCII digits and commas, spaces around them only: '1 8' is not 18, '1,,8' and '1;8' are typos, not lists
    if not re.fullmatch(r"\s*[0-9]+\s*(,\s*[0-9]+\s*)*", text):
        raise UsageError(f"{what} {text!r}: give comma-separated integers, e.g. 1,8,32")
    vals = [int(v) for v in text.split(",")]
    if not vals or any(v < 1 for v in vals):
        raise UsageError(f"{what} {text!r}: give positive integers, e.g. 1,8,32")
    return vals


def format_table(rows: list) -> str:
    """Plain fixed-width text: it reads the same on a terminal, in a log and pasted into an issue."""
    name_w = max([len("artifact")] + [len(Path(r.artifact).name) for r in rows])
    head = f"{'artifact':<{name_w}}  {'backend':<11}  {'prec':<4}  {'batch':>5}  {'calls':>5}  {'p50 ms':>9}  {'p90 ms':>9}  {'p99 ms':>9}  {'images/s':>9}  {'x first':>7}  {'peak MB':>8}"
    lines = [head, "-" * len(head)]
    first: dict[int, float] = {}
    for r in rows:
        base = first.setdefault(r.batch, r.throughput)
        lines.append(f"{Path(r.artifact).name:<{name_w}}  {r.backend:<11}  {r.precision:<4}  {r.batch:>5}  {r.iterations:>5}  "
                     f"{r.p50_ms:>9.2f}  {r.p90_ms:>9.2f}  {r.p99_ms:>9.2f}  {r.throughput:>9.1f}  {r.throughput / base:>7.2f}  "
                     f"{(f'{r.peak_rss_mb:.0f}' if r.peak_rss_mb else '-'):>8}")
    return "\n".join(lines)


@app.command()
@handle_errors
def benchmark(
    models: Optional[list[Path]] = typer.Argument(None, help="Checkpoints, ONNX models and engines to measure side by side. "
                                                  "Default: the artifacts in this folder (as infer picks them)."),
    preset: Optional[str] = typer.Option(None, help="Without MODEL: build a random-weight model of this preset, its FP32, FP16 and INT8 ONNX, and measure them all (see `vitdeploy presets`)."),
    batch_sizes: str = typer.Option("1,8,32", "--batch-sizes", help="Comma-separated batch sizes."),
    backends: Optional[str] = typer.Option(None, help="Comma-separated backends to measure (torch, onnxruntime, openvino, tensorrt). Default: every installed backend that can run each artifact."),
    warmup: int = typer.Option(3, **bounded("warmup_calls"), help="Untimed calls per row and batch size before measuring."),
    iterations: Optional[int] = typer.Option(None, **bounded("iterations"), help="Timed calls per row and batch size."),
    seconds: Optional[float] = typer.Option(None, **bounded("seconds"), help="Seconds per row and batch size (default 5 unless --iterations)."),
    threads: Optional[int] = typer.Option(None, **bounded("threads"), help="Threads for torch, ONNX Runtime and OpenVINO (default: one per core)."),
    device: str = typer.Option("cpu", help="cpu or cuda, for torch and ONNX Runtime rows (engines always run on the GPU)."),
    json_file: Optional[Path] = typer.Option(None, "--json", help="Write {\"results\": [...], \"machine\", \"versions\", ...} to FILE ('-': stdout, without the table)."),
    keep: Optional[Path] = typer.Option(None, help="With --preset: keep the generated artifacts in this folder."),
    versus: Optional[str] = typer.Option(None, help="nncf: also measure OpenVINO on NNCF's INT8 of the FP32 ONNX, made in this run, and print each INT8 row's ratio to it (needs nncf and openvino)."),
) -> None:
    """Latency p50/p90/p99, images/s and peak memory of each artifact on each backend, with ratios.

    Each row runs in its own process (ONNX Runtime's and OpenVINO's thread pools slow each other in one) and
    the rows' rounds alternate, so the ratios hold on a busy machine; peak MB is the row process's peak RSS.
    """
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import check_output, names_stdout, strict_json, write_text_atomic

    if not models and not preset:  # like infer: the folder's artifacts (raw-pixel variants left out)
        from vitdeploy.tools.infer import candidate_models, stale_note

        models = [p for p in candidate_models(".") if not p.name.endswith(".raw.onnx")]
        for why in filter(None, map(stale_note, models)):  # never measure a stale artifact silently
            err_console.print(why, highlight=False, markup=False)
        models = [p for p in models if not stale_note(p)]
        if models:
            err_console.print("measuring the artifacts here: " + ", ".join(p.name for p in models), highlight=False)
    to_stdout = names_stdout(json_file)
    if json_file is not None and not to_stdout:
        check_output(json_file, models or [], option="--json")
    sizes = _ints(batch_sizes, "--batch-sizes")
    backs = [b.strip() for b in backends.split(",") if b.strip()] if backends else None
    if iterations is not None and seconds is not None:
        raise UsageError("pass --iterations or --seconds, not both")
    if models and preset:
        raise UsageError("pass MODEL paths or --preset NAME, not both")
    if not models and not preset:
        raise UsageError("nothing to measure: pass MODEL paths or --preset NAME (e.g. --preset vit-small)")
    from vitdeploy.tools.bench import benchmark as run_benchmark  # numpy, the runners: after the light refusals
    from vitdeploy.tools.bench import benchmark_preset, check_settings

    check_settings(sizes, warmup, iterations, seconds, threads, device)  # before a preset's artifacts are made
    with Progress(SpinnerColumn(), text_column("benchmark", "bold"), text_column("{task.description}"), TimeElapsedColumn(),
                  console=err_console, transient=True, disable=not err_console.is_terminal) as prog:
        task = prog.add_task("starting")

        def say(msg: str) -> None:
            prog.update(task, description=msg)

        if preset:
            rep = benchmark_preset(preset, sizes, backs, warmup, iterations, seconds, threads, device, keep, say, versus)
        else:
            rep = run_benchmark(models or [], sizes, backs, warmup, iterations, seconds, threads, device, say, versus)
    for n in rep.notes:
        err_console.print(f"note: {n}", highlight=False)
    if to_stdout:
        print_json(rep.to_dict())
        return
    m = rep.machine
    console.print(f"{m['cpu']} ({', '.join(m['cpu_flags']) or 'no AVX'}), {m['threads']} threads"
                  + (f", GPU {', '.join(m['gpu'])}" if m["gpu"] else ""), highlight=False)
    console.print(format_table(rep.results), highlight=False, soft_wrap=True)
    for q in rep.ratios:
        if q.get("versus"):
            continue
        console.print(f"batch {q['batch']}: {q['row']} ({Path(q['row_artifact']).name}) / {q['vs']} "
                      f"({Path(q['vs_artifact']).name}) = {q['ratio']:.2f}x", highlight=False, soft_wrap=True)
    for q in (q for q in rep.ratios if q.get("versus")):
        console.print(f"batch {q['batch']}: ours / NNCF: {q['row']} ({Path(q['row_artifact']).name}) / {q['vs']} "
                      f"(NNCF's INT8) = {q['ratio']:.2f}x", highlight=False, soft_wrap=True)
    console.print(f"settings: torch {rep.settings['torch']}; onnxruntime {rep.settings['onnxruntime']}; "
                  f"openvino {rep.settings['openvino']}; {rep.settings['isolation']}", highlight=False, soft_wrap=True)
    if json_file is not None:
        write_text_atomic(json_file, strict_json(rep.to_dict()) + "\n")
        console.print(f"results → {json_file}", highlight=False)
