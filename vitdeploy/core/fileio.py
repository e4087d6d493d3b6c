"""Atomic artifact writes and hashing: a failed command never leaves a half-written file."""

from __future__ import annotations

import contextlib
import glob
import hashlib
import json
import math
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

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


# --- outputs that are not plain files ---------------------------------------------------------------------------
# `--json /dev/stdout`, a named pipe, /dev/null: such an output is a channel, not an artifact. Renaming a temp file
# over it would replace the channel with a regular file (as root: /dev/null for every process in the container), so
# it is written to in place. A symlink to a regular file (or to nothing) is replaced by the new file, never written
# through (issue 40): the link's target may be an input.


def _link_chain(path: Path) -> list[Path]:
    """The path and every symlink hop it goes through (absolute), up to the kernel's own 40-hop limit."""
    chain = [Path(os.path.abspath(path))]
    for _ in range(40):
        cur = chain[-1]
        try:
            nxt = os.readlink(cur)
        except OSError:  # not a link, or gone
            break
        chain.append(Path(os.path.normpath(cur.parent / nxt)) if not os.path.isabs(nxt) else Path(nxt))
    return chain


def output_kind(path: str | Path) -> str:
    """What an output path names: 'file' (absent, or a regular file: written atomically), 'channel' (a character
    device, FIFO or /proc link such as /dev/stdout: written in place), or a refusal's noun ('socket', 'block device')."""
    chain = _link_chain(Path(path))
    try:
        mode = os.stat(path).st_mode
    except OSError:
        mode = 0
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISBLK(mode):
        return "block device"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "channel"
    if any(str(p) == "/proc" or str(p).startswith("/proc/") for p in chain):
        return "channel"  # e.g. /dev/stdout → /proc/self/fd/1 → a file the shell opened: its fd is the output
    return "file"


