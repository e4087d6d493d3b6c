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
# Beyond KEEP_BYTES, the arrays of this many leading items are still kept (the check after a calibration).
KEEP_FIRST = 64


@dataclass
class _Cache:
    """Decoded rows (item index, name, array, label) and skipped files (index, name, why) of the leading
    ``covered`` items, for one preprocessing."""

    rows: list[tuple[int, str, np.ndarray, int | None]] = field(default_factory=list)
    skipped: list[tuple[int, str, str]] = field(default_factory=list)
    covered: int = 0
    have: set[int] = field(default_factory=set)


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
    classes: list[str] | None = None  # the class names ``labels`` index, where a labeled folder gave them
    _kept: dict[str, _Cache] = field(default_factory=dict, repr=False)
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
    def labeled(cls, root: str | Path, names: Sequence[str] | None, require: bool = False) -> ImageSet:
        """An ImageFolder (or its val/ split) labeled by the model's class names (None: by its own class folders,
        for an embedding model's kNN); with ``require`` an unlabeled folder is refused (accuracy is the point),
        otherwise it is read unlabeled with a note."""
        from vitdeploy.model.data import read_labeled_folder

        r = Path(root)
        if r.is_file():
            return cls([r], str(r))
        folder = read_labeled_folder(r, None if names is None else list(names), require=require)
        return cls(list(folder.files), str(folder.root), folder.labels, notes=list(folder.notes),
                   classes=folder.classes if folder.labels is not None else None)

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
        """Batches in item order (unreadable files reported in ``Batch.skipped`` and in ``self.skipped``).

        Decoded arrays are kept (all of them while the set fits KEEP_BYTES, else the first KEEP_FIRST items), so a
        later pass with the same preprocessing, or over ``head(n)``, is served from memory: nothing decodes twice.
        """
        key = repr(pp)
        cache = self._kept.setdefault(key, _Cache())
        if cache.covered >= len(self.items):
            yield from self._from_cache(cache, batch_size, progress)
            return
        fits = len(self.items) * 3 * pp.input_size[0] * pp.input_size[1] * 4 <= KEEP_BYTES
        keep_upto = len(self.items) if fits else KEEP_FIRST
        index = {id(it): i for i, it in enumerate(self.items)}
        self.skipped = []
        consumed = 0
        for b in iter_batches(self.items, pp, batch_size, labels=self.labels, loader=_load):
            self.decoded += len(b.paths) + len(b.skipped)
            self.skipped += [(str(p), why) for p, why in b.skipped]
            idx = [index[id(p)] for p in b.paths]
            if self.names is not None:  # in-memory items: name them in reports
                b.paths = [Path(self.name_of(i)) for i in idx]
            for j, i in enumerate(idx):
                if cache.covered <= i < keep_upto and i not in cache.have:
                    cache.have.add(i)
                    cache.rows.append((i, str(b.paths[j]), b.array[j], b.labels[j] if b.labels is not None else None))
            for p, why in b.skipped:
                i = index.get(id(p), -1)
                if cache.covered <= i < keep_upto and i not in cache.have:
                    cache.have.add(i)
                    cache.skipped.append((i, str(p), why))
            consumed = max([consumed, *[i + 1 for i in idx], *[index.get(id(p), -1) + 1 for p, _ in b.skipped]])
            if progress:
                progress(len(b.paths) + len(b.skipped))
            yield b
            cache.covered = max(cache.covered, min(consumed, keep_upto))

    def _from_cache(self, cache: _Cache, batch_size: int,
                    progress: Callable[[int], None] | None) -> Iterator[Batch]:
        rows = sorted((r for r in cache.rows if r[0] < len(self.items)), key=lambda r: r[0])
        self.skipped = [(p, why) for i, p, why in sorted(cache.skipped) if i < len(self.items)]
        first = True
        for k in range(0, len(rows), batch_size):
            chunk = rows[k : k + batch_size]
            b = Batch([Path(r[1]) for r in chunk], np.stack([r[2] for r in chunk]),
                      [int(r[3] or 0) for r in chunk] if self.labels is not None else None,
                      [(Path(p), why) for p, why in self.skipped] if first else [])
            first = False
            if progress:
                progress(len(b.paths) + len(b.skipped))
            yield b
        if first and self.skipped:
            yield Batch([], np.empty((0,), np.float32), [] if self.labels is not None else None,
                        [(Path(p), why) for p, why in self.skipped])

    def head(self, n: int) -> ImageSet:
        """The first ``n`` items as a set of their own; arrays decoded for this set are shared, not decoded again."""
        sub = ImageSet(self.items[:n], self.source, self.labels[:n] if self.labels is not None else None,
                       self.names[:n] if self.names is not None else None, notes=list(self.notes))
        for key, c in self._kept.items():
            rows, skipped = [r for r in c.rows if r[0] < n], [s for s in c.skipped if s[0] < n]
            sub._kept[key] = _Cache(rows, skipped, min(c.covered, n), {r[0] for r in rows} | {s[0] for s in skipped})
        return sub

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
