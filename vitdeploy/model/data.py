"""Image folders and the embedded digits set, decoded once through the one preprocessing path."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from PIL import Image

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.preprocess import ImageReadError, Preprocess, list_images, load_image, resize_crop, to_array
from vitdeploy.core.text import printable_list

DIGITS_NAME = "digits"
DIGITS_LABELS = [str(i) for i in range(10)]
DIGITS_VAL_FRACTION = 0.2  # the split in model/digits_split.py: these, and scikit-learn's train_test_split
DIGITS_SPLIT_SEED = 0


@dataclass
class Split:
    """Resized uint8 RGB images (HWC, the preprocessing's resize/crop already applied) and labels."""

    images: list[np.ndarray]
    labels: np.ndarray
    paths: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.images)

    def arrays(self, pp: Preprocess, idx: Sequence[int] | np.ndarray | None = None) -> np.ndarray:
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


def _digits_csv() -> Path | None:
    """The CSV file that scikit-learn's ``load_digits`` reads, found without importing scikit-learn."""
    import importlib.util

    spec = importlib.util.find_spec("sklearn")  # a top-level package is found, not run
    for folder in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(folder) / "datasets" / "data" / "digits.csv.gz"
        if path.is_file():
            return path
    return None


def digits_images() -> tuple[list[Image.Image], np.ndarray]:
    """scikit-learn's 1,797 handwritten digit scans (8x8, 17 grey levels) as 8-bit grey images.

    Read from the file scikit-learn ships, as its ``load_digits`` reads it: importing scikit-learn (it imports
    SciPy) cost 0.7 CPU-s, ten times the reading (``tests/test_digits.py`` compares the two)."""
    path = _digits_csv()
    if path is None:  # a scikit-learn that keeps its data elsewhere: ask it
        from sklearn.datasets import load_digits

        d = load_digits()
        pixels, target = d.images, d.target
    else:
        import gzip

        with gzip.open(path, "rt") as f:
            data = np.loadtxt(f, delimiter=",")
        pixels, target = data[:, :-1].reshape(-1, 8, 8), data[:, -1]
    imgs = [Image.fromarray(np.round(x * (255.0 / 16.0)).astype(np.uint8)) for x in pixels]
    return imgs, target.astype(np.int64)


def digits_split() -> tuple[np.ndarray, np.ndarray]:
    """The fixed stratified train/val split of the digits set (indices): ``model/digits_split.py`` says how it was
    drawn."""
    from vitdeploy.model.digits_split import COUNT, VAL_INDICES

    va = np.asarray(VAL_INDICES, dtype=np.int64)
    return np.setdiff1d(np.arange(COUNT), va), va


def load_digits_dataset(pp: Preprocess) -> Dataset:
    imgs, y = digits_images()
    tr, va = digits_split()

    def split(ix: np.ndarray) -> Split:
        return Split([np.asarray(resize_crop(imgs[i].convert("RGB"), pp)) for i in ix], y[ix], [f"digits[{i}]" for i in ix])

    return Dataset(split(tr), split(va), list(DIGITS_LABELS), DIGITS_NAME)


def write_digits(out_dir: str | Path) -> tuple[int, int]:
    """Write the digits set as an ImageFolder (train/, val/) of PNG files; returns the counts.

    Written in a folder beside ``out_dir`` and moved into place when complete, so a run killed midway leaves no
    half set (the next run removes its leftovers)."""
    import os
    import shutil

    from vitdeploy.core.errors import UsageError
    from vitdeploy.core.fileio import temp_dir_beside

    out = Path(out_dir)
    if out.exists() and not out.is_dir():
        raise UsageError(f"{out} is a file: give a folder to write the dataset into")
    for sub in ("train", "val"):
        if (out / sub).exists():
            raise UsageError(f"{out / sub} exists: write the dataset to a new folder")
    imgs, y = digits_images()
    tr, va = digits_split()
    tmp = temp_dir_beside(out)
    try:
        for sub, ix in (("train", tr), ("val", va)):
            for i in ix:
                d = tmp / sub / DIGITS_LABELS[y[i]]
                d.mkdir(parents=True, exist_ok=True)
                imgs[i].save(d / f"{i:04d}.png")
        if not out.exists():
            os.replace(tmp, out)
        else:
            for sub in ("train", "val"):
                os.replace(tmp / sub, out / sub)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return len(tr), len(va)


def scan_image_folder(root: Path) -> tuple[list[str], list[tuple[Path, int]]]:
    """Classes (sorted sub-folder names) and (file, class index) pairs of an ImageFolder."""
    classes = sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    items = [(f, ci) for ci, c in enumerate(classes) for f in list_images(root / c)]
    return classes, items


@dataclass
class LabeledImages:
    """The images of a folder and, when its class folders are all among the given names, their labels."""

    root: Path  # the folder read: its val/ when it has train/ and val/
    files: list[Path]
    labels: list[int] | None  # per file, an index into the names; None: not labeled by those names
    notes: list[str] = field(default_factory=list)
    classes: list[str] = field(default_factory=list)  # the names the labels index


