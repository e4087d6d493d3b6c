"""The ViT's configuration and its presets, each with the preprocessing it was designed for: no torch.

The table is read where no model is built: `vitdeploy presets`, and the refusal of an unknown --preset by train and
benchmark, which must not pay for importing torch (a second) to say one line. model/vit.py builds the modules from
these configs and re-exports every name here.
"""

from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass, field, replace
from typing import Any

from vitdeploy.core.errors import UsageError

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _pair(x: int | tuple[int, int] | list[int]) -> tuple[int, int]:
    if isinstance(x, int):
        return (x, x)
    h, w = x
    return (int(h), int(w))


# Vocabularies of the config's string knobs (timm's names).
GLOBAL_POOLS = ("token", "avg", "map", "token_avg")
ACTS = ("gelu", "quick_gelu", "gelu_tanh", "silu")
MLPS = ("mlp", "swiglu_packed", "swiglu")
# ViTConfig.embed_pool: "" the model's own pooling; the others as DINOv2 defines them (after the final norm)
EMBED_POOLS = ("", "cls", "mean", "cls+mean")
# The manifest's keys before the timm knobs: "pool" (cls | mean) and "final_norm" (norm | fc_norm). to_dict still
# writes both (so every manifest written before reads the same), with the new values map | token_avg and none.
_LEGACY_POOL = {"cls": "token", "mean": "avg"}
_POOL_LEGACY = {v: k for k, v in _LEGACY_POOL.items()}
_FINAL_NORMS = ("norm", "fc_norm", "none")


def _legacy_head(changes: dict[str, Any], global_pool: str, use_fc: bool) -> dict[str, Any]:
    """``pool``/``final_norm`` (the manifest's names) in ``changes`` → global_pool, fc_norm and final_norm.

    ``global_pool``: the pooling the changes lead to; ``use_fc``: where the final norm is now (a change of pool alone
    keeps it there, as the old ``pool`` option did).
    """
    out = dict(changes)
    if "pool" in out:
        pool = out.pop("pool")
        if _LEGACY_POOL.get(pool, pool) not in GLOBAL_POOLS:
            raise ValueError(f"pool must be 'cls' or 'mean' (or one of {', '.join(GLOBAL_POOLS)}), not {pool!r}")
        out.setdefault("global_pool", global_pool)
    fn = out.get("final_norm")
    if isinstance(fn, str):
        if fn not in _FINAL_NORMS:
            raise ValueError(f"final_norm must be one of {', '.join(_FINAL_NORMS)}, not {fn!r}")
        out["final_norm"] = fn != "none"
        use_fc = fn == "fc_norm"
    elif "fc_norm" in out or "final_norm" in out or "global_pool" not in out:
        return out
    # timm's rule: fc_norm=None means "after the pooling when global_pool is avg"; keep None where it agrees
    out.setdefault("fc_norm", None if use_fc == (global_pool == "avg") else use_fc)
    return out


