"""Lineage: is a derived artifact still made from the source that stands beside it?

Every derived artifact records its source's name and SHA-256 in its manifest (``source.artifact`` or
``source.path``, and ``source.sha256``): model.int8.onnx names model.onnx, model.onnx names ckpt.pth, an engine's
sidecar names the ONNX it was built from. A command that picks, packs or builds from artifacts compares that record
with the file beside it and never uses a stale one silently: it re-makes it, or refuses naming the one command that
re-makes it (``require_current``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import StaleArtifact, VitdeployError
from vitdeploy.core.fileio import source_sha256
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.naming import ENGINE_SUFFIXES as _ENGINES
from vitdeploy.core.naming import base_stem

CURRENT, STALE, MISSING, UNRECORDED = "current", "stale", "missing", "unrecorded"


@dataclass(frozen=True)
class Link:
    """One link of a lineage chain: ``artifact`` was made from ``source`` (a file beside it)."""

    artifact: Path
    source: Path | None
    recorded_sha256: str | None
    actual_sha256: str | None
    status: str  # current, stale (the source changed since), missing (no such file beside it), unrecorded

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": str(self.artifact), "source": str(self.source) if self.source else None,
                "recorded_sha256": self.recorded_sha256, "actual_sha256": self.actual_sha256, "status": self.status}


_sha_cache: dict[tuple[str, int, int, tuple[str, ...] | None], str] = {}


def _sha(path: Path, files: Any = None) -> str:
    """The source's SHA-256 (a folder's files for a Hugging Face folder: those recorded in ``source.files`` at import,
    under the rule for paths inside a folder), hashed once per command per file version."""
    st = path.stat()
    names = tuple(str(f) for f in files) if isinstance(files, list) and path.is_dir() else None
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns, names)
    if key not in _sha_cache:
        if names is not None:
            from vitdeploy.core.bundle_paths import bundle_file, link_root
            from vitdeploy.core.limits import bounds

            for n in names:  # a manifest's list is read as any foreign list: nothing outside the folder, no FIFO
                bundle_file(path, n, f"{path}: the checkpoint's source.files names", int(bounds("weights_file_bytes")["max"]),
                            inside=str(path), fix="import it again", within=link_root(path))
        _sha_cache[key] = source_sha256(path, names)
    return _sha_cache[key]


def remember_sha(path: str | Path, sha256: str) -> None:
    """Tell lineage the SHA-256 of ``path`` as a command read it (core/loaded.py: hashed as it was read), so a chain
    walked through it hashes no byte twice. Kept for that file version only (size and mtime), as ``_sha`` keeps."""
    p = Path(path)
    try:
        st = p.stat()
    except OSError:
        return
    if p.is_file():
        _sha_cache[(str(p.resolve()), st.st_size, st.st_mtime_ns, None)] = sha256


def source_link(path: str | Path, manifest: Manifest) -> Link:
    """How ``path`` (with its ``manifest``) stands against the source its manifest records."""
    p = Path(path)
    src = manifest.source or {}
    name = src.get("artifact") or src.get("path")
    recorded = src.get("sha256")
    if not name or not recorded:
        return Link(p, None, None, None, UNRECORDED)
    beside = p.parent / Path(str(name)).name
    if not beside.exists():
        return Link(p, beside, recorded, None, MISSING)
    try:
        actual = _sha(beside, src.get("files"))
    except VitdeployError:  # a recorded file gone, or no longer a regular file inside the folder: changed since
        return Link(p, beside, recorded, None, STALE)
    return Link(p, beside, recorded, actual, CURRENT if actual == recorded else STALE)


def is_stale(path: str | Path, manifest: Manifest) -> bool:
    """True only when the recorded source stands beside the artifact and has changed since it was made."""
    return source_link(path, manifest).status == STALE


def remake_command(path: str | Path, manifest: Manifest, target: str | None = None) -> str:
    """The one command that re-makes ``path`` from its source (same precision and target)."""
    p = Path(path)
    t = target or manifest.target
    tflag = f" --target {t}" if t else ""
    src = manifest.source or {}
    fp32 = p.parent / f"{base_stem(p)}.onnx"
    if p.suffix in (".engine", ".plan", ".trt"):
        onnx_src = p.parent / str(src.get("artifact") or fp32.name)
        return f"vitdeploy build-engine {onnx_src}"
    if manifest.precision == "int8":
        return f"vitdeploy calibrate {fp32}{tflag}"
    if manifest.precision == "fp16":
        return f"vitdeploy convert-fp16 {fp32}{tflag}"
    ckpt = p.parent / str(src.get("path") or "ckpt.pth")
    out = "" if p.name == "model.onnx" else f" -o {p}"
    return f"vitdeploy export {ckpt}{tflag}{out}"


def require_current(path: str | Path, manifest: Manifest, what: str = "") -> Link:
    """Refuse a stale artifact in one line naming it, its changed source and the command that re-makes it."""
    link = source_link(path, manifest)
    if link.status == STALE:
        assert link.source is not None
        raise StaleArtifact(
            f"{link.artifact} is stale: it was made from an earlier {link.source.name} (recorded "
            f"{str(link.recorded_sha256)[:12]}, now {str(link.actual_sha256)[:12]}){what}: re-make it with "
            f"`{remake_command(path, manifest)}`"
        )
    return link


# --- identity: is this artifact made from X? ---------------------------------------------------------------------
#
# "Current" is half the question. An artifact reused for a command must also *descend from that command's input*: the
# SHA-256 chain from the artifact back through its recorded sources (model.int8.onnx → model.onnx → ckpt.pth; an
# engine's sidecar → its ONNX → …) must reach the input. A model.onnx exported from A.pth is current (A.pth is
# unchanged) and yet not B.pth's model: `bundle B.pth` must neither ship it nor replace it without a word.

DESCENDS, FOREIGN, UNKNOWN = "descends", "foreign", "unknown"  # (and STALE: made from an earlier version of it)
_MAX_CHAIN = 8  # engine → int8 → fp32 → checkpoint is 3 links; a longer chain is a loop of hand-edited manifests


@dataclass(frozen=True)
class Descent:
    """How ``artifact`` stands against ``origin`` (a command's input).

    ``verdict``: descends (every link current back to the input's bytes), stale (the chain reaches the input by name
    or by recorded bytes, but a link changed since: the usual re-make), foreign (made from another file), unknown (a
    recorded source is missing, or none is recorded, or a manifest on the way is unreadable: not shown to be the
    input's). ``made_from`` / ``made_from_sha256``: the file the chain ends at (the checkpoint it was made from, where
    known) and the SHA-256 recorded for it."""

    artifact: Path
    origin: Path
    verdict: str
    made_from: Path | None = None
    made_from_sha256: str | None = None
    why: str = ""
    via: tuple[str, ...] = ()  # the recorded sources walked through before ``made_from`` (model.onnx for an INT8)

    @property
    def usable(self) -> bool:
        """Made from the input (current, or stale: re-made from it by the usual rule)."""
        return self.verdict in (DESCENDS, STALE)

    def made_from_text(self) -> str:
        """What the chain ends at: the checkpoint (or model) it was made from, with its recorded SHA-256."""
        if self.made_from is None:
            return self.why or "no recorded source"
        sha = f" (SHA-256 {self.made_from_sha256[:12]})" if self.made_from_sha256 else ""
        gone = "" if self.verdict != UNKNOWN else (", " + self.why if self.why else "")
        via = f", through {' and '.join(self.via)}" if self.via else ""
        return f"{self.made_from.name}{sha}{gone}{via}"


def _manifest_of(path: Path) -> Manifest | None:
    """An ONNX model's or an engine's manifest (None: unreadable, or a checkpoint: its manifest costs a torch.load,
    and a chain walked toward a command's input ends at the first checkpoint)."""
    from vitdeploy.core.artifact import read_manifest

    try:
        return read_manifest(path)
    except (VitdeployError, OSError, ValueError):
        return None


def _same_file(a: Path, b: Path) -> bool:
    try:
        return a.samefile(b)
    except OSError:
        return False


def descends_from(artifact: str | Path, origin: str | Path, manifest: Manifest | None = None) -> Descent:
    """Is ``artifact`` made from ``origin``? The one answer every command that reuses, packs, picks or replaces an
    artifact asks (bundle, build-engine, calibrate, convert-fp16, verify, infer's folder pick).

    The chain is walked from ``artifact`` through each recorded source beside it (``source_link``), ONNX models and
    engines only, and ends at the first recorded SHA-256 equal to ``origin``'s (descends; stale when a link on the
    way changed since), at ``origin`` itself by name with other bytes (stale: made from an earlier version of the
    input), at another file that is not an ONNX model or engine (foreign: the checkpoint it was made from), or where a
    recorded source is missing or none is recorded (unknown)."""
    a, o = Path(artifact), Path(origin)
    if _same_file(a, o):
        return Descent(a, o, DESCENDS, o)
    origin_sha = _sha(o) if o.is_file() else None  # a folder (Hugging Face): told by name, as its files were listed
    cur, m = a, manifest
    changed = False
    via: list[str] = []
    for _ in range(_MAX_CHAIN):
        if m is None:
            m = _manifest_of(cur)
            if m is None:
                return Descent(a, o, UNKNOWN, None, None, f"{cur.name} has no readable vitdeploy manifest")
        link = source_link(cur, m)
        if link.status == UNRECORDED:
            return Descent(a, o, UNKNOWN, None, None, f"{cur.name} records no source")
        assert link.source is not None
        if origin_sha is not None and link.recorded_sha256 == origin_sha:
            return Descent(a, o, STALE if changed else DESCENDS, link.source, link.recorded_sha256, via=tuple(via))
        if _same_file(link.source, o):
            return Descent(a, o, STALE, link.source, link.recorded_sha256, via=tuple(via))
        if link.status == MISSING:
            return Descent(a, o, UNKNOWN, link.source, link.recorded_sha256, f"which is not beside {cur.name}",
                           tuple(via))
        changed = changed or link.status == STALE
        if link.source.is_dir() or link.source.suffix not in (".onnx", *_ENGINES):
            return Descent(a, o, FOREIGN, link.source, link.recorded_sha256, via=tuple(via))
        via.append(link.source.name)
        cur, m = link.source, None
    return Descent(a, o, UNKNOWN, None, None, f"its recorded sources run past {_MAX_CHAIN} links")


def ancestors(artifact: str | Path, manifest: Manifest | None = None) -> tuple[set[str], bool]:
    """The SHA-256s ``artifact`` is made of: its own and each recorded source's, walked through ONNX models and
    engines while each link is current (a recorded SHA-256 is a fact even where its file is gone); and whether a link
    on the way is stale. Two artifacts of one model share one (verify: model.int8.onnx and model.fp16.onnx share
    model.onnx's)."""
    cur, m = Path(artifact), manifest
    shas = {_sha(cur)} if cur.is_file() else set()
    for _ in range(_MAX_CHAIN):
        if m is None:
            m = _manifest_of(cur)
            if m is None:
                break
        link = source_link(cur, m)
        if link.recorded_sha256:
            shas.add(link.recorded_sha256)
        if link.status == STALE:
            return shas, True
        if link.status != CURRENT or link.source is None or link.source.is_dir() \
                or link.source.suffix not in (".onnx", *_ENGINES):
            break
        cur, m = link.source, None
    return shas, False


def not_made_from(d: Descent, command: str, remake: str | None = None, ways: str | None = None) -> StaleArtifact:
    """The one line that refuses an artifact in the way that is not made from the command's input: it names the input,
    the artifact and what it was made from, and the ways out (a folder of its own, or making it again explicitly;
    ``ways`` says them where the command is not about to write)."""
    if ways is None:
        again = f"make it again from {d.origin.name} explicitly (`{remake}`, which replaces it)" if remake else \
            f"remove {d.artifact.name} first"
        ways = f"nothing written, it is neither used nor replaced: run in a folder of its own, or {again}"
        command += f": {d.artifact} is in the way and"
    else:
        command += f": {d.artifact}"
    return StaleArtifact(f"{command} was not made from {d.origin} (made from {d.made_from_text()}); {ways}")


def require_descends(artifact: str | Path, origin: str | Path, command: str, remake: str | None = None,
                     manifest: Manifest | None = None) -> Descent | None:
    """Refuse (StaleArtifact, exit 1, before any work) ``artifact`` when it exists and is not made from ``origin``;
    None where there is no such file."""
    if not Path(artifact).exists():
        return None
    d = descends_from(artifact, origin, manifest)
    if not d.usable and not of_one_model(artifact, origin, manifest):
        raise not_made_from(d, command, remake)
    return d


def of_one_model(a: str | Path, b: str | Path, a_manifest: Manifest | None = None,
                 b_manifest: Manifest | None = None) -> bool:
    """Whether ``a`` and ``b`` are one model's files although neither chain reaches the other: a SHA-256 in common
    along their recorded chains (``ancestors``), as an INT8 another tool made from model.onnx, keeping its manifest,
    records model.onnx's checkpoint. The walk stops at checkpoints, so two fine-tunes of one backbone are not one
    model."""
    mine, _ = ancestors(a, a_manifest)
    theirs, _ = ancestors(b, b_manifest)
    return bool(mine & theirs)


def replacing_note(out: str | Path, origin: str | Path) -> str | None:
    """What a command the user asked for (``export B.pth``) says when its own output replaces a file that was not
    made from its input: replaced, never silently. None when there is no such file, or it was made from ``origin``."""
    p = Path(out)
    if not p.is_file():
        return None
    try:
        d = descends_from(p, origin)
    except (OSError, VitdeployError):
        return None
    if d.usable:
        return None
    return (f"replaced {p} (made from {d.made_from_text()}, not {Path(origin).name}): the models made from the "
            "earlier one beside it are now stale (bundle re-makes them from this one)")


# --- the checkpoint root: which checkpoint does this model descend from? ------------------------------------------
#
# One walk, asked by the gallery (an index of another checkpoint is refused) and the corpus shard sink (another
# checkpoint's shards are refused): both record and compare what it answers, so they must answer alike.

_MAX_RECORDS = 16  # a chain is a few records long (engine → INT8 → fp32 → checkpoint); a loop of records ends here


@dataclass(frozen=True)
class Root:
    """The checkpoint an artifact descends from: ``checkpoint`` is its SHA-256 (None where the chain breaks before a
    record of kind ``checkpoint``: a model.int8.onnx whose model.onnx is gone or was replaced), ``shas`` every SHA-256
    known along the way, the artifact's own first where given, then each recorded source's, deepest last."""

    checkpoint: str | None
    shas: tuple[str, ...] = ()


def checkpoint_root(path: str | Path, manifest: Manifest | None = None, own_sha256: str | None = None) -> Root:
    """Walk ``path``'s recorded ``source`` down to its checkpoint. A checkpoint (a .pth, a Hugging Face folder) is its
    own root. For an ONNX model or an engine: the first record of kind ``checkpoint`` (as export writes); on the way,
    a record's embedded ``parent`` (as an engine's sidecar carries its ONNX's source), else the manifest of the source
    ONNX standing beside it (model.int8.onnx names model.onnx), read only while its bytes still match the record: a
    model.onnx exported again since, from another checkpoint, says nothing about what this artifact was made from."""
    p = Path(path)
    if p.suffix not in (".onnx", *_ENGINES):
        root = own_sha256 or source_sha256(p)
        return Root(root, (root,))
    m = manifest if manifest is not None else _manifest_of(p)
    shas: list[str] = [own_sha256] if own_sha256 else []
    rec: Any = (m.source if m is not None else None) or {}
    here = p
    for _ in range(_MAX_RECORDS):
        if not isinstance(rec, dict):
            break
        sha = rec.get("sha256")
        sha = sha if isinstance(sha, str) and sha else None
        if sha:
            shas.append(sha)
        if sha and rec.get("kind") == "checkpoint":
            return Root(sha, tuple(shas))
        parent = rec.get("parent")
        if isinstance(parent, dict) and (parent.get("sha256") or parent.get("artifact")):
            rec = parent
            continue
        name = rec.get("artifact")
        if not isinstance(name, str) or not name:
            break
        beside = here.parent / Path(name).name
        if beside == here or beside.suffix != ".onnx" or not beside.is_file():
            break
        try:
            if _sha(beside) != sha:  # replaced since (or no SHA-256 recorded): the record is all we know
                break
        except (VitdeployError, OSError):
            break
        bm = _manifest_of(beside)
        if bm is None:
            break
        rec, here = bm.source or {}, beside
    return Root(None, tuple(shas))
