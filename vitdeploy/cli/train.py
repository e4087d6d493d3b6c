"""`vitdeploy train`, `vitdeploy presets`, `vitdeploy datasets`."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from vitdeploy.cli.app import app, console, err_console, handle_errors, print_json
from vitdeploy.core.errors import EXIT_PARTIAL


@app.command()
@handle_errors
def presets(json_out: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table.")) -> None:
    """List the model presets and their sizes (parameters at 224x224 with 1000 classes)."""
    from vitdeploy.model.vit import preset_table

    rows = preset_table()
    if json_out:
        print_json(rows)
        return
    t = Table(title="presets (params at 224x224, 1000 classes)")
    for c in ("name", "params", "patch", "dim", "depth", "heads", "mlp", "default input", "description"):
        t.add_column(c, justify="right" if c in ("params", "patch", "dim", "depth", "heads", "mlp") else "left")
    for r in rows:
        t.add_row(
            r["name"], f"{r['params']:,}", str(r["patch_size"]), str(r["embed_dim"]), str(r["depth"]),
            str(r["num_heads"]), str(r["mlp_dim"]), "x".join(map(str, r["image_size"])), r["description"],
        )
    console.print(t)


@app.command()
@handle_errors
def datasets(
    name: str = typer.Argument(..., help="Dataset to write; today: digits."),
    out_dir: Path = typer.Argument(..., help="Folder to write the ImageFolder (train/, val/) into."),
) -> None:
    """Write an embedded dataset as an ImageFolder of PNG files (train/ and val/)."""
    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.data import DIGITS_NAME, write_digits

    if name != DIGITS_NAME:
        raise UsageError(f"unknown dataset {name!r}: the embedded dataset is 'digits'")
    n_train, n_val = write_digits(out_dir)
    console.print(f"wrote {n_train} train and {n_val} val images to {out_dir}/")


@app.command()
@handle_errors
def train(
    data_dir: Optional[Path] = typer.Argument(None, help="ImageFolder (class sub-folders, or train/ and val/). Default: the embedded digits set."),
    preset: Optional[str] = typer.Option(None, help="Model preset (see `vitdeploy presets`). Default: vit-digits."),
    image_size: Optional[int] = typer.Option(None, help="Input size (square), overriding the preset's."),
    patch_size: Optional[int] = typer.Option(None, help="Patch size, overriding the preset's."),
    pool: Optional[str] = typer.Option(None, help="Head on the 'cls' token or the 'mean' of patch tokens."),
    epochs: Optional[int] = typer.Option(None, help="Epochs (default 40 on digits, 30 on a folder)."),
    batch_size: int = typer.Option(
        64, help="Global batch: images per optimizer step, summed over the torchrun processes and --accum-steps."),
    lr: float = typer.Option(2e-3, help="Peak learning rate (AdamW, warm-up then cosine decay)."),
    weight_decay: float = typer.Option(0.05, help="AdamW weight decay."),
    label_smoothing: float = typer.Option(0.1, help="Label smoothing, in [0, 1)."),
    augment: bool = typer.Option(True, help="Light augmentation (random translation)."),
    seed: int = typer.Option(0, help="Seed: the same seed gives the same result on CPU."),
    out: Path = typer.Option(
        Path("ckpt.pth"), "--out", "-o",
        help="Checkpoint to write. The best epoch is kept in OUT.partial and renamed to OUT when the run ends."),
    resume: Optional[Path] = typer.Option(None, help="Continue training from this checkpoint (any number of processes)."),
    init: Optional[Path] = typer.Option(
        None, help="Fine-tune from this checkpoint, Hugging Face ViT folder or timm state dict (with --arch); "
        "new head when the classes differ; keeps the source's preprocessing."),
    arch: Optional[str] = typer.Option(None, help="timm model name of an --init state dict, e.g. vit_small_patch16_224."),
    labels: Optional[Path] = typer.Option(None, help="Class names of the --init source, one per line."),
    device: str = typer.Option("auto", help="auto, cpu or cuda."),
    val_fraction: float = typer.Option(0.1, help="Validation share when DATA_DIR has no val/ folder, in (0, 1)."),
    precision: Optional[str] = typer.Option(
        None, help="bf16, fp16 or fp32 (autocast on CUDA; fp16 with a GradScaler). "
        "Default: bf16 where the GPU has it, else fp16; fp32 on a CPU."),
    workers: Optional[int] = typer.Option(
        None, help="DataLoader worker processes per process (default: from the core count on CUDA, 0 on a CPU)."),
    accum_steps: int = typer.Option(1, help="Gradient accumulation: micro-batches per optimizer step."),
) -> None:
    """Train a ViT on an image folder or the embedded digits set; writes a self-describing checkpoint.

    Under `torchrun --nproc-per-node N -m vitdeploy train ...` it trains with DistributedDataParallel;
    rank 0 alone reports and writes the checkpoint.
    """
    import contextlib

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.train import TrainOptions, dist_from_env
    from vitdeploy.model.train import train as run_train

    opts = TrainOptions(
        preset=preset, image_size=image_size, patch_size=patch_size, pool=pool, epochs=epochs, batch_size=batch_size,
        lr=lr, weight_decay=weight_decay, label_smoothing=label_smoothing, augment=augment, seed=seed, out=out,
        resume=resume, init=init, arch=arch, labels=labels, device=device, val_fraction=val_fraction,
        precision=precision, workers=workers, accum_steps=accum_steps,
    )
    main_rank = dist_from_env().main
    prog = Progress(
        TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(), console=err_console, transient=True, disable=not main_rank,
    )
    try:
        with prog if main_rank else contextlib.nullcontext(prog):
            task = prog.add_task("train", total=None, info="reading images")

            def on_event(kind: str, d: dict) -> None:
                if kind == "start":
                    where = f"  {d['world_size']} processes" if d.get("world_size", 1) > 1 else ""
                    prog.update(task, total=d["epochs"], completed=d["start_epoch"],
                                info=f"{d['train']} train / {d['val']} val images{where}")
                elif kind == "epoch":
                    prog.update(task, completed=d["epoch"] + 1,
                                info=f"loss {d['loss']:.3f}  val top-1 {d['val_accuracy']:.2%}  best {d['best']:.2%}")

            result = run_train(data_dir, opts, on_event if main_rank else None)
    except UsageError as e:
        if main_rank:
            raise
        raise typer.Exit(e.exit_code) from None  # the same on every rank: rank 0 says it, once
    if not main_rank:
        if result.skipped:
            raise typer.Exit(EXIT_PARTIAL)
        return
    for path, why in result.skipped:
        err_console.print(f"skipped {path}: {why}", highlight=False, soft_wrap=True)
    procs = f", {result.world_size} processes" if result.world_size > 1 else ""
    console.print(
        f"best validation top-1 {result.best_val_accuracy:.2%} (epoch {result.best_epoch + 1}/{result.epochs}) "
        f"in {result.seconds:.0f} s{procs} → {result.checkpoint}"
    )
    if result.skipped:
        err_console.print(f"{len(result.skipped)} unreadable image(s) skipped")
        raise typer.Exit(EXIT_PARTIAL)
