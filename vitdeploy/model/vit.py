"""The Vision Transformer.

Laid out like timm's ``vision_transformer.py`` (same module and parameter names),
so timm and Hugging Face weights map onto it one to one. Its config and the presets,
each declaring its preprocessing next to its architecture, are in model/presets.py
(no torch there) and are re-exported here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitdeploy.model.presets import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    PRESETS,
    Preset,
    UnknownPreset,
    ViTConfig,
    count_params,
    get_preset,
    preset_table,
)
from vitdeploy.model.relpos import RelativePositionBias
from vitdeploy.model.rope import Rope, apply_rope, sequence_tables

__all__ = [
    "IMAGENET_MEAN", "IMAGENET_STD", "PRESETS", "Attention", "Block", "Mlp", "PatchEmbed", "Preset", "UnknownPreset",
    "ViTConfig", "VisionTransformer", "build_model", "count_params", "get_preset", "preset_table",
]


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection.

    The normal path calls ``scaled_dot_product_attention``; exported, it becomes
    MatMul → Softmax → MatMul with the scale applied before the first MatMul, the
    pattern TensorRT fuses. ``return_attn`` takes an explicit path that also hands
    back the attention probabilities (for attention maps), so the normal path and
    the exported graph stay untouched.

    Second-ring options (timm's eva.py / beit.py), all off by default:
    - ``qv_bias``: q and v biases without a k bias, held as timm's Eva/Beit hold them: ``qkv.weight`` with no
      bias, parameters ``q_bias`` and ``v_bias``, and a non-persistent zero ``k_bias``; the projection uses
      their concatenation, so a timm state dict loads as it is and the result is exact (the k part is a
      constant zero). Exported, the concatenation folds into one bias constant: MatMul + Add, like a Linear.
    - ``rope``: the model's constant tables (model/rope.py), passed to every block; q and k are rotated after the
      projection, elementwise.
    - ``rel_pos_grid``: BEiT's relative position bias (model/relpos.py), added to the scores before Softmax on
      an explicit path: MatMul(Q·scale, Kᵀ) → Add(bias) → Softmax → MatMul(·, V).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        qv_bias: bool = False,
        rel_pos_grid: tuple[int, int] | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias and not qv_bias)
        self.q_bias: nn.Parameter | None = None
        self.v_bias: nn.Parameter | None = None
        if qv_bias:
            self.q_bias = nn.Parameter(torch.zeros(dim))
            self.k_bias: torch.Tensor
            self.register_buffer("k_bias", torch.zeros(dim), persistent=False)
            self.v_bias = nn.Parameter(torch.zeros(dim))
        self.relative_position_bias_table: nn.Parameter | None = None
        self.rel_pos: RelativePositionBias | None = None
        if rel_pos_grid is not None:
            self.rel_pos = RelativePositionBias(rel_pos_grid, num_heads)
            self.relative_position_bias_table = nn.Parameter(torch.zeros(self.rel_pos.num_relative_distance, num_heads))
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)

    def forward(
        self, x: torch.Tensor, return_attn: bool = False, rope: Rope | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        if self.q_bias is not None and self.v_bias is not None:
            qkv = F.linear(x, self.qkv.weight, torch.cat((self.q_bias, self.k_bias, self.v_bias)))
        else:
            qkv = self.qkv(x)
        qkv = qkv.reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        if rope is not None:
            q, k = apply_rope(q, rope), apply_rope(k, rope)
        attn: torch.Tensor | None = None
        if self.rel_pos is not None and self.relative_position_bias_table is not None:
            scores = (q * self.scale) @ k.transpose(-2, -1) + self.rel_pos(self.relative_position_bias_table)
            probs = scores.softmax(dim=-1)
            attn = probs if return_attn else None
            x = F.dropout(probs, self.attn_drop, self.training) @ v
        elif return_attn:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x), attn


class QuickGELU(nn.Module):
    """x·sigmoid(1.702x): OpenAI CLIP's activation (timm's QuickGELU, transformers' quick_gelu)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(name: str) -> nn.Module:
    """The MLP's activation by ViTConfig.act; "gelu" is the exact (erf) GELU every default model has."""
    if name == "quick_gelu":
        return QuickGELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "silu":
        return nn.SiLU()
    return nn.GELU()


