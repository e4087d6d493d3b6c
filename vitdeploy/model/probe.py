"""Probes on frozen features: ``vitdeploy train DATA --init BACKBONE --probe linear|knn``.

Why: fine-tuning updates every weight (hours for a ViT-B on a 2-core CPU), while DINOv2's own evaluations read the
frozen backbone's features once and fit a head on them (facebookresearch/dinov2 ``eval/log_regression.py``,
``eval/linear.py``, ``eval/knn.py``): minutes, most of it the features. The head is then folded into the same ViT as
its classifier, so the result is a plain classifier checkpoint that exports, quantizes and deploys like any other.

The recipe, DINOv2's ``eval/log_regression.py`` in its choose-on-val mode (``--finetune-on-val``):

- **Features**: the frozen backbone (float32, eval mode) on every image through the one preprocessing
  (``core/preprocess``: the eval transform, no augmentation), in batches. Where the backbone has the choice (a class
  token and the final norm over every token) the cache keeps the class token and the mean patch token side by side
  (cls‖mean, DINOv2's ``avgpool=True`` linear input), so cls, mean and cls+mean are slices of one cache; elsewhere
  the backbone's own pooled output (timm's ``forward_head(pre_logits=True)``, with a CLIP projection and L2 norm
  where it has them).
- **Head**: L2-regularised multinomial logistic regression, full batch, L-BFGS in float64. Its objective is the one
  scikit-learn's ``LogisticRegression(C)`` minimises (mean cross-entropy + ||W||² / (2·C·N), bias unpenalised), so
  the two can be held against each other on the same features (``tests/test_feature_probe.py``). C is swept over DINOv2's
  grid (``C_POWER_RANGE``: 10^linspace(-6, 5, 45)), strongest penalty first, each fit warm-starting the next; the
  best val top-1 wins (ties: the stronger penalty, as DINOv2's tracker keeps the first best). Every C is fitted: a
  sweep stopped after some Cs without a better val top-1 stopped at the flat strong-penalty start on a small set. Without ``--pool`` both
  cls and cls+mean are fitted (DINOv2's ``avgpool`` False/True) and the better one is kept. Choosing on val is what
  ``train`` does with its epochs; the val top-1 reported is the one the choice was made on, as DINOv2 reports it.
- **Fold**: logits = W·f + b is the ViT's own head over the chosen pooling (``num_classes`` = the folder's classes,
  ``embed_pool`` = the pooling); the backbone's weights are unchanged.

The features are cached beside the checkpoint (``<out>.features.npz``), keyed by lineage: the backbone's SHA-256
(of the bytes read), the feature model's config and preprocessing, the pooling, and the data folder's file list with
sizes and modification times. A second run with the same key computes no features; a stale cache is recomputed,
said in one line.

``--probe knn`` (tools/knn_probe.py, a layer up, beside checks.metrics' kNN) reads the same cached features and
writes no checkpoint.

Torch is imported where the work starts, so every refusal (options, a folder without classes) comes without it.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import atomic_path
from vitdeploy.core.loaded import SourceReads
from vitdeploy.core.manifest import Manifest, tool_versions
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.core.task import CLASSIFIER, Task, pool_of
from vitdeploy.model.data import (
    DIGITS_LABELS,
    DIGITS_NAME,
    digits_images,
    digits_split,
    plan_image_folder,
    require_every_class,
    stratified_indices,
)
from vitdeploy.model.presets import ViTConfig
from vitdeploy.model.train_options import TrainOptions, check_options, dist_from_env

if TYPE_CHECKING:  # torch is imported where the work starts: every refusal before it comes without it
    import torch

    from vitdeploy.model.checkpoint import Checkpoint
    from vitdeploy.model.vit import VisionTransformer

CACHE_SUFFIX = ".features.npz"
CACHE_VERSION = 1
# DINOv2 eval/log_regression.py: C_POWER_RANGE = torch.linspace(-6, 5, 45), C = 10**power; DEFAULT_MAX_ITER = 1000
C_GRID = tuple(float(10.0**p) for p in np.linspace(-6.0, 5.0, 45))
MAX_ITER = 1000
# L-BFGS stops when the preconditioned gradient's largest entry is below this. Measured on the digits ViT's features
# (near-separable at large C): 1e-6 took 18.6k iterations over the grid, 1e-5 9.4k, 1e-4 2.0k; the objective at the
# largest C was 0.3% and 10% above the 1e-6 optimum, every C's val top-1 within 0.3 points of it.
GRAD_TOL = 1e-5
# the classifiers a probe replaces (model/train.py HEAD_PREFIXES: the class head and a distilled model's second head)
HEAD_PREFIXES = ("head.", "head_dist.")
# the cached pooling when the backbone has the choice: cls, mean and cls+mean are slices of it
SLICED = "cls+mean"

Progress = Callable[[str, dict[str, Any]], None]


def cache_path(out: str | Path) -> Path:
    """Where the features of a run writing ``out`` are kept: beside it, ``<out>.features.npz``."""
    from vitdeploy.core.outputs import side_output_path

    return side_output_path("features cache", out)


# --- the backbone -------------------------------------------------------------------------------------------------


@dataclass
class Backbone:
    """The frozen --init model as the probe reads it: the feature model's config (no head; ``embed_pool`` the cached
    pooling), its weights without any classifier, the preprocessing, and the SHA-256 of the bytes read."""

    source: Checkpoint  # as loaded (resized to --image-size where asked)
    cfg: ViTConfig  # the feature model: num_classes 0
    state: dict[str, torch.Tensor]
    pp: Preprocess
    sha256: str
    where: str
    cached_pool: str  # "cls+mean" (sliceable), "cls" / "mean", or "" (the model's own pooling)
    pools: tuple[str, ...]  # the --pool values this backbone has

    @property
    def own_pool(self) -> str:
        """The name of the backbone's own pooling (core.task.pool_of: cls, avg, map, token_avg …)."""
        return pool_of(self.source.manifest.model)

    def feature_pool(self, pool: str) -> str:
        """The name recorded for features read with ``pool`` ("" : the backbone's own)."""
        return pool or self.own_pool

    def candidates(self, requested: str | None) -> list[str]:
        """The poolings a probe fits: the one asked for; else cls and cls+mean where the cache holds both (DINOv2's
        avgpool False/True), else what the backbone pools."""
        if requested is not None:
            return [requested]
        return ["cls", SLICED] if self.cached_pool == SLICED else [self.cached_pool]

    def select(self, x: np.ndarray, pool: str) -> np.ndarray:
        """The features read with ``pool`` out of the cached ones (a slice of cls‖mean, or the cache itself)."""
        if pool == self.cached_pool:
            return x
        d = self.cfg.embed_dim
        if self.cached_pool == SLICED and pool in ("cls", "mean"):
            return x[:, :d] if pool == "cls" else x[:, d:]
        raise VitdeployError(f"internal: features pooled {self.cached_pool!r} do not hold {pool!r}")


