"""`vitdeploy train`, `vitdeploy presets`, `vitdeploy datasets`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.table import Table

from vitdeploy.cli.app import app, console, emit_json, err_console, handle_errors, next_step, text_column
from vitdeploy.cli.options import JSON_HELP, bounded
from vitdeploy.core.errors import EXIT_PARTIAL

if TYPE_CHECKING:
    from vitdeploy.model.train_options import TrainOptions


@app.command()
@handle_errors
def presets(json_out: Optional[str] = typer.Option(None, "--json", metavar="FILE", help=JSON_HELP)) -> None:
    """List the model presets and their sizes (parameters at 224x224 with 1000 classes)."""
    from vitdeploy.model.presets import preset_table

    rows = preset_table()
    if emit_json(rows, json_out):
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
    next_step(f"vitdeploy train {out_dir}")


@app.command()
@handle_errors
def train(
    data_dir: Optional[Path] = typer.Argument(None, help="ImageFolder (class sub-folders, or train/ and val/). Default: the embedded digits set."),
    preset: Optional[str] = typer.Option(None, help="Model preset (see `vitdeploy presets`). Default: vit-digits."),
    image_size: Optional[int] = typer.Option(None, **bounded("image_size"), help="Input size (square), overriding the preset's."),
    patch_size: Optional[int] = typer.Option(None, **bounded("patch_size"), help="Patch size, overriding the preset's."),
    pool: Optional[str] = typer.Option(
        None, help="Head on the 'cls' token or the 'mean' of patch tokens. With --probe, the frozen features the head "
        "reads: cls, mean or cls+mean (default: cls and cls+mean both fitted, the better on val kept, as DINOv2's "
        "linear eval)."),
    epochs: Optional[int] = typer.Option(None, **bounded("epochs"), help="Epochs (default 40 on digits, 30 on a folder)."),
    batch_size: int = typer.Option(
        64, **bounded("batch"), help="Global batch: images per optimizer step, summed over the torchrun processes and --accum-steps."),
    lr: float = typer.Option(2e-3, **bounded("lr"), help="Peak learning rate (AdamW, warm-up then cosine decay)."),
    weight_decay: float = typer.Option(0.05, **bounded("weight_decay"), help="AdamW weight decay."),
    label_smoothing: float = typer.Option(0.1, **bounded("fraction"), help="Label smoothing, in [0, 1)."),
    augment: bool = typer.Option(True, help="Light augmentation (random translation)."),
    seed: int = typer.Option(0, **bounded("seed"), help="Seed: the same seed gives the same result on CPU."),
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
    val_fraction: float = typer.Option(0.1, **bounded("fraction"), help="Validation share when DATA_DIR has no val/ folder, in (0, 1)."),
    precision: Optional[str] = typer.Option(
        None, help="bf16, fp16 or fp32 (autocast on CUDA; fp16 with a GradScaler). "
        "Default: bf16 where the GPU has it, else fp16; fp32 on a CPU."),
    workers: Optional[int] = typer.Option(
        None, **bounded("train_workers"), help="DataLoader worker processes per process (default: from the core count on CUDA, 0 on a CPU)."),
    accum_steps: int = typer.Option(1, **bounded("accum_steps"), help="Gradient accumulation: micro-batches per optimizer step."),
    probe: Optional[str] = typer.Option(
        None, metavar="linear|knn",
        help="Keep the --init backbone frozen. linear: its features are computed once (cached in OUT.features.npz, "
        "keyed by the backbone's SHA-256, the images and the preprocessing) and a linear head is fitted on them "
        "(L2 logistic regression, its strength chosen on val, as DINOv2's eval/log_regression.py) and folded into a "
        "classifier checkpoint that deploys like any other. knn: writes no checkpoint; reports the val top-1 of "
        "DINOv2's weighted kNN (k=20, T=0.07) with the train images as the gallery, and keeps the features cache "
        "for a --probe linear run after it. --batch-size is the feature batch; the fine-tuning options (--epochs, "
        "--lr, --weight-decay, ...) are refused."),
) -> None:
    """Train a ViT on an image folder or the embedded digits set; writes a self-describing checkpoint.

    Under `torchrun --nproc-per-node N -m vitdeploy train ...` it trains with DistributedDataParallel;
    rank 0 alone reports and writes the checkpoint. With --probe the backbone stays frozen: minutes instead of hours.
    """
    import contextlib

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from vitdeploy.core.errors import UsageError
    from vitdeploy.model.train_options import TrainOptions, check_options, dist_from_env

    opts = TrainOptions(
        preset=preset, image_size=image_size, patch_size=patch_size, pool=pool, epochs=epochs, batch_size=batch_size,
        lr=lr, weight_decay=weight_decay, label_smoothing=label_smoothing, augment=augment, seed=seed, out=out,
        resume=resume, init=init, arch=arch, labels=labels, device=device, val_fraction=val_fraction,
        precision=precision, workers=workers, accum_steps=accum_steps, probe=probe,
    )
    main_rank = dist_from_env().main
    try:  # a bad value is refused before model.train imports torch (train checks again, for library callers)
        check_options(opts)
    except UsageError as e:
        if main_rank:
            raise
        raise typer.Exit(e.exit_code) from None  # the same on every rank: rank 0 says it, once
    if probe is not None:
        run_probe(data_dir, opts)
        return
    from vitdeploy.model.train import train as run_train

    if main_rank:
        say_model_choice(data_dir, preset, image_size, init or resume)
    live = main_rank and err_console.is_terminal  # a terminal: a per-batch bar with an ETA; else one line per epoch
    prog = Progress(
        text_column("train", "bold"), text_column("{task.fields[epoch]}"), BarColumn(), MofNCompleteColumn(),
        text_column("{task.fields[info]}"), TimeElapsedColumn(), text_column("ETA"), TimeRemainingColumn(),
        console=err_console, transient=True, disable=not live,
    )
    clock = EpochClock()
    try:
        with prog if main_rank else contextlib.nullcontext(prog):
            task = prog.add_task("train", total=None, info="reading images", epoch="")

            def on_event(kind: str, d: dict) -> None:
                if kind == "start":
                    where = f", {d['world_size']} processes" if d.get("world_size", 1) > 1 else ""
                    clock.begin(d["epochs"], d["start_epoch"], d.get("steps", 1))
                    size = "x".join(map(str, d.get("image_size", [])))
                    head = (f"training {d.get('name', 'the model')} at {size}: {d['train']} train / {d['val']} val images, "
                            f"{d['epochs'] - d['start_epoch']} epochs of {d.get('steps', '?')} steps on "
                            f"{d.get('device', '?')} ({d.get('precision', 'fp32')}{where})")
                    (prog.console if live else console).print(head, highlight=False, soft_wrap=True)
                    prog.update(task, total=clock.total_steps, completed=0, info="")
                elif kind == "batch":
                    prog.update(task, completed=clock.step(), epoch=f"epoch {d['epoch'] + 1}/{clock.epochs}")
                elif kind == "note":
                    (prog.console if live else console).print(f"note: {d['text']}", highlight=False, soft_wrap=True)
                elif kind == "epoch":
                    line = clock.epoch_line(d)
                    (prog.console if live else console).print(line, highlight=False, soft_wrap=True)
                    prog.update(task, completed=clock.done_steps)

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
    next_step(f"vitdeploy export {result.checkpoint}" + (f" -i {data_dir}" if data_dir else ""))
    if result.skipped:
        err_console.print(f"{len(result.skipped)} unreadable image(s) skipped")
        raise typer.Exit(EXIT_PARTIAL)


def run_probe(data_dir: Optional[Path], opts: TrainOptions) -> None:
    """train --probe: the features (a bar on a terminal while they are computed), then the linear head or the kNN."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn, TimeRemainingColumn

    from vitdeploy.model.probe import C_GRID, train_probe
    from vitdeploy.tools.knn_probe import knn_probe
    live = err_console.is_terminal
    prog = Progress(text_column("features", "bold"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    text_column("ETA"), TimeRemainingColumn(), console=err_console, transient=True, disable=not live)
    say = prog.console if live else console

    with prog:
        bar = prog.add_task("features", total=None, visible=False)

        def on_event(kind: str, d: dict) -> None:
            if kind == "note":
                say.print(f"note: {d['text']}", highlight=False, soft_wrap=True)
            elif kind == "features":
                size = "x".join(map(str, d["image_size"]))
                say.print(f"features: {d['total']} images through {d['name']} at {size} ({d['pool']}, {d['dim']}-d) "
                          f"on {d['device']}", highlight=False, soft_wrap=True)
                prog.update(bar, total=d["total"], completed=0, visible=True)
            elif kind == "features_batch":
                prog.update(bar, completed=d["done"])
            elif kind == "fit":
                prog.update(bar, visible=False)

        if opts.probe == "knn":
            feats, figures = knn_probe(data_dir, opts, on_event)
        else:
            result = train_probe(data_dir, opts, on_event)
            feats = result.features
    where = f" → {feats.cache}" if feats.cache else ""
    if feats.computed:
        console.print(f"features of {len(feats.x)} images computed in {feats.seconds:.1f} s{where}", highlight=False)
    else:
        console.print(f"features of {len(feats.x)} images read from {feats.cache} (same backbone, images, "
                      "preprocessing and pooling: nothing computed)", highlight=False)
    for path, why in feats.skipped:
        err_console.print(f"skipped {path}: {why}", highlight=False, soft_wrap=True)
    if opts.probe == "knn":
        from vitdeploy.checks.metrics import KNN_K, KNN_T

        for fig in figures:
            console.print(f"kNN val top-1 {fig.accuracy:.2%} on {fig.pool} features (k={KNN_K}, T={KNN_T}, cosine-weighted "
                          f"votes as DINOv2's eval/knn.py; {fig.gallery} train images as the gallery, {fig.queries} val "
                          "queries)", highlight=False)
        console.print("no checkpoint written (kNN has no head to fold); for a deployable classifier: "
                      "--probe linear", highlight=False)
        same = [("--arch", opts.arch), ("--labels", opts.labels), ("--image-size", opts.image_size), ("--pool", opts.pool)]
        flags = "".join(f" {k} {v}" for k, v in same if v is not None)
        next_step(f"vitdeploy train{f' {data_dir}' if data_dir else ''} --init {opts.init}{flags} --probe linear -o {opts.out}")
    else:
        for pool, f in result.fits.items():
            mark = "  ← kept" if f is result.fit and len(result.fits) > 1 else ""
            console.print(f"linear probe on {pool} features ({f.weight.shape[1]}-d): val top-1 "
                          f"{f.val_accuracy:.2%} (train {f.train_accuracy:.2%}) at C={f.C:.3g}, chosen on val among "
                          f"{len(f.sweep)} of {len(C_GRID)}; {f.seconds:.1f} s{mark}", highlight=False)
        console.print(f"wrote {result.checkpoint}: a {len(feats.classes)}-class classifier, the frozen backbone with the "
                      f"probe folded in as its head ({result.train_images} train / {result.val_images} val images, "
                      f"{result.seconds:.0f} s)", highlight=False)
        next_step(f"vitdeploy export {result.checkpoint}" + (f" -i {data_dir}" if data_dir else ""))
    if feats.skipped:
        err_console.print(f"{len(feats.skipped)} unreadable image(s) skipped")
        raise typer.Exit(EXIT_PARTIAL)


class EpochClock:
    """Steps done and seconds per epoch, for the bar's total and each epoch's line (time, ETA)."""

    def __init__(self) -> None:
        import time

        self._now = time.perf_counter
        self.epochs, self.start, self.steps, self.done_steps = 0, 0, 1, 0
        self.t0 = self.t_epoch = self._now()

    @property
    def total_steps(self) -> int:
        return max(1, (self.epochs - self.start) * self.steps)

    def begin(self, epochs: int, start: int, steps: int) -> None:
        self.epochs, self.start, self.steps = epochs, start, max(1, steps)
        self.t0 = self.t_epoch = self._now()

    def step(self) -> int:
        self.done_steps += 1
        return self.done_steps

    def epoch_line(self, d: dict) -> str:
        """'epoch 3/40  loss 0.412  val top-1 91.20%  best 91.20%  4.1 s  ETA 2m 31s' (ETA from the mean epoch so far)."""
        now = self._now()
        took, self.t_epoch = now - self.t_epoch, now
        done = d["epoch"] + 1 - self.start
        self.done_steps = done * self.steps
        left = (now - self.t0) / max(1, done) * (self.epochs - d["epoch"] - 1)
        return (f"epoch {d['epoch'] + 1}/{self.epochs}  loss {d['loss']:.3f}  val top-1 {d['val_accuracy']:.2%}  "
                f"best {d['best']:.2%}  {took:.1f} s  ETA {_hms(left)}")


def _hms(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}h {s % 3600 // 60:02d}m" if s >= 3600 else (f"{s // 60}m {s % 60:02d}s" if s >= 60 else f"{s}s")


def say_model_choice(data_dir: Optional[Path], preset: Optional[str], image_size: Optional[int], start: Optional[Path]) -> None:
    """Say plainly what train chose when the user did not: on a folder of photos the default is still vit-digits at
    32x32 (small and fast on a CPU); a photo model needs --preset (decided: a default that guesses a size from the
    photos would turn a 2-minute run into hours on a CPU without asking)."""
    if preset is not None or start is not None or data_dir is None:
        return
    from vitdeploy.model.presets import get_preset

    p = get_preset("vit-digits")
    h, w = p.config.image_size if image_size is None else (image_size, image_size)
    big = _first_image_size(data_dir)
    if big is not None and max(big) > max(h, w):
        err_console.print(
            f"note: training the vit-digits preset (the default) at {h}x{w}: your images ({big[0]}x{big[1]}) are "
            f"shrunk to {h}x{w}. For photos pass --preset (e.g. --preset vit-tiny, 224x224; "
            "see `vitdeploy presets`) or fine-tune a pretrained model with --init.", highlight=False, soft_wrap=True)


def _first_image_size(folder: Path) -> Optional[tuple[int, int]]:
    """The size of the first image in ``folder`` (header only), or None."""
    from vitdeploy.core.preprocess import list_images

    try:
        files = list_images(folder)
        if not files:
            return None
        from PIL import Image

        with Image.open(files[0]) as im:
            return int(im.size[0]), int(im.size[1])
    except Exception:  # noqa: BLE001 - only a hint; train itself reports unreadable files
        return None
