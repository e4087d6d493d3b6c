"""Fold the preprocessing into a model's graph and write the raw-pixel variant (uint8 image in, logits out).

The graph edit is graph.embed.embed_model; this stage reads the source through OnnxArtifact, writes the variant with
the artifact's one write (hashing the bytes written) and names the variant in the source's manifest.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.naming import raw_variant_name
from vitdeploy.graph.embed import RAW_INPUT, embed_model

# A raw-pixel variant as written: an OnnxArtifact (its model, manifest, and the SHA-256 of the bytes written).
Variant = OnnxArtifact


def embed_preprocess(
    onnx_path: str | Path,
    out: str | Path | None = None,
    dtype: str = "uint8",
    layout: str = "nhwc",
    input_name: str = RAW_INPUT,
    softmax: bool = False,
) -> Path:
    """Write the raw-pixel variant of an exported ONNX model (default: model.raw.onnx beside it).

    The preprocessing constants come from the model's own manifest; the variant's
    manifest records its ``input`` (name, dtype, layout, shape) and its source.
    """
    src = Path(onnx_path)
    art = OnnxArtifact.open(src)
    model, manifest = art.load_weights(), art.manifest
    if manifest.extra.get("input", {}).get("preprocess_in_graph"):
        raise VitdeployError(f"{src}: preprocessing is already in this graph; embed into the normal export")
    dest = Path(out) if out is not None else src.with_name(raw_variant_name(src.name))
    if dest.resolve() == src.resolve():
        raise VitdeployError(f"{dest}: the variant would overwrite its source; choose another output name")
    write_variant(model, manifest, src.name, art.sha256, dest, dtype, layout, input_name, softmax)
    return dest




def write_variant(
    model: Any,
    manifest: Manifest,
    source_name: str,
    source_sha256: str,
    dest: Path,
    dtype: str = "uint8",
    layout: str = "nhwc",
    input_name: str = RAW_INPUT,
    softmax: bool = False,
) -> Variant:
    """``embed_preprocess`` for a model already in memory: serialized once, hashed from the bytes written."""
    new, spec = embed_model(model, manifest.pp(), dtype=dtype, layout=layout, input_name=input_name, softmax=softmax)
    derived = manifest.derive(
        source={"artifact": source_name, "sha256": source_sha256, "kind": "onnx"},
        input=spec.to_dict(),
        output={"name": new.graph.output[0].name, "kind": "probs" if softmax else "logits"},
    )
    derived.extra.pop("raw_variant", None)
    return OnnxArtifact.write(new, derived, dest)


def record_raw_variant(onnx_path: str | Path, variant: str | Path) -> None:
    """Name the raw-pixel variant in the source model's manifest (``raw_variant``), so tools can find it.

    Only the metadata changes; the model is rewritten atomically. Models with external
    data (over 2 GB) are left as they are.
    """
    import onnx

    art = OnnxArtifact.open(onnx_path)
    if any(t.data_location == onnx.TensorProto.EXTERNAL for t in art.model.graph.initializer):
        return
    OnnxArtifact.write(art.model, art.manifest.derive(raw_variant=Path(variant).name), art.path)
