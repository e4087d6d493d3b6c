"""The Vision Transformer and its presets.

Laid out like timm's ``vision_transformer.py`` (same module and parameter names),
so timm and Hugging Face weights map onto it one to one, and each preset declares
its preprocessing next to its architecture.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitdeploy.core.errors import UsageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(x, int):
        return (x, x)
    h, w = x
    return (int(h), int(w))


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of a ViT; every field has a default so presets stay short."""

    image_size: tuple[int, int] = (224, 224)
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    embed_dim: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_ratio: float = 4.0
    mlp_dim: int | None = None
    qkv_bias: bool = True
    pool: str = "cls"  # "cls" or "mean"
    # "norm": LayerNorm over all tokens before pooling (timm's default); "fc_norm": LayerNorm after
    # pooling (timm's global_pool="avg" models, whose weights name it fc_norm).
    final_norm: str = "norm"
    ln_eps: float = 1e-6
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "image_size", _pair(self.image_size))
        h, w = self.image_size
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {self.patch_size}: "
                f"choose a size that is a multiple of {self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.pool not in ("cls", "mean"):
            raise ValueError(f"pool must be 'cls' or 'mean', not {self.pool!r}")
        if self.final_norm not in ("norm", "fc_norm"):
            raise ValueError(f"final_norm must be 'norm' or 'fc_norm', not {self.final_norm!r}")

    @property
    def hidden_dim(self) -> int:
        return self.mlp_dim if self.mlp_dim is not None else int(self.embed_dim * self.mlp_ratio)

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["image_size"] = list(self.image_size)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        known = {f for f in cls.__dataclass_fields__}
        kwargs: dict[str, Any] = {k: (tuple(v) if k == "image_size" else v) for k, v in d.items() if k in known}
        return cls(**kwargs)

    def with_(self, **changes: Any) -> ViTConfig:
        return replace(self, **changes)


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection.

    The normal path calls ``scaled_dot_product_attention``; exported, it becomes
    MatMul → Softmax → MatMul with the scale applied before the first MatMul, the
    pattern TensorRT fuses. ``return_attn`` takes an explicit path that also hands
    back the attention probabilities (for attention maps), so the normal path and
    the exported graph stay untouched.
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = True, attn_drop: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        B, N, C = x.shape
        qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        attn: torch.Tensor | None = None
        if return_attn:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        x = x.transpose(1, 2).reshape(B, N, C)
        return self.proj(x), attn


