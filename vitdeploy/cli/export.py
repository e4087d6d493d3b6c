"""`vitdeploy export`: checkpoint → ONNX with a dynamic batch, parity-checked against PyTorch."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, next_step, say_target, text_column
from vitdeploy.cli.options import TARGET_NAMES, bounded

_STAGES = {
    "load": "loading the checkpoint",
    "export": "tracing to ONNX",
    "clean": "folding constants, removing dead and duplicated nodes",
    "save": "writing",
    "checker": "onnx.checker (full check, shape inference)",
    "parity": "parity against PyTorch at batch 1, 7, 32",
}


@app.command()
@handle_errors
def export(
    checkpoint: Path = typer.Argument(Path("ckpt.pth"), help="Checkpoint (vitdeploy, Hugging Face folder, or timm state dict with --arch)."),
    out: Path = typer.Option(Path("model.onnx"), "--out", "-o", help="ONNX model to write (atomically; external data beside it over 2 GB)."),
    opset: int = typer.Option(17, **bounded("opset"), help="ONNX opset: 17 (TensorRT 8.5/8.6 parse up to 17) or higher."),
    check: bool = typer.Option(True, "--check/--no-check", help="Parity check against PyTorch after export."),
    images: Optional[Path] = typer.Option(None, "--images", "-i", help="Images for the parity check. Default: calibration/, else the digits set for a digits model, else random inputs."),
    arch: Optional[str] = typer.Option(None, help="Architecture of a foreign state dict (a timm name such as vit_base_patch16_224)."),
    labels: Optional[Path] = typer.Option(None, help="File of class names, one per line, replacing the checkpoint's."),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Print node counts by op type and the time of each step."),
    target: Optional[str] = typer.Option(None, "--target", "-t", help=f"What the ONNX is made for: {TARGET_NAMES}. trt8.5 spells "
                                         "LayerNorm out in primitive ops (8.5 has no LayerNormalization importer). Default: none, the "
                                         "opset-17 graph TensorRT 8.6+ and ONNX Runtime all read. Recorded in the manifest: later "
                                         "steps inherit it."),
    embedding: bool = typer.Option(False, "--embedding", help="Export a classifier as an embedding model: output "
                                   "embedding [batch, D], its pre-logits features (the head dropped), for retrieval."),
    pool: Optional[str] = typer.Option(None, "--pool", help="An embedding model's pooling where the model has the choice: "
                                       "cls | mean | cls+mean (DINOv2's linear heads read cls+mean). Default: the model's own."),
    normalize: bool = typer.Option(False, "--normalize", help="L2-normalise the embedding inside the graph."),
    tokens: bool = typer.Option(False, "--tokens", help="A second output patch_tokens [batch, patches, width]: the patch "
                                "tokens after the final norm, without class or register tokens."),
    embed_preprocess: bool = typer.Option(False, "--embed-preprocess", help="Also write MODEL.raw.onnx: uint8 RGB [batch, H, W, 3] "
                                          "in, scaling/mean/std/layout inside the graph (for DeepStream, C++, cameras)."),
) -> None:
    """Export a checkpoint to ONNX: input pixel_values [batch, 3, H, W], output logits [batch, classes] for a
    classifier or embedding [batch, D] for an embedding model (a backbone, or --embedding), manifest inside."""
    from rich.progress import Progress, SpinnerColumn, TimeElapsedColumn

    from vitdeploy.core.fileio import check_output

    target = say_target(target)  # resolved once, before any work
    check_output(out, [checkpoint, labels], suffixes=(".onnx",))
    from vitdeploy.core.outputs import check_side_outputs

    check_side_outputs(out, ["external data", *(["raw variant"] if embed_preprocess else [])], [checkpoint, labels])
    from vitdeploy.stages.export import EmbeddingOptions, export_onnx  # numpy, onnx: after the light refusals

    as_embedding = EmbeddingOptions(embedding, pool, normalize, tokens)
    as_embedding.check()
    from vitdeploy.core.lineage import replacing_note

    replaced = replacing_note(out, checkpoint)  # asked for, so replaced: but said (core/lineage.py)

    with Progress(
        SpinnerColumn(), text_column("export", "bold"), text_column("{task.fields[info]}"), TimeElapsedColumn(),
        console=err_console, transient=True, disable=not err_console.is_terminal,
    ) as prog:
        task = prog.add_task("export", total=None, info="")

        def on_step(stage: str, info: dict) -> None:
            prog.update(task, info=_STAGES.get(stage, stage))

        result = export_onnx(checkpoint, out, opset=opset, check=check, images=images, arch=arch, labels=labels,
                             progress=on_step, target=target, embedding=as_embedding)
    if verbose:
        console.print("nodes by op type: " + ", ".join(f"{op} {n}" for op, n in result.node_counts.items()), highlight=False)
        console.print(f"{sum(result.node_counts.values())} nodes; steps: "
                      + ", ".join(f"{k} {v:.1f} s" for k, v in result.timings.items()), highlight=False)
    if result.parity is not None:
        for w in result.parity.warnings:
            err_console.print(f"warning: {w}", highlight=False)
        for p, why in result.parity.skipped:
            err_console.print(f"skipped {p}: {why}", highlight=False)
        if verbose:
            for b in result.parity:
                console.print(f"  {b.describe()}", highlight=False)
        console.print(result.parity.summary(), highlight=False)
    else:
        err_console.print("parity check skipped (--no-check)")
    extra = f" + {result.external_data.name}" if result.external_data else ""
    console.print(f"wrote {result.path}{extra} (opset {result.opset}, dynamic batch) in {result.seconds:.1f} s", highlight=False)
    if replaced:
        console.print(f"note: {replaced}", highlight=False, soft_wrap=True, markup=False)
    if embed_preprocess:
        from vitdeploy.stages.embed import embed_preprocess as embed
        from vitdeploy.stages.embed import raw_variant_name, record_raw_variant

        record_raw_variant(result.path, raw_variant_name(result.path.name))
        raw = embed(result.path)
        console.print(f"wrote {raw} (uint8 RGB [batch, H, W, 3] in, preprocessing in the graph)", highlight=False, markup=False)
    imgs = f" -i {images}" if images else ""
    next_step(f"vitdeploy build-engine {result.path} --int8{imgs}", f"vitdeploy bundle {result.path}{imgs}")
    if result.parity is not None and result.parity.skipped:  # checked on the readable images only: partly done
        from vitdeploy.core.errors import EXIT_PARTIAL, VitdeployError

        raise VitdeployError(f"{len(result.parity.skipped)} unreadable parity image(s) skipped; the model is written "
                             "and passed on the rest", EXIT_PARTIAL)
