"""Attention extraction: logits and every block's attention probabilities, from a checkpoint (PyTorch) or an ONNX
model (ONNX Runtime, its Softmax outputs made graph outputs). ``vitdeploy explain`` draws maps from them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import to_array
from vitdeploy.model.family import TokenLayout, pooling

Forward = Callable[[Sequence[Image.Image]], tuple[np.ndarray, list[np.ndarray]]]
# an embedding model's own pooling (export --pool, ViTConfig.embed_pool) as the map's readout names it
EMBED_POOL_READS = {"cls": "token", "mean": "avg", "cls+mean": "token_avg"}


def reads(cfg: dict[str, Any]) -> str:
    """What the model's output reads of the tokens: an embedding model's own pooling where it has one (its MAP
    head, if any, is then not run), else what the head reads (model.family.pooling): token, avg, token_avg or map."""
    return EMBED_POOL_READS.get(str(cfg.get("embed_pool") or ""), "") or pooling(cfg)


@dataclass
class AttentionModel:
    """Logits and every block's attention probabilities for resized images, from a checkpoint or an ONNX model."""

    path: Path
    manifest: Manifest
    backend: str
    forward: Forward

    @property
    def grid(self) -> tuple[int, int]:
        h, w = self.manifest.model.get("image_size", self.manifest.input_size)
        p = int(self.manifest.model["patch_size"])
        return (int(h) // p, int(w) // p)

    @property
    def pool(self) -> str:
        """What the output reads (``reads``): token, avg, token_avg or map."""
        return reads(self.manifest.model)

    @property
    def layout(self) -> TokenLayout:
        """Where the class, distillation, register and patch tokens sit in the attention's rows and columns."""
        from vitdeploy.model.family import token_layout

        return token_layout(self.manifest.model)


def _torch_attention(path: Path) -> AttentionModel:
    import torch

    from vitdeploy.model.importers import load_any

    ck = load_any(path)
    net = ck.build()
    pp = ck.manifest.pp()

    def forward(images: Sequence[Image.Image]) -> tuple[np.ndarray, list[np.ndarray]]:
        x = torch.from_numpy(np.stack([to_array(im, pp) for im in images]))
        with torch.inference_mode():
            # a MAP head (not bypassed by an embedding model's own pooling): its pooling attention after the blocks'
            if getattr(net, "attn_pool", None) is not None and not net.cfg.embed_pool:
                feats, attns = net.forward_features(x, return_attn=True)
                _, pooled = net.pool(feats, return_attn=True)
                logits = net.forward_head(feats)
                attns = [*attns, pooled] if pooled is not None else attns
            else:
                logits, attns = net.forward_with_attention(x)
        return logits.float().numpy(), [a.float().numpy() for a in attns]

    return AttentionModel(path, ck.manifest, "torch", forward)


def softmax_outputs(model: Any) -> list[str]:
    """The attention probabilities of an exported ViT: its Softmax nodes' outputs, in graph order.

    A Softmax that makes a graph output (class probabilities added by ``export
    --embed-preprocess --softmax``) is no attention and is left out.
    """
    outs = {o.name for o in model.graph.output}
    return [n.output[0] for n in model.graph.node if n.op_type == "Softmax" and n.output[0] not in outs]


def logits_output(model: Any) -> str:
    """The logits tensor: the first graph output, or the input of the Softmax that turns it into probabilities."""
    first = model.graph.output[0].name
    for n in model.graph.node:
        if n.op_type == "Softmax" and n.output[0] == first:
            return str(n.input[0])
    return str(first)


def _onnx_attention(path: Path, threads: int | None = None) -> AttentionModel:
    """The ONNX model with its Softmax outputs made graph outputs: the FP16 or INT8 copy's own attention.

    No torch here: this is the deployed graph, run by ONNX Runtime as verify runs it.
    """
    import onnx

    from vitdeploy.runners.onnxruntime import session

    art = OnnxArtifact.open(path)
    model, manifest = art.load_weights(), art.manifest
    names = softmax_outputs(model)
    # one Softmax per block, and one more for an attention-pooling head's query (its map's last entry)
    depth = int(manifest.model.get("depth", len(names))) + (reads(manifest.model) == "map")
    if len(names) != depth:
        raise VitdeployError(
            f"{path}: {len(names)} Softmax nodes for {depth} attentions, so the attention cannot be read; "
            "explain the checkpoint instead"
        )
    try:
        typed = onnx.shape_inference.infer_shapes(model)
        types = {v.name: v.type.tensor_type.elem_type for v in typed.graph.value_info}
    except Exception:  # noqa: BLE001 - a type is only a hint here
        types = {}
    logits_name = logits_output(model)
    existing = {o.name for o in model.graph.output}
    for n in [logits_name, *names]:
        if n not in existing:
            model.graph.output.append(onnx.helper.make_tensor_value_info(n, types.get(n) or onnx.TensorProto.FLOAT, None))
    sess = session(model, threads)
    inp = sess.get_inputs()[0]
    raw_spec = manifest.extra.get("input")
    spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    in_graph = bool(spec.get("preprocess_in_graph"))
    layout = str(spec.get("layout", "NHWC")).upper()
    dtype = np.uint8 if spec.get("dtype", "uint8") == "uint8" else np.float32
    pp = manifest.pp()

    def forward(images: Sequence[Image.Image]) -> tuple[np.ndarray, list[np.ndarray]]:
        if in_graph:  # preprocessing folded into the graph: resized RGB pixels in
            x = np.stack([np.asarray(im, np.uint8) for im in images])
            x = (x.transpose(0, 3, 1, 2) if layout == "NCHW" else x).astype(dtype)
        else:
            x = np.stack([to_array(im, pp) for im in images])
        out = sess.run([logits_name, *names], {inp.name: x})
        return np.asarray(out[0], np.float32), [np.asarray(a, np.float32) for a in out[1:]]

    return AttentionModel(path, manifest, "onnxruntime", forward)


def open_attention_model(path: str | Path, threads: int | None = None) -> AttentionModel:
    """A checkpoint (PyTorch) or an ONNX model, FP32, FP16 or INT8 (ONNX Runtime); engines have no attention outputs."""
    from vitdeploy.runners import artifact_kind

    p = Path(path)
    if not p.exists():
        raise VitdeployError(f"{p}: no such model; pass --model ckpt.pth or an .onnx model")
    kind = artifact_kind(p)
    if kind == "engine":
        raise UsageError(
            f"{p}: a TensorRT engine hands out only its logits; explain the ONNX model it was built from "
            "(its attention is the same graph's)"
        )
    if kind == "onnx":
        return _onnx_attention(p, threads)
    return _torch_attention(p)