def read_labeled_folder(
    root: str | Path, names: Sequence[str] | None, require: bool = False, of: str = "the model's labels"
) -> LabeledImages:
    """The one reader of labeled folders (verify, the accuracy guard, training's val/ split).

    An ImageFolder (one sub-folder per class, or its val/ split) whose class folders are all
    among ``names`` is labeled: each file gets the index of its folder's name. Anything else
    (loose images, or a class folder not among the names) is read as unlabeled images, with a
    note naming the unknown folders; with ``require`` (where accuracy is the point) that is an
    error naming them instead. ``names`` None: the folder's own class folders label it (an embedding model has no
    classes: its kNN accuracy is measured on the folder's).
    """
    r = Path(root)
    if not r.is_dir():
        from vitdeploy.core.folders import not_a_folder

        raise VitdeployError(f"{r}: {not_a_folder(r)} of images: pass a folder with one sub-folder per class")
    notes: list[str] = []
    if (r / "val").is_dir() and (r / "train").is_dir():
        notes.append(f"{r} has train/ and val/: reading val/")
        r = r / "val"
    classes, items = scan_image_folder(r)
    if names is None:
        names = classes
    loose = [p for p in list_images(r) if p.parent == r]
    if not items or loose:
        if require:
            raise VitdeployError(f"{r} holds no images in class sub-folders only: expected {r}/<class>/<image files>")
        files = list_images(r)
        if not files:
            raise VitdeployError(f"{r}: no image files in it")
        return LabeledImages(r, files, None, notes)
    unknown = [c for c in classes if c not in names]
    if unknown:
        listed = f"{printable_list(unknown[:5])}{', …' if len(unknown) > 5 else ''}"
        if require:
            raise VitdeployError(
                f"{r}: class folder(s) {listed} are not among {of} ({printable_list(list(names)[:10])}"
                f"{', …' if len(names) > 10 else ''}): name the folders as {of}"
            )
        notes.append(f"class folders {listed} are not among {of}: agreement only, no accuracy")
        return LabeledImages(r, [p for p, _ in items], None, notes)
    index = {n: i for i, n in enumerate(names)}
    return LabeledImages(r, [p for p, _ in items], [index[classes[ci]] for _, ci in items], notes, list(names))


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


@dataclass
class FolderPlan:
    """An ImageFolder's classes and (file, class index) pairs, read from the folder names alone (nothing decoded).

    ``val``: the pairs of its val/ folder when it has train/ and val/; None when the validation share is drawn from
    ``train`` (``stratified_indices``)."""

    root: Path
    classes: list[str]
    train: list[tuple[Path, int]]
    val: list[tuple[Path, int]] | None


def plan_image_folder(root: str | Path) -> FolderPlan:
    """What ``load_image_folder`` will decode, with its refusals (no such folder, no class sub-folders, one class, a
    val/ class that train/ lacks) made before any image is read: the frozen-feature probe keys its cache on it."""
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
    val_items: list[tuple[Path, int]] | None = None
    if has_split:
        v = read_labeled_folder(r / "val", classes, require=True, of=f"the classes of {r}/train")
        val_items = list(zip(v.files, v.labels or [], strict=True))
    return FolderPlan(r, classes, items, val_items)


def require_every_class(labels: np.ndarray, classes: Sequence[str]) -> None:
    """Refuse a training split in which a class has no readable image (one line naming the classes)."""
    counts = np.bincount(np.asarray(labels, np.int64), minlength=len(classes)) if len(labels) else np.zeros(len(classes), int)
    empty = [classes[i] for i in range(len(classes)) if counts[i] == 0]
    if empty:
        raise VitdeployError(
            f"class folder(s) with no readable image: {', '.join(empty)} — add images or remove the folder"
        )


def load_image_folder(
    root: str | Path,
    pp: Preprocess,
    val_fraction: float = 0.1,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    decode: Callable[[Sequence[tuple[Path, int]]], tuple[Split, list[tuple[str, str]]]] | None = None,
) -> Dataset:
    """An ImageFolder (or train/ + val/ of them), decoded and resized once.

    Unreadable files are skipped and listed; a class left with no readable image is an error. ``decode`` reads the
    (file, class) pairs (default: here, one after another; training passes one that decodes in DataLoader workers).
    """
    if decode is None:
        def decode(items: Sequence[tuple[Path, int]]) -> tuple[Split, list[tuple[str, str]]]:
            return _decode(items, pp, progress)

    plan = plan_image_folder(root)
    train, skipped = decode(plan.train)
    require_every_class(train.labels, plan.classes)
    if plan.val is not None:
        val, vskipped = decode(plan.val)
        skipped += vskipped
    else:
        train, val = _stratified_split(train, val_fraction, seed)
    return Dataset(train, val, plan.classes, plan.root.name, skipped)


def stratified_indices(labels: np.ndarray, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """The seeded per-class train/val draw of a folder without val/ (indices into ``labels``, each sorted): a class's
    share ``val_fraction`` (at least one image of a class that has two) goes to val."""
    rng = np.random.default_rng(seed)
    tr, va = [], []
    for c in np.unique(labels):
        ix = np.flatnonzero(labels == c)
        rng.shuffle(ix)
        n_val = int(round(len(ix) * val_fraction)) if len(ix) > 1 else 0
        n_val = max(1, n_val) if len(ix) > 1 else 0
        va += ix[:n_val].tolist()
        tr += ix[n_val:].tolist()
    return sorted(tr), sorted(va)


def _stratified_split(s: Split, val_fraction: float, seed: int) -> tuple[Split, Split]:
    tr, va = stratified_indices(s.labels, val_fraction, seed)

    def sub(ix: list[int]) -> Split:
        return Split([s.images[i] for i in ix], s.labels[ix], [s.paths[i] for i in ix])

    return sub(tr), sub(va)
