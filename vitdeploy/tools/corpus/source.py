"""A corpus's source: the image paths it names, in a fixed order, held compactly, cut into fixed-size partitions.

A source is an image folder (recursive, hidden files and folders left out, in the order ``list_images`` gives: each
folder's entries sorted by name, a sub-folder's images where its name sorts), a ``.txt`` list (one path per line,
relative to the list's folder, in the listed order) or a ``.parquet`` table with a ``path`` column (relative paths
likewise, in the table's order). An image file named itself is one path. An image's id is its position in the
whole listing, so partition ``i`` holds ids ``[i*N, (i+1)*N)`` for ``--shard-size N`` whatever the executor.

90,000 ``PosixPath`` objects take about 45 MB; here a path costs its UTF-8 bytes plus an 8-byte offset (one
``bytearray`` and one ``array('q')``), so 10M paths of 40 bytes take about 480 MB, not 5 GB.
"""

from __future__ import annotations

import hashlib
import os
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.preprocess import IMAGE_EXTENSIONS

LIST_SUFFIXES = (".txt", ".parquet")


@dataclass
class Listing:
    """Paths (as given, joined to their source's folder) and, for an ImageFolder, each path's class."""

    blob: bytearray = field(default_factory=bytearray)
    ends: array = field(default_factory=lambda: array("q"))
    classes: list[str] = field(default_factory=list)  # class names; empty when no source is an ImageFolder
    class_ids: array = field(default_factory=lambda: array("i"))  # per path, -1: none
    names: list[str] = field(default_factory=list)  # the sources, for messages

    def append(self, path: str, cls: int = -1) -> None:
        self.blob += os.fsencode(path)
        self.ends.append(len(self.blob))
        self.class_ids.append(cls)

    def __len__(self) -> int:
        return len(self.ends)

    def path(self, i: int) -> str:
        start = self.ends[i - 1] if i else 0
        return os.fsdecode(bytes(self.blob[start:self.ends[i]]))

    def paths(self, start: int, stop: int) -> list[str]:
        return [self.path(i) for i in range(start, stop)]

    def class_of(self, i: int) -> str | None:
        c = self.class_ids[i]
        return self.classes[c] if c >= 0 else None

    @property
    def has_classes(self) -> bool:
        return bool(self.classes)

    def frozen(self) -> FrozenListing:
        """The listing as numpy arrays, for shipping once through Ray's object store (read there without a copy)."""
        import numpy as np

        return FrozenListing(np.frombuffer(bytes(self.blob), np.uint8), np.frombuffer(self.ends, np.int64).copy(),
                             list(self.classes), np.frombuffer(self.class_ids, np.int32).copy())


@dataclass
class FrozenListing:
    blob: Any  # uint8 array
    ends: Any  # int64 array
    classes: list[str]
    class_ids: Any  # int32 array

    def path(self, i: int) -> str:
        start = int(self.ends[i - 1]) if i else 0
        return os.fsdecode(self.blob[start:int(self.ends[i])].tobytes())

    def class_of(self, i: int) -> str | None:
        c = int(self.class_ids[i])
        return self.classes[c] if c >= 0 else None


def _is_image(name: str) -> bool:
    return os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS


def _walk(folder: str) -> Iterator[tuple[str, int]]:
    """(path, depth) of the images under ``folder`` in ``list_images``' order: entries sorted by name at each level,
    a sub-folder's images in its place, hidden entries left out. One folder's names are held at a time."""
    try:
        with os.scandir(folder) as it:
            entries = sorted((e.name, e.is_dir()) for e in it if not e.name.startswith("."))
    except OSError as e:
        raise VitdeployError(f"{folder}: cannot list it ({e.strerror or e})") from None
    for name, is_dir in entries:
        p = os.path.join(folder, name)
        if is_dir:
            for sub, depth in _walk(p):
                yield sub, depth + 1
        elif _is_image(name) and os.path.isfile(p):
            yield p, 1


