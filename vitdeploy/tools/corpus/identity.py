"""Which model made a shard: the artifact's SHA-256 (another precision or export is another model: its shards are
made again) and its checkpoint's, the root of its lineage (another checkpoint is another model altogether: a folder
of its shards is refused, never mixed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import source_sha256
from vitdeploy.core.naming import ENGINE_SUFFIXES


@dataclass(frozen=True)
class ModelId:
    artifact: str  # the file name
    sha256: str
    checkpoint: str  # the lineage root's SHA-256

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "sha256": self.sha256, "checkpoint": self.checkpoint}


def checkpoint_sha256(path: str | Path, manifest: Any) -> str:
    """The SHA-256 of the checkpoint ``path`` descends from: its own for a checkpoint; for an ONNX model or an engine,
    the first record of kind ``checkpoint`` along its source records (``parent`` links, and the manifest of a source
    ONNX standing beside it, as model.int8.onnx names model.onnx); else the deepest SHA-256 recorded; else its own."""
    from vitdeploy.core.artifact import read_manifest

    p = Path(path)
    if p.suffix != ".onnx" and p.suffix not in ENGINE_SUFFIXES:
        return source_sha256(p)
    rec: Any = manifest.source or {}
    last: str | None = None
    for _ in range(32):  # a chain is a few links long; a cycle in a foreign manifest ends here
        if not isinstance(rec, dict):
            break
        sha = rec.get("sha256")
        if rec.get("kind") == "checkpoint" and isinstance(sha, str):
            return sha
        if isinstance(sha, str):
            last = sha
        parent = rec.get("parent")
        if isinstance(parent, dict) and (parent.get("sha256") or parent.get("artifact")):
            rec = parent
            continue
        name = rec.get("artifact")
        beside = p.parent / Path(str(name)).name if name else None
        if beside is None or not beside.is_file() or beside.suffix != ".onnx" or beside == p:
            break
        try:
            if source_sha256(beside) != sha:  # replaced since: the record is what we know
                break
            rec = read_manifest(beside).source or {}
        except (VitdeployError, OSError, ValueError):
            break
    return last or source_sha256(p)


def model_id(path: str | Path, manifest: Any) -> ModelId:
    p = Path(path)
    return ModelId(p.name, source_sha256(p), checkpoint_sha256(p, manifest))
