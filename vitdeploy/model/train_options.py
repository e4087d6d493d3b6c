"""What `vitdeploy train` takes and the checks it makes before any work, without torch.

Why a module of its own: the CLI refuses a bad option value (one line, exit 2) before ``model.train`` imports torch
(1.2 CPU-seconds for a usage error otherwise), and the library makes the same checks for its Python callers. One
``check_options`` serves both. An explicit ``--preset`` is looked up in ``model.presets``, which holds the table
without torch.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

from vitdeploy.core.errors import UsageError
from vitdeploy.core.fileio import check_output
from vitdeploy.core.limits import check_range
from vitdeploy.core.task import POOLS

DEFAULT_PRESET = "vit-digits"
PRECISIONS = ("bf16", "fp16", "fp32")
# --probe: a head on the frozen --init backbone's features instead of fine-tuning every weight (model/probe.py)
PROBES = ("linear", "knn")
# Suffixes of the other artifacts: a checkpoint written under one of them would be mistaken for it.
_NOT_CHECKPOINT_SUFFIXES = (".onnx", ".engine", ".plan", ".json", ".txt", ".png", ".jpg")


@dataclass
class TrainOptions:
    preset: str | None = None
    image_size: int | tuple[int, int] | None = None
    patch_size: int | None = None
    pool: str | None = None
    epochs: int | None = None
    batch_size: int = 64  # global: images per optimizer step, over all processes and accumulation steps
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
    precision: str | None = None  # bf16, fp16, fp32; None: bf16 (else fp16) on CUDA, fp32 on a CPU
    workers: int | None = None  # DataLoader worker processes; None: from the core count
    accum_steps: int = 1  # gradient accumulation: micro-batches per optimizer step
    probe: str | None = None  # "linear" | "knn": a head on the frozen --init backbone's features (model/probe.py)


def check_options(opts: TrainOptions) -> None:
    """Refuse impossible values before any work, in one line each (exit 2)."""
    if opts.epochs is not None and opts.epochs < 1:
        raise UsageError(f"--epochs must be at least 1, not {opts.epochs}")
    if opts.batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {opts.batch_size}")
    if not (opts.lr > 0 and math.isfinite(opts.lr)):
        raise UsageError(f"--lr must be a positive number, not {opts.lr}")
    if not opts.weight_decay >= 0:
        raise UsageError(f"--weight-decay must be 0 or more, not {opts.weight_decay}")
    if not 0 <= opts.label_smoothing < 1:
        raise UsageError(f"--label-smoothing must be in [0, 1), not {opts.label_smoothing}")
    if not 0 < opts.val_fraction < 1:
        raise UsageError(f"--val-fraction must be between 0 and 1 (exclusive), not {opts.val_fraction}")
    if not opts.warmup_epochs >= 0:
        raise UsageError(f"warmup_epochs must be 0 or more, not {opts.warmup_epochs}")
    sizes = [opts.image_size] if isinstance(opts.image_size, int) or opts.image_size is None else list(opts.image_size)
    if any(s is not None and s < 1 for s in sizes):
        raise UsageError(f"--image-size must be at least 1, not {opts.image_size}")
    if opts.patch_size is not None and opts.patch_size < 1:
        raise UsageError(f"--patch-size must be at least 1, not {opts.patch_size}")
    if opts.workers is not None and opts.workers < 0:
        raise UsageError(f"--workers must be 0 or more, not {opts.workers}")
    if opts.accum_steps < 1:
        raise UsageError(f"--accum-steps must be at least 1, not {opts.accum_steps}")
    if opts.threads is not None and opts.threads < 1:
        raise UsageError(f"--threads must be at least 1, not {opts.threads}")
    # the ceilings of the CLI's range table, for library callers too (issue 31: a NaN checkpoint from
    # weight_decay=inf, numpy's raw exception for seed=-1, a fork bomb from workers=10**20)
    for option, value, idea in (("--epochs", opts.epochs, "epochs"), ("--batch-size", opts.batch_size, "batch"),
                                ("--weight-decay", opts.weight_decay, "weight_decay"), ("--lr", opts.lr, "lr"),
                                ("--seed", opts.seed, "seed"), ("--workers", opts.workers, "train_workers"),
                                ("--accum-steps", opts.accum_steps, "accum_steps"), ("--threads", opts.threads, "threads")):
        check_range(option, value, idea)
    if opts.precision is not None and opts.precision not in PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, not {opts.precision!r}")
    if opts.probe is not None:
        check_probe_options(opts)
    if opts.preset is not None:
        from vitdeploy.model.presets import get_preset

        get_preset(opts.preset)  # an unknown one raises UnknownPreset, a usage error
    _check_out(Path(opts.out), opts.init)
    _check_side_outputs(opts)


def _check_side_outputs(opts: TrainOptions) -> None:
    """The files train writes beside -o go through the same check (core/outputs.py): a probe's features cache, a
    fine-tuning run's best-so-far checkpoint. Inputs: the --init weights, and --resume unless it names that very
    best-so-far (``--resume ckpt.pth.partial -o ckpt.pth`` continues it, and the run replaces it); a link there to
    the --resume checkpoint is refused like any link to an input."""
    from vitdeploy.core.outputs import check_side_outputs, same_name, side_output_path

    if opts.probe is not None:
        check_side_outputs(opts.out, ["features cache"], [opts.init])
        return
    partial = side_output_path("partial checkpoint", opts.out)
    resume = None if opts.resume is None or same_name(opts.resume, partial) else opts.resume
    check_side_outputs(opts.out, ["partial checkpoint"], [opts.init, resume])



# The options of full fine-tuning (name, field): a probe fits its head on frozen features in one full-batch solve,
# so none of them would do anything; given with --probe they are refused rather than silently ignored.
_FINE_TUNING_ONLY = (("--epochs", "epochs"), ("--lr", "lr"), ("--weight-decay", "weight_decay"),
                     ("--label-smoothing", "label_smoothing"), ("--accum-steps", "accum_steps"),
                     ("--precision", "precision"), ("warmup_epochs", "warmup_epochs"))


def check_probe_options(opts: TrainOptions) -> None:
    """--probe's refusals, before any work (exit 2): an unknown probe, no backbone, and every option it would ignore."""
    if opts.probe not in PROBES:
        raise UsageError(f"--probe must be one of {', '.join(PROBES)}, not {opts.probe!r}")
    if opts.init is None:
        raise UsageError(f"--probe {opts.probe} reads the features of a frozen backbone: pass it with --init (a "
                         "vitdeploy checkpoint, a Hugging Face folder, or a timm state dict with --arch)")
    if opts.resume is not None:
        raise UsageError("--probe fits a new head on a frozen backbone and has nothing to resume: drop --resume")
    for option, value in (("--preset", opts.preset), ("--patch-size", opts.patch_size)):
        if value is not None:
            raise UsageError(f"{option} with --probe: the backbone (--init) keeps its architecture; drop {option}")
    if opts.pool is not None and opts.pool not in POOLS:
        raise UsageError(f"--pool with --probe names the features the head reads: {', '.join(POOLS)}, "
                         f"not {opts.pool!r}")
    defaults = TrainOptions()
    given = [option for option, name in _FINE_TUNING_ONLY if getattr(opts, name) != getattr(defaults, name)]
    if given:
        what = ("fits its head in one full-batch solve, its L2 penalty chosen on val" if opts.probe == "linear"
                else "has no training at all")
        raise UsageError(f"{', '.join(given)} with --probe {opts.probe}: full fine-tuning options, and the probe "
                         f"{what}; drop {'them' if len(given) > 1 else 'it'} (or drop --probe to fine-tune every weight)")


