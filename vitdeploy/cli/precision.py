"""`vitdeploy calibrate` (INT8 Q/DQ with the accuracy guard) and `vitdeploy convert-fp16`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, next_step, say_target, styled, text_column
from vitdeploy.cli.options import TARGET_NAMES, bounded
from vitdeploy.core.defaults import DEFAULT_METHOD, DEFAULT_QUANTIZE_ATTENTION


@app.command()
@handle_errors
def calibrate(
    model: Path = typer.Argument(Path("model.onnx"), help="FP32 ONNX model from `vitdeploy export`."),
    images: Path = typer.Option(Path("calibration"), "--images", "-i", help="Folder of calibration images (any size; preprocessed as the model's manifest says)."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="INT8 model to write (default: MODEL.int8.onnx beside MODEL)."),
    num_images: int = typer.Option(512, **bounded("images"), help="Images sampled from --images (all when fewer; a warning below 100)."),
    batch_size: int = typer.Option(32, "--batch-size", "-b", **bounded("batch"), help="Calibration batch size."),
    method: str = typer.Option(DEFAULT_METHOD, help="Activation ranges: entropy (KL, TensorRT's legacy calibrator), minmax or percentile (99.99%)."),
    quantize_attention: bool = typer.Option(DEFAULT_QUANTIZE_ATTENTION, "--quantize-attention/--no-quantize-attention", help="Also quantize the two attention matmuls (Q·Kᵀ, P·V)."),
    float_type: Optional[str] = typer.Option(None, "--float", help="Type of everything left unquantized: fp32 (ONNX Runtime on a CPU) or fp16 (TensorRT). Default: the target's (fp16 for trt*, else fp32)."),
    seed: int = typer.Option(0, **bounded("seed"), help="Seed of the image sample."),
    max_drop: Optional[float] = typer.Option(None, "--max-drop", **bounded("points"), help="Top-1 drop budget in points against FP32 on --eval; sensitive layers are kept in float until it fits (exit 1 if it cannot). An embedding model: the kNN top-1 drop, on a labeled --eval."),
    eval_dir: Optional[Path] = typer.Option(None, "--eval", help="Labeled ImageFolder (or one with val/) to measure FP32 vs INT8 top-1 on; for an embedding model any folder of images (per-image cosine to FP32)."),
    min_agreement: Optional[float] = typer.Option(None, "--min-agreement", **bounded("fraction"), help="With --eval: also keep layers in float until INT8's top-1 agrees with FP32's on at least this fraction (e.g. 0.99); for an embedding model, its nearest-neighbour agreement (default 0.97 with --min-cosine)."),
    min_cosine: Optional[float] = typer.Option(None, "--min-cosine", **bounded("fraction"), help="An embedding model's budget, with --eval: keep layers in float until the mean per-image cosine to FP32 is at least this (e.g. 0.99), the 1st percentile at least 0.97 and the nearest-neighbour agreement at least 0.97."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=f"What the INT8 model is made for: {TARGET_NAMES}. trt10/trt11: "
                                         "float16 Q/DQ scales and GEMMs, opset 19; cpu/openvino also quantize Q·Kᵀ (openvino: the guard judges on OpenVINO). Default: the model's target, "
                                         "else none (float32 scales: TensorRT 8.x and CPUs)."),
    backend: str = typer.Option("auto", "--backend", help="With --eval: where the INT8 model is measured: auto (the TensorRT oracle for a TensorRT target, openvino for -t openvino, else onnxruntime), onnxruntime, openvino or oracle."),
    quantizer: str = typer.Option("vitdeploy", "--quantizer", help="Who places the Q/DQ: vitdeploy (ours, the default) or nncf "
                                  "(NNCF's transformer scheme, for -t cpu/openvino; pip install 'vitdeploy[cpu]'). The guard works on either."),
    smooth: str = typer.Option("auto", "--smooth", help="SmoothQuant-style migration of wide LayerNorm channels into the next weights (exact in FP32): auto (strength 0.5 where a channel spread exceeds 16), off, or a strength 0-1. With --quantizer nncf: auto only (NNCF applies its own SmoothQuant)."),
) -> None:
    """Quantize an ONNX model to INT8 (explicit Q/DQ, the form TensorRT 8.5–11 builds) from calibration images.

    Q/DQ go on both inputs of every encoder linear layer and the patch embedding; LayerNorm, Softmax, GELU and the
    residual stream stay in float. Ranges are cached beside the output (MODEL.int8.calib.json): a rerun reuses them.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import check_output
    from vitdeploy.core.naming import precision_name

    if quantizer not in ("vitdeploy", "nncf"):  # before any work (stages.precision.QUANTIZERS: numpy, onnx)
        raise UsageError(f"--quantizer {quantizer!r}: choose vitdeploy or nncf")
    target = say_target(target)
    check_output(out or precision_name(model, "int8"), [model], suffixes=(".onnx",))
    from vitdeploy.core.outputs import check_side_outputs

    check_side_outputs(out or precision_name(model, "int8"), ["calibration cache"], [model, images])
    from vitdeploy.stages.precision import calibrate as run_calibrate  # numpy, onnx: after the light refusals

    with Progress(text_column("{task.description}", "bold"), BarColumn(), MofNCompleteColumn(), text_column("{task.fields[info]}"),
                  TimeElapsedColumn(), console=err_console, transient=True, disable=not err_console.is_terminal) as prog:
        task = prog.add_task("calibrate", total=None, info="")

        def on_event(kind: str, d: dict) -> None:
            if kind == "calibrate":
                prog.update(task, description="calibrate", total=d["total"], completed=d["done"], info="images")
            elif kind == "evaluate":
                prog.update(task, description="evaluate", total=None, info=f"FP32 vs INT8 on {eval_dir}")
            elif kind in ("sensitivity", "exclude"):
                prog.update(task, description=kind, total=d["total"], completed=d["done"], info=d["layer"])

        result = run_calibrate(
            model, images, out, num_images=num_images, batch_size=batch_size, method=method,
            quantize_attention=quantize_attention, float_type=float_type, seed=seed, max_drop=max_drop,
            eval_dir=eval_dir, progress=on_event, min_agreement=min_agreement, backend=backend, target=target,
            smooth=smooth, quantizer=quantizer, min_cosine=min_cosine,
        )
    for path, why in result.skipped:
        err_console.print(f"skipped {path}: {why}", highlight=False)
    for w in result.warnings:
        err_console.print(styled("warning:", "yellow", w), highlight=False)
    q = result.manifest.extra["quantization"]
    ranges = f"ranges reused from {result.cache.name}" if result.cache_reused else f"ranges cached in {result.cache.name}"
    if q.get("quantizer") == "nncf":
        ranges = f"NNCF {q.get('nncf')}'s transformer scheme, with its own SmoothQuant"
    console.print(
        f"INT8 ({q['method']}, {result.images} images, {len(result.quantized)} layers quantized, "
        f"unquantized parts {q['float_type']}; {ranges}) → {result.path}",
        highlight=False,
    )
    from vitdeploy.checks.guard import figures_line  # numpy: loaded by the calibration already

    if result.excluded:
        b = result.manifest.extra["guard"]["before"]
        console.print(
            f"with every layer quantized: {figures_line(b, short=True)}; kept in float by the guard "
            f"({len(result.excluded)}): {', '.join(result.excluded)}",
            highlight=False,
        )
    if result.figures:
        console.print(figures_line(result.figures), highlight=False)
    given = f" -i {images}" if Path(images).is_dir() else ""
    next_step(f"vitdeploy build-engine {result.path}", f"vitdeploy bundle {model} {result.path}{given}")
    if result.skipped:  # written from the readable images, as infer and verify do: partly done
        from vitdeploy.core.errors import EXIT_PARTIAL, VitdeployError

        raise VitdeployError(f"{len(result.skipped)} unreadable calibration image(s) skipped; the INT8 model is written "
                             "from the rest", EXIT_PARTIAL)


