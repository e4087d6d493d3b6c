"""Training and fine-tuning: AdamW, warm-up + cosine decay, label smoothing, light augmentation.

The best epoch (by validation top-1) is saved atomically as a self-describing checkpoint.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest, tool_versions
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.model.checkpoint import load_checkpoint, save_checkpoint
from vitdeploy.model.data import Dataset, load_digits_dataset, load_image_folder
from vitdeploy.model.vit import VisionTransformer, ViTConfig, get_preset

DEFAULT_PRESET = "vit-digits"


@dataclass
class TrainOptions:
    preset: str | None = None
    image_size: int | tuple[int, int] | None = None
    patch_size: int | None = None
    pool: str | None = None
    epochs: int | None = None
    batch_size: int = 64
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_epochs: float = 3.0
    label_smoothing: float = 0.1
    augment: bool = True
    seed: int = 0
    out: str | Path = "ckpt.pth"
    resume: str | Path | None = None
    init: str | Path | None = None
    arch: str | None = None  # timm model name of an --init state dict
    labels: str | Path | None = None  # class names of the --init source, one per line
    device: str = "auto"
    val_fraction: float = 0.1
    threads: int | None = None


@dataclass
class TrainResult:
    checkpoint: Path
    best_val_accuracy: float
    best_epoch: int
    epochs: int
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


# Epochs that reach the accuracy target on the embedded digits set within the time budget.
DIGITS_EPOCHS = 40
FOLDER_EPOCHS = 30


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible here; use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, not {name!r}")
    return torch.device(name)


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to 1/8 of the size (edge-replicated), per image."""
    b, _, h, w = x.shape
    ph, pw = max(1, h // 8), max(1, w // 8)
    padded = F.pad(x, (pw, pw, ph, ph), mode="replicate")
    dy = torch.randint(0, 2 * ph + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * pw + 1, (b,), generator=gen)
    return torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)])


def evaluate(model: VisionTransformer, ds_split: Any, pp: Preprocess, device: torch.device, batch: int = 256) -> float:
    model.eval()
    correct = 0
    with torch.inference_mode():
        for i in range(0, len(ds_split), batch):
            idx = list(range(i, min(i + batch, len(ds_split))))
            x = torch.from_numpy(ds_split.arrays(pp, idx)).to(device)
            pred = model(x).argmax(-1).cpu().numpy()
            correct += int((pred == ds_split.labels[idx]).sum())
    return correct / max(1, len(ds_split))


