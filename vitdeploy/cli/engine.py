"""`vitdeploy build-engine`: the precision artifact, then a TensorRT plan with its sidecar."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, next_step, say_target, styled, text_column
from vitdeploy.cli.options import IMAGES_ALIAS_HELP, TARGET_NAMES, bounded
from vitdeploy.core.errors import EXIT_PARTIAL


@app.command("build-engine")
@handle_errors
def build_engine(
    ctx: typer.Context,
    model: Path = typer.Argument(Path("model.onnx"), help="ONNX model from `vitdeploy export` (or its .fp16/.int8 artifact)."),
    fp16: bool = typer.Option(False, "--fp16", help="Make MODEL.fp16.onnx first (FP16 with float32 islands) and build that."),
    int8: bool = typer.Option(False, "--int8", help="Calibrate MODEL.int8.onnx first (Q/DQ INT8, FP16 for the rest) and build "
                              "that. With --fp16 too: the same (INT8 with FP16 for the unquantized parts)."),
    images: Path = typer.Option(Path("calibration"), "--images", "-i", help="Folder of calibration images for --int8 (the FP16/INT8 "
                                "artifact is also checked against MODEL on up to 64 of them)."),
    calib: Optional[Path] = typer.Option(None, "--calib", hidden=True, help=IMAGES_ALIAS_HELP),
    min_batch: int = typer.Option(1, **bounded("engine_batch"), help="Smallest batch of the optimization profile."),
    opt_batch: int = typer.Option(8, **bounded("engine_batch"), help="Batch TensorRT tunes for (with --dla-core: the one fixed batch)."),
    max_batch: int = typer.Option(32, **bounded("engine_batch"), help="Largest batch; the runner splits larger ones."),
    workspace: Optional[float] = typer.Option(None, **bounded("workspace_gib"), help="Builder workspace limit in GiB (default: TensorRT's)."),
    timing_cache: Optional[Path] = typer.Option(None, help="Timing cache to read and update (per device and TensorRT version)."),
    dla_core: Optional[int] = typer.Option(None, **bounded("dla_core"), help="Build for this DLA core (Jetson Orin) with GPU fallback; fixed batch."),
    version_compatible: bool = typer.Option(False, "--version-compatible", help="Let newer TensorRT runtimes load the plan (8.6+)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Engine file (default: MODEL.<precision>.engine beside MODEL)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=f"What --fp16/--int8 make the artifact for: {TARGET_NAMES}. "
                                         "A module name also checks --dla-core. Default: the TensorRT found here (else the model's target)."),
) -> None:
    """Build a TensorRT engine from an ONNX model whose graph carries the precision.

    Without TensorRT or a CUDA GPU the precision artifact is still written, the commands that finish the job on the target are printed, and the exit code is 3.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TimeElapsedColumn

    from vitdeploy.core.fileio import check_output
    from vitdeploy.core.targets import check_request, resolve_target

    calib = calib or images
    facts = resolve_target(target)
    src = {n: getattr(ctx.get_parameter_source(n), "name", "DEFAULT") for n in ("min_batch", "max_batch")}
    explicit = {n for n, s in src.items() if s != "DEFAULT"}  # given on the command line (typer carries its own click)
    check_request(facts, dla_core=dla_core, int8=int8, dynamic_batch=bool(explicit) and min_batch != max_batch)
    target = say_target(target)
    if out is not None:
        check_output(out, [model, calib, timing_cache])
    from vitdeploy.stages.engine import BuildOptions, EngineNotBuilt  # numpy, onnx: after the light refusals
    from vitdeploy.stages.engine import build_engine as run_build

    opts = BuildOptions(
        fp16=fp16, int8=int8, calib=calib, min_batch=min_batch, opt_batch=opt_batch, max_batch=max_batch,
        workspace=workspace, timing_cache=timing_cache, dla_core=dla_core, version_compatible=version_compatible,
        out=out, target=target,
    )
    with Progress(SpinnerColumn(), text_column("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=not err_console.is_terminal) as prog:
        task = prog.add_task("build-engine", total=None)

        def on_event(kind: str, d: dict) -> None:
            nonlocal task
            if kind == "artifact":
                what = "calibrating INT8" if d["kind"] == "int8" else "converting to FP16"
                prog.update(task, description=f"{what} → {d['path']}", total=None)
            elif kind == "calibrate":
                prog.update(task, total=d["total"], completed=d["done"])
            elif kind == "check":  # a new task: rich's update(total=None) keeps the calibration total (0/512 before)
                prog.remove_task(task)
                task = prog.add_task(f"checking {d['path']} against {model.name}", total=d.get("total") or None)
            elif kind == "artifact-done":
                report_artifact(d)
            elif kind == "warning":
                err_console.print(styled("warning:", "yellow", d["message"]), highlight=False, soft_wrap=True)
            elif kind == "build":
                prog.reset(task)
                prog.update(task, description=f"TensorRT {d['tensorrt']} building {d['engine']} (minutes)",
                            total=None, completed=0)

        try:
            result = run_build(model, opts, on_event)
        except EngineNotBuilt as e:
            prog.stop()
            err_console.print(styled("partly done:", "bold yellow", f"{e.missing}; the engine is built where TensorRT and the GPU are."),
                              highlight=False, soft_wrap=True)
            console.print(f"# {e.artifact} is ready. On the target, in this folder:", highlight=False, soft_wrap=True)
            for line in e.commands:
                console.print(line, highlight=False, soft_wrap=True, markup=False)
            given = f" -i {calib}" if Path(calib).is_dir() else ""  # (else the images the one rule picks)
            next_step(f"vitdeploy bundle{given}   (packs the models here with build_engine.sh for the device)")
            raise typer.Exit(EXIT_PARTIAL) from None
    rec = result.record
    console.print(
        f"built {result.engine} (TensorRT {rec['tensorrt']}, {rec['gpu']} sm_{rec['compute_capability'].replace('.', '')}, "
        f"batch {rec['options']['min_batch']}–{rec['options']['max_batch']}) in {rec['build_seconds']:.0f} s; "
        f"sidecar {result.sidecar.name}",
        highlight=False,
    )
    console.print(receipt_line(rec.get("receipt") or {}), highlight=False, soft_wrap=True, markup=False)
    next_step(f"vitdeploy verify {model} {result.engine} -i IMAGES", f"vitdeploy infer IMAGES -m {result.engine}")
    if result.made and result.made["skipped"]:
        raise typer.Exit(EXIT_PARTIAL)


def receipt_line(r: dict) -> str:
    """The engine's precision receipt in one line: where the GEMM FLOPs run, attention, the FP32 layers."""
    if r.get("status") != "ok":
        return f"precision receipt: unknown ({r.get('reason') or 'no layer information'})"
    share = ", ".join(f"{k} {v:.0%}" for k, v in sorted((r.get("gemm_share") or {}).items(), key=lambda kv: -kv[1]))
    att = (r.get("attention") or {}).get("fused")
    return (f"precision receipt: GEMM FLOPs {share or 'not given'}; attention "
            f"{'fused' if att else 'not fused' if att is False else 'unknown'}; {len(r.get('fp32_layers') or [])} FP32 layers")


def report_artifact(made: dict) -> None:
    """What the precision step wrote, and how closely it answers like the FP32 model."""
    for path, why in made["skipped"]:
        err_console.print(f"skipped {path}: {why}", highlight=False, soft_wrap=True)
    for w in made["warnings"]:
        err_console.print(styled("warning:", "yellow", w), highlight=False, soft_wrap=True)
    out = console
    c = made.get("check")
    if c and "cosine_mean" in c:  # an embedding model (checks/compare.agreement asked its task)
        out.print(
            f"wrote {made['path']}: mean cosine to {c['against']} {c['cosine_mean']:.5f} (1st percentile "
            f"{c['cosine_p1']:.5f}), nearest-neighbour agreement {c['nn_agreement']:.2%} on {c['images']} "
            f"calibration images ({c['runner']})",
            highlight=False, soft_wrap=True,
        )
    elif c:
        out.print(
            f"wrote {made['path']}: top-1 agreement with {c['against']} {c['top1_agreement']:.2%} on {c['images']} "
            f"calibration images, largest logit difference {c['max_abs_logit_diff']:.3g} (ONNX Runtime)",
            highlight=False, soft_wrap=True,
        )
    else:
        out.print(f"wrote {made['path']} (no images to check it on)", highlight=False, soft_wrap=True)
