"""Training and fine-tuning: AdamW, warm-up + cosine decay, label smoothing, light augmentation.

One process, or several under ``torchrun`` (DistributedDataParallel: gloo on CPU, NCCL on CUDA).
``batch_size`` is the global batch of one optimizer step: it is split over the processes and the
gradient-accumulation steps, so a recipe gives the same schedule on 1 or N processes. Mixed
precision (bf16/fp16 autocast, a GradScaler for fp16) on CUDA. The best epoch (by validation top-1,
counted over every validation image exactly once, whatever the number of processes) is written by
rank 0 to ``<out>.partial`` and renamed to ``out`` when the run ends, so an interrupted run never
replaces the user's previous checkpoint.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import atomic_path, same_file
from vitdeploy.core.host import die_with_parent, thread_count
from vitdeploy.core.manifest import Manifest, tool_versions
from vitdeploy.core.preprocess import ImageReadError, Preprocess, load_image, resize_crop
from vitdeploy.model.checkpoint import load_checkpoint, save_checkpoint
from vitdeploy.model.data import (
    Dataset,
    Split,
    load_digits_dataset,
    load_image_folder,
)
from vitdeploy.model.train_options import (  # noqa: F401 (re-exported: model.train is where callers look)
    DEFAULT_PRESET,
    PRECISIONS,
    Dist,
    TrainOptions,
    check_options,
    dist_from_env,
)
from vitdeploy.model.vit import VisionTransformer, ViTConfig, get_preset


def class_difference(checkpoint: list[str], data: list[str]) -> str:
    """Where the checkpoint's classes and the data's differ, in words (the first differing class, not two lists)."""
    if len(checkpoint) != len(data):
        return f"the checkpoint has {len(checkpoint)} classes, the data {len(data)}"
    k = next(i for i, (a, b) in enumerate(zip(checkpoint, data, strict=True)) if a != b)
    return f"class {k} is {checkpoint[k]!r} in the checkpoint and {data[k]!r} in the data"


@dataclass
class TrainResult:
    checkpoint: Path
    best_val_accuracy: float
    best_epoch: int
    epochs: int
    seconds: float
    history: list[dict[str, float]] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)
    world_size: int = 1
    precision: str = "fp32"
    rank: int = 0


# Epochs that reach the accuracy target on the embedded digits set within the time budget.
DIGITS_EPOCHS = 40
FOLDER_EPOCHS = 30


def partial_path(out: str | Path) -> Path:
    """Where the best-so-far checkpoint lives until the run ends (then it is renamed to ``out``)."""
    from vitdeploy.core.outputs import side_output_path

    return side_output_path("partial checkpoint", out)


def _device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA GPU is visible here; use --device cpu or auto")
    if name not in ("cpu", "cuda"):
        raise UsageError(f"--device must be auto, cpu or cuda, not {name!r}")
    return torch.device(name)


def resolve_precision(precision: str | None, device: torch.device) -> str:
    """bf16/fp16/fp32 for this device: the default is bf16 where the GPU has it, else fp16; fp32 on a CPU."""
    if precision is not None and precision not in PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if device.type != "cuda":
        if precision in ("bf16", "fp16"):
            raise UsageError(f"--precision {precision} needs a CUDA GPU; on a CPU training runs in fp32 (drop --precision)")
        return "fp32"
    bf16_ok = torch.cuda.is_bf16_supported()
    if precision is None:
        return "bf16" if bf16_ok else "fp16"
    if precision == "bf16" and not bf16_ok:
        raise UsageError("--precision bf16: this GPU has no bfloat16; use --precision fp16")
    return precision


def _amp_dtype(precision: str) -> torch.dtype | None:
    return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)


def _autocast(device: torch.device, dtype: torch.dtype | None) -> contextlib.AbstractContextManager[Any]:
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device_type=device.type, dtype=dtype)


def default_workers(world_size: int = 1, device: torch.device | None = None) -> int:
    """DataLoader workers per process: on CUDA the cores left after the training processes (at most 8);
    on a CPU 0, since training itself needs the cores and the images are decoded once up front."""
    if device is None or device.type != "cuda":
        return 0
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(0, min(8, cores // max(1, world_size) - 1))


class PartialNotWritten(Exception):
    """The best epoch could not be saved (a full disk): the run stops and leaves nothing behind."""


def keep_earlier_partial(out: Path, resume: str | Path | None) -> Path | None:
    """An earlier interrupted run's best (``<out>.partial``) that this run would overwrite at its first epoch:
    moved aside to ``<out>.partial.N`` and returned (None when there is none, or this run resumes from it)."""
    partial = partial_path(out)
    if not partial.is_file() or (resume is not None and Path(resume).exists() and same_file(resume, partial)):
        return None
    k = 1
    while (aside := partial.with_name(f"{partial.name}.{k}")).exists():
        k += 1
    os.replace(partial, aside)
    return aside


# --- processes --------------------------------------------------------------------------------------------


def _init_process_group(d: Dist, device: torch.device) -> None:
    import torch.distributed as td

    if td.is_initialized():
        return
    addr, port = os.environ.get("MASTER_ADDR", "?"), os.environ.get("MASTER_PORT", "?")
    backend = "nccl" if device.type == "cuda" else "gloo"
    timeout = timedelta(seconds=float(os.environ.get("VITDEPLOY_RENDEZVOUS_TIMEOUT", "300")))
    try:
        td.init_process_group(backend=backend, rank=d.rank, world_size=d.world_size, timeout=timeout)
    except Exception as e:  # noqa: BLE001 - DistNetworkError, DistStoreError, TimeoutError, RuntimeError
        why = str(e).strip().splitlines()[0][:160].rstrip(".") if str(e).strip() else type(e).__name__
        raise VitdeployError(
            f"rank {d.rank} of {d.world_size} cannot join the rendezvous at {addr}:{port} ({why}): "
            f"check that rank 0 runs and that {addr}:{port} (MASTER_ADDR:MASTER_PORT) is reachable from this machine"
        ) from None


def _all_sum(values: list[float], d: Dist, device: torch.device) -> list[float]:
    if not d.active:
        return values
    import torch.distributed as td

    t = torch.tensor(values, dtype=torch.float64, device=device)
    td.all_reduce(t, op=td.ReduceOp.SUM)
    return [float(v) for v in t.cpu().tolist()]


# --- steps ------------------------------------------------------------------------------------------------


def _augment(x: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """Random translation by up to 1/8 of the size (edge-replicated), per image."""
    b, _, h, w = x.shape
    ph, pw = max(1, h // 8), max(1, w // 8)
    padded = F.pad(x, (pw, pw, ph, ph), mode="replicate")
    dy = torch.randint(0, 2 * ph + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * pw + 1, (b,), generator=gen)
    return torch.stack([padded[i, :, dy[i] : dy[i] + h, dx[i] : dx[i] + w] for i in range(b)])


def evaluate(
    model: VisionTransformer,
    ds_split: Any,
    pp: Preprocess,
    device: torch.device,
    batch: int = 256,
    dist: Dist | None = None,
    amp_dtype: torch.dtype | None = None,
) -> float:
    """Validation top-1. Under torchrun each rank takes images rank::world and the counts are summed,
    so every image counts exactly once and the result equals a single-process evaluation."""
    d = dist or Dist()
    model.eval()
    correct = 0
    mine = list(range(d.rank, len(ds_split), d.world_size))
    with torch.inference_mode(), _autocast(device, amp_dtype):
        for i in range(0, len(mine), batch):
            idx = mine[i : i + batch]
            x = torch.from_numpy(ds_split.arrays(pp, idx)).to(device)
            pred = model(x).argmax(-1).cpu().numpy()
            correct += int((pred == ds_split.labels[idx]).sum())
    correct_all, total = _all_sum([float(correct), float(len(mine))], d, device)
    return correct_all / max(1.0, total)


def train_step(
    model: torch.nn.Module,
    opt: torch.optim.Optimizer,
    micro_batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
    label_smoothing: float = 0.0,
    amp_dtype: torch.dtype | None = None,
    scaler: Any = None,
    clip: float = 1.0,
) -> tuple[float, int]:
    """One optimizer step over one or more micro-batches (gradient accumulation); returns (loss sum, images).

    ``model`` may be wrapped in DistributedDataParallel: its gradients are then averaged over the
    processes on the last micro-batch only (``no_sync`` on the others). Each micro-batch's mean loss is
    weighted by its share of the images, so K micro-batches give the gradient of their union.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    total = sum(len(y) for _, y in micro_batches)
    device = next(model.parameters()).device
    opt.zero_grad(set_to_none=True)
    loss_sum = 0.0
    for i, (x, y) in enumerate(micro_batches):
        last = i == len(micro_batches) - 1
        sync = model.no_sync() if isinstance(model, DDP) and not last else contextlib.nullcontext()
        with sync:
            with _autocast(device, amp_dtype):
                loss = F.cross_entropy(model(x), y, label_smoothing=label_smoothing)
            part = loss if len(micro_batches) == 1 else loss * (len(y) / total)
            (scaler.scale(part) if scaler is not None else part).backward()
        loss_sum += loss.item() * len(y)
    if scaler is not None:
        scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
    if scaler is not None:
        scaler.step(opt)
        scaler.update()
    else:
        opt.step()
    return loss_sum, total


