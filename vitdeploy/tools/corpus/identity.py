"""Which model made a shard: the artifact's SHA-256 (another precision or export is another model: its shards are
made again) and its checkpoint's, the root of its lineage (another checkpoint is another model altogether: a folder
of its shards is refused, never mixed)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitdeploy.core.fileio import source_sha256


@dataclass(frozen=True)
class ModelId:
    artifact: str  # the file name
    sha256: str
    checkpoint: str  # the lineage root's SHA-256

    def to_dict(self) -> dict[str, Any]:
        return {"artifact": self.artifact, "sha256": self.sha256, "checkpoint": self.checkpoint}


def checkpoint_sha256(path: str | Path, manifest: Any) -> str:
    """The SHA-256 of the checkpoint ``path`` descends from (core/lineage.checkpoint_root: the walk the gallery asks
    too); where the chain breaks before the checkpoint, the deepest SHA-256 recorded; else its own."""
    from vitdeploy.core.lineage import checkpoint_root

    root = checkpoint_root(path, manifest)
    return root.checkpoint or (root.shas[-1] if root.shas else source_sha256(Path(path)))


def model_id(path: str | Path, manifest: Any) -> ModelId:
    p = Path(path)
    return ModelId(p.name, source_sha256(p), checkpoint_sha256(p, manifest))