@app.command("convert-fp16")
@handle_errors
def convert_fp16(
    model: Path = typer.Argument(Path("model.onnx"), help="FP32 ONNX model from `vitdeploy export`."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="FP16 model to write (default: MODEL.fp16.onnx beside MODEL)."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=f"What the FP16 model is made for: {TARGET_NAMES}. "
                                         "Default: the model's target, else none."),
    images: Optional[Path] = typer.Option(None, "--images", "-i", help="Images to measure the FP16 headroom on (default: "
                                          "calibration/, else the digits for a digits model); tensors within 2x of 65504 stay float32."),
    fp32_islands: bool = typer.Option(True, "--fp32-islands/--no-fp32-islands", help="Keep tensors that would overflow "
                                      "float16 in float32 (default), or refuse the conversion when there are any."),
) -> None:
    """Convert an ONNX model to FP16: float16 inside, float32 input/output, LayerNorm/Softmax/reductions in float32."""
    from vitdeploy.core.fileio import check_output
    from vitdeploy.core.naming import precision_name

    target = say_target(target)
    check_output(out or precision_name(model, "fp16"), [model], suffixes=(".onnx",))
    from vitdeploy.stages.precision import convert_fp16 as run_convert  # numpy, onnx: after the light refusals

    dest = run_convert(model, out, target=target, images=images, keep_unsafe=fp32_islands)
    console.print(f"FP16 (LayerNorm, Softmax and reductions kept in float32) → {dest}", highlight=False)
    next_step(f"vitdeploy build-engine {dest}", f"vitdeploy verify {model} {dest} -i IMAGES")