class _Batches(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """Batch ``i`` of a split as (float32 NCHW, labels): the preprocessing runs in the DataLoader's workers."""

    def __init__(self, split: Split, pp: Preprocess, chunks: list[np.ndarray]) -> None:
        self.split, self.pp, self.chunks = split, pp, chunks

    def __len__(self) -> int:
        return len(self.chunks)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        idx = self.chunks[i]
        return torch.from_numpy(self.split.arrays(self.pp, idx)), torch.from_numpy(self.split.labels[idx])


def _batches(split: Split, pp: Preprocess, chunks: list[np.ndarray], workers: int, pin: bool) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    if workers == 0:
        for idx in chunks:
            yield torch.from_numpy(split.arrays(pp, idx)), torch.from_numpy(split.labels[idx])
        return
    loader = torch.utils.data.DataLoader(_Batches(split, pp, chunks), batch_size=None, shuffle=False, num_workers=workers,
                                         pin_memory=pin, worker_init_fn=functools.partial(die_with_parent, os.getpid()))
    yield from loader


def _as_list(batch: list[Any]) -> list[Any]:
    return batch


class _DecodeFiles(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """File ``i`` decoded and resized in a DataLoader worker: (i, uint8 HWC or None, why it could not be read)."""

    def __init__(self, items: Sequence[tuple[Path, int]], pp: Preprocess) -> None:
        self.items, self.pp = items, pp

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> tuple[int, np.ndarray | None, str]:
        try:
            return i, np.asarray(resize_crop(load_image(self.items[i][0]), self.pp)), ""
        except ImageReadError as e:
            return i, None, str(e)
        except Exception as e:  # noqa: BLE001 - one bad file (a decompression bomb …) must not stop the job
            return i, None, f"{type(e).__name__}: {e}"


def _decode_in_workers(
    items: Sequence[tuple[Path, int]], pp: Preprocess, workers: int
) -> tuple[Split, list[tuple[str, str]]]:
    """Decode every file once, in ``workers`` DataLoader processes; unreadable files are skipped and named once."""
    images, labels, paths, skipped = [], [], [], []
    loader = torch.utils.data.DataLoader(
        _DecodeFiles(items, pp), batch_size=32, shuffle=False, num_workers=workers, collate_fn=_as_list,
        worker_init_fn=functools.partial(die_with_parent, os.getpid()),  # no orphan when this run is killed
    )
    for batch in loader:
        for i, arr, why in batch:
            path, ci = items[i]
            if arr is None:
                skipped.append((str(path), why))
            else:
                images.append(arr)
                labels.append(ci)
                paths.append(str(path))
    return Split(images, np.asarray(labels, np.int64), paths), skipped


def _load_folder(root: str | Path, pp: Preprocess, val_fraction: float, seed: int, workers: int) -> Dataset:
    """``load_image_folder``, with the decoding done in ``workers`` DataLoader processes (none: in this one)."""
    if workers <= 0:
        return load_image_folder(root, pp, val_fraction, seed)
    return load_image_folder(root, pp, val_fraction, seed, decode=lambda items: _decode_in_workers(items, pp, workers))


def _epoch_order(n: int, epoch: int, d: Dist, seed: int, rng: np.random.Generator) -> np.ndarray:
    """This process's training indices for the epoch: a seeded permutation (DistributedSampler under torchrun)."""
    if not d.active:
        return rng.permutation(n)
    from torch.utils.data.distributed import DistributedSampler

    sampler: DistributedSampler[int] = DistributedSampler(
        range(n),  # type: ignore[arg-type]  # only its length is read
        num_replicas=d.world_size, rank=d.rank, shuffle=True, seed=seed, drop_last=False,
    )
    sampler.set_epoch(epoch)
    return np.fromiter(iter(sampler), dtype=np.int64)


def _lr_at(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    t = (step - warmup) / max(1, total - warmup)
    return base * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


# the classifiers a new label set replaces: the class head and a distilled model's second head (timm's names)
HEAD_PREFIXES = ("head.", "head_dist.")
# parameters without weight decay beside biases and norms: timm's no_weight_decay() (tokens, position embeddings,
# an attention-pooling head's latent query)
NO_DECAY = ("cls_token", "pos_embed", "dist_token", "reg_token", "attn_pool.latent")


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
    """Train (or fine-tune/resume) a ViT and save the best checkpoint to ``opts.out``.

    Under torchrun (WORLD_SIZE > 1 in the environment) this process joins the job as its RANK; only
    rank 0 writes the checkpoint and should report progress. The user's ``opts.out`` is replaced only when
    the run ends: until then the best epoch is kept in ``<out>.partial``.
    """
    opts = opts or TrainOptions()
    t0 = time.perf_counter()
    check_options(opts)
    if opts.probe is not None:
        raise UsageError(f"opts.probe={opts.probe!r}: a frozen-feature probe is vitdeploy.model.probe.train_probe "
                         "(train fine-tunes every weight)")
    if opts.resume and opts.init:
        raise UsageError("--resume and --init exclude each other: resume continues a run, init starts a new one")
    if (opts.arch or opts.labels) and not opts.init:
        raise UsageError("--arch and --labels describe the --init source: pass them with --init")
    d = dist_from_env()
    device = _device(opts.device)
    if d.active and device.type == "cuda":
        device = torch.device("cuda", d.local_rank % max(1, torch.cuda.device_count()))
        torch.cuda.set_device(device)
    precision = resolve_precision(opts.precision, device)
    per_step = d.world_size * opts.accum_steps
    if opts.batch_size % per_step:
        raise UsageError(
            f"--batch-size {opts.batch_size} (the global batch) must be a multiple of processes × --accum-steps "
            f"= {d.world_size} × {opts.accum_steps}; pass e.g. --batch-size {max(1, opts.batch_size // per_step) * per_step}"
        )
    micro = opts.batch_size // per_step
    workers = default_workers(d.world_size, device) if opts.workers is None else opts.workers
    if opts.threads:
        torch.set_num_threads(thread_count(opts.threads))
    cfg, pp, name, init_state, source = _resolve_model(opts, data_dir)
    if d.active:
        _init_process_group(d, device)
    try:
        return _train(data_dir, opts, progress, t0, d, device, precision, micro, workers, cfg, pp, name, init_state, source)
    finally:
        if d.active:
            import torch.distributed as td

            if td.is_initialized():
                td.destroy_process_group()


def _train(
    data_dir: str | Path | None,
    opts: TrainOptions,
    progress: Callable[[str, dict[str, Any]], None] | None,
    t0: float,
    d: Dist,
    device: torch.device,
    precision: str,
    micro: int,
    workers: int,
    cfg: ViTConfig,
    pp: Preprocess,
    name: str,
    init_state: dict[str, Any] | None,
    source: Manifest | None,
) -> TrainResult:
    if progress:
        progress("status", {"message": "reading images"})
    if data_dir is None:
        ds: Dataset = load_digits_dataset(pp)
    else:
        ds = _load_folder(data_dir, pp, opts.val_fraction, opts.seed, workers)
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
            raise VitdeployError(f"--resume: {class_difference(list(source.labels), labels)}; use --init to fine-tune")
        state = dict(init_state)
        if not same_head:  # new classes: every classifier starts afresh (a distilled model's second head too)
            state = {k: v for k, v in state.items() if not k.startswith(HEAD_PREFIXES)}
        pos = getattr(model, "pos_embed", None)
        if "pos_embed" in state and pos is not None and state["pos_embed"].shape != pos.shape:
            state["pos_embed"] = _resize_pos_embed(state["pos_embed"], cfg, pos.shape[1])
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or any(not k.startswith(HEAD_PREFIXES) for k in missing):
            raise VitdeployError(f"{opts.resume or opts.init}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
        if opts.resume:
            train_state = load_checkpoint(opts.resume).train_state
    model.to(device)

    epochs = opts.epochs or (DIGITS_EPOCHS if data_dir is None else FOLDER_EPOCHS)
    n_train = len(ds.train)
    per_rank = math.ceil(n_train / d.world_size)
    steps_per_epoch = max(1, math.ceil(per_rank / (micro * opts.accum_steps)))
    total = epochs * steps_per_epoch
    warmup = int(opts.warmup_epochs * steps_per_epoch)
    decay: list[torch.nn.Parameter] = []
    no_decay: list[torch.nn.Parameter] = []
    for n, p in model.named_parameters():
        (no_decay if p.ndim <= 1 or n in NO_DECAY else decay).append(p)
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

    amp_dtype = _amp_dtype(precision)
    scaler = torch.amp.GradScaler("cuda") if precision == "fp16" else None
    net: torch.nn.Module = model
    if d.active:
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    gen = torch.Generator().manual_seed(opts.seed + 1_000_003 * d.rank)
    rng = np.random.default_rng(opts.seed + start_epoch)
    manifest = Manifest(
        model=cfg.to_dict(),
        labels=labels,
        preprocess=pp.to_dict(),
        name=name,
        source={"dataset": ds.name if data_dir is None else str(Path(data_dir).resolve()), "init": str(opts.init) if opts.init else None},
        versions=tool_versions("torch", "numpy"),
    )
    out, partial = Path(opts.out), partial_path(opts.out)
    saved = False
    if d.main and (aside := keep_earlier_partial(out, opts.resume)) is not None and progress:
        progress("note", {"text": f"an earlier interrupted run's best was in {partial}: kept as {aside} "
                                  f"(continue it with --resume {aside})"})
    if progress:
        progress("start", {"epochs": epochs, "start_epoch": start_epoch, "train": n_train, "val": len(ds.val),
                           "world_size": d.world_size, "precision": precision, "name": name,
                           "image_size": list(cfg.image_size), "steps": steps_per_epoch, "device": str(device)})
    pin = device.type == "cuda"
    try:
        for epoch in range(start_epoch, epochs):
            net.train()
            order = _epoch_order(n_train, epoch, d, opts.seed, rng)
            chunks = [order[i : i + micro] for i in range(0, len(order), micro)]
            loss_sum, seen = 0.0, 0
            pending: list[tuple[torch.Tensor, torch.Tensor]] = []
            step = 0
            for ci, (x, y) in enumerate(_batches(ds.train, pp, chunks, workers, pin)):
                if opts.augment:
                    x = _augment(x, gen)
                pending.append((x.to(device, non_blocking=pin), y.to(device, non_blocking=pin)))
                if len(pending) < opts.accum_steps and ci < len(chunks) - 1:
                    continue
                for g in opt.param_groups:
                    g["lr"] = _lr_at(epoch * steps_per_epoch + step, total, warmup, opts.lr)
                ls, nb = train_step(net, opt, pending, opts.label_smoothing, amp_dtype, scaler)
                loss_sum, seen, step, pending = loss_sum + ls, seen + nb, step + 1, []
                if progress:  # per-batch progress (a terminal's bar and its ETA)
                    progress("batch", {"epoch": epoch, "step": step, "steps": steps_per_epoch})
            loss_sum, seen_f = _all_sum([loss_sum, float(seen)], d, device)
            acc = evaluate(model, ds.val, pp, device, dist=d, amp_dtype=amp_dtype)
            history.append({"epoch": epoch, "loss": loss_sum / max(1.0, seen_f), "val_accuracy": acc})
            if acc > best_acc:
                best_acc, best_epoch = acc, epoch
                manifest.training = {
                    "best_val_accuracy": acc,
                    "best_epoch": epoch,
                    "epochs": epochs,
                    "train_images": n_train,
                    "val_images": len(ds.val),
                    "seed": opts.seed,
                    "lr": opts.lr,
                    "batch_size": opts.batch_size,
                    "seconds": round(time.perf_counter() - t0, 1),
                    "processes": d.world_size,
                    "accum_steps": opts.accum_steps,
                    "precision": precision,
                }
                if d.main:
                    try:
                        save_checkpoint(  # copies the plain module's weights to the CPU; the model stays where it is
                            partial,
                            model,
                            manifest,
                            {"optimizer": opt.state_dict(), "epoch": epoch, "best_val_accuracy": acc},
                        )
                    except (OSError, RuntimeError) as e:  # a full disk: torch's zip writer raises RuntimeError
                        raise PartialNotWritten(str(e).strip().splitlines()[0][:120] if str(e).strip() else
                                                type(e).__name__) from None
                saved = True
            if progress:
                progress("epoch", {"epoch": epoch, "loss": loss_sum / max(1.0, seen_f), "val_accuracy": acc, "best": best_acc})
    except KeyboardInterrupt:
        if not d.main:
            raise VitdeployError(f"rank {d.rank}: interrupted", exit_code=130) from None
        if saved:
            raise VitdeployError(
                f"interrupted: {out} is unchanged; the best epoch so far ({best_epoch + 1}, val top-1 {best_acc:.2%}) "
                f"is in {partial} (rename it, or continue with --resume {partial})",
                exit_code=130,
            ) from None
        raise VitdeployError(f"interrupted before an epoch ended: {out} is unchanged", exit_code=130) from None
    except PartialNotWritten as e:
        if d.main:  # a full disk: this run's partial best goes too, so the failed command leaves nothing behind
            partial.unlink(missing_ok=True)
        raise VitdeployError(f"could not write {partial} ({e}); nothing written, {out} is unchanged: "
                             "free some space and run again") from None
    if d.main and saved:
        os.replace(partial, out)
    elif d.main and opts.resume and Path(opts.resume).resolve() != out.resolve():
        # no epoch beat the resumed checkpoint's best: that checkpoint is still the result
        with atomic_path(out) as tmp:
            shutil.copyfile(opts.resume, tmp)
    if d.active:
        import torch.distributed as td

        td.barrier()
    return TrainResult(out, best_acc, best_epoch, epochs, time.perf_counter() - t0, history, ds.skipped,
                       d.world_size, precision, d.rank)


def _resize_pos_embed(pos: torch.Tensor, cfg: ViTConfig, length: int) -> torch.Tensor:
    """Interpolate learned position embeddings to a new patch grid (fine-tuning at another size). The embeddings of
    the prefix tokens (class, distillation, registers: whatever the table holds beyond the grid) are kept as they
    are; a table without them (timm's no_embed_class) is all grid."""
    gh, gw = cfg.grid_size
    prefix = length - gh * gw
    cls, grid = pos[:, :prefix], pos[:, prefix:]
    n = grid.shape[1]
    side = int(math.isqrt(n))
    if prefix < 0 or side * side != n:
        raise VitdeployError("cannot resize position embeddings of a non-square grid; keep the source image size")
    g = grid.reshape(1, side, side, -1).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=(gh, gw), mode="bicubic", align_corners=False)
    return torch.cat([cls, g.permute(0, 2, 3, 1).reshape(1, gh * gw, -1)], dim=1)