def pool_refusal(pool: str, where: str, own: str, pools: tuple[str, ...]) -> str:
    """The one line refusing a --pool the backbone cannot read: what it pools by itself (SigLIP's MAP head, not the
    mean --pool offers beside it) and the other poolings --pool takes, so the line never calls another pooling its
    own (issue 40: "--pool cls: X has mean" for a MAP model)."""
    takes = f"--pool takes {', '.join(pools)}" if pools else "--pool takes no other pooling"
    return f"--pool {pool}: {where} pools by {own} itself and {takes}; drop --pool to read its own features"


def load_backbone(opts: TrainOptions) -> Backbone:
    """The --init source (any checkpoint ``train --init`` takes), at --image-size where given, with the SHA-256 of the
    bytes read; --pool checked against the poolings it has (exit 2)."""
    from vitdeploy.model.importers import load_any

    assert opts.init is not None
    where = str(opts.init)
    with SourceReads("train --probe") as reads:
        ck = load_any(opts.init, arch=opts.arch, labels=opts.labels)
        if opts.image_size is not None:
            from vitdeploy.model.pos_embed import resize_checkpoint

            size = (opts.image_size, opts.image_size) if isinstance(opts.image_size, int) else tuple(opts.image_size)
            ck, _ = resize_checkpoint(ck, (int(size[0]), int(size[1])), where)
    sha = reads.sha256(opts.init)
    cfg = ViTConfig.from_dict(ck.manifest.model)
    # a projection or an L2 norm after the pooling reads the model's own pooled vector: no other pooling fits them
    pools = () if cfg.proj_dim or cfg.l2_norm else tuple(cfg.embed_pools)
    if opts.pool is not None and opts.pool not in pools:
        raise UsageError(pool_refusal(opts.pool, where, pool_of(ck.manifest.model), pools))
    cached = SLICED if SLICED in pools else (opts.pool or "")
    feat_cfg = cfg.with_(num_classes=0, **({"embed_pool": cached} if cached else {}))
    state = {k: v for k, v in ck.state_dict.items() if not k.startswith(HEAD_PREFIXES)}
    return Backbone(ck, feat_cfg, state, Preprocess.from_dict(ck.manifest.preprocess), sha, where, cached, pools)


