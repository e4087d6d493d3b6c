"""The ViT's configuration and its presets, each with the preprocessing it was designed for: no torch.

The table is read where no model is built: `vitdeploy presets`, and the refusal of an unknown --preset by train and
benchmark, which must not pay for importing torch (a second) to say one line. model/vit.py builds the modules from
these configs and re-exports every name here.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

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
    # --- first ring (stand-in until h1-model's lands: the knobs the Eva/Beit models need); defaults change nothing.
    class_token: bool = True
    reg_tokens: int = 0
    init_values: float | None = None  # LayerScale (ls1.gamma, ls2.gamma)
    mlp: str = "plain"  # "plain" | "swiglu_packed" (timm's GluMlp: fc1 → [gate, x]) | "swiglu" (fc1_g, fc1_x)
    mlp_norm: bool = False  # LayerNorm before fc2 (timm's scale_mlp / Mlp(norm_layer))
    # --- second ring (timm's eva.py / beit.py); every default leaves the model, its state dict and its graph as before.
    # Absolute position embeddings (timm's use_abs_pos_emb): BEiT, DINOv3 and the RoPE ViTs have none.
    abs_pos_embed: bool = True
    # q and v biases without a k bias (BEiT/EVA's q_bias, v_bias parameters); replaces qkv_bias.
    qv_bias: bool = False
    # Rotary position embeddings (model/rope.py): "" none, "cat" (EVA-02, timm's vit_*_rope_*), "dinov3".
    rope: str = ""
    rope_temperature: float = 10000.0
    rope_ref_grid: tuple[int, int] | None = None  # timm's ref_feat_shape: positions rescaled onto this grid
    rope_half: bool = False  # rotate-half layout (DINOv3) instead of interleaved pairs (EVA)
    rope_grid_offset: float = 0.0
    rope_grid_indexing: str = "ij"
    # BEiT's relative position bias, one table per block (model/relpos.py).
    rel_pos_bias: bool = False
    # --- first-ring knobs the Hugging Face families need (h3 stand-in until h1-model's land; same names as h1's brief).
    act: str = "gelu"  # "gelu" (erf) | "quick_gelu" (CLIP) | "gelu_tanh" (SigLIP) | "silu"
    pre_norm: bool = False  # LayerNorm on the embedded tokens before the blocks (CLIP's pre_layrnorm; timm's norm_pre)
    distilled: bool = False  # DeiT's distillation token after the class token, and head_dist; eval = mean of both heads

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
        if self.pool not in ("cls", "mean", "token_avg"):
            raise ValueError(f"pool must be 'cls', 'mean' or 'token_avg', not {self.pool!r}")
        if self.final_norm not in ("norm", "fc_norm", "none"):
            raise ValueError(f"final_norm must be 'norm', 'fc_norm' or 'none', not {self.final_norm!r}")
        if self.act not in ("gelu", "quick_gelu", "gelu_tanh", "silu"):
            raise ValueError(f"act must be 'gelu', 'quick_gelu', 'gelu_tanh' or 'silu', not {self.act!r}")
        if self.distilled and (not self.class_token or self.pool != "cls"):
            raise ValueError("a distilled model pools its class and distillation tokens: class_token=True, pool 'cls'")
        if self.pool == "token_avg" and not self.class_token:
            raise ValueError("pool 'token_avg' concatenates the class token with the patch mean: class_token=True")
        if self.mlp not in ("plain", "swiglu_packed", "swiglu"):
            raise ValueError(f"mlp must be 'plain', 'swiglu_packed' or 'swiglu', not {self.mlp!r}")
        if self.pool == "cls" and not self.class_token:
            raise ValueError("pool 'cls' needs the class token: use pool 'mean' or class_token=True")
        if self.rel_pos_bias and (not self.class_token or self.reg_tokens):
            raise ValueError("the relative position bias (BEiT) is laid out for one class token and no registers")
        if self.rope_ref_grid is not None:
            object.__setattr__(self, "rope_ref_grid", _pair(self.rope_ref_grid))
        if self.qv_bias and self.qkv_bias:
            raise ValueError("qv_bias replaces qkv_bias (no k bias): set qkv_bias=False")
        if self.rope not in ("", "cat", "dinov3"):
            raise ValueError(f"rope must be '', 'cat' or 'dinov3', not {self.rope!r}")
        if self.rope and (self.embed_dim // self.num_heads) % 4:
            raise ValueError(f"rotary embeddings need a head dim divisible by 4, not {self.embed_dim // self.num_heads}")
        if self.rope_grid_indexing not in ("ij", "xy"):
            raise ValueError(f"rope_grid_indexing must be 'ij' or 'xy', not {self.rope_grid_indexing!r}")

    @property
    def hidden_dim(self) -> int:
        return self.mlp_dim if self.mlp_dim is not None else int(self.embed_dim * self.mlp_ratio)

    @property
    def num_prefix_tokens(self) -> int:
        """Class, distillation and register tokens before the patch tokens."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    def to_dict(self) -> dict[str, Any]:
        """The fields, leaving out the second ring's while they hold their defaults (so a manifest, and the ONNX
        metadata that carries it, stays byte-identical for every model that has none of them)."""
        d = asdict(self)
        d["image_size"] = list(self.image_size)
        for k in _RING2_FIELDS:
            if d[k] == _RING2_DEFAULTS[k]:
                del d[k]
        if d.get("rope_ref_grid") is not None:
            d["rope_ref_grid"] = list(d["rope_ref_grid"])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        known = {f for f in cls.__dataclass_fields__}
        kwargs: dict[str, Any] = {
            k: (tuple(v) if k in ("image_size", "rope_ref_grid") and v is not None else v) for k, v in d.items() if k in known
        }
        return cls(**kwargs)

    def with_(self, **changes: Any) -> ViTConfig:
        return replace(self, **changes)


_RING2_FIELDS = ("class_token", "reg_tokens", "init_values", "mlp", "mlp_norm", "abs_pos_embed", "qv_bias", "rope", "rope_temperature", "rope_ref_grid", "rope_half", "rope_grid_offset",
                 "rope_grid_indexing", "rel_pos_bias", "act", "pre_norm", "distilled")
_RING2_DEFAULTS = {k: ViTConfig.__dataclass_fields__[k].default for k in _RING2_FIELDS}


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
