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