def feature_model(bb: Backbone, device: torch.device) -> VisionTransformer:
    from vitdeploy.model.vit import VisionTransformer

    model = VisionTransformer(bb.cfg, weight_init="skip")  # weights loaded next
    missing, unexpected = model.load_state_dict(bb.state, strict=False)
    if missing or unexpected:
        raise VitdeployError(f"{bb.where}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.eval().to(device)


# --- the images ---------------------------------------------------------------------------------------------------


@dataclass
class ImagesPlan:
    """The images a probe reads, before any is decoded: (file or digits index, class) pairs, which are val/ images
    (None: drawn by --val-fraction and --seed after reading), the classes, and the lineage key of the set."""

    name: str
    classes: list[str]
    items: list[tuple[Any, int]]
    is_val: list[bool] | None
    key: dict[str, Any]
    digits: bool = False


def plan_images(data_dir: str | Path | None, init: str | Path | None = None) -> ImagesPlan:
    """The labelled images for the probe: an ImageFolder's class folders (train/ and val/ when it has them), or the
    embedded digits set; a folder without classes is one line (exit 2) saying what to do instead."""
    if data_dir is None:
        tr, va = digits_split()
        _, y = digits_images()
        order = [int(i) for i in np.concatenate([tr, va])]
        return ImagesPlan(DIGITS_NAME, list(DIGITS_LABELS), [(i, int(y[i])) for i in order],
                          [False] * len(tr) + [True] * len(va), {"dataset": DIGITS_NAME, "images": len(order)}, True)
    try:
        plan = plan_image_folder(data_dir)
    except VitdeployError as e:
        emb = f"; for features without labels export the backbone as it is: vitdeploy export {init}" if init else ""
        raise UsageError(f"--probe fits a classifier on labelled images, and {e}{emb}") from None
    items = list(plan.train) + list(plan.val or [])
    is_val = None if plan.val is None else [False] * len(plan.train) + [True] * len(plan.val)
    h = hashlib.sha256()
    root = plan.root.resolve()
    for i, (path, ci) in enumerate(items):
        st = os.stat(path)
        part = "val" if is_val is not None and is_val[i] else "train"
        h.update(f"{Path(path).resolve().relative_to(root)}\t{ci}\t{part}\t{st.st_size}\t{st.st_mtime_ns}\n".encode())
    key = {"folder": str(root), "classes": plan.classes, "images": len(items), "files_sha256": h.hexdigest()}
    return ImagesPlan(plan.root.name, plan.classes, items, is_val, key)


def _image_batches(plan: ImagesPlan, pp: Preprocess, batch: int, workers: int
                   ) -> Iterator[tuple[list[int], np.ndarray, list[tuple[str, str]]]]:
    """(positions in plan.items, float32 NCHW batch, unreadable files) through the one preprocessing."""
    import torch
    from PIL import Image

    from vitdeploy.core.preprocess import to_array

    if plan.digits:  # the embedded set: scikit-learn's scans in memory, by index
        from vitdeploy.core.preprocess import resize_crop

        images, _ = digits_images()
        for start in range(0, len(plan.items), batch):
            idx = list(range(start, min(start + batch, len(plan.items))))
            yield idx, np.stack([to_array(resize_crop(images[plan.items[i][0]].convert("RGB"), pp), pp) for i in idx]), []
        return
    import functools

    from vitdeploy.core.host import die_with_parent
    from vitdeploy.model.train import _as_list, _DecodeFiles

    loader = torch.utils.data.DataLoader(
        _DecodeFiles(plan.items, pp), batch_size=batch, shuffle=False, num_workers=workers, collate_fn=_as_list,
        worker_init_fn=functools.partial(die_with_parent, os.getpid()) if workers else None,
    )
    for part in loader:
        idx, arrays, bad = [], [], []
        for i, arr, why in part:
            if arr is None:
                bad.append((str(plan.items[i][0]), why))
            else:
                idx.append(i)
                arrays.append(to_array(Image.fromarray(arr), pp))
        yield idx, (np.stack(arrays) if arrays else np.zeros((0, 3, *pp.input_size), np.float32)), bad


# --- the features and their cache ---------------------------------------------------------------------------------


@dataclass
class Features:
    """Every readable image's frozen features (float32 [N, D]), class and split, as cached."""

    x: np.ndarray
    labels: np.ndarray
    items: np.ndarray  # per row, its position in the plan's items (ImagesPlan.items: the same while the key is)
    is_val: np.ndarray | None  # per image; None: the split is drawn from the labels (--val-fraction, --seed)
    paths: list[str]
    classes: list[str]
    skipped: list[tuple[str, str]]
    pool: str  # the cached pooling (Backbone.cached_pool)
    cache: Path | None
    computed: bool  # False: read from the cache
    seconds: float = 0.0
    stale: str = ""  # why an earlier cache was recomputed

    def split(self, val_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """Train and val row indices: the val/ folder's images, else the stratified draw ``train`` makes
        (model.data.stratified_indices over the readable images, in folder order)."""
        if self.is_val is not None:
            return np.flatnonzero(~self.is_val), np.flatnonzero(self.is_val)
        tr, va = stratified_indices(self.labels, val_fraction, seed)
        return np.asarray(tr, np.int64), np.asarray(va, np.int64)


def cache_key(bb: Backbone, plan: ImagesPlan) -> dict[str, Any]:
    """What the cached features depend on: the backbone's bytes, the feature model, the preprocessing, the pooling
    and the images (names, classes, sizes and modification times)."""
    return {"version": CACHE_VERSION, "backbone_sha256": bb.sha256, "model": bb.cfg.to_dict(),
            "preprocess": bb.pp.to_dict(), "pool": bb.cached_pool, "data": plan.key}


def _stale_reason(old: dict[str, Any], new: dict[str, Any]) -> str:
    if old.get("version") != new["version"]:
        return "made by another vitdeploy version"
    if old.get("backbone_sha256") != new["backbone_sha256"]:
        return f"made from another backbone (sha256 {str(old.get('backbone_sha256'))[:12]}, now {new['backbone_sha256'][:12]})"
    if old.get("data") != new["data"]:
        return "the images changed (files added, removed or rewritten)"
    if old.get("preprocess") != new["preprocess"]:
        return "the preprocessing changed"
    if old.get("pool") != new["pool"]:
        return "the pooling changed"
    return "the feature model changed"


def _read_cache(path: Path, key: dict[str, Any]) -> tuple[Features | None, str]:
    """The cached features when their key is this run's, else (None, why not); no cache: (None, "")."""
    if not path.is_file():
        return None, ""
    try:
        with np.load(path, allow_pickle=False) as z:
            old = json.loads(str(z["key"]))
            if old != key:
                return None, _stale_reason(old, key)
            is_val = z["is_val"] if bool(z["has_val"]) else None
            return Features(np.asarray(z["features"], np.float32), np.asarray(z["labels"], np.int64),
                            np.asarray(z["items"], np.int64), None if is_val is None else np.asarray(is_val, bool), [str(p) for p in z["paths"]],
                            list(json.loads(str(z["classes"]))), [tuple(s) for s in json.loads(str(z["skipped"]))],
                            str(key["pool"]), path, computed=False), ""
    except Exception as e:  # noqa: BLE001 - a truncated or foreign file is only a cache: it is made again
        return None, f"unreadable ({type(e).__name__})"


def cache_disagreement(f: Features, plan: ImagesPlan, dim: int) -> str:
    """Why cached features whose key is this run's cannot be this run's features ("" when they can): their arrays
    must be what ``compute_features`` makes of ``plan`` with a ``dim``-wide backbone. A key says what the features
    were made from, not that the arrays beside it are whole: an edited or damaged cache used to reach the probe as
    "internal: a 5-d probe for 64-d features", an IndexError, a NaN classifier or "no readable image" (issue 40)."""
    x, n_items = f.x, len(plan.items)
    if x.ndim != 2 or x.shape[1] != dim:
        return f"its features are {'x'.join(map(str, x.shape))}, not {dim}-d rows (the backbone's width)"
    n = len(x)
    if n == 0:
        return "it holds no features"
    for name, arr in (("labels", f.labels), ("items", f.items)):
        if arr.shape != (n,):
            return f"its {name} are {'x'.join(map(str, arr.shape))} for {n} feature rows"
    if not np.isfinite(x).all():
        return "its features hold NaN or Inf"
    if (f.items < 0).any() or (f.items >= n_items).any() or (n > 1 and (np.diff(f.items) <= 0).any()):
        return f"its items do not index the {n_items} images in order"
    if not np.array_equal(f.labels, np.asarray([plan.items[i][1] for i in f.items], np.int64)):
        return "its labels are not the images' classes"
    if f.classes != list(plan.classes):
        return "its classes are not the folder's"
    want_val = None if plan.is_val is None else np.asarray(plan.is_val, bool)[f.items]
    if want_val is None or f.is_val is None:
        if (want_val is None) != (f.is_val is None):
            return "its train/val split is not the folder's"
    elif not np.array_equal(f.is_val, want_val):
        return "its train/val split is not the folder's"
    names = [f"digits[{plan.items[i][0]}]" if plan.digits else str(plan.items[i][0]) for i in f.items]
    if f.paths != names:
        return "its file names are not the images'"
    if n + len(f.skipped) != n_items or not all(len(s) == 2 and all(isinstance(t, str) for t in s) for s in f.skipped):
        return f"it accounts for {n} read + {len(f.skipped)} skipped of the {n_items} images"
    return ""


def _write_cache(path: Path, key: dict[str, Any], f: Features) -> str:
    """Keep the features beside the checkpoint (atomically); a cache that cannot be written is a note, not a failure."""
    try:
        with atomic_path(path) as tmp, open(tmp, "wb") as fh:
            np.savez(fh, key=np.array(json.dumps(key)), features=f.x, labels=f.labels, items=f.items,
                     has_val=np.array(f.is_val is not None), is_val=f.is_val if f.is_val is not None else np.zeros(0, bool),
                     paths=np.array(f.paths, dtype=str), classes=np.array(json.dumps(f.classes)),
                     skipped=np.array(json.dumps(f.skipped)))
    except (OSError, VitdeployError) as e:
        return f"the features cache {path} could not be written ({e}); the next run computes them again"
    return ""


def compute_features(bb: Backbone, plan: ImagesPlan, device: torch.device, batch: int, workers: int,
                     progress: Progress | None = None) -> Features:
    """The frozen backbone's features of every readable image of ``plan``, in batches of ``batch``."""
    import torch

    t0 = time.perf_counter()
    model = feature_model(bb, device)
    n = len(plan.items)
    x = np.zeros((n, bb.cfg.feature_dim), np.float32)
    ok = np.zeros(n, bool)
    skipped: list[tuple[str, str]] = []
    if progress:
        progress("features", {"total": n, "name": bb.source.manifest.name, "image_size": list(bb.cfg.image_size),
                              "pool": bb.feature_pool(bb.cached_pool), "dim": bb.cfg.feature_dim, "device": str(device)})
    done = 0
    with torch.inference_mode():
        for idx, arrays, bad in _image_batches(plan, bb.pp, batch, workers):
            if idx:
                out = model(torch.from_numpy(arrays).to(device)).float().cpu().numpy()
                x[idx], ok[idx] = out, True
            skipped += bad
            done += len(idx) + len(bad)
            if progress:
                progress("features_batch", {"done": done, "total": n})
    bad_rows = ok & ~np.isfinite(x).all(axis=1)
    if bad_rows.any():
        raise VitdeployError(f"{bb.where}: the backbone's features are not finite on {int(bad_rows.sum())} of {n} "
                             "images; check the checkpoint (its weights hold NaN or overflow in float32)")
    labels = np.asarray([ci for _, ci in plan.items], np.int64)
    paths = [f"digits[{p}]" if plan.digits else str(p) for p, _ in plan.items]
    keep = np.flatnonzero(ok)
    is_val = None if plan.is_val is None else np.asarray(plan.is_val, bool)[keep]
    return Features(x[keep], labels[keep], keep.astype(np.int64), is_val, [paths[i] for i in keep], list(plan.classes), skipped,
                    bb.cached_pool, None, computed=True, seconds=time.perf_counter() - t0)


def probe_features(data_dir: str | Path | None, opts: TrainOptions, progress: Progress | None = None
                   ) -> tuple[Features, Backbone, ImagesPlan]:
    """The frozen --init backbone's features of the labelled images (from the cache beside ``opts.out`` when its key
    is this run's; else computed and cached), and the backbone. Every refusal comes before any work."""
    check_options(opts)
    if opts.probe is None:
        raise UsageError("probe_features needs opts.probe (linear or knn)")
    if dist_from_env().active:
        raise UsageError("--probe runs in one process: run it without torchrun")
    plan = plan_images(data_dir, opts.init)  # a folder without classes is refused before the backbone is read
    from vitdeploy.model.train import _device

    device = _device(opts.device)
    if opts.threads:
        import torch

        from vitdeploy.core.host import thread_count

        torch.set_num_threads(thread_count(opts.threads))
    bb = load_backbone(opts)
    path = cache_path(opts.out)
    key = cache_key(bb, plan)
    feats, why = _read_cache(path, key)
    note = f"{path} is stale ({why}): computing the features again" if why else ""
    if feats is not None and (bad := cache_disagreement(feats, plan, bb.cfg.feature_dim)):
        feats, why, note = None, bad, f"{path}: {bad}, though its key is this run's; recomputed"
    if feats is None:
        if note and progress:
            progress("note", {"text": note})
        from vitdeploy.model.train import default_workers

        workers = default_workers(1, device) if opts.workers is None else opts.workers
        feats = compute_features(bb, plan, device, opts.batch_size, workers, progress)
        feats.stale = why
        note = _write_cache(path, key, feats)
        feats.cache = None if note else path
        if note and progress:
            progress("note", {"text": note})
    if len(feats.x) == 0:
        raise VitdeployError(f"{plan.name}: no readable image ({len(feats.skipped)} skipped)")
    # as load_image_folder: every class keeps a readable image among the train images (before a drawn split)
    require_every_class(feats.labels if feats.is_val is None else feats.labels[~feats.is_val], feats.classes)
    return feats, bb, plan


# --- the linear head ----------------------------------------------------------------------------------------------


@dataclass
class LinearFit:
    """A linear head over features: logits = features @ weight.T + bias (float64), the C it was fitted with
    (scikit-learn's inverse L2 strength), and its figures."""

    weight: np.ndarray  # [classes, dim]
    bias: np.ndarray  # [classes]
    C: float
    val_accuracy: float
    train_accuracy: float
    sweep: list[tuple[float, float]] = field(default_factory=list)  # (C, val top-1) in sweep order
    iterations: int = 0
    seconds: float = 0.0

    def logits(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, np.float64) @ self.weight.T + self.bias


def fit_linear(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, num_classes: int,
               grid: tuple[float, ...] = C_GRID, max_iter: int = MAX_ITER) -> LinearFit:
    """L2-regularised multinomial logistic regression on frozen features, C chosen on val (see the module docstring):
    for each C the exact minimiser of scikit-learn's objective, mean cross-entropy + ||W||² / (2·C·N).

    Solved by L-BFGS (float64, as DINOv2's ``train_dtype``) in a preconditioned basis that leaves the objective
    unchanged: the features are centred (the unpenalised bias absorbs the shift) and rotated onto the eigenvectors of
    their scatter matrix (a rotation keeps ||W||), and each direction's weight is scaled by 1/sqrt(s²/4N + 1/CN), the
    inverse square root of its curvature (loss + penalty). Frozen features are badly conditioned: a random-weight
    DINOv2-S's cls+mean features at 112 px spread their per-dimension spread over five decades (std 3e-6 to 0.25).
    Measured there (scripts/bench_probe.py), at the C chosen: this solver's objective 0.386151, scikit-learn's exact
    newton-cholesky 0.386150, the same val top-1 (82.50%) in 3 s instead of 523 s; scikit-learn's lbfgs stops
    unconverged after 1000 iterations at objective 1.42 and 53.6%. The features are not standardised: that would
    change the objective and favour directions of tiny variance, which float rounding, INT8 and FP16 then drown.
    """
    import torch

    t0 = time.perf_counter()
    if len(x_train) == 0 or len(x_val) == 0:
        raise VitdeployError("the linear probe needs train and val images: add images or a val/ folder")
    threads = torch.get_num_threads()
    n, d = np.shape(x_train)
    if n * d * num_classes < 50_000_000:  # small products: a second thread only adds waiting (10x on a busy CPU)
        torch.set_num_threads(1)
    try:
        return _fit_linear(x_train, y_train, x_val, y_val, num_classes, grid, max_iter, t0)
    finally:
        torch.set_num_threads(threads)


def _fit_linear(x_train: np.ndarray, y_train: np.ndarray, x_val: np.ndarray, y_val: np.ndarray, num_classes: int,
                grid: tuple[float, ...], max_iter: int, t0: float) -> LinearFit:
    import torch
    import torch.nn.functional as F

    xt = torch.as_tensor(np.asarray(x_train), dtype=torch.float64)
    mu = xt.mean(0)
    xt = xt - mu
    n, d = xt.shape
    s2, basis = torch.linalg.eigh(xt.T @ xt)  # the scatter's eigenvalues (s², ascending) and eigenvectors
    s2 = s2.clamp_min(0.0)
    z = xt @ basis  # the features in the eigenbasis: the same objective, W = W_z @ basis.T
    zv = (torch.as_tensor(np.asarray(x_val), dtype=torch.float64) - mu) @ basis
    yt = torch.as_tensor(np.asarray(y_train), dtype=torch.long)
    yv = np.asarray(y_val)
    wz = torch.zeros(num_classes, d, dtype=torch.float64)
    b = torch.zeros(num_classes, dtype=torch.float64, requires_grad=True)
    best: tuple[float, float, torch.Tensor, torch.Tensor] | None = None
    sweep: list[tuple[float, float]] = []
    iters = 0
    for c in sorted(grid):  # strongest penalty first: each optimum warm-starts the next, weaker one
        lam = 1.0 / (c * n)
        scale = 1.0 / torch.sqrt(0.25 * s2 / n + lam)  # 1/sqrt(curvature) per direction (softmax's p(1-p) <= 1/4)
        u = (wz / scale).requires_grad_(True)
        zs = z * scale
        opt = torch.optim.LBFGS([u, b], lr=1.0, max_iter=max_iter, tolerance_grad=GRAD_TOL, tolerance_change=1e-10,
                                history_size=20, line_search_fn="strong_wolfe")

        def closure(lam: float = lam, zs: torch.Tensor = zs, scale: torch.Tensor = scale, u: torch.Tensor = u,
                    opt: torch.optim.LBFGS = opt) -> torch.Tensor:
            opt.zero_grad()
            loss = F.cross_entropy(zs @ u.T + b, yt) + 0.5 * lam * ((u * scale) ** 2).sum()
            loss.backward()  # type: ignore[no-untyped-call]
            return loss

        opt.step(closure)  # type: ignore[no-untyped-call]
        iters += int(opt.state[u].get("n_iter", 0))
        with torch.no_grad():
            wz = (u * scale).detach()
            acc = float(((zv @ wz.T + b).argmax(1).numpy() == yv).mean())
        sweep.append((c, acc))
        if best is None or acc > best[1]:
            best = (c, acc, wz.clone(), b.detach().clone())
    assert best is not None
    c, acc, bwz, bb = best
    with torch.no_grad():
        train_acc = float(((z @ bwz.T + bb).argmax(1).numpy() == yt.numpy()).mean())
        w = bwz @ basis.T  # back to the features' own coordinates
        bias = bb - w @ mu  # logits = W (x - mu) + b = W x + (b - W mu)
    return LinearFit(w.numpy(), bias.numpy(), c, acc, train_acc, sweep, iters, time.perf_counter() - t0)


# --- the folded classifier ----------------------------------------------------------------------------------------


def fold_linear(bb: Backbone, pool: str, fit: LinearFit, classes: list[str]) -> VisionTransformer:
    """The backbone with the probe as its classifier: the same weights, ``embed_pool`` the pooling read, the head
    ``fit``'s weight and bias (a distilled backbone's two heads both, so their mean is the probe)."""
    import torch

    from vitdeploy.model.vit import VisionTransformer

    changes: dict[str, Any] = {"num_classes": len(classes)}
    if pool:
        changes["embed_pool"] = pool
    cfg = bb.cfg.with_(**changes)
    if cfg.feature_dim != fit.weight.shape[1]:
        raise VitdeployError(f"internal: a {fit.weight.shape[1]}-d probe for {cfg.feature_dim}-d features")
    model = VisionTransformer(cfg, weight_init="skip")
    state = dict(bb.state)
    head = {"weight": torch.as_tensor(fit.weight, dtype=torch.float32),
            "bias": torch.as_tensor(fit.bias, dtype=torch.float32)}
    for prefix in ("head.", "head_dist.") if cfg.distilled else ("head.",):
        state.update({prefix + k: v.clone() for k, v in head.items()})
    model.load_state_dict(state)
    return model.eval()


@dataclass
class ProbeResult:
    checkpoint: Path | None
    pool: str  # the features the head reads (cls, mean, cls+mean, or the backbone's own pooling's name)
    fit: LinearFit
    features: Features
    fits: dict[str, LinearFit]  # per pooling tried, by its name (as ``pool``)
    seconds: float
    train_images: int
    val_images: int
    folded_max_abs_diff: float  # the folded model's logits vs the probe on val images (a check of the fold)


def train_probe(data_dir: str | Path | None, opts: TrainOptions, progress: Progress | None = None) -> ProbeResult:
    """``train --probe linear``: features (cached), the head chosen on val, folded and written to ``opts.out``
    (atomically, once everything else succeeded)."""
    t0 = time.perf_counter()
    if opts.probe != "linear":
        raise UsageError(f"train_probe fits a linear head (opts.probe='linear'), not {opts.probe!r}")
    feats, bb, plan = probe_features(data_dir, opts, progress)
    tr, va = feats.split(opts.val_fraction, opts.seed)
    if len(va) == 0:
        raise VitdeployError(f"{data_dir}: too few images to hold out a validation split; add images or a val/ folder")
    fits: dict[str, LinearFit] = {}  # by the pooling read ("" : the backbone's own)
    for pool in bb.candidates(opts.pool):
        x = bb.select(feats.x, pool)
        if progress:
            progress("fit", {"pool": bb.feature_pool(pool), "dim": x.shape[1], "grid": len(C_GRID)})
        fits[pool] = fit_linear(x[tr], feats.labels[tr], x[va], feats.labels[va], len(feats.classes))
    pool = max(fits, key=lambda p: fits[p].val_accuracy)  # the first best: cls before cls+mean, as DINOv2 orders them
    fit = fits[pool]
    model = fold_linear(bb, pool, fit, feats.classes)
    diff = _check_fold(model, bb, plan, feats, va, pool, fit)
    manifest = _manifest(bb, pool, fit, feats, len(tr), len(va), data_dir, opts, time.perf_counter() - t0)
    out = Path(opts.out)
    from vitdeploy.model.checkpoint import save_checkpoint

    save_checkpoint(out, model, manifest)
    named = {bb.feature_pool(p): f for p, f in fits.items()}
    return ProbeResult(out, bb.feature_pool(pool), fit, feats, named, time.perf_counter() - t0, len(tr), len(va), diff)


def _check_fold(model: VisionTransformer, bb: Backbone, plan: ImagesPlan, feats: Features, va: np.ndarray, pool: str,
                fit: LinearFit, count: int = 8) -> float:
    """The folded model answers what the probe answers: its logits on a few val images against the head applied to
    their cached features (a folding error is orders of magnitude above the tolerance, float32 rounding far below)."""
    import torch

    rows = va[:count]
    sub = ImagesPlan(plan.name, plan.classes, [plan.items[i] for i in feats.items[rows]], None, plan.key, plan.digits)
    got, ref = [], []
    for idx, arrays, _ in _image_batches(sub, bb.pp, len(rows), 0):
        if idx:
            with torch.inference_mode():
                got.append(model(torch.from_numpy(arrays)).double().numpy())
            ref.append(fit.logits(bb.select(feats.x[rows[idx]], pool)))
    if not got:
        return 0.0
    diff = float(np.abs(np.concatenate(got) - np.concatenate(ref)).max())
    scale = max(1.0, float(np.abs(np.concatenate(ref)).max()))
    if not diff <= 1e-3 * scale:
        raise VitdeployError(f"internal: the folded classifier answers {diff:.3g} away from the probe's logits")
    return diff


def _manifest(bb: Backbone, pool: str, fit: LinearFit, feats: Features, n_train: int, n_val: int,
              data_dir: str | Path | None, opts: TrainOptions, seconds: float) -> Manifest:
    cfg = bb.cfg.with_(num_classes=len(feats.classes), **({"embed_pool": pool} if pool else {}))
    probe = {
        "kind": "linear",
        "features": bb.feature_pool(pool),
        "dim": int(fit.weight.shape[1]),
        "backbone": str(opts.init),
        "backbone_sha256": bb.sha256,
        "C": fit.C,
        "val_top1": fit.val_accuracy,
        "train_top1": fit.train_accuracy,
        "train_images": n_train,
        "val_images": n_val,
        "recipe": "L2 multinomial logistic regression (L-BFGS, float64), C chosen on val over 10^linspace(-6, 5, 45) "
                  "(DINOv2 eval/log_regression.py)",
    }
    m = bb.source.manifest.derive(
        model=cfg.to_dict(), labels=list(feats.classes), preprocess=bb.pp.to_dict(),
        source={"dataset": DIGITS_NAME if data_dir is None else str(Path(data_dir).resolve()), "init": str(opts.init),
                "init_sha256": bb.sha256},
        versions=tool_versions("torch", "numpy"),
    )
    m.training = {"probe": "linear", "best_val_accuracy": fit.val_accuracy, "train_images": n_train,
                  "val_images": n_val, "seed": opts.seed, "seconds": round(seconds, 1),
                  "features_cached": not feats.computed}
    m.extra["task"] = Task(CLASSIFIER, len(feats.classes), probe=probe).to_dict()
    return m
