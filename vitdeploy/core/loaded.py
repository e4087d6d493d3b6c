"""The bytes a command loaded and their SHA-256: lineage records what was converted, not what lies there later.

A command that converts a source (export, import, convert-fp16, calibrate, build-engine, bundle's re-makes) reads
each source file once (``read_hashed``): the SHA-256 comes from the very bytes it parses. A file replaced (a training
run renaming its ``.partial``) or rewritten (a copy from another terminal) while it was read, or before the command
writes its result, is refused in one line naming it (``SourceChanged``), and nothing is written; hashing the file
again after the work would name the new file while the result holds the old weights.

``SourceReads`` collects the reads made inside a ``with`` block (a stage's own loads, also those made deep in an
importer), so the stage can record the source's digest and check, just before it writes, that nothing it read has
changed since.
"""

from __future__ import annotations

import contextvars
import hashlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

from vitdeploy.core.errors import SourceChanged

StatKey = tuple[int, int, int, int]  # device, inode, size, mtime (ns): a rename over it or a write changes it


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def changed_message(path: str | Path, what: str = "") -> str:
    """The one line for a source that changed under a command."""
    during = f" while {what} ran" if what else " while it was being read"
    return (f"{path} changed{during} (replaced or rewritten by another program): nothing written; run the command "
            "again once it is finished")


@dataclass(frozen=True)
class Read:
    """One file read whole: its path as given and resolved, its identity when read and the SHA-256 of the bytes read."""

    given: Path
    path: Path
    key: StatKey
    sha256: str


_active: contextvars.ContextVar[tuple[SourceReads, ...]] = contextvars.ContextVar("vitdeploy_source_reads", default=())


def read_hashed(path: str | Path) -> tuple[bytes, str]:
    """The file's bytes, read once, and their SHA-256. Refused (SourceChanged) when the file changed while it was
    read (its identity before and after differ, or fewer bytes came than it holds). Every ``SourceReads`` block
    active here records the read."""
    p = Path(path)
    with open(p, "rb") as f:
        before = stat_key(os.fstat(f.fileno()))
        data = f.read()
        after = stat_key(os.fstat(f.fileno()))
    if before != after or len(data) != after[2]:
        raise SourceChanged(changed_message(p))
    digest = hashlib.sha256(data).hexdigest()
    rec = Read(p, Path(os.path.realpath(p)), after, digest)
    for reads in _active.get():
        reads.files[rec.path] = rec
    return data, digest


def hash_recorded(path: str | Path, chunk: int = 1 << 20) -> str:
    """The file's SHA-256, streamed (never held whole), recorded as ``read_hashed`` records a read: for a file the
    caller then maps lazily (safetensors' ``safe_open``), which ``require_unchanged`` holds to this identity. Refused
    (SourceChanged) when it changed while hashed."""
    p = Path(path)
    h = hashlib.sha256()
    n = 0
    with open(p, "rb") as f:
        before = stat_key(os.fstat(f.fileno()))
        while block := f.read(chunk):
            h.update(block)
            n += len(block)
        after = stat_key(os.fstat(f.fileno()))
    if before != after or n != after[2]:
        raise SourceChanged(changed_message(p))
    rec = Read(p, Path(os.path.realpath(p)), after, h.hexdigest())
    for reads in _active.get():
        reads.files[rec.path] = rec
    return rec.sha256


@dataclass
class SourceReads:
    """The files read (``read_hashed``) inside a ``with`` block, by resolved path (see the module docstring)."""

    what: str = ""  # the command, for the message ("export")
    files: dict[Path, Read] = field(default_factory=dict)
    _token: contextvars.Token[tuple[SourceReads, ...]] | None = None

    def __enter__(self) -> SourceReads:
        self._token = _active.set((*_active.get(), self))
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        if self._token is not None:
            _active.reset(self._token)
            self._token = None

    def sha256(self, source: str | Path, files: list[str] | None = None) -> str:
        """The source's SHA-256 as ``core.fileio.source_sha256`` defines it (a file's bytes; a folder's files, names
        and contents; ``files``: only those of the folder), taken from the bytes read here for every file that was
        read; a file of a folder that was not read (a config read as text) is hashed as it is now."""
        from vitdeploy.core.fileio import folder_sha256, sha256_file

        def digest(f: Path) -> str:
            rec = self.files.get(Path(os.path.realpath(f)))
            return rec.sha256 if rec is not None else sha256_file(f)

        p = Path(source)
        if not p.is_dir():
            return digest(p)
        if files is not None:
            return folder_sha256(p, sorted(files), digest)
        return folder_sha256(p, [str(q.relative_to(p)) for q in sorted(q for q in p.rglob("*") if q.is_file())], digest)

    def require_unchanged(self) -> None:
        """Refuse (SourceChanged) when a file read here has been replaced or rewritten since: call it just before
        writing the result."""
        for rec in self.files.values():
            try:
                now: StatKey | None = stat_key(os.stat(rec.path))
            except OSError:
                now = None
            if now != rec.key:
                raise SourceChanged(changed_message(rec.given, self.what))
