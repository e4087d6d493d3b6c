"""A bundle reads only itself: the rule for every path its manifest.json names.

The same rule holds for every folder a file names files in: a Hugging Face sharded index (``weight_map``) names its
shards inside its own folder (model/sources.py passes ``inside`` and ``fix`` for its wording).

A bundle is handed from one person to another, so its manifest is untrusted input: an entry such as ``/usr``,
``../x``, a FIFO or ``/dev/zero`` must not make ``vitdeploy info`` read outside the folder, for ever, or until memory
runs out. The bundle's run.py (``bundle_file``/``read_bundle_bytes``, stdlib only: it cannot import vitdeploy) and
build_engine.sh (``entry_ok``) apply the same rule with the same limits; tests/test_bundle_paths.py holds them to it.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from vitdeploy.core.errors import UnreadableArtifact

MAX_BYTES = 8 << 30  # a model, engine or array (ViT-H FP32 is 2.5 GB); the same in run.py and build_engine.sh
MAX_TEXT_BYTES = 64 << 20  # manifest.json, labels.txt


def bundle_file(root: Path, rel: object, what: str = "manifest.json lists", limit: int = MAX_BYTES,
                inside: str = "this bundle", fix: str = "copy the bundle again", within: Path | None = None) -> Path:
    """The file ``rel`` names inside bundle ``root``, or UnreadableArtifact in one line naming the entry: an absolute
    or ../ path, a path out of the bundle (also through a symlink), anything but a regular file, a file over
    ``limit`` bytes. Nothing is opened: a FIFO or a device is refused by its type. ``inside`` names the folder and
    ``fix`` the remedy in the message (another folder than a bundle: a sharded index's); ``within``: a folder above
    ``root`` its symlinks may lead into (the Hugging Face cache's blobs beside a snapshot), ``root`` by default."""
    name = repr(rel) if not isinstance(rel, str) else repr(rel.encode("unicode_escape").decode("ascii"))
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel \
            or ".." in rel.split("/"):
        raise UnreadableArtifact(f"{what} {name}: not a relative path inside {inside}: {fix}")
    here = root.resolve()
    try:
        real = (here / rel).resolve()
        real.relative_to(within.resolve() if within is not None else here)
    except (ValueError, OSError, RuntimeError):
        raise UnreadableArtifact(f"{what} {name}: it leads out of {inside}: {fix}") from None
    try:
        st = os.stat(real)
    except OSError:
        raise UnreadableArtifact(f"{name} is missing from {inside}: {fix}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableArtifact(f"{what} {name}: not a regular file: {fix}")
    if st.st_size > limit:
        raise UnreadableArtifact(f"{what} {name}: {st.st_size} bytes, more than a file of {inside} may hold "
                                 f"({limit}): {fix}")
    return real


def link_root(folder: Path) -> Path:
    """Where a model folder's files may lead through symlinks: the folder itself, or for a snapshot of the Hugging Face
    hub's cache (``models--org--name/snapshots/REV``, whose files link to ``../../blobs/``) the model's cache folder."""
    d = folder.resolve()
    return d.parent.parent if d.parent.name == "snapshots" and (d.parent.parent / "blobs").is_dir() else d


def read_bundle_text(root: Path, rel: str, limit: int = MAX_TEXT_BYTES, what: str = "the bundle's",
                     inside: str = "this bundle", fix: str = "copy the bundle again", within: Path | None = None) -> str:
    """A small text file of the bundle (manifest.json), under the rule above, read through one checked descriptor
    (UnicodeDecodeError for bytes that are no UTF-8: the caller names the file)."""
    path = bundle_file(root, rel, what, limit, inside, fix, within)
    return _read(path, rel, limit, hashing=False, what=what, fix=fix).decode("utf-8")


def bundle_sha256(root: Path, rel: object, limit: int = MAX_BYTES) -> str:
    """SHA-256 of a bundle file under the rule above, streamed (a model is not held in memory)."""
    return _read(bundle_file(root, rel, limit=limit), str(rel), limit, hashing=True).decode("ascii")


def _read(path: Path, rel: str, limit: int, hashing: bool, what: str = "manifest.json lists",
          fix: str = "copy the bundle again") -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:  # swapped between the check and the open
            raise UnreadableArtifact(f"{what} {rel!r}: not a regular file of a bounded size: {fix}")
        h, parts, n = hashlib.sha256(), [], 0
        while block := f.read(1 << 20):
            n += len(block)
            if n > limit:
                raise UnreadableArtifact(f"{what} {rel!r}: it grew past {limit} bytes while read: {fix}")
            if hashing:
                h.update(block)
            else:
                parts.append(block)
    return h.hexdigest().encode() if hashing else b"".join(parts)
