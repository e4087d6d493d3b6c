"""Which ViT family a config describes, and how its token sequence is laid out: read from the config dict alone.

No torch here: `info` names the family from a manifest, and `explain` reads the token layout (which rows and columns
of an attention map are the class, distillation and register tokens) without building a model. Fields a config
leaves out (they are written only when they differ from the default) read as their defaults, so a manifest written
before a knob existed describes the plain ViT it is.

Token order is timm's (``VisionTransformer._pos_embed`` and ``VisionTransformerDistilled``): class token, then the
distillation token, then the register tokens, then the patches.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


def _get(cfg: dict[str, Any], key: str, default: Any) -> Any:
    v = cfg.get(key, default)
    return default if v is None else v


def pooling(cfg: dict[str, Any]) -> str:
    """What the head reads: "token" (the class token), "avg" (mean of the patch tokens), "token_avg" (both,
    transformers' DINOv2 classifier) or "map" (an attention-pooling head). The first config's ``pool`` ("cls" /
    "mean") reads as token / avg."""
    gp = cfg.get("global_pool")
    if gp in ("token", "avg", "map", "token_avg"):
        return str(gp)
    if gp in ("cls",):
        return "token"
    if gp in ("mean", "avg"):
        return "avg"
    pool = _get(cfg, "pool", "cls")
    return {"mean": "avg", "token_avg": "token_avg", "map": "map"}.get(pool, "token")


@dataclass(frozen=True)
class TokenLayout:
    """Where each kind of token sits in the sequence the blocks attend over."""

    class_token: bool
    distilled: bool
    registers: int
    patches: int

    @property
    def prefix(self) -> int:
        return int(self.class_token) + int(self.distilled) + self.registers

    @property
    def cls_index(self) -> int | None:
        return 0 if self.class_token else None

    @property
    def dist_index(self) -> int | None:
        return int(self.class_token) if self.distilled else None

    @property
    def length(self) -> int:
        return self.prefix + self.patches

    def patch_slice(self) -> slice:
        return slice(self.prefix, self.prefix + self.patches)


def token_layout(cfg: dict[str, Any]) -> TokenLayout:
    h, w = _get(cfg, "image_size", [224, 224])
    p = int(_get(cfg, "patch_size", 16))
    return TokenLayout(
        class_token=bool(_get(cfg, "class_token", True)),
        distilled=bool(_get(cfg, "distilled", False)),
        registers=int(_get(cfg, "reg_tokens", 0)),
        patches=(int(h) // p) * (int(w) // p),
    )


def features(cfg: dict[str, Any]) -> list[str]:
    """The architecture's departures from the plain ViT (timm's vit_*), each as a short phrase, in timm's order."""
    out: list[str] = []
    lay = token_layout(cfg)
    if not lay.class_token:
        out.append("no class token")
    if lay.distilled:
        out.append("distillation token + second head (mean of the two heads)")
    if lay.registers:
        out.append(f"{lay.registers} register tokens")
    if _get(cfg, "no_embed_class", False):
        out.append("no position embedding on the prefix tokens")
    if not _get(cfg, "abs_pos_embed", True):
        out.append("no absolute position embedding")
    if _get(cfg, "pre_norm", False):
        out.append("pre-norm (LayerNorm before the blocks)")
    if _get(cfg, "init_values", None):
        out.append(f"LayerScale (init {cfg['init_values']:g})")
    if _get(cfg, "qk_norm", False):
        out.append("q/k norm")
    if _get(cfg, "qv_bias", False):
        out.append("q/v bias without k bias")
    rope = _get(cfg, "rope", "")
    if rope:
        out.append(f"rotary position embedding ({rope})")
    if _get(cfg, "rel_pos_bias", False):
        out.append("relative position bias")
    act = _get(cfg, "act", "gelu")
    if act != "gelu":
        out.append(f"activation {act}")
    mlp = _get(cfg, "mlp", "plain")
    if mlp not in ("plain", "mlp"):
        out.append({"swiglu": "SwiGLU MLP", "swiglu_packed": "SwiGLU MLP (packed)"}.get(mlp, f"MLP {mlp}"))
    if _get(cfg, "mlp_norm", False):
        out.append("norm inside the MLP")
    pool = pooling(cfg)
    if _get(cfg, "final_norm", "norm") in ("none", False):
        out.append("no final LayerNorm")
    out.append({"token": "class-token head", "avg": "mean-pool head", "token_avg": "class token + patch mean head",
                "map": "attention-pooling (MAP) head"}[pool])
    if pool == "map" and _get(cfg, "pool_heads", 0):
        out.append(f"attention pool with {cfg['pool_heads']} heads")
    if _get(cfg, "proj_dim", 0):
        out.append(f"projection to {cfg['proj_dim']}{' (with bias)' if _get(cfg, 'proj_bias', False) else ''}")
    fc = cfg.get("fc_norm")
    if fc or _get(cfg, "final_norm", "norm") == "fc_norm" or (fc is None and "global_pool" in cfg and pool == "avg"):
        out.append("LayerNorm after pooling (fc_norm)")
    return out


def family(cfg: dict[str, Any]) -> str:
    """The family a config belongs to, named by its defining features (the names users know them by)."""
    lay = token_layout(cfg)
    act, mlp, pool = _get(cfg, "act", "gelu"), str(_get(cfg, "mlp", "plain")), pooling(cfg)
    if _get(cfg, "rope", "") and _get(cfg, "pre_norm", False) and pool == "map":
        return "Perception Encoder (pre-norm, rotary position embedding, attention pool)"
    if _get(cfg, "rope", "") and mlp.startswith("swiglu"):
        return "EVA-02 (SwiGLU, rotary position embedding)"
    if _get(cfg, "rope", ""):
        return "RoPE ViT (rotary position embedding)"
    if _get(cfg, "rel_pos_bias", False):
        return "BEiT (relative position bias)"
    if lay.distilled:
        return "DeiT distilled (distillation token)"
    if pool == "map":
        return "SigLIP-like (attention-pooling head)"
    if _get(cfg, "pre_norm", False) or act == "quick_gelu":
        return "CLIP (pre-norm" + (", quick_gelu)" if act == "quick_gelu" else ")")
    if lay.registers:
        return f"ViT with registers ({lay.registers})"
    if pool == "token_avg":
        return "DINOv2 classifier (class token + patch mean)"
    if _get(cfg, "init_values", None):
        return "LayerScale ViT (DeiT-III / DINOv2)"
    if not lay.class_token or pool == "avg":
        return "ViT, mean-pooled"
    return "ViT"
