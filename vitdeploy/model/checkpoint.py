"""Self-describing checkpoints: weights plus the manifest, readable with ``torch.load(weights_only=True)``.

Importers for other libraries' ViTs (timm, Hugging Face) plug into ``load_model``.
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import atomic_path
from vitdeploy.core.loaded import read_hashed
from vitdeploy.core.manifest import CKPT_KEY, Manifest
from vitdeploy.model.sources import check_checkpoint_file
from vitdeploy.model.vit import VisionTransformer, ViTConfig


@dataclass
class Checkpoint:
    manifest: Manifest
    state_dict: dict[str, torch.Tensor]
    train_state: dict[str, Any] | None = None

    def build(self) -> VisionTransformer:
        model = VisionTransformer(ViTConfig.from_dict(self.manifest.model), weight_init="skip")  # loaded next
        model.load_state_dict(self.state_dict)
        return model.eval()


def save_checkpoint(
    path: str | Path,
    model: VisionTransformer,
    manifest: Manifest,
    train_state: dict[str, Any] | None = None,
) -> Path:
    """Write atomically: an existing file is replaced only by a complete new checkpoint."""
    obj: dict[str, Any] = {
        CKPT_KEY: manifest.to_json(),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
    }
    if train_state is not None:
        obj["train_state"] = train_state
    with atomic_path(path) as tmp:
        torch.save(obj, tmp)
    return Path(path)


def _timm_model_name(obj: dict[str, Any]) -> str | None:
    """The model name in a timm training checkpoint's argparse ``args`` (timm's CheckpointSaver stores them)."""
    args = obj.get("args")
    name = getattr(args, "model", None) if args is not None else None
    if name is None and isinstance(args, dict):
        name = args.get("model")
    return name if isinstance(name, str) else None


# Key markers of well-known non-ViT (or non-mappable) layouts → what to call them.
_FOREIGN_LAYOUTS = (
    (("conv_proj.weight", "encoder.layers.encoder_layer_0.ln_1.weight"), "a torchvision ViT (vit_b_16 …) state dict"),
    (("visual.class_embedding",), "an OpenAI CLIP checkpoint"),
    (("dist_token",), "a distilled DeiT state dict (dist_token, head_dist), which the vitdeploy ViT cannot hold"),
    (("swin.embeddings.patch_embeddings.projection.weight",), "a Hugging Face Swin state dict"),
    (("deit.embeddings.cls_token",), "a Hugging Face DeiT state dict (with a distillation token)"),
    (("beit.embeddings.cls_token",), "a Hugging Face BEiT state dict"),
    (("layers.0.blocks.0.attn.relative_position_bias_table",), "a Swin Transformer state dict"),
    (("stages.0.blocks.0.conv_dw.weight",), "a ConvNeXt state dict"),
    (("downsample_layers.0.0.weight",), "a ConvNeXt state dict"),
    (("conv_stem.weight",), "an EfficientNet/MobileNet state dict"),
)


# Where training checkpoints keep their weights, in the order timm's load_state_dict(use_ema=True) looks.
STATE_DICT_KEYS = ("state_dict_ema", "model_ema", "state_dict", "model")


def unwrap_state_dict(obj: Any) -> tuple[Any, str | None]:
    """The weights inside a loaded object, and the training-checkpoint key they came from (None: the object itself).

    The one unwrapping rule (timm's): the first non-empty dict under STATE_DICT_KEYS; a
    DataParallel ``module.`` prefix on every tensor is dropped (then only the tensors are kept).
    """
    key: str | None = None
    if isinstance(obj, dict):
        for k in STATE_DICT_KEYS:
            if isinstance(obj.get(k), dict) and obj[k]:
                obj, key = obj[k], k
                break
    if isinstance(obj, dict):
        tensors = [k for k in obj if isinstance(k, str) and isinstance(obj[k], torch.Tensor)]
        if tensors and all(k.startswith("module.") for k in tensors):
            obj = {k[len("module.") :]: obj[k] for k in tensors}
    return obj, key


def describe_foreign(obj: Any) -> str:
    """What a loaded object that is not a vitdeploy checkpoint looks like, for the error message."""
    if isinstance(obj, dict):
        inner, _ = unwrap_state_dict(obj)
        if not isinstance(inner, dict):
            inner = obj
        keys = [k for k in inner if isinstance(k, str)]
        tensors = [k for k in keys if isinstance(inner[k], torch.Tensor)]
        if tensors:
            ks = " ".join(keys)
            for markers, what in _FOREIGN_LAYOUTS:
                if any(m in inner for m in markers):
                    return f"{what}: vitdeploy imports ViTs from timm (--arch) and Hugging Face (save_pretrained folders)"
            if "patch_embed.proj.weight" in inner and "cls_token" in inner:
                timm_name = _timm_model_name(obj)
                example = timm_name or "vit_base_patch16_224"
                what = "a timm training checkpoint" if inner is not obj else "a timm-style ViT state dict"
                return f"{what}: pass it with --arch NAME (e.g. --arch {example})"
            if "vit.embeddings.patch_embeddings.projection.weight" in inner or "embeddings.patch_embeddings.projection.weight" in inner:
                return "a Hugging Face ViT state dict: pass the save_pretrained folder (config.json beside it)"
            if "layer1.0.conv1.weight" in inner or "fc.weight" in inner and "conv1.weight" in inner:
                return f"a ResNet state dict ({len(tensors)} tensors): no patch_embed/cls_token keys"
            if "conv" in ks or "features." in ks:
                return f"a CNN state dict ({len(tensors)} tensors): no patch_embed/cls_token keys"
            return f"a plain state_dict of {len(tensors)} tensors (no vitdeploy manifest, no ViT keys such as patch_embed/cls_token)"
        if "optimizer" in obj or "param_groups" in obj:
            return "an optimizer state without model weights"
        return f"a dict with keys {', '.join(map(str, list(obj)[:6]))}, not a vitdeploy checkpoint"
    if isinstance(obj, torch.Tensor):
        return "a single tensor"
    return f"a {type(obj).__name__} object"


def load_checkpoint(path: str | Path) -> Checkpoint:
    p = Path(path)
    check_checkpoint_file(p)  # missing, a folder, empty, a legacy pickle, not a zip: said without torch (model/sources.py)
    data, _ = read_hashed(p)  # lineage hashes the bytes loaded (core/loaded.py)
    try:
        obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in msg or "Unsupported global" in msg:
            raise VitdeployError(f"{p}: holds pickled Python objects, not a vitdeploy checkpoint") from None
        raise VitdeployError(f"{p}: a truncated or corrupt checkpoint ({msg[:80]})") from None
    return _from_object(p, obj)


def _from_object(p: Path, obj: Any) -> Checkpoint:
    if not isinstance(obj, dict) or CKPT_KEY not in obj:
        raise VitdeployError(f"{p}: not a vitdeploy checkpoint — {describe_foreign(obj)}")
    try:
        manifest = Manifest.from_json(obj[CKPT_KEY])
        state = obj["state_dict"]
    except (KeyError, json.JSONDecodeError) as e:
        raise VitdeployError(f"{p}: a damaged vitdeploy checkpoint ({e})") from None
    return Checkpoint(manifest, state, obj.get("train_state"))


def load_model(path: str | Path) -> tuple[VisionTransformer, Manifest]:
    """The model and manifest of a checkpoint, ready for eval."""
    ck = load_checkpoint(path)
    return ck.build(), ck.manifest
