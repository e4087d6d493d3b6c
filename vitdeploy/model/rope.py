"""Rotary position embeddings as timm computes them (timm/layers/pos_embed_sincos.py), as constant tables.

A RoPE ViT rotates each head's q and k by angles that depend only on a token's grid position, so for a model
built at one image size the rotation is constant tables and elementwise ops. timm computes
``x * cos + rot(x) * sin``, where ``rot`` pairs each channel with a partner and flips one sign (EVA's interleaved
layout: [-x1, x0, -x3, x2, ...]; DINOv3's rotate-half layout: [-x_{D/2..D}, x_{0..D/2}]). Both are a fixed
permutation times a fixed sign, so with the sign folded into the sin table (exact: a sign flip) this is

    x' = x * cos + x[..., perm] * signed_sin

exported as Mul, Gather (constant indices on the last axis), Mul, Add — ops every TensorRT from 8.5 on parses,
no Shape/Reshape chain, and no MatMul with a constant that INT8 placement would take for a Linear. The tables
cover the whole sequence: prefix tokens (class, registers) get cos 1 and sin 0, which leaves them exactly as
they are (x*1 + y*0 == x in floating point), so no slicing of the sequence is exported. They are recomputed
from the config whenever the model is built, so a model built at another image size gets its own grid's
tables, as timm's ``img_size=`` does. The tables are non-persistent buffers: never in a state dict.

Two of timm's schemes:
- ``cat`` (RotaryEmbeddingCat with in_pixels=False: EVA-02, the timm SBB ``vit_*_rope_*``): integer positions,
  rescaled onto ``ref_feat_shape`` when given; bands 1 / temperature ** (i / (D/4)).
- ``dinov3`` (RotaryEmbeddingDinoV3): 0.5-centered positions normalized to [-1, 1] per axis; angles
  2π·pos / temperature ** (2i / (D/2)).
Same float32 operations in the same order as timm, so the tables equal timm's.
"""

from __future__ import annotations

import math

import torch

from vitdeploy.model.presets import ViTConfig

Rope = tuple[torch.Tensor, torch.Tensor, torch.Tensor]  # (signed sin, cos, perm), see sequence_tables


def _grid(cfg: ViTConfig, grid: tuple[int, int], centered: bool) -> torch.Tensor:
    """Positions [H*W, 2] (timm's _build_grid: 'index' or 'centered' with separate normalization)."""
    shape = list(grid)
    ref = list(cfg.rope_ref_grid) if cfg.rope_ref_grid is not None and not centered else None
    if cfg.rope_grid_indexing == "xy":
        shape = [shape[1], shape[0]]
        ref = [ref[1], ref[0]] if ref is not None else None
    if centered:
        t = [(torch.arange(0.5, s, dtype=torch.float32) + cfg.rope_grid_offset) / float(s) for s in shape]
    else:
        t = [torch.arange(s, dtype=torch.int64).to(torch.float32) + cfg.rope_grid_offset for s in shape]
    if ref is not None:
        t = [x / f * r for x, f, r in zip(t, shape, ref, strict=True)]
    g = torch.stack(torch.meshgrid(t, indexing=cfg.rope_grid_indexing), dim=-1).to(torch.float32)
    if centered:
        g = 2.0 * g - 1.0
    return g.flatten(0, -2)


def _layout(x: torch.Tensor, half: bool) -> torch.Tensor:
    """Per-frequency values [..., D/2] → [..., D] in the rotation's channel layout."""
    return torch.cat([x, x], dim=-1) if half else x.repeat_interleave(2, -1)


def rope_tables(cfg: ViTConfig, grid: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(sin, cos), each [H*W, head_dim] float32, for the patch grid (default: the config's)."""
    dim = cfg.embed_dim // cfg.num_heads
    n = dim // 4
    g = _grid(cfg, grid or cfg.grid_size, centered=cfg.rope == "dinov3")  # [HW, 2]
    if cfg.rope == "cat":
        bands = 1.0 / (float(cfg.rope_temperature) ** (torch.arange(0, n, 1, dtype=torch.int64).to(torch.float32) / n))
        pos = g.unsqueeze(-1) * bands  # [HW, 2, n]
    elif cfg.rope == "dinov3":
        periods = float(cfg.rope_temperature) ** (2.0 * torch.arange(n, dtype=torch.float32) / (dim // 2))
        pos = 2 * math.pi * g[:, :, None] / periods[None, None, :]
    else:
        raise ValueError(f"no rotary embedding {cfg.rope!r}")
    sin, cos = pos.sin().flatten(1), pos.cos().flatten(1)  # [HW, D/2]
    return _layout(sin, cfg.rope_half), _layout(cos, cfg.rope_half)


def partner(dim: int, half: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(perm, sign) with rot(x) == x[..., perm] * sign: rotate-half or interleaved pairs."""
    idx = torch.arange(dim)
    if half:
        perm = torch.cat([idx[dim // 2 :], idx[: dim // 2]])
        sign = torch.cat([-torch.ones(dim // 2), torch.ones(dim // 2)])
    else:
        perm = idx.view(-1, 2).flip(-1).flatten()
        sign = torch.tensor([-1.0, 1.0]).repeat(dim // 2)
    return perm, sign


def sequence_tables(cfg: ViTConfig, num_prefix: int) -> Rope:
    """(signed sin, cos, perm) over the whole sequence [N, head_dim]: identity (sin 0, cos 1) on the prefix."""
    sin, cos = rope_tables(cfg)
    d = sin.shape[-1]
    perm, sign = partner(d, cfg.rope_half)
    return (
        torch.cat([torch.zeros(num_prefix, d), sin * sign]),
        torch.cat([torch.ones(num_prefix, d), cos]),
        perm,
    )


def apply_rope(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x [B, heads, N, D] rotated by (signed sin, cos, perm) from sequence_tables (timm's apply_rot_embed)."""
    sin, cos, perm = rope
    return x * cos + x.index_select(-1, perm) * sin