@dataclass(frozen=True)
class ViTConfig:
    """Architecture of a ViT; every field has a default so presets stay short.

    The knobs carry timm's names (timm/models/vision_transformer.py ``VisionTransformer``), so one class covers the
    plain ViT, DeiT (distilled, III), DINOv2 (registers), CLIP, SigLIP and the gap variants. Every default leaves the
    model, its state dict and its exported graph as they were before the knob existed.
    """

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
    # head: "token" (class token), "avg" (mean of the tokens), "map" (attention pooling, timm's attn_pool),
    # "token_avg" (concat(class token, mean of patch tokens) -> Linear(2*dim): transformers' Dinov2ForImageClassification)
    global_pool: str = "token"
    # LayerNorm after the pooling instead of over all tokens before it; None: timm's rule (after, when global_pool avg)
    fc_norm: bool | None = None
    final_norm: bool = True  # False: no norm after the blocks at all (HF CLIPForImageClassification)
    ln_eps: float = 1e-6
    drop_rate: float = 0.0
    attn_drop_rate: float = 0.0
    # --- ring 1: tokens and embeddings ---
    class_token: bool = True
    reg_tokens: int = 0  # DINOv2 registers (reg_token), after the class token
    no_embed_class: bool = False  # position embeddings for the patch tokens only (DeiT III, DINOv2 reg, SigLIP)
    pre_norm: bool = False  # LayerNorm before the blocks (CLIP's norm_pre); the patch embedding then has no bias
    distilled: bool = False  # DeiT's dist_token and head_dist; eval logits = mean of the two heads
    pool_include_prefix: bool = False  # avg/map over all tokens, not the patch tokens only
    # --- ring 1: blocks ---
    init_values: float | None = None  # LayerScale (blocks.i.ls1.gamma, ls2.gamma)
    qk_norm: bool = False  # LayerNorm over each head's q and k (attn.q_norm, attn.k_norm)
    act: str = "gelu"
    mlp: str = "mlp"  # "swiglu_packed": timm's SwiGLUPacked (fc1 -> chunk); "swiglu": timm's SwiGLU (fc1_g, fc1_x)
    mlp_norm: bool = False  # LayerNorm inside the MLP before fc2 (timm's scale_mlp_norm; mlp.norm)
    # --- ring 2 (timm's eva.py / beit.py) ---
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
    # --- ring 3: what the model answers (core/task.py says what the task is; these say how it is computed) ---
    # The pooling of an embedding model when it is not the model's own (the head's) pooling: "" the model's own
    # (global_pool, fc_norm), "cls" the class token after the final norm (DINOv2's x_norm_clstoken, HF pooler_output),
    # "mean" the mean of the patch tokens after the final norm, "cls+mean" both concatenated (DINOv2's linear heads).
    embed_pool: str = ""
    # A projection after the pooling (CLIP's visual projection; timm's CLIP towers hold it as their "head"):
    # module ``proj``, Linear(pooled width, proj_dim); 0: none.
    proj_dim: int = 0
    proj_bias: bool = False
    # L2-normalise the vector before the head (an embedding model's --normalize; a zero-shot classifier's image side).
    l2_norm: bool = False
    # The attention-pooling (MAP) head's own heads and MLP width where they are not the blocks' (timm's Eva
    # attn_pool_num_heads / attn_pool_mlp_ratio: PE-core's pool has 8 heads over a 3-head ViT-T); 0 / None: the blocks'.
    pool_heads: int = 0
    pool_mlp_dim: int | None = None
    # The old constructor keyword: pool "cls" | "mean" (LayerNorm before the pooling unless final_norm says fc_norm).
    pool: InitVar[str | None] = None

    def __post_init__(self, pool: str | None = None) -> None:
        if isinstance(self.final_norm, str) or pool is not None:  # the old names (pool, final_norm: norm | fc_norm)
            legacy: dict[str, Any] = {"final_norm": self.final_norm} if isinstance(self.final_norm, str) else {}
            if pool is not None:
                legacy["pool"] = pool
            gp = _LEGACY_POOL.get(pool, pool) if pool is not None else self.global_pool
            for k, v in _legacy_head(legacy, gp, use_fc=False if self.fc_norm is None else self.fc_norm).items():
                object.__setattr__(self, k, v)
        object.__setattr__(self, "image_size", _pair(self.image_size))
        h, w = self.image_size
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(
                f"image size {h}x{w} is not divisible by the patch size {self.patch_size}: "
                f"choose a size that is a multiple of {self.patch_size}"
            )
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}")
        if self.global_pool not in GLOBAL_POOLS:
            raise ValueError(f"global_pool must be one of {', '.join(GLOBAL_POOLS)}, not {self.global_pool!r}")
        if not isinstance(self.final_norm, bool):
            raise ValueError(f"final_norm must be one of {', '.join(_FINAL_NORMS)}, not {self.final_norm!r}")
        if not self.final_norm:
            object.__setattr__(self, "fc_norm", None)  # no final norm: where it would go does not matter
        if self.global_pool in ("token", "token_avg") and not self.class_token:
            raise ValueError(f"global_pool {self.global_pool!r} needs the class token (class_token=True)")
        if self.distilled and (not self.class_token or self.global_pool != "token"):
            raise ValueError("a distilled ViT pools its class and distillation tokens: class_token=True, global_pool='token'")
        if self.reg_tokens < 0:
            raise ValueError(f"reg_tokens must be >= 0, not {self.reg_tokens}")
        if self.init_values is not None and not self.init_values > 0:
            raise ValueError(f"init_values (LayerScale) must be > 0 or None, not {self.init_values}")
        if self.act not in ACTS:
            raise ValueError(f"act must be one of {', '.join(ACTS)}, not {self.act!r}")
        if self.mlp not in MLPS:
            raise ValueError(f"mlp must be one of {', '.join(MLPS)}, not {self.mlp!r}")
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
        if self.rel_pos_bias and (self.num_prefix_tokens != 1 or not self.class_token):
            raise ValueError("the relative position bias (BEiT) is laid out for one class token and no other prefix")
        if self.embed_pool not in EMBED_POOLS:
            raise ValueError(f"embed_pool must be '' or one of {', '.join(EMBED_POOLS[1:])}, not {self.embed_pool!r}")
        if self.embed_pool in ("cls", "cls+mean") and not self.class_token:
            raise ValueError(f"embed_pool {self.embed_pool!r} needs the class token (class_token=True)")
        if self.embed_pool and self.use_fc_norm:
            raise ValueError("embed_pool pools after the final norm over all tokens; this model norms after its pooling")
        if self.embed_pool and self.distilled:
            raise ValueError("a distilled ViT's embedding is the mean of its class and distillation tokens: no embed_pool")
        if self.proj_dim < 0:
            raise ValueError(f"proj_dim must be >= 0, not {self.proj_dim}")
        if self.pool_heads < 0 or (self.pool_heads and self.embed_dim % self.pool_heads):
            raise ValueError(f"pool_heads {self.pool_heads} must divide embed_dim {self.embed_dim} (0: the blocks' heads)")
        if self.pool_mlp_dim is not None and self.pool_mlp_dim <= 0:
            raise ValueError(f"pool_mlp_dim must be > 0 or None, not {self.pool_mlp_dim}")
        if self.mlp == "swiglu_packed" and self.hidden_dim % 2:
            raise ValueError(f"mlp 'swiglu_packed' splits fc1 in two halves: its width {self.hidden_dim} must be even")

    @property
    def pooled_dim(self) -> int:
        """The width of the pooled vector (before the projection and the head)."""
        if self.embed_pool:
            return 2 * self.embed_dim if self.embed_pool == "cls+mean" else self.embed_dim
        return 2 * self.embed_dim if self.global_pool == "token_avg" else self.embed_dim

    @property
    def embed_pools(self) -> tuple[str, ...]:
        """The embed_pool values this model has (export --pool, train --probe --pool): with a class token and the final
        norm over every token, all three as DINOv2 defines them; without a class token, mean; none for a model that
        norms after its pooling, a distilled one, one without a final norm, or one whose projection (CLIP's, PE's) was
        trained on its own pooling."""
        if self.use_fc_norm or self.distilled or not self.final_norm or self.proj_dim:
            return ()
        return EMBED_POOLS[1:] if self.class_token else ("mean",)

    @property
    def feature_dim(self) -> int:
        """The width of the vector the head reads: the pooled vector, or the projection's output."""
        return self.proj_dim or self.pooled_dim

    @property
    def output_dim(self) -> int:
        """What the model answers per image: num_classes logits, or (num_classes 0) the feature_dim-wide embedding."""
        return self.num_classes or self.feature_dim

    @property
    def hidden_dim(self) -> int:
        return self.mlp_dim if self.mlp_dim is not None else int(self.embed_dim * self.mlp_ratio)

    @property
    def grid_size(self) -> tuple[int, int]:
        return (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)

    @property
    def use_fc_norm(self) -> bool:
        """timm's rule: the final LayerNorm goes after the pooling when fc_norm says so, or (None) for avg pooling."""
        return self.final_norm and (self.global_pool == "avg" if self.fc_norm is None else self.fc_norm)

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch tokens: class, distillation, then registers (timm's order)."""
        return int(self.class_token) + int(self.distilled) + self.reg_tokens

    @property
    def seq_len(self) -> int:
        gh, gw = self.grid_size
        return self.num_prefix_tokens + gh * gw

    @property
    def pos_embed_len(self) -> int:
        gh, gw = self.grid_size
        return gh * gw + (0 if self.no_embed_class else self.num_prefix_tokens)

    def to_dict(self) -> dict[str, Any]:
        """The manifest's "model": every field before the timm knobs always (pool/final_norm in their old names and
        places), each newer field only where it is not the default, so a default model's manifest is unchanged."""
        d = asdict(self)
        d["image_size"] = list(self.image_size)
        out: dict[str, Any] = {}
        for k, v in d.items():
            if k == "global_pool":
                out["pool"] = _POOL_LEGACY.get(v, v)
            elif k == "fc_norm":
                continue
            elif k == "final_norm":
                out["final_norm"] = ("fc_norm" if self.use_fc_norm else "norm") if v else "none"
            elif k in _NEW_FIELDS:
                if v != _DEFAULTS[k]:
                    out[k] = v
            else:
                out[k] = v
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ViTConfig:
        """Any manifest's "model" (with the old pool/final_norm names, or timm's); unknown keys are ignored."""
        known = {f for f in cls.__dataclass_fields__} | {"pool"}
        kwargs: dict[str, Any] = {k: (tuple(v) if k == "image_size" else v) for k, v in d.items() if k in known}
        pool = kwargs.get("pool", "cls")
        gp = kwargs.get("global_pool", _LEGACY_POOL.get(pool, pool))
        return cls(**_legacy_head(kwargs, gp, use_fc=False))

    def with_(self, **changes: Any) -> ViTConfig:
        """A copy with ``changes``; the manifest's names ``pool`` (cls | mean) and ``final_norm`` (norm | fc_norm |
        none) are accepted too."""
        pool = changes.get("pool", self.global_pool)
        gp = changes.get("global_pool", _LEGACY_POOL.get(pool, pool))
        return replace(self, **_legacy_head(changes, gp, self.use_fc_norm))


_DEFAULTS: dict[str, Any] = {k: f.default for k, f in ViTConfig.__dataclass_fields__.items() if k != "pool"}
# The fields added with the timm knobs: to_dict writes them only where they differ from the default.
_NEW_FIELDS = frozenset(list(_DEFAULTS)[list(_DEFAULTS).index("class_token") :])


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
    """Parameter count computed from the config alone (no weights allocated); every knob counted (a test holds it
    to the built model's count)."""
    d, h = cfg.embed_dim, cfg.hidden_dim
    p, c = cfg.patch_size, cfg.num_classes
    ln = 2 * d
    n = d * cfg.in_chans * p * p + (0 if cfg.pre_norm else d)  # patch embedding (no bias under a pre-norm)
    n += (cfg.num_prefix_tokens + cfg.pos_embed_len) * d  # prefix tokens, position embeddings
    n += ln if cfg.pre_norm else 0
    mlp = {"mlp": d * h + h + h * d + d, "swiglu_packed": d * h + h + (h // 2) * d + d, "swiglu": 2 * (d * h + h) + h * d + d}
    mlp_norm = (h // 2 if cfg.mlp == "swiglu_packed" else h) * 2 if cfg.mlp_norm else 0
    attn = 3 * d * d + (3 * d if cfg.qkv_bias else 0) + d * d + d + (4 * (d // cfg.num_heads) if cfg.qk_norm else 0)
    per_block = 2 * ln + attn + mlp[cfg.mlp] + mlp_norm + (2 * d if cfg.init_values else 0)
    n += cfg.depth * per_block
    if cfg.global_pool == "map":  # latent, q, kv, proj, norm, its plain MLP
        ph = cfg.pool_mlp_dim or h
        n += d + (d * d + d) + (2 * d * d + 2 * d) + (d * d + d) + ln + (d * ph + ph + ph * d + d)
    head_in = cfg.pooled_dim
    n += 2 * head_in if cfg.use_fc_norm else (ln if cfg.final_norm else 0)
    if cfg.proj_dim:  # CLIP's visual projection; the head (if any) then reads its output
        n += cfg.pooled_dim * cfg.proj_dim + (cfg.proj_dim if cfg.proj_bias else 0)
        head_in = cfg.proj_dim
    if c > 0:
        n += (head_in * c + c) * (2 if cfg.distilled else 1)
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