class Mlp(nn.Module):
    """fc1 → act → (norm) → fc2: timm's Mlp; ``norm`` is EVA's scale_mlp inner LayerNorm (off by default)."""

    def __init__(
        self, in_features: int, hidden_features: int, drop: float = 0.0, norm_eps: float | None = None, act: str = "gelu"
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = make_act(act)
        if norm_eps is not None:
            self.norm = nn.LayerNorm(hidden_features, eps=norm_eps)
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.act(self.fc1(x)))
        if hasattr(self, "norm"):
            x = self.norm(x)
        return self.drop(self.fc2(x))


class SwiGLU(nn.Module):
    """SiLU-gated MLP in timm's two layouts: ``packed`` (GluMlp: one fc1 whose first half is the gate) or
    separate ``fc1_g`` / ``fc1_x`` (timm's SwiGLU); either with EVA's inner LayerNorm before fc2."""

    def __init__(self, dim: int, hidden: int, packed: bool, drop: float = 0.0, norm_eps: float | None = None) -> None:
        super().__init__()
        self.packed = packed
        if packed:
            self.fc1 = nn.Linear(dim, hidden * 2)
        else:
            self.fc1_g = nn.Linear(dim, hidden)
            self.fc1_x = nn.Linear(dim, hidden)
        self.act = nn.SiLU()
        if norm_eps is not None:
            self.norm = nn.LayerNorm(hidden, eps=norm_eps)
        self.fc2 = nn.Linear(hidden, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed:
            g, x = self.fc1(x).chunk(2, dim=-1)
        else:
            g, x = self.fc1_g(x), self.fc1_x(x)
        x = self.drop(self.act(g) * x)
        if hasattr(self, "norm"):
            x = self.norm(x)
        return self.drop(self.fc2(x))


class LayerScale(nn.Module):
    """Per-channel scale of a residual branch (timm's ls1/ls2 with parameter ``gamma``)."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm encoder block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        self.attn = Attention(
            cfg.embed_dim, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate,
            qv_bias=cfg.qv_bias, rel_pos_grid=cfg.grid_size if cfg.rel_pos_bias else None,
        )
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        norm_eps = cfg.ln_eps if cfg.mlp_norm else None
        self.mlp: nn.Module
        if cfg.mlp == "mlp":
            self.mlp = Mlp(cfg.embed_dim, cfg.hidden_dim, cfg.drop_rate, norm_eps, cfg.act)
        else:
            self.mlp = SwiGLU(cfg.embed_dim, cfg.hidden_dim, cfg.mlp == "swiglu_packed", cfg.drop_rate, norm_eps)
        self.ls1 = LayerScale(cfg.embed_dim, cfg.init_values) if cfg.init_values is not None else None
        self.ls2 = LayerScale(cfg.embed_dim, cfg.init_values) if cfg.init_values is not None else None

    def forward(
        self, x: torch.Tensor, return_attn: bool = False, rope: Rope | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attn, rope)
        x = x + (self.ls1(y) if self.ls1 is not None else y)
        y = self.mlp(self.norm2(x))
        x = x + (self.ls2(y) if self.ls2 is not None else y)
        return x, attn


class PatchEmbed(nn.Module):
    """Image → patch tokens as one strided Conv (equal to rearrange + Linear)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        # timm: no bias where a pre-norm follows (CLIP)
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=not cfg.pre_norm)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    def __init__(self, cfg: ViTConfig | None = None, weight_init: str = "", **kwargs: Any) -> None:
        """``cfg`` with ``kwargs`` applied. ``weight_init="skip"`` (timm's name) leaves the layers' own default
        initialisation, for a model whose weights are loaded next (a checkpoint's build, an importer's reference
        keys): the truncated-normal fill it skips costs 0.36 CPU-s at vit-base."""
        super().__init__()
        if weight_init not in ("", "skip"):
            raise ValueError(f"weight_init must be '' or 'skip', not {weight_init!r}")
        cfg = cfg.with_(**kwargs) if cfg is not None else ViTConfig(**kwargs)
        self.cfg = cfg
        gh, gw = cfg.grid_size
        self.patch_embed = PatchEmbed(cfg)
        npt = cfg.num_prefix_tokens
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, cfg.embed_dim)) if cfg.reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.pos_embed_len, cfg.embed_dim)) if cfg.abs_pos_embed else None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        if cfg.pre_norm:  # only where asked, so other models' state dicts keep their names
            self.norm_pre = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        # Same parameter names as timm: fc_norm only exists (and norm is an Identity) for fc_norm models,
        # so the default model, its state dict and its exported graph are unchanged.
        fc = cfg.use_fc_norm
        # final_norm False: no LayerNorm at all (transformers' CLIPForImageClassification pools the un-normed states).
        self.norm = nn.Identity() if fc or not cfg.final_norm else nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        self.fc_norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps) if fc else None
        head_in = cfg.embed_dim * (2 if cfg.global_pool == "token_avg" else 1)  # [class token, patch mean]
        self.head = nn.Linear(head_in, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist: nn.Module | None = None
        if cfg.distilled:
            self.head_dist = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.rope_sin: torch.Tensor | None
        self.rope_cos: torch.Tensor | None
        self.rope_perm: torch.Tensor | None
        if cfg.rope:  # constant tables for this grid, recomputed at every build (never in a state dict)
            for name, t in zip(("rope_sin", "rope_cos", "rope_perm"), sequence_tables(cfg, num_prefix=npt), strict=True):
                self.register_buffer(name, t, persistent=False)
        else:
            self.rope_sin = self.rope_cos = self.rope_perm = None
        if weight_init != "skip":
            self._init_weights()

    def _init_weights(self) -> None:
        if self.pos_embed is not None:
            nn.init.trunc_normal_(self.pos_embed, std=0.02)
        if self.cls_token is not None:
            nn.init.normal_(self.cls_token, std=1e-6)
        for t in (self.reg_token, self.dist_token):
            if t is not None:
                nn.init.normal_(t, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        w = self.patch_embed.proj.weight
        nn.init.trunc_normal_(w.view(w.shape[0], -1), std=0.02)

    def forward_features(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.patch_embed(x)
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if self.pos_embed is not None and self.cfg.no_embed_class:  # timm: position embeddings on the patches only
            x = x + self.pos_embed
            x = torch.cat([*prefix, x], dim=1) if prefix else x
        else:
            x = torch.cat([*prefix, x], dim=1) if prefix else x
            x = x + self.pos_embed if self.pos_embed is not None else x
        x = self.pos_drop(x)
        if self.cfg.pre_norm:
            x = self.norm_pre(x)
        rope = None
        if self.rope_sin is not None and self.rope_cos is not None and self.rope_perm is not None:
            rope = (self.rope_sin, self.rope_cos, self.rope_perm)
        attns: list[torch.Tensor] = []
        for blk in self.blocks:
            x, attn = blk(x, return_attn, rope)
            if attn is not None:
                attns.append(attn)
        return self.norm(x), attns

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_dist is not None:  # DeiT distilled, eval: the mean of the class head and the distillation head
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2
        pool, start = self.cfg.global_pool, 0 if self.cfg.pool_include_prefix else self.cfg.num_prefix_tokens
        if pool == "token_avg":  # transformers' Dinov2ForImageClassification: [class token, mean of patch tokens]
            x = torch.cat([x[:, 0], x[:, self.cfg.num_prefix_tokens :].mean(dim=1)], dim=-1)
        else:
            x = x[:, start:].mean(dim=1) if pool == "avg" else x[:, 0]
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x)[0])

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and the attention probabilities of every block, each [B, heads, N, N]."""
        feats, attns = self.forward_features(x, return_attn=True)
        return self.forward_head(feats), attns


def build_model(cfg: ViTConfig) -> VisionTransformer:
    return VisionTransformer(cfg)