def _add_folder(listing: Listing, folder: Path) -> None:
    """An ImageFolder (no image directly inside, one sub-folder per class) gives its paths a class; others do not."""
    start = len(listing)
    top = str(folder)
    class_index: dict[str, int] = {}
    flat = False
    for p, depth in _walk(top):
        cls = -1
        if depth >= 2:
            name = os.path.relpath(p, top).split(os.sep, 1)[0]
            cls = class_index.setdefault(name, len(listing.classes) + len(class_index))
        else:
            flat = True
        listing.append(p, cls)
    if flat or not class_index:  # images at the top: not an ImageFolder, so no path of it has a class
        for i in range(start, len(listing)):
            listing.class_ids[i] = -1
        return
    listing.classes.extend(sorted(class_index, key=class_index.__getitem__))


def _add_txt(listing: Listing, path: Path) -> None:
    base = path.parent
    try:
        with path.open(encoding="utf-8", newline="") as f:
            for n, line in enumerate(f, 1):
                name = line.rstrip("\r\n")
                if not name.strip():
                    continue
                if "\0" in name:
                    raise UsageError(f"{path}, line {n}: a NUL byte in a path; write one path per line")
                listing.append(os.path.join(base, name))
    except UnicodeDecodeError as e:
        raise UsageError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start}); write one path per line in UTF-8") from None


def _add_parquet(listing: Listing, path: Path) -> None:
    from vitdeploy.tools.corpus.deps import need

    pq = need("pyarrow.parquet")
    try:
        pf = pq.ParquetFile(str(path))
    except Exception as e:  # noqa: BLE001 - pyarrow's errors are many kinds; one line names the file
        raise UsageError(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None
    names = pf.schema_arrow.names
    if "path" not in names:
        raise UsageError(f"{path}: no `path` column (its columns: {', '.join(names) or 'none'}); a Parquet source "
                         "needs one column `path` of image paths, relative to its folder")
    base = path.parent
    row = 0
    for batch in pf.iter_batches(columns=["path"], batch_size=65536):
        for v in batch.column(0).to_pylist():
            row += 1
            if not isinstance(v, str) or not v:
                raise UsageError(f"{path}, row {row}, column `path`: {v!r} is not a path; fill it or drop the row")
            listing.append(os.path.join(base, v))


def read_source(inputs: Sequence[str | Path]) -> Listing:
    """The listing of ``inputs`` (folders, .txt or .parquet lists, image files), in the order given."""
    if not inputs:
        raise UsageError("no images given: pass a folder, a .txt list or a .parquet with a `path` column")
    listing = Listing()
    for i in inputs:
        p = Path(i)
        listing.names.append(str(p))
        if not p.exists():
            raise VitdeployError(f"{i}: no such file or folder")
        if p.is_dir():
            _add_folder(listing, p)
        elif p.suffix.lower() == ".txt":
            _add_txt(listing, p)
        elif p.suffix.lower() == ".parquet":
            _add_parquet(listing, p)
        else:
            listing.append(str(p))
    if not len(listing):
        raise VitdeployError(f"no images in {', '.join(map(str, inputs))}: image files end in "
                             f"{' '.join(IMAGE_EXTENSIONS)}")
    return listing


# --- partitions ------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Partition:
    index: int
    start: int  # first id
    stop: int  # one past the last id

    @property
    def size(self) -> int:
        return self.stop - self.start


def partitions(n: int, shard_size: int) -> list[Partition]:
    """``n`` ids cut into partitions of ``shard_size`` (the last one shorter): the same cut on every run."""
    if shard_size < 1:
        raise UsageError(f"--shard-size {shard_size}: must be at least 1")
    return [Partition(i, s, min(s + shard_size, n)) for i, s in enumerate(range(0, n, shard_size))]


def source_hash(listing: Listing, part: Partition) -> str:
    """SHA-256 over the partition's paths, sizes and mtimes: a shard is current while none of its files changed,
    moved in or out. A file gone hashes as gone (its shard is re-made, and lists it as unreadable)."""
    h = hashlib.sha256(f"{part.start}:{part.stop}\n".encode())
    for i in range(part.start, part.stop):
        p = listing.path(i)
        try:
            st = os.stat(p)
            facts = f"{st.st_size}:{st.st_mtime_ns}"
        except OSError:
            facts = "gone"
        h.update(os.fsencode(p) + b"\0" + facts.encode() + b"\n")
    return h.hexdigest()
