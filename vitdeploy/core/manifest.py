"""The manifest: one JSON description that travels with every artifact.

It lives in the checkpoint (key ``vitdeploy_manifest``), in an ONNX model's
``metadata_props`` (key ``vitdeploy.manifest``) and in the ``<engine>.json``
sidecar beside an engine. No step asks the user for what an earlier step knew.
"""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy import __version__
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.naming import ENGINE_SUFFIXES, sidecar_name  # noqa: F401 - ENGINE_SUFFIXES re-exported
from vitdeploy.core.preprocess import Preprocess

FORMAT = "vitdeploy-manifest/1"
ONNX_KEY = "vitdeploy.manifest"  # on disk: never follows module paths
CKPT_KEY = "vitdeploy_manifest"


@dataclass
class Manifest:
    model: dict[str, Any]
    labels: list[str]
    preprocess: dict[str, Any]
    name: str = "vit"
    precision: str = "fp32"
    # what the artifact was made for (core.targets.TARGETS); None: made before targets existed (= the default)
    target: str | None = None
    source: dict[str, Any] = field(default_factory=dict)
    training: dict[str, Any] = field(default_factory=dict)
    versions: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def num_classes(self) -> int:
        return int(self.model["num_classes"])

    @property
    def input_size(self) -> tuple[int, int]:
        h, w = self.preprocess["input_size"]
        return (int(h), int(w))

    def pp(self) -> Preprocess:
        return Preprocess.from_dict(self.preprocess)

    def to_dict(self) -> dict[str, Any]:
        d = {
            "format": FORMAT,
            "name": self.name,
            "precision": self.precision,
            **({"target": self.target} if self.target else {}),
            "model": self.model,
            "labels": self.labels,
            "preprocess": self.preprocess,
            "source": self.source,
            "training": self.training,
            "versions": self.versions,
        }
        d.update(self.extra)
        return d

    def to_json(self, indent: int | None = None) -> str:
        return json.dumps(self.to_dict(), indent=indent, sort_keys=False)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        if d.get("format") != FORMAT:
            raise VitdeployError(f"unsupported manifest format {d.get('format')!r} (expected {FORMAT})")
        core = {"format", "name", "precision", "target", "model", "labels", "preprocess", "source", "training", "versions"}
        return cls(
            model=dict(d["model"]),
            labels=list(d["labels"]),
            preprocess=dict(d["preprocess"]),
            name=d.get("name", "vit"),
            precision=d.get("precision", "fp32"),
            target=d.get("target"),
            source=dict(d.get("source") or {}),
            training=dict(d.get("training") or {}),
            versions=dict(d.get("versions") or {}),
            extra={k: v for k, v in d.items() if k not in core},
        )

    @classmethod
    def from_json(cls, s: str) -> Manifest:
        return cls.from_dict(json.loads(s))

    def derive(self, **changes: Any) -> Manifest:
        """A copy for a derived artifact (deep, so edits never leak back)."""
        m = Manifest.from_dict(json.loads(self.to_json()))
        for k, v in changes.items():
            if hasattr(m, k) and k != "extra":
                setattr(m, k, v)
            else:
                m.extra[k] = v
        return m


def tool_versions(*names: str) -> dict[str, str]:
    """Versions of vitdeploy, Python and the named packages that are importable (without importing them)."""
    from importlib import metadata

    out = {"vitdeploy": __version__, "python": platform.python_version()}
    for n in names:
        try:
            out[n] = metadata.version(n)
        except metadata.PackageNotFoundError:
            pass
    return out


def set_onnx_manifest(model: Any, manifest: Manifest) -> None:
    """Store the manifest in an onnx.ModelProto's metadata_props, replacing an older one."""
    keep = [p for p in model.metadata_props if p.key != ONNX_KEY]
    del model.metadata_props[:]
    for p in keep:
        model.metadata_props.append(p)
    entry = model.metadata_props.add()
    entry.key = ONNX_KEY
    entry.value = manifest.to_json()


def sidecar_path(engine: str | Path) -> Path:
    """model.int8.engine → model.int8.engine.json (core.naming.sidecar_name)."""
    return sidecar_name(engine)
