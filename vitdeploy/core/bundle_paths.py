"""A bundle reads only itself: the rule for every path its manifest.json names.

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


def bundle_file(root: Path, rel: object, what: str = "manifest.json lists", limit: int = MAX_BYTES) -> Path:
    """The file ``rel`` names inside bundle ``root``, or UnreadableArtifact in one line naming the entry: an absolute
    or ../ path, a path out of the bundle (also through a symlink), anything but a regular file, a file over
    ``limit`` bytes. Nothing is opened: a FIFO or a device is refused by its type."""
    name = repr(rel) if not isinstance(rel, str) else repr(rel.encode("unicode_escape").decode("ascii"))
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel \
            or ".." in rel.split("/"):
        raise UnreadableArtifact(f"{what} {name}: not a relative path inside this bundle: copy the bundle again")
    here = root.resolve()
    try:
        real = (here / rel).resolve()
        real.relative_to(here)
    except (ValueError, OSError, RuntimeError):
        raise UnreadableArtifact(f"{what} {name}: it leads out of this bundle: copy the bundle again") from None
    try:
        st = os.stat(real)
    except OSError:
        raise UnreadableArtifact(f"{name} is missing from this bundle: copy the bundle again") from None
    if not stat.S_ISREG(st.st_mode):
        raise UnreadableArtifact(f"{what} {name}: not a regular file: copy the bundle again")
    if st.st_size > limit:
        raise UnreadableArtifact(f"{what} {name}: {st.st_size} bytes, more than a bundle file may hold ({limit}): "
                                 "copy the bundle again")
    return real


def read_bundle_text(root: Path, rel: str, limit: int = MAX_TEXT_BYTES) -> str:
    """A small text file of the bundle (manifest.json), under the rule above, read through one checked descriptor."""
    return _read(bundle_file(root, rel, "the bundle's", limit), rel, limit, hashing=False).decode("utf-8")


def bundle_sha256(root: Path, rel: object, limit: int = MAX_BYTES) -> str:
    """SHA-256 of a bundle file under the rule above, streamed (a model is not held in memory)."""
    return _read(bundle_file(root, rel, limit=limit), str(rel), limit, hashing=True).decode("ascii")


def _read(path: Path, rel: str, limit: int, hashing: bool) -> bytes:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:  # swapped between the check and the open
            raise UnreadableArtifact(f"manifest.json lists {rel!r}: not a regular file of a bounded size: copy the "
                                     "bundle again")
        h, parts, n = hashlib.sha256(), [], 0
        while block := f.read(1 << 20):
            n += len(block)
            if n > limit:
                raise UnreadableArtifact(f"manifest.json lists {rel!r}: it grew past {limit} bytes while read")
            if hashing:
                h.update(block)
            else:
                parts.append(block)
    return h.hexdigest().encode() if hashing else b"".join(parts)
