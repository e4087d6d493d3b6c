"""`vitdeploy import`: a Hugging Face ViT folder, an open_clip checkpoint or a timm state dict → a self-describing vitdeploy
checkpoint; with --classes, a CLIP/SigLIP pair → a zero-shot classifier of those classes."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer

from vitdeploy.cli.app import app, console, err_console, handle_errors, next_step, text_column
from vitdeploy.core.limits import RANGES

# Off a terminal (a log, a pipe) the bar is off; a long text tower still says where it is, this often (seconds)
LOG_EVERY_S = 30.0


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
    classes: Optional[Path] = typer.Option(
        None, "--classes", help="Class names, one per line: make a zero-shot classifier of a CLIP/SigLIP pair (a "
        "transformers CLIPModel/SiglipModel folder with its tokenizer, or an open_clip checkpoint); the text tower runs "
        "once here and becomes the classifier head. At least 2 names; at most "
        f"{RANGES['prompts']['max']:,} prompts (classes × templates). A prompt longer than the text tower's context "
        "is refused, never cut."),
    templates: Optional[str] = typer.Option(
        None, "--templates", help="With --classes: the prompts each class name is put in: openai (open_clip's 80 "
        "ImageNet templates, the default), simple (its 7), or a file of templates, one per line, each with {} for the "
        "class name. A file named openai or simple here is refused as ambiguous: write ./openai for the file."),
) -> None:
    """Convert a ViT trained elsewhere into a vitdeploy checkpoint (labels, preprocessing and architecture inside).

    Every command takes a Hugging Face folder directly, and export and train --init take a timm state dict with
    --arch; convert once here so verify, infer, benchmark and the rest take it as a plain checkpoint. With --classes,
    a CLIP or SigLIP pair becomes a zero-shot classifier of those classes, deployable as any classifier.
    """
    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import check_output

    if templates is not None and classes is None:
        raise UsageError("--templates shapes the prompts of --classes: give the class names with --classes FILE")
    if classes is not None and (arch or labels is not None):
        raise UsageError(f"--classes names the classes of a zero-shot classifier of an image-text pair: drop "
                         f"{'--arch' if arch else '--labels'}")
    inputs = [source, labels, classes]
    if templates is not None:
        from vitdeploy.model.zero_shot import check_templates_spec

        if check_templates_spec(templates) not in ("openai", "simple"):
            inputs.append(Path(templates))
    from vitdeploy.core.naming import CHECKPOINT_SUFFIXES
    from vitdeploy.model.sources import check_output_outside

    check_output_outside(out, source)  # not a file the folder's loader reads (its weights, configs, shards)
    # over its own source, a checkpoint would lose its training state; under another suffix, info misreads it
    check_output(out, inputs, suffixes=CHECKPOINT_SUFFIXES)
    size = None
    if image_size is not None:
        from vitdeploy.core.image_size import parse_image_size

        size = parse_image_size(image_size)
    request = None
    if classes is not None:
        from vitdeploy.model.zero_shot import DEFAULT_TEMPLATES, ZeroShotRequest, check_zero_shot

        request = ZeroShotRequest(classes, templates or DEFAULT_TEMPLATES)
        check_zero_shot(source, request)  # the class names, a template file, the folder: refused before torch
    from vitdeploy.model.importers import import_checkpoint  # torch: after the output is known to be usable

    if request is None:
        if err_console.is_terminal:  # progress, as the zero-shot bar: a refusal in a log or a pipe stays one line
            err_console.print(f"importing {source}: reading the weights and building the model (seconds for ViT-B)…",
                              highlight=False, soft_wrap=True)
        path, m = import_checkpoint(source, out, arch=arch, labels=labels, image_size=size)
    else:
        path, m = _import_zero_shot(source, out, arch, labels, size, request)
    for note in m.source.get("notes") or ():  # what the import converted (a repeated class name …), said once
        err_console.print(f"note: {note}", highlight=False, soft_wrap=True)
    pp = m.pp()
    h, w = pp.input_size
    from vitdeploy.core.task import task_of

    console.print(
        f"wrote {path}: {m.name}, {m.model['depth']} blocks × {m.model['embed_dim']}, patch {m.model['patch_size']}, "
        f"{task_of(m).describe()}; input {h}x{w} ({pp.resize_mode}, crop {pp.crop_pct:g}, {pp.interpolation}, "
        f"mean {list(pp.mean)}, std {list(pp.std)})",
        highlight=False,
    )
    next_step(f"vitdeploy export {path} -i IMAGES", f"vitdeploy bundle {path} -t jetpack6.1 -i IMAGES")


def _import_zero_shot(source: Path, out: Path, arch: Optional[str], labels: Optional[Path],
                      size: Optional[tuple[int, int]], request: Any) -> tuple[Path, Any]:
    """import --classes: the pair's text tower, with a progress bar over its prompts (checked, then encoded) and the
    classes (compared); off a terminal, a line every LOG_EVERY_S seconds, so a long list is never silent."""
    import time

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from vitdeploy.model.importers import import_checkpoint

    if err_console.is_terminal:  # progress (the bar below is shown on a terminal only, too)
        err_console.print(f"importing {source}: the image tower, then the text tower on the class names of "
                          f"{request.classes}…", highlight=False, soft_wrap=True)
    with Progress(text_column("{task.description}", "bold"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TimeRemainingColumn(), console=err_console, transient=True,
                  disable=not err_console.is_terminal) as prog:
        task = prog.add_task("text tower", total=None)
        clock: list[float] = []  # [start, last line]: from the text tower's first report, not the image tower's load

        def on_progress(done: int, total: int, phase: str = "text tower") -> None:
            if prog.tasks[0].description != phase:  # each phase its own clock: the text tower's pass has the check's
                prog.reset(task, total=total, completed=done, description=phase)  # total, and rich kept the check's
            else:  # finished clock for it (elapsed frozen, 0:00:00 remaining through the whole encode)
                prog.update(task, total=total, completed=done)
            now = time.monotonic()
            if not clock:
                clock.extend((now, now))
            if not err_console.is_terminal and now - clock[1] >= LOG_EVERY_S:
                clock[1] = now
                unit = "classes" if phase == "comparing classes" else "prompts"
                err_console.print(f"{phase}: {done:,}/{total:,} {unit} ({100 * done / max(1, total):.0f}%), "
                                  f"{now - clock[0]:.0f} s", highlight=False, soft_wrap=True)

        return import_checkpoint(source, out, arch=arch, labels=labels, image_size=size, zero_shot=request,
                                 progress=on_progress)