class Mlp(nn.Module):
    def __init__(self, in_features: int, hidden_features: int, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class Block(nn.Module):
    """Pre-norm encoder block: x + attn(norm1(x)), then x + mlp(norm2(x))."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        self.attn = Attention(cfg.embed_dim, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate)
        self.norm2 = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        self.mlp = Mlp(cfg.embed_dim, cfg.hidden_dim, cfg.drop_rate)

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attn)
        x = x + y
        x = x + self.mlp(self.norm2(x))
        return x, attn


class PatchEmbed(nn.Module):
    """Image → patch tokens as one strided Conv (equal to rearrange + Linear)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(cfg.in_chans, cfg.embed_dim, kernel_size=cfg.patch_size, stride=cfg.patch_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    def __init__(self, cfg: ViTConfig | None = None, **kwargs: Any) -> None:
        super().__init__()
        cfg = cfg.with_(**kwargs) if cfg is not None else ViTConfig(**kwargs)
        self.cfg = cfg
        gh, gw = cfg.grid_size
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, cfg.embed_dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, gh * gw + 1, cfg.embed_dim))
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        # Same parameter names as timm: fc_norm only exists (and norm is an Identity) for fc_norm models,
        # so the default model, its state dict and its exported graph are unchanged.
        fc = cfg.final_norm == "fc_norm"
        self.norm = nn.Identity() if fc else nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps)
        self.fc_norm = nn.LayerNorm(cfg.embed_dim, eps=cfg.ln_eps) if fc else None
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self._init_weights()

    def _init_weights(self) -> None:
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        nn.init.normal_(self.cls_token, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        w = self.patch_embed.proj.weight
        nn.init.trunc_normal_(w.view(w.shape[0], -1), std=0.02)

    def forward_features(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.patch_embed(x)
        x = torch.cat([self.cls_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = self.pos_drop(x + self.pos_embed)
        attns: list[torch.Tensor] = []
        for blk in self.blocks:
            x, attn = blk(x, return_attn)
            if attn is not None:
                attns.append(attn)
        return self.norm(x), attns

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        x = x[:, 1:].mean(dim=1) if self.cfg.pool == "mean" else x[:, 0]
        if self.fc_norm is not None:
            x = self.fc_norm(x)
        return self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x)[0])

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and the attention probabilities of every block, each [B, heads, N, N]."""
        feats, attns = self.forward_features(x, return_attn=True)
        return self.forward_head(feats), attns


# --- presets -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Preset:
    """An architecture plus the preprocessing it was designed for."""

    name: str
    config: ViTConfig
    preprocess: dict[str, Any] = field(default_factory=dict)
    description: str = ""


def _imagenet_pp(size: int = 224) -> dict[str, Any]:
    return {
        "input_size": [size, size],
        "resize_mode": "shorter",
        "crop_pct": 0.875,
        "interpolation": "bicubic",
        "mean": list(IMAGENET_MEAN),
        "std": list(IMAGENET_STD),
        "channel_order": "RGB",
    }


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            "vit-digits",
            ViTConfig(image_size=(32, 32), patch_size=4, embed_dim=96, depth=4, num_heads=4, mlp_ratio=2.0, num_classes=10),
            {
                "input_size": [32, 32],
                "resize_mode": "squash",
                "crop_pct": 1.0,
                "interpolation": "bilinear",
                "mean": [0.5, 0.5, 0.5],
                "std": [0.5, 0.5, 0.5],
                "channel_order": "RGB",
            },
            "small ViT for the embedded digits demo (32x32, patch 4)",
        ),
        Preset("vit-tiny", ViTConfig(embed_dim=192, depth=12, num_heads=3), _imagenet_pp(), "ViT-Ti/16"),
        Preset("vit-small", ViTConfig(embed_dim=384, depth=12, num_heads=6), _imagenet_pp(), "ViT-S/16"),
        Preset("vit-base", ViTConfig(embed_dim=768, depth=12, num_heads=12), _imagenet_pp(), "ViT-B/16"),
        Preset("vit-large", ViTConfig(embed_dim=1024, depth=24, num_heads=16), _imagenet_pp(), "ViT-L/16"),
        Preset(
            "vit-huge",
            ViTConfig(patch_size=14, embed_dim=1280, depth=32, num_heads=16),
            _imagenet_pp(),
            "ViT-H/14",
        ),
    ]
}


class UnknownPreset(UsageError, ValueError):
    """A preset name that is not in PRESETS: a usage error (exit 2) wherever a command takes --preset."""


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownPreset(f"unknown preset {name!r}: choose one of {', '.join(PRESETS)}") from None


def count_params(cfg: ViTConfig) -> int:
    """Parameter count computed from the config alone (no weights allocated)."""
    d, h = cfg.embed_dim, cfg.hidden_dim
    gh, gw = cfg.grid_size
    p = cfg.patch_size
    n = d * cfg.in_chans * p * p + d  # patch embedding
    n += d + (gh * gw + 1) * d  # cls token, position embeddings
    per_block = 2 * d + (3 * d * d + (3 * d if cfg.qkv_bias else 0)) + (d * d + d) + 2 * d + (d * h + h) + (h * d + d)
    n += cfg.depth * per_block
    n += 2 * d  # final norm
    if cfg.num_classes > 0:
        n += d * cfg.num_classes + cfg.num_classes
    return n


def preset_table() -> list[dict[str, Any]]:
    """Presets with their size at 224x224 and 1000 classes (the literature's reference)."""
    rows = []
    for p in PRESETS.values():
        ref = p.config.with_(image_size=(224, 224), num_classes=1000)
        rows.append(
            {
                "name": p.name,
                "params": count_params(ref),
                "params_as_configured": count_params(p.config),
                "patch_size": p.config.patch_size,
                "embed_dim": p.config.embed_dim,
                "depth": p.config.depth,
                "num_heads": p.config.num_heads,
                "mlp_dim": p.config.hidden_dim,
                "image_size": list(p.config.image_size),
                "description": p.description,
            }
        )
    return rows


def build_model(cfg: ViTConfig) -> VisionTransformer:
    return VisionTransformer(cfg)


def gflops(cfg: ViTConfig) -> float:
    """Approximate forward GFLOPs per image (multiply-adds x2), for the presets table."""
    n = cfg.grid_size[0] * cfg.grid_size[1] + 1
    d, h = cfg.embed_dim, cfg.hidden_dim
    per_block = 2 * n * (3 * d * d + d * d + 2 * d * h) + 2 * 2 * n * n * d
    return (cfg.depth * per_block + 2 * (n - 1) * d * cfg.in_chans * cfg.patch_size**2) / 1e9 + 0 * math.pi