def _check_out(out: Path, init: str | Path | None = None) -> None:
    """The one output check (core.fileio.check_output), after the one rule of train's own: a checkpoint is not
    written under an ONNX or engine name. The --init weights are an input (``--resume X -o X`` is allowed: a
    resumed run continues X, which is replaced only at the end)."""
    if out.suffix.lower() in _NOT_CHECKPOINT_SUFFIXES:
        raise UsageError(f"-o {out}: a checkpoint is a .pth file, not {out.suffix}; pass e.g. -o {out.with_suffix('.pth').name}")
    check_output(out, [init], option="-o")


# --- processes ------------------------------------------------------------------------------------------


@dataclass
class Dist:
    """This process's place in a torchrun job (rank 0 of 1 when not under torchrun)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def dist_from_env(env: dict[str, str] | None = None) -> Dist:
    """RANK/WORLD_SIZE/LOCAL_RANK as torchrun sets them; a plain run is rank 0 of 1."""
    e = os.environ if env is None else env
    try:
        world = int(e.get("WORLD_SIZE", "1"))
        rank = int(e.get("RANK", "0"))
        local = int(e.get("LOCAL_RANK", str(rank)))
    except ValueError:
        raise UsageError("RANK/WORLD_SIZE/LOCAL_RANK must be integers (torchrun sets them)") from None
    return Dist(rank, world, local) if world > 1 else Dist()
