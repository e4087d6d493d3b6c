"""Atomic artifact writes and hashing: a failed command never leaves a half-written file."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

# Temporary files and folders beside an output carry this tag and the writer's pid, so a later run can tell
# the leftovers of a killed run (pid gone) from the work of a running one.
TMP_TAG = ".vitdeploy-tmp-"


def _umask() -> int:
    """The process umask; read from /proc where it can be (os.umask sets it too, racing other threads' files)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    old = os.umask(0o022)
    os.umask(old)
    return old


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def clean_stale(dest: str | Path) -> list[Path]:
    """Remove the temporary files and folders a killed vitdeploy left beside ``dest`` (their writer is gone)."""
    d = Path(dest)
    removed: list[Path] = []
    if not d.parent.is_dir():
        return removed
    for p in d.parent.glob(f".{glob.escape(d.name)}{TMP_TAG}*"):
        try:
            pid = int(p.name[len(f".{d.name}{TMP_TAG}"):].split("-", 1)[0])
        except ValueError:
            continue
        if pid == os.getpid() or _pid_alive(pid):
            continue
        shutil.rmtree(p, ignore_errors=True) if p.is_dir() and not p.is_symlink() else p.unlink(missing_ok=True)
        removed.append(p)
    return removed


def _prefix(dest: Path) -> str:
    return f".{dest.name}{TMP_TAG}{os.getpid()}-"


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds.

    The file gets the mode any new file gets here (0666 less the umask; mkstemp alone would leave it 0600, which
    a Triton or DeepStream container running as another user cannot read). Leftovers of a killed earlier run for
    the same output are removed first."""
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(dest)
    fd, tmp = tempfile.mkstemp(prefix=_prefix(dest), suffix=suffix or dest.suffix or ".tmp", dir=dest.parent)
    os.fchmod(fd, 0o666 & ~_umask())
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, dest)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


def temp_dir_beside(dest: str | Path) -> Path:
    """A new folder beside ``dest`` to build it in (mode 0777 less the umask), after removing a killed run's."""
    d = Path(dest)
    d.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(d)
    tmp = Path(tempfile.mkdtemp(prefix=_prefix(d), dir=d.parent))
    os.chmod(tmp, 0o777 & ~_umask())
    return tmp


def write_text_atomic(path: str | Path, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text)


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether two paths name one file (another spelling, a symlink or a hard link)."""
    try:
        return os.path.samefile(a, b)
    except OSError:
        return Path(a).resolve() == Path(b).resolve()


def check_output(out: str | Path, inputs: Iterable[str | Path | None] = (), kind: str = "file",
                 suffixes: tuple[str, ...] = (), option: str = "-o") -> Path:
    """Refuse an output before any work starts (one line, exit 2): one of the inputs (never written over), a
    folder where a file goes or the reverse, a name without the expected suffix, or a place not writable here."""
    from vitdeploy.core.errors import UsageError

    o = Path(out)
    for i in inputs:
        if i is not None and Path(i).exists() and same_file(o, i):
            raise UsageError(f"{option} {out} is the input {i}: write the result elsewhere (inputs are never written over)")
    if kind == "file" and o.is_dir():
        raise UsageError(f"{option} {out} is a folder: give a file name")
    if kind == "dir" and o.exists() and not o.is_dir():
        raise UsageError(f"{option} {out} is a file: give a folder")
    if kind == "file" and suffixes and not o.name.endswith(suffixes):
        raise UsageError(f"{option} {out}: the name must end in {' or '.join(suffixes)}")
    parent = o.parent if kind == "file" or not o.exists() else o
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UsageError(f"{option} {out}: {parent} is a file, not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{option} {out}: {parent} is not writable here (read-only or no permission)")
    return o


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_sha256(path: str | Path) -> str:
    """SHA-256 of a checkpoint file, or of a folder's files (names and contents) for a Hugging Face folder."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    h = hashlib.sha256()
    for f in sorted(q for q in p.rglob("*") if q.is_file()):
        h.update(str(f.relative_to(p)).encode() + b"\0" + bytes.fromhex(sha256_file(f)))
    return h.hexdigest()
