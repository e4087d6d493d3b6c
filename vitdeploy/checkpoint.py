"""Self-describing checkpoints: weights plus the manifest, readable with ``torch.load(weights_only=True)``.

Importers for other libraries' ViTs (timm, Hugging Face) plug into ``load_model``.
"""

from __future__ import annotations

import json
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitdeploy.errors import VitdeployError
from vitdeploy.fileio import atomic_path
from vitdeploy.manifest import CKPT_KEY, Manifest
from vitdeploy.model import VisionTransformer, ViTConfig


@dataclass
class Checkpoint:
    manifest: Manifest
    state_dict: dict[str, torch.Tensor]
    train_state: dict[str, Any] | None = None

    def build(self) -> VisionTransformer:
        model = VisionTransformer(ViTConfig.from_dict(self.manifest.model))
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


def describe_foreign(obj: Any) -> str:
    """What a loaded object that is not a vitdeploy checkpoint looks like, for the error message."""
    if isinstance(obj, dict):
        inner = obj
        for k in ("state_dict", "state_dict_ema", "model"):
            if isinstance(obj.get(k), dict):
                inner = obj[k]
                break
        keys = [k for k in inner if isinstance(k, str)]
        tensors = [k for k in keys if isinstance(inner[k], torch.Tensor)]
        if tensors:
            ks = " ".join(keys)
            if "patch_embed.proj.weight" in inner and "cls_token" in inner:
                return "a timm-style ViT state dict: pass it with --arch NAME (e.g. vit_base_patch16_224)"
            if "vit.embeddings.patch_embeddings.projection.weight" in inner:
                return "a Hugging Face ViT state dict: pass the save_pretrained folder (config.json beside it)"
            if "layer1.0.conv1.weight" in inner or "fc.weight" in inner and "conv1.weight" in inner:
                return f"a ResNet state dict ({len(tensors)} tensors): no patch_embed/cls_token keys"
            if "conv" in ks or "features." in ks:
                return f"a CNN state dict ({len(tensors)} tensors): no patch_embed/cls_token keys"
            return f"a plain state_dict of {len(tensors)} tensors (no vitdeploy manifest)"
        return f"a dict with keys {', '.join(map(str, list(obj)[:6]))}, not a vitdeploy checkpoint"
    if isinstance(obj, torch.Tensor):
        return "a single tensor"
    return f"a {type(obj).__name__} object"


def load_checkpoint(path: str | Path) -> Checkpoint:
    p = Path(path)
    if not p.exists():
        raise VitdeployError(f"{p}: no such checkpoint; train one with `vitdeploy train` or pass its path")
    if p.is_dir():
        raise VitdeployError(f"{p} is a folder, not a vitdeploy checkpoint file")
    if p.stat().st_size == 0:
        raise VitdeployError(f"{p}: empty file, not a checkpoint")
    if not zipfile.is_zipfile(p):
        head = p.read_bytes()[:4]
        what = "a truncated or corrupt checkpoint" if head.startswith(b"PK") else "not a PyTorch checkpoint"
        raise VitdeployError(f"{p}: {what}; re-create it with `vitdeploy train`")
    try:
        obj = torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in msg or "Unsupported global" in msg:
            raise VitdeployError(f"{p}: holds pickled Python objects, not a vitdeploy checkpoint") from None
        raise VitdeployError(f"{p}: a truncated or corrupt checkpoint ({msg[:80]})") from None
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


def load_any(path: str | Path, arch: str | None = None, labels: str | Path | None = None) -> Checkpoint:
    """A checkpoint from any source vitdeploy reads.

    ``arch`` names the architecture of a foreign state dict (e.g. a timm name) and
    ``labels`` a file of class names, one per line, for sources that carry none.
    """
    return load_checkpoint(path)