def _lr_at(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def _resolve_model(opts: TrainOptions, data_dir: str | Path | None) -> tuple[ViTConfig, Preprocess, str, dict[str, Any] | None, Manifest | None]:
    """Config and preprocessing from the preset (or the --init/--resume checkpoint), with overrides."""
    source: Manifest | None = None
    state: dict[str, Any] | None = None
    start = opts.resume or opts.init
    if start is not None:
        from vitdeploy.model.importers import load_any

        ck = load_any(start, arch=opts.arch, labels=opts.labels)
        source, state = ck.manifest, ck.state_dict
        cfg = ViTConfig.from_dict(source.model)
        pp_dict = dict(source.preprocess)
        name = source.name
        if opts.preset:
            raise UsageError("--preset cannot be combined with --init/--resume: the architecture comes from the checkpoint")
        if (opts.image_size or opts.patch_size) and opts.resume:
            raise UsageError("--image-size/--patch-size cannot change when resuming")
    else:
        preset = get_preset(opts.preset or DEFAULT_PRESET)
        cfg, pp_dict, name = preset.config, dict(preset.preprocess), preset.name
    changes: dict[str, Any] = {}
    if opts.patch_size:
        changes["patch_size"] = opts.patch_size
    if opts.image_size:
        size = (opts.image_size, opts.image_size) if isinstance(opts.image_size, int) else tuple(opts.image_size)
        changes["image_size"] = size
        pp_dict["input_size"] = list(size)
    if opts.pool:
        changes["pool"] = opts.pool
    if changes:
        try:
            cfg = cfg.with_(**changes)
        except ValueError as e:
            raise UsageError(str(e)) from None
    return cfg, Preprocess.from_dict(pp_dict), name, state, source


def train(
    data_dir: str | Path | None = None,
    opts: TrainOptions | None = None,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
) -> TrainResult:
    """Train (or fine-tune/resume) a ViT and save the best checkpoint to ``opts.out``."""
    opts = opts or TrainOptions()
    t0 = time.perf_counter()
    if opts.threads:
        torch.set_num_threads(opts.threads)
    if opts.resume and opts.init:
        raise UsageError("--resume and --init exclude each other: resume continues a run, init starts a new one")
    if (opts.arch or opts.labels) and not opts.init:
        raise UsageError("--arch and --labels describe the --init source: pass them with --init")
    device = _device(opts.device)
    cfg, pp, name, init_state, source = _resolve_model(opts, data_dir)

    if progress:
        progress("status", {"message": "reading images"})
    if data_dir is None:
        ds: Dataset = load_digits_dataset(pp)
    else:
        ds = load_image_folder(data_dir, pp, opts.val_fraction, opts.seed)
    if len(ds.val) == 0:
        raise VitdeployError(f"{data_dir}: too few images to hold out a validation split; add images or a val/ folder")

    labels = ds.labels
    cfg = cfg.with_(num_classes=len(labels))
    torch.manual_seed(opts.seed)
    model = VisionTransformer(cfg)
    train_state: dict[str, Any] | None = None
    start_epoch = 0
    if init_state is not None and source is not None:
        same_head = list(source.labels) == labels and int(source.model["num_classes"]) == len(labels)
        if opts.resume and not same_head:
            raise VitdeployError(
                f"--resume: the checkpoint has classes {source.labels[:5]}…, the data {labels[:5]}…; use --init to fine-tune"
            )
        state = dict(init_state)
        if not same_head:
            state = {k: v for k, v in state.items() if not k.startswith("head.")}
        if state["pos_embed"].shape != model.pos_embed.shape:
            state["pos_embed"] = _resize_pos_embed(state["pos_embed"], cfg)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any(not k.startswith("head.") for k in missing):
            raise VitdeployError(f"{opts.resume or opts.init}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
        if opts.resume:
            train_state = load_checkpoint(opts.resume).train_state
    model.to(device)

    epochs = opts.epochs or (DIGITS_EPOCHS if data_dir is None else FOLDER_EPOCHS)
    steps_per_epoch = max(1, math.ceil(len(ds.train) / opts.batch_size))
    total = epochs * steps_per_epoch
    warmup = int(opts.warmup_epochs * steps_per_epoch)
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for n, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or n in ("cls_token", "pos_embed") else decay).append(p)
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": opts.weight_decay}, {"params": no_decay, "weight_decay": 0.0}], lr=opts.lr
    )
    best_acc, best_epoch, history = -1.0, -1, []
    if train_state:
        opt.load_state_dict(train_state["optimizer"])
        start_epoch = int(train_state["epoch"]) + 1
        best_acc = float(train_state.get("best_val_accuracy", -1.0))
        best_epoch = int(train_state["epoch"])
        if start_epoch >= epochs:
            raise UsageError(f"--resume: the checkpoint already finished epoch {start_epoch}; pass --epochs above {start_epoch}")

    gen = torch.Generator().manual_seed(opts.seed)
    rng = np.random.default_rng(opts.seed + start_epoch)
    manifest = Manifest(
        model=cfg.to_dict(),
        labels=labels,
        preprocess=pp.to_dict(),
        name=name,
        source={"dataset": ds.name if data_dir is None else str(Path(data_dir).resolve()), "init": str(opts.init) if opts.init else None},
        versions=tool_versions("torch", "numpy"),
    )
    if progress:
        progress("start", {"epochs": epochs, "start_epoch": start_epoch, "train": len(ds.train), "val": len(ds.val)})
    y_all = torch.from_numpy(ds.train.labels)
    for epoch in range(start_epoch, epochs):
        model.train()
        order = rng.permutation(len(ds.train))
        loss_sum, seen = 0.0, 0
        for s in range(steps_per_epoch):
            idx = order[s * opts.batch_size : (s + 1) * opts.batch_size]
            if len(idx) == 0:
                continue
            x = torch.from_numpy(ds.train.arrays(pp, idx))
            if opts.augment:
                x = _augment(x, gen)
            x, y = x.to(device), y_all[idx].to(device)
            for g in opt.param_groups:
                g["lr"] = _lr_at(epoch * steps_per_epoch + s, total, warmup, opts.lr)
            loss = F.cross_entropy(model(x), y, label_smoothing=opts.label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            loss_sum += loss.item() * len(idx)
            seen += len(idx)
        acc = evaluate(model, ds.val, pp, device)
        history.append({"epoch": epoch, "loss": loss_sum / max(1, seen), "val_accuracy": acc})
        if acc > best_acc:
            best_acc, best_epoch = acc, epoch
            manifest.training = {
                "best_val_accuracy": acc,
                "best_epoch": epoch,
                "epochs": epochs,
                "train_images": len(ds.train),
                "val_images": len(ds.val),
                "seed": opts.seed,
                "lr": opts.lr,
                "batch_size": opts.batch_size,
                "seconds": round(time.perf_counter() - t0, 1),
            }
            save_checkpoint(
                opts.out,
                model.cpu(),
                manifest,
                {"optimizer": opt.state_dict(), "epoch": epoch, "best_val_accuracy": acc},
            )
            model.to(device)
        if progress:
            progress("epoch", {"epoch": epoch, "loss": loss_sum / max(1, seen), "val_accuracy": acc, "best": best_acc})
    return TrainResult(Path(opts.out), best_acc, best_epoch, epochs, time.perf_counter() - t0, history, ds.skipped)


def _resize_pos_embed(pos: torch.Tensor, cfg: ViTConfig) -> torch.Tensor:
    """Interpolate learned position embeddings to a new patch grid (fine-tuning at another size)."""
    cls, grid = pos[:, :1], pos[:, 1:]
    n = grid.shape[1]
    side = int(math.isqrt(n))
    if side * side != n:
        raise VitdeployError("cannot resize position embeddings of a non-square grid; keep the source image size")
    gh, gw = cfg.grid_size
    g = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=(gh, gw), mode="bicubic", align_corners=False)
    return torch.cat([cls, g.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)], dim=1)
