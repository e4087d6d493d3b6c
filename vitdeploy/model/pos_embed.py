"""Deploy a ViT at another input size: absolute position embeddings resampled exactly as timm does.

A model trained at 518 px (DINOv2) runs at 224 px on a small Jetson the way timm runs it there
(``timm.create_model(name, img_size=224)`` loads the 518 weights through ``checkpoint_filter_fn``, which calls
``timm.layers.resample_abs_pos_embed``): bicubic with antialias, in float32, the prefix tokens (class, distillation,
registers, unless the model has no position embedding for them) untouched. RoPE tables are not weights: they are
recomputed from the config at the new grid when the model is built (model/rope.py).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

import torch
import torch.nn.functional as F

from vitdeploy.core.errors import UsageError
from vitdeploy.core.image_size import parse_image_size  # noqa: F401  (re-exported)
from vitdeploy.model.checkpoint import Checkpoint
from vitdeploy.model.vit import ViTConfig


def resample_abs_pos_embed(
    posemb: torch.Tensor,
    new_size: tuple[int, int],
    old_size: tuple[int, int] | None = None,
    num_prefix_tokens: int = 1,
    interpolation: str = "bicubic",
    antialias: bool = True,
) -> torch.Tensor:
    """timm.layers.pos_embed.resample_abs_pos_embed (timm 1.0.31): [1, prefix + H*W, D] → [1, prefix + H'*W', D]."""
    n = int(posemb.shape[1])
    if old_size is None:
        hw = int(math.sqrt(n - num_prefix_tokens))
        old_size = (hw, hw)
    if n == new_size[0] * new_size[1] + num_prefix_tokens and tuple(old_size) == tuple(new_size):
        return posemb
    prefix, grid = posemb[:, :num_prefix_tokens], posemb[:, num_prefix_tokens:]
    dim, dtype = int(grid.shape[-1]), grid.dtype
    g = grid.float().reshape(1, old_size[0], old_size[1], -1).permute(0, 3, 1, 2)
    g = F.interpolate(g, size=new_size, mode=interpolation, antialias=antialias)
    g = g.permute(0, 2, 3, 1).reshape(1, -1, dim).to(dtype)
    return torch.cat([prefix, g], dim=1) if num_prefix_tokens else g


def check_resize(model: dict[str, Any], size: tuple[int, int], where: str) -> None:
    """The refusals that need only the model's config (a manifest's "model"): usage errors, exit 2."""
    p = int(model["patch_size"])
    if size[0] % p or size[1] % p:
        raise UsageError(f"--image-size {size[0]}x{size[1]}: not a multiple of {where}'s patch size {p}; "
                         f"choose a multiple of {p} (e.g. {size[0] // p * p or p}x{size[1] // p * p or p})")
    if "image_size" in model and tuple(model["image_size"]) == tuple(size):
        return  # its own size: nothing to adapt, whatever its position encoding
    if model.get("rel_pos_bias"):
        raise UsageError(f"--image-size: {where} has a relative position bias (BEiT), whose tables vitdeploy does "
                         "not resample; deploy it at its own size")
    if not model.get("abs_pos_embed", True) and not model.get("rope"):
        raise UsageError(f"--image-size: {where} has no absolute position embeddings (nor RoPE) to adapt to a new size")


def resize_checkpoint(ck: Checkpoint, size: tuple[int, int], where: str = "the model") -> tuple[Checkpoint, str]:
    """The checkpoint at input ``size``: position embeddings resampled (timm's way), RoPE tables left to the build,
    the preprocessing's input size following; and a note on what was done."""
    m = ck.manifest
    check_resize(m.model, size, where)
    cfg = ViTConfig.from_dict(m.model)
    if tuple(cfg.image_size) == size:
        return ck, f"already {size[0]}x{size[1]}"
    new_cfg = cfg.with_(image_size=size)
    state = dict(ck.state_dict)
    notes = []
    if cfg.abs_pos_embed and "pos_embed" in state:
        prefix = 0 if cfg.no_embed_class else cfg.num_prefix_tokens
        state["pos_embed"] = resample_abs_pos_embed(state["pos_embed"], new_cfg.grid_size, cfg.grid_size, prefix)
        notes.append(f"position embeddings resampled {cfg.grid_size[0]}x{cfg.grid_size[1]} -> "
                     f"{new_cfg.grid_size[0]}x{new_cfg.grid_size[1]} (bicubic, antialias, as timm)")
    if cfg.rope:
        notes.append("RoPE tables recomputed for the new grid")
    pp = dict(m.preprocess)
    pp["input_size"] = [size[0], size[1]]
    manifest = replace(m, model=new_cfg.to_dict(), preprocess=pp)
    return Checkpoint(manifest, state, ck.train_state), "; ".join(notes)
