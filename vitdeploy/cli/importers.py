"""`vitdeploy import`: a Hugging Face ViT folder or a timm state dict → a self-describing vitdeploy checkpoint."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, next_step


@app.command("import")
@handle_errors
def import_(
    source: Path = typer.Argument(..., help="Hugging Face save_pretrained folder (or its config.json), or a timm state dict / training checkpoint (.pth, .bin, .safetensors) with --arch."),
    arch: Optional[str] = typer.Option(None, help="timm model name of a state dict, e.g. vit_base_patch16_224 or deit_small_patch16_224."),
    labels: Optional[Path] = typer.Option(None, help="Class names, one per line (replace id2label; name a timm head's classes)."),
    out: Path = typer.Option(Path("ckpt.pth"), "--out", "-o", help="Checkpoint to write (atomically)."),
    image_size: Optional[str] = typer.Option(
        None, "--image-size", help="Deploy at this input size, H or HxW (a multiple of the patch size): absolute position "
        "embeddings resampled as timm does (bicubic, antialias), RoPE tables recomputed."),
) -> None:
    """Convert a ViT trained elsewhere into a vitdeploy checkpoint (labels, preprocessing and architecture inside).

    Every command takes a Hugging Face folder directly, and export and train --init take a timm state dict with
    --arch; convert once here so verify, infer, benchmark and the rest take it as a plain checkpoint.
    """
    from vitdeploy.core.fileio import check_output

    check_output(out, [source, labels])  # over its own source, a checkpoint would lose its training state
    size = None
    if image_size is not None:
        from vitdeploy.core.image_size import parse_image_size

        size = parse_image_size(image_size)
    from vitdeploy.model.importers import import_checkpoint  # torch: after the output is known to be usable

    err_console.print(f"importing {source}: reading the weights and building the model (seconds for ViT-B)…", highlight=False,
                      soft_wrap=True)
    path, m = import_checkpoint(source, out, arch=arch, labels=labels, image_size=size)
    pp = m.pp()
    h, w = pp.input_size
    console.print(
        f"wrote {path}: {m.name}, {m.model['depth']} blocks × {m.model['embed_dim']}, patch {m.model['patch_size']}, "
        f"{m.num_classes} classes; input {h}x{w} ({pp.resize_mode}, crop {pp.crop_pct:g}, {pp.interpolation}, "
        f"mean {list(pp.mean)}, std {list(pp.std)})",
        highlight=False,
    )
    next_step(f"vitdeploy export {path} -i IMAGES", f"vitdeploy bundle {path} -t jetpack6.1 -i IMAGES")
