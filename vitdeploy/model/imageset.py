"""An image set: which images a command checks, calibrates or verifies on, chosen by one rule.

Polygraphy's ``DataLoader`` idea for image classifiers. An ``ImageSet`` has its items (files, or in-memory images
for the embedded digits), their labels where the folder is labeled, a description of where they came from and the
files that could not be read. It streams batches through the decode pool (core.images) and keeps the decoded arrays
of a small set, so a second pass over it (the check after a calibration, a guard's probes) decodes nothing again.

The one selection rule (``ImageSet.for_model``): the folder the user named; else ``calibration/`` in the working
folder; else, for a model trained on the embedded digits, their validation split; else none (the caller says
what it does without images).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.images import Batch, iter_batches
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import Preprocess, list_images, preprocess_file, preprocess_image

DEFAULT_FOLDER = Path("calibration")
# Decoded arrays kept for a second pass while the set is at most this large (float32 bytes).
KEEP_BYTES = 256 << 20

Item = Any  # a Path, or a PIL image held in memory (the embedded digits)


def _load(item: Item, pp: Preprocess) -> np.ndarray:
    return preprocess_file(item, pp) if isinstance(item, Path) else preprocess_image(item.convert("RGB"), pp)


@dataclass
class ImageSet:
    """Images to run models on, in a fixed order (see the module docstring)."""

    items: list[Item]
    source: str  # a folder, "calibration/", "digits" (described for reports)
    labels: list[int] | None = None  # per item, an index into the model's labels
    names: list[str] | None = None  # how each in-memory item is named in reports
    skipped: list[tuple[str, str]] = field(default_factory=list)  # unreadable files met so far
    notes: list[str] = field(default_factory=list)
    _kept: dict[str, tuple[list[str], np.ndarray, list[int] | None]] = field(default_factory=dict, repr=False)
    decoded: int = 0  # images decoded so far (each at most once while the set is kept)

    # --- constructors (the one selection rule) ----------------------------------------------------------

    @classmethod
    def folder(cls, root: str | Path, limit: int | None = None, seed: int | None = None,
               option: str = "--images") -> ImageSet:
        """The images under ``root`` (recursive, sorted); ``limit`` takes the first ``limit``, or with ``seed`` a
        seeded random sample of that many (kept in folder order)."""
        r = Path(root)
        if not r.exists():
            raise VitdeployError(f"{option} {r}: no such folder of images")
        files = list_images(r)
        if not files:
            raise VitdeployError(f"{option} {r}: no image files in it")
        if limit is not None:
            if limit < 1:
                raise UsageError(f"{option}: the number of images must be at least 1, not {limit}")
            if len(files) > limit:
                if seed is None:
                    files = files[:limit]
                else:
                    pick = np.sort(np.random.default_rng(seed).choice(len(files), limit, replace=False))
                    files = [files[i] for i in pick]
        return cls(list(files), str(r))

    @classmethod
    def labeled(cls, root: str | Path, names: Sequence[str], require: bool = False) -> ImageSet:
        """An ImageFolder (or its val/ split) labeled by the model's class names; with ``require`` an unlabeled
        folder is refused (accuracy is the point), otherwise it is read unlabeled with a note."""
        from vitdeploy.model.data import read_labeled_folder

        r = Path(root)
        if r.is_file():
            return cls([r], str(r))
        folder = read_labeled_folder(r, list(names), require=require)
        return cls(list(folder.files), str(folder.root), folder.labels, notes=list(folder.notes))

    @classmethod
    def digits(cls, limit: int | None = None) -> ImageSet:
        """The embedded digits' validation split, labeled (what a digits model was trained against)."""
        from vitdeploy.model.data import digits_images, digits_split

        imgs, y = digits_images()
        _, val = digits_split()
        idx = list(val[:limit] if limit else val)
        return cls([imgs[i] for i in idx], "digits", [int(y[i]) for i in idx], names=[f"digits/val/{i}" for i in idx])

    @classmethod
    def for_model(cls, manifest: Manifest, images: str | Path | None = None, limit: int | None = None,
                  seed: int | None = None, option: str = "--images") -> ImageSet | None:
        """The one rule: ``images``; else calibration/ here; else the digits for a digits model; else None."""
        if images is not None:
            return cls.folder(images, limit, seed, option)
        if DEFAULT_FOLDER.is_dir() and list_images(DEFAULT_FOLDER):
            s = cls.folder(DEFAULT_FOLDER, limit, seed)
            s.source = f"{DEFAULT_FOLDER}/"
            return s
        if manifest.source.get("dataset") == "digits":
            return cls.digits(limit)
        return None

    # --- reading ----------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.items)

    def name_of(self, i: int) -> str:
        return self.names[i] if self.names is not None else str(self.items[i])

    def batches(self, pp: Preprocess, batch_size: int = 32,
                progress: Callable[[int], None] | None = None) -> Iterator[Batch]:
        """Batches in item order (unreadable files reported in ``Batch.skipped`` and in ``self.skipped``); a set
        read before with the same preprocessing is served from memory."""
        key = repr(pp)
        if key in self._kept:
            paths, arr, labels = self._kept[key]
            for i in range(0, len(paths), batch_size):
                b = Batch([Path(p) for p in paths[i : i + batch_size]], arr[i : i + batch_size],
                          labels[i : i + batch_size] if labels is not None else None)
                if progress:
                    progress(len(b.paths))
                yield b
            return
        keep = len(self.items) * 3 * pp.input_size[0] * pp.input_size[1] * 4 <= KEEP_BYTES
        index = {id(it): i for i, it in enumerate(self.items)}
        kept_paths: list[str] = []
        kept_arrays: list[np.ndarray] = []
        kept_labels: list[int] = []
        self.skipped = []
        complete = True
        for b in iter_batches(self.items, pp, batch_size, labels=self.labels, loader=_load):
            self.decoded += len(b.paths) + len(b.skipped)
            self.skipped += [(str(p), why) for p, why in b.skipped]
            if self.names is not None:  # in-memory items: name them in reports
                b.paths = [Path(self.name_of(index[id(p)])) if id(p) in index else p for p in b.paths]
            if keep and len(b.paths):
                kept_paths += [str(p) for p in b.paths]
                kept_arrays.append(b.array)
                kept_labels += list(b.labels or [])
            if progress:
                progress(len(b.paths) + len(b.skipped))
            try:
                yield b
            except GeneratorExit:
                complete = False
                raise
        if keep and complete and kept_arrays:
            self._kept[key] = (kept_paths, np.concatenate(kept_arrays), kept_labels if self.labels is not None else None)

    def arrays(self, pp: Preprocess, batch_size: int = 64) -> tuple[list[str], np.ndarray, np.ndarray | None]:
        """Every readable image decoded (names, float32 NCHW, labels or None); refused when none can be read."""
        names: list[str] = []
        xs: list[np.ndarray] = []
        ys: list[int] = []
        for b in self.batches(pp, batch_size):
            if len(b.paths):
                names += [str(p) for p in b.paths]
                xs.append(b.array)
                ys += list(b.labels or [])
        if not xs:
            first = f" (first: {self.skipped[0][0]}: {self.skipped[0][1]})" if self.skipped else ""
            raise VitdeployError(f"{self.source}: none of its images can be read{first}")
        return names, np.concatenate(xs).astype(np.float32), (np.asarray(ys, np.int64) if self.labels is not None else None)