def names_stdout(path: str | Path | None) -> bool:
    """Whether an output names this process's stdout: '-', or a path (/dev/stdout, /proc/self/fd/1) to the same file."""
    if path is None:
        return False
    if str(path) == "-":
        return True
    try:
        a, b = os.stat(path), os.fstat(1)
    except OSError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _write_in_place(src: Path, dest: Path) -> None:
    """Copy ``src`` into the channel ``dest``: no create, no truncation, no rename (append to a file behind /proc)."""
    fd = os.open(dest, os.O_WRONLY | os.O_APPEND)
    try:
        with open(src, "rb") as f:
            while block := f.read(1 << 20):
                view = memoryview(block)
                while view:
                    view = view[os.write(fd, view):]
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | Path, suffix: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it into place only if the block succeeds.

    The file gets the mode any new file gets here (0666 less the umask; mkstemp alone would leave it 0600, which
    a Triton or DeepStream container running as another user cannot read). Leftovers of a killed earlier run for
    the same output are removed first. A symlink at ``path`` is replaced by the new file, never written through: its
    target, which may be an input (``p.pth.features.npz -> dinov2.pth`` turned the --init weights into an npz), keeps
    its bytes; ``check_output`` refuses, before any work, an output that is a link to an input. A channel (character
    device, FIFO, /proc link: ``output_kind``) gets the finished bytes written into it, never renamed over."""
    kind = output_kind(path)
    if kind not in ("file", "channel"):
        from vitdeploy.core.errors import UsageError

        raise UsageError(f"{path} is a {kind}: give a file name")
    if kind == "channel":
        fd, tmp = tempfile.mkstemp(prefix=f"vitdeploy-{os.getpid()}-", suffix=suffix or Path(path).suffix or ".tmp")
        os.close(fd)
        tmp_path = Path(tmp)
        try:
            yield tmp_path
            _write_in_place(tmp_path, Path(path))
        finally:
            tmp_path.unlink(missing_ok=True)
        return
    dest = Path(path)  # a link here is renamed over (replaced), its target untouched
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


def follow_umask(root: str | Path) -> None:
    """Give every folder and file under ``root`` (and root) the mode a new one gets here: 0777/0666 less the umask,
    executables keeping their x bits less the umask. shutil.copy/copymode/copytree copy the source's mode, which
    under umask 077 would leave copied files group/other-readable."""
    mask = _umask()
    for dirpath, _dirs, filenames in os.walk(root):
        os.chmod(dirpath, 0o777 & ~mask)
        for name in filenames:
            p = os.path.join(dirpath, name)
            st = os.lstat(p)
            if stat.S_ISREG(st.st_mode):
                os.chmod(p, (0o777 if st.st_mode & 0o111 else 0o666) & ~mask)


def move_into(src: str | Path, dest: str | Path) -> None:
    """Put a folder built beside ``dest`` in place: renamed whole when ``dest`` is new, else file by file (renames:
    they need no space, so a full disk cannot stop them half way as a write can). A symlink at a file or sub-folder
    of ``dest`` is replaced, never written through."""
    s, d = Path(src), Path(dest)
    if d.is_symlink():  # a link in place of the folder: replaced by it, its target untouched
        d.unlink()
    if not d.exists():
        os.replace(s, d)
        return
    for f in sorted(p for p in s.rglob("*") if not p.is_dir()):
        target = d / f.relative_to(s)
        _real_folders(d, target.parent)
        os.replace(f, target)  # a link at target is replaced, never written through


def _real_folders(root: Path, folder: Path) -> None:
    """Make ``folder`` (under ``root``) and its parents up to ``root`` real folders: a symlink among them (to an input
    folder, say) is removed, not written into; its target is untouched."""
    cur = root
    for part in folder.relative_to(root).parts:
        cur = cur / part
        if cur.is_symlink():
            cur.unlink()
        cur.mkdir(exist_ok=True)


def write_text_atomic(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) whole or not at all; a channel such as /dev/stdout gets it in place."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | Path, obj: Any, indent: int | None = 2) -> None:
    """``strict_json(obj)`` written whole or not at all, with a final newline."""
    write_text_atomic(path, strict_json(obj, indent) + "\n")


# --- strict JSON and printable names ------------------------------------------------------------------------------


def printable_name(name: str | os.PathLike[str] | bytes) -> str:
    """A file name as text that any terminal, CSV or JSON reader takes: bytes that are not UTF-8 (legal in a Linux
    name, e.g. b'bad\\xff.png') become ``\\xff`` escapes; valid names print as they are."""
    raw = os.fsencode(name)
    return raw.decode("utf-8", "backslashreplace")


def _finite_only(obj: Any, where: str, found: list[str]) -> Any:
    """``obj`` with every NaN/Inf float replaced by None, noting where; numpy scalars and arrays become lists."""
    if isinstance(obj, dict):
        return {str(k): _finite_only(v, f"{where}.{k}" if where else str(k), found) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_only(v, f"{where}[{i}]", found) for i, v in enumerate(obj)]
    if hasattr(obj, "tolist") and not isinstance(obj, (str, bytes)):  # numpy arrays and scalars
        return _finite_only(obj.tolist(), where, found)
    if isinstance(obj, float) and not math.isfinite(obj):
        found.append(f"{where} ({obj})")
        return None
    if isinstance(obj, bytes | os.PathLike):
        return printable_name(obj)
    if isinstance(obj, str) and any("\udc80" <= c <= "\udcff" for c in obj):  # a name decoded with surrogateescape
        return printable_name(obj)
    return obj


def strict_json(obj: Any, indent: int | None = 2) -> str:
    """JSON that every parser takes (RFC 8259: no bare NaN or Infinity). A non-finite number is written as null,
    and a top-level object gets a ``non_finite`` note naming each such field (jq would read a bare NaN as null and
    ``.passed`` as true; Node's JSON.parse would throw)."""
    found: list[str] = []
    clean = _finite_only(obj, "", found)
    if found and isinstance(clean, dict):
        clean["non_finite"] = f"{len(found)} value(s) were NaN or Inf, written as null: " + ", ".join(found[:20])
    return json.dumps(clean, indent=indent, allow_nan=False)


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
    given = [Path(i) for i in inputs if i is not None]
    for i in given:
        if i.exists() and same_file(o, i):
            raise UsageError(f"{option} {out} is the input {i}: write the result elsewhere (inputs are never written over)")
    for i in given:  # a file inside an input folder (a Hugging Face folder's weights, an image folder's files)
        if i.is_dir() and o.exists() and not o.is_dir() and _inside(o, i):
            raise UsageError(f"{option} {out} is a file of the input folder {i}: write the result elsewhere "
                             "(inputs are never written over)")
    what = output_kind(o)
    if what in ("socket", "block device"):
        raise UsageError(f"{option} {out} is a {what}: give a file name")
    if what == "channel":  # /dev/stdout, a FIFO, /dev/null: written in place, so only the channel must be writable
        if kind == "dir":
            raise UsageError(f"{option} {out} is not a folder: give a folder")
        if not os.access(o, os.W_OK):
            raise UsageError(f"{option} {out} is not writable here (no permission)")
        return o
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


def _inside(path: Path, folder: Path) -> bool:
    """Whether ``path`` (followed through links) lies inside ``folder``."""
    try:
        Path(os.path.realpath(path)).relative_to(os.path.realpath(folder))
    except ValueError:
        return False
    return True


class NotAFileOfBoundedSize(ValueError):
    """``read_bounded``'s refusal; its text is the reason ("a FIFO, not a regular file"), the caller names the file."""


def read_bounded(path: str | Path, limit: int) -> bytes:
    """A small file's bytes (a labels or classes file), read without trusting it: anything but a regular file is
    refused by its type before it is read (a FIFO would block for ever, /dev/zero never ends), and a file holding
    more than ``limit`` bytes is refused when its size or its reading passes the limit (read in chunks, so the
    limit is never allocated up front). NotAFileOfBoundedSize says why; OSError where it cannot be opened."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # a FIFO opens at once, its type then refused
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode):
            kind = "a FIFO" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or \
                stat.S_ISBLK(st.st_mode) else "a folder" if stat.S_ISDIR(st.st_mode) else "a socket"
            raise NotAFileOfBoundedSize(f"{kind}, not a regular file")
        if st.st_size > limit:
            raise NotAFileOfBoundedSize(f"{st.st_size} bytes, more than the {limit} this file may hold")
        parts, n = [], 0
        while block := f.read(min(1 << 20, limit + 1 - n)):
            parts.append(block)
            n += len(block)
            if n > limit:
                raise NotAFileOfBoundedSize(f"more than the {limit} bytes this file may hold")
    return b"".join(parts)


def sha256_file(path: str | Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_sha256(path: str | Path, files: Iterable[str] | None = None) -> str:
    """SHA-256 of a checkpoint file, or of a folder's files (names and contents) for a Hugging Face folder.

    ``files``: the folder's files the model is made of (its configs and weights, as an import records them in
    ``source.files``): only those are hashed, so a large file left beside the weights (a 60 GB download, a symlink to
    one) neither slows the hash nor changes it. Without it (manifests written before), every file of the folder."""
    p = Path(path)
    if p.is_file():
        return sha256_file(p)
    if files is not None:
        return folder_sha256(p, sorted(files), sha256_file)
    return folder_sha256(p, [str(q.relative_to(p)) for q in sorted(q for q in p.rglob("*") if q.is_file())],
                         sha256_file)


def folder_sha256(folder: Path, names: Iterable[str], digest_of: Callable[[Path], str]) -> str:
    """The one definition of a folder's digest: over its files' names, in the order given, and their SHA-256s."""
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode() + b"\0" + bytes.fromhex(digest_of(folder / name)))
    return h.hexdigest()
