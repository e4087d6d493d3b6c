"""The range of every numeric option, in one table: the CLI puts each on its Typer option (shown in --help as
``[1<=x<=2]`` and refused with exit 2 before any work, cli/options.py), and library callers get the same bounds
from ``check_range``.

Why each ceiling (issue 31): values past them were accepted and then ran for ever, forked hundreds of processes or
crashed. ``--workers 99999999999999999999`` forked 852 processes in 30 s; ``--threads 100000`` made verify crash
with SIGSEGV and ONNX Runtime hang (64 intra-op threads on 2 cores already take 1 s per call of a 32x32 model, so
threads and worker processes stop at the cores this process may use); ``--max-batch 99999999999999999999`` wrote a
config.pbtxt Triton rejects; ``--epochs/--iterations 1e20`` never end; ``--weight-decay inf`` wrote NaN weights;
``--seed -1`` reached numpy's seed and failed with its exception.

The sizes read from files have ceilings here too (issue 37): a foreign processor's or ``--image-size``'s input size
(``image_size``), a labels file's bytes (``text_file_bytes``), a weights file's bytes; past them, one line before
the allocation.
"""

from __future__ import annotations

import math
from typing import TypedDict

from vitdeploy.core.errors import UsageError
from vitdeploy.core.host import available_cores


class Bounds(TypedDict):
    """Inclusive bounds, named as Typer's ``typer.Option(min=..., max=...)`` takes them."""

    min: int | float
    max: int | float


CORES = available_cores()
SEED_MAX = 2**32 - 1  # numpy's and torch's seeds: 0 .. 2**32 - 1
BATCH_MAX = 4096  # images per model call, and TensorRT/Triton profile batches (int32 in config.pbtxt, far below)

