"""Image folders and the embedded digits set, decoded once through the one preprocessing path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from vitdeploy.errors import VitdeployError
from vitdeploy.preprocess import ImageReadError, Preprocess, list_images, load_image, resize_crop, to_array

DIGITS_NAME = "digits"
DIGITS_LABELS = [str(i) for i in range(10)]
DIGITS_VAL_FRACTION = 0.2
DIGITS_SPLIT_SEED = 0


@dataclass
class Split:
    """Resized uint8 RGB images (HWC, the preprocessing's resize/crop already applied) and labels."""

    images: list[np.ndarray]
    labels: np.ndarray
    paths: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.images)

    def arrays(self, pp: Preprocess, idx: Sequence[int] | None = None) -> np.ndarray:
        """Normalised float32 NCHW batch through preprocess.to_array."""
        sel = range(len(self.images)) if idx is None else idx
        return np.stack([to_array(Image.fromarray(self.images[i]), pp) for i in sel])


@dataclass
class Dataset:
    train: Split
    val: Split
    labels: list[str]
    name: str
    skipped: list[tuple[str, str]] = field(default_factory=list)


def digits_images() -> tuple[list[Image.Image], np.ndarray]:
    """scikit-learn's 1,797 handwritten digit scans (8x8, 17 grey levels) as 8-bit grey images."""
    from sklearn.datasets import load_digits

    d = load_digits()
    imgs = [Image.fromarray(np.round(x * (255.0 / 16.0)).astype(np.uint8)) for x in d.images]
    return imgs, d.target.astype(np.int64)


def digits_split() -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified train/val split of the digits set (indices)."""
    from sklearn.model_selection import train_test_split

    _, y = digits_images()
    idx = np.arange(len(y))
    tr, va = train_test_split(idx, test_size=DIGITS_VAL_FRACTION, random_state=DIGITS_SPLIT_SEED, stratify=y)
    return np.sort(tr), np.sort(va)


def load_digits_dataset(pp: Preprocess) -> Dataset:
    imgs, y = digits_images()
    tr, va = digits_split()

    def split(ix: np.ndarray) -> Split:
        return Split([np.asarray(resize_crop(imgs[i].convert("RGB"), pp)) for i in ix], y[ix], [f"digits[{i}]" for i in ix])

    return Dataset(split(tr), split(va), list(DIGITS_LABELS), DIGITS_NAME)


def write_digits(out_dir: str | Path) -> tuple[int, int]:
    """Write the digits set as an ImageFolder (train/, val/) of PNG files; returns the counts."""
    out = Path(out_dir)
    imgs, y = digits_images()
    tr, va = digits_split()
    for sub, ix in (("train", tr), ("val", va)):
        for i in ix:
            d = out / sub / DIGITS_LABELS[y[i]]
            d.mkdir(parents=True, exist_ok=True)
            imgs[i].save(d / f"{i:04d}.png")
    return len(tr), len(va)


def scan_image_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Classes (sorted sub-folder names) and (file, class index) pairs of an ImageFolder."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    items = [(f, ci) for ci, c in enumerate(classes) for f in list_images(root / c)]
    return classes, items


def is_image_folder(root: Path) -> bool:
    """True when root holds class sub-folders with images (or train/ + val/ that do)."""
    if (root / "train").is_dir() and (root / "val").is_dir():
        return True
    try:
        classes, items = scan_image_folder(root)
    except OSError:
        return False
    return len(classes) >= 1 and len(items) > 0


def _decode(
    items: Sequence[tuple[Path, int]], pp: Preprocess, progress: Callable[[int], None] | None
) -> tuple[Split, list[tuple[str, str]]]:
    images, labels, paths, skipped = [], [], [], []
    for path, ci in items:
        try:
            images.append(np.asarray(resize_crop(load_image(path), pp)))
            labels.append(ci)
            paths.append(str(path))
        except ImageReadError as e:
            skipped.append((str(path), str(e)))
        if progress:
            progress(1)
    return Split(images, np.asarray(labels, np.int64), paths), skipped


def load_image_folder(
    root: str | Path,
    pp: Preprocess,
    val_fraction: float = 0.1,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> Dataset:
    """An ImageFolder (or train/ + val/ of them), decoded and resized once.

    Unreadable files are skipped and listed; a class left with no readable image is an error.
    """
    r = Path(root)
    if not r.exists():
        raise VitdeployError(f"data folder {r} does not exist: pass a folder with one sub-folder per class")
    if not r.is_dir():
        raise VitdeployError(f"{r} is not a folder: pass a folder with one sub-folder per class")
    has_split = (r / "train").is_dir() and (r / "val").is_dir()
    classes, items = scan_image_folder(r / "train" if has_split else r)
    if not classes or not items:
        raise VitdeployError(f"{r} holds no images in class sub-folders: expected {r}/<class>/<image files>")
    if len(classes) < 2:
        raise VitdeployError(f"{r} has only one class ({classes[0]}): a classifier needs at least two class folders")
    val_items: list[tuple[Path, int]] = []
    if has_split:
        vclasses, val_items = scan_image_folder(r / "val")
        unknown = sorted(set(vclasses) - set(classes))
        if unknown:
            raise VitdeployError(f"{r}/val has classes that train/ lacks: {', '.join(unknown)}")
        val_items = [(f, classes.index(vclasses[ci])) for f, ci in val_items]
    train, skipped = _decode(items, pp, progress)
    counts = np.bincount(train.labels, minlength=len(classes)) if len(train) else np.zeros(len(classes), int)
    empty = [classes[i] for i in range(len(classes)) if counts[i] == 0]
    if empty:
        raise VitdeployError(
            f"class folder(s) with no readable image: {', '.join(empty)} — add images or remove the folder"
        )
    if has_split:
        val, vskipped = _decode(val_items, pp, progress)
        skipped += vskipped
    else:
        train, val = _stratified_split(train, val_fraction, seed)
    return Dataset(train, val, classes, r.name, skipped)


def _stratified_split(s: Split, val_fraction: float, seed: int) -> tuple[Split, Split]:
    rng = np.random.default_rng(seed)
    tr, va = [], []
    for c in np.unique(s.labels):
        ix = np.flatnonzero(s.labels == c)
        rng.shuffle(ix)
        n_val = int(round(len(ix) * val_fraction)) if len(ix) > 1 else 0
        n_val = max(1, n_val) if len(ix) > 1 else 0
        va += ix[:n_val].tolist()
        tr += ix[n_val:].tolist()

    def sub(ix: list[int]) -> Split:
        ix = sorted(ix)
        return Split([s.images[i] for i in ix], s.labels[ix], [s.paths[i] for i in ix])

    return sub(tr), sub(va)