RANGES: dict[str, Bounds] = {
    # processes and threads: never more than the cores this process may run on
    "threads": {"min": 1, "max": CORES},
    # DataLoader processes per training process: decoding waits on files too, so a few more than the cores (as
    # torch's own warning allows), never thousands; at least 4, so a process pinned to one core may still use 2
    "train_workers": {"min": 0, "max": max(4, 2 * CORES)},
    "reader_threads": {"min": 1, "max": 64},  # infer's decoding threads (I/O-bound: may exceed the cores)
    # sizes
    "batch": {"min": 1, "max": BATCH_MAX},
    "engine_batch": {"min": 1, "max": BATCH_MAX},
    "images": {"min": 1, "max": 1_000_000},  # images sampled for calibration or a numerics scan
    "references": {"min": 1, "max": 1000},
    "top_k": {"min": 1, "max": 100_000},
    "shard_size": {"min": 1, "max": 10_000_000},  # images per Parquet shard of infer -o DIR/ (the driver holds one)
    "actors": {"min": 1, "max": 4096},  # Ray actors running the model (infer --actors)
    "image_size": {"min": 1, "max": 4096},
    "patch_size": {"min": 1, "max": 1024},
    "accum_steps": {"min": 1, "max": 4096},
    "opset": {"min": 17, "max": 99},  # stages.export.check_opset narrows the top to what the installed onnx reads
    "dla_core": {"min": 0, "max": 1},  # Orin and Xavier have DLA cores 0 and 1
    "workspace_gib": {"min": 0.0, "max": 1024.0},
    # time
    "epochs": {"min": 1, "max": 100_000},
    "warmup_calls": {"min": 0, "max": 100_000},
    "iterations": {"min": 1, "max": 1_000_000},
    "seconds": {"min": 0.0, "max": 86_400.0},
    # numbers of the optimizer and the checks
    "seed": {"min": 0, "max": SEED_MAX},
    "lr": {"min": 0.0, "max": 10.0},
    "weight_decay": {"min": 0.0, "max": 10.0},
    "fraction": {"min": 0.0, "max": 1.0},
    "points": {"min": 0.0, "max": 100.0},
    "factor": {"min": 1.0, "max": 1e6},
    # sizes of files read (bytes), refused before they are read (issue 37: --labels /dev/zero held 4.9 GB)
    "text_file_bytes": {"min": 1, "max": 64 << 20},  # --labels, --classes, --templates files, a shard index
    "weights_file_bytes": {"min": 1, "max": 1 << 40},  # one foreign weights file or shard (ViT-22B bf16: 44 GB)
    # the architecture and preprocessing read from a foreign model's files (core/schema.py; issue 37, P1/P2)
    "heads": {"min": 1, "max": 1024},  # attention heads (ViT-22B has 48); 0 divided by zero, negatives built nothing
    "width": {"min": 1, "max": 65_536},  # hidden_size / embed_dim / MLP width (ViT-22B: 6144 wide, MLP 24576)
    "depth": {"min": 1, "max": 1024},  # blocks
    # LayerNorm's eps is added to a variance: above 0 (0 divides by zero on a constant token, NaN/negative give NaN)
    # and at most 1 (real models use 1e-12 .. 1e-5; larger flattens every activation)
    "ln_eps": {"min": 0.0, "max": 1.0},
    # the eval resize is input_size / crop_pct: timm's and transformers' models use 0.875 .. 1.0. Below 0.25 the
    # resize grows with 1 / crop_pct squared (1e-4 asked a 2.2-megapixel side and died in MemoryError; 0.002 took
    # 2.6 GB per image); above 1 the resize is smaller than the crop and the rest is padding, never above 2
    "crop_pct": {"min": 0.25, "max": 2.0},
    # rescale_factor multiplies the 0..255 pixel values: transformers writes 1/255; 0 or NaN makes every image one
    # constant, past 1 saturates every normalization
    "rescale": {"min": 1e-6, "max": 1.0},
    # rotary temperature (timm: 10000, DINOv3: 100): a base raised to fractional powers, so above 1 and finite
    "rope_temperature": {"min": 1.0, "max": 1e9},
    "classes": {"min": 0, "max": 1_000_000},  # a head's classes, as id2label / label_names count them
    # a zero-shot import's text tower (issue 40, G): its sizes come from the pair's config and are checked here before
    # anything is allocated (an open_clip context_length of 10**9 asked 256 GB for its position embeddings). The
    # context: a prompt is at least its text and an end token; real towers read 64 (SigLIP) .. 77 (CLIP) .. 512
    # tokens. The vocabulary: Gemma's (SigLIP 2) has 256k entries.
    "context_length": {"min": 2, "max": 8192},
    "vocab_size": {"min": 2, "max": 1 << 21},
    # classes x templates encoded by one import: 100,000 classes x open_clip's 80 templates (8M) fit; past 10M the
    # text tower alone runs for hours on a CPU and the class list is no longer a list of names
    "prompts": {"min": 1, "max": 10_000_000},
}


def bounds(idea: str) -> Bounds:
    """The range of one idea (KeyError for an idea the table lacks: every numeric option has one)."""
    return RANGES[idea]


def range_message(option: str, value: object, b: Bounds) -> str:
    """The one wording of an out-of-range value, for the CLI's refusal and ``check_range`` alike."""
    lo, hi = b["min"], b["max"]
    try:
        v = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        kind = "a whole number" if isinstance(lo, int) and isinstance(hi, int) else "a number"
        return f"{option} takes {kind} from {lo} to {hi}, not {value!r}"
    if math.isnan(v):
        return f"{option} must be a number from {lo} to {hi}, not {value}"
    if v < lo:
        return f"{option} must be at least {lo}, not {value}"
    if v > hi:
        return f"{option} must be at most {hi}, not {value}"
    return f"{option} takes a number from {lo} to {hi}, not {value!r}"


def check_range(option: str, value: int | float | None, idea: str) -> None:
    """Refuse (UsageError, exit 2) a value outside the idea's range; None (the default) passes."""
    if value is None:
        return
    b = RANGES[idea]
    if not (b["min"] <= value <= b["max"]):  # NaN fails both comparisons
        raise UsageError(range_message(option, value, b))


# The largest gallery a bundle ships (bundle --gallery): its vectors as float16, 1M x 128-d. run.py searches it on the
# device with numpy alone (a FAISS file needs faiss), in chunks of a memory map; past this size a device should query
# an index with faiss instead of an exact search over every vector for every image.
GALLERY_BYTES_MAX = 1_000_000 * 128 * 2  # 256 MB
