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
    "IMAGENET_MEAN", "IMAGENET_STD", "PRESETS", "Attention", "Block", "LayerScale", "Mlp", "PatchEmbed", "Preset",
    "SwiGLU", "SwiGLUPacked", "UnknownPreset", "ViTConfig", "VisionTransformer", "WithPatchTokens", "build_model", "count_params",
    "fold_layer_scale", "get_preset", "preset_table",
]


class QuickGELU(nn.Module):
    """x * sigmoid(1.702 x): OpenAI CLIP's activation (timm's QuickGELU)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(1.702 * x)


def make_act(name: str) -> nn.Module:
    """The activation a config names (ViTConfig.act), as timm's get_act_layer builds it."""
    if name == "gelu":
        return nn.GELU()
    if name == "gelu_tanh":
        return nn.GELU(approximate="tanh")
    if name == "quick_gelu":
        return QuickGELU()
    if name == "silu":
        return nn.SiLU()
    raise ValueError(f"unknown activation {name!r}")


class Attention(nn.Module):
    """Multi-head self-attention with one fused QKV projection.

    The normal path calls ``scaled_dot_product_attention``; exported, it becomes
    MatMul → Softmax → MatMul with the scale applied before the first MatMul, the
    pattern TensorRT fuses (q/k norm, when there, comes before it). ``return_attn`` takes an explicit path that
    also hands back the attention probabilities (for attention maps), so the normal path and
    the exported graph stay untouched.

    Second-ring options (timm's eva.py / beit.py), all off by default:
    - ``qv_bias``: q and v biases without a k bias, held as timm's Eva/Beit hold them: ``qkv.weight`` with no
      bias, parameters ``q_bias`` and ``v_bias``, and a non-persistent zero ``k_bias``; the projection uses
      their concatenation, so a timm state dict loads as it is and the result is exact (the k part is a
      constant zero). Exported, the concatenation folds into one bias constant: MatMul + Add, like a Linear.
    - ``rope``: the model's constant tables (model/rope.py), passed to every block; q and k are rotated after the
      projection (and after q/k norm, as in timm's EvaAttention), elementwise.
    - ``rel_pos_grid``: BEiT's relative position bias (model/relpos.py), added to the scores before Softmax on
      an explicit path: MatMul(Q·scale, Kᵀ) → Add(bias) → Softmax → MatMul(·, V).
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        qk_norm: bool = False,
        ln_eps: float = 1e-6,
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
        # timm's names; absent (None) without qk_norm, so the default model's modules are what they were
        self.q_norm = nn.LayerNorm(self.head_dim, eps=ln_eps) if qk_norm else None
        self.k_norm = nn.LayerNorm(self.head_dim, eps=ln_eps) if qk_norm else None
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
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
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


class Mlp(nn.Module):
    """fc1 → act → (norm) → fc2 (timm's Mlp; ``norm`` is timm's scale_mlp_norm)."""

    def __init__(
        self, in_features: int, hidden_features: int, drop: float = 0.0, act: str = "gelu", norm_eps: float | None = None
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = make_act(act)
        self.norm = nn.LayerNorm(hidden_features, eps=norm_eps) if norm_eps is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.norm(self.drop(self.act(self.fc1(x))))))


class SwiGLUPacked(nn.Module):
    """timm's SwiGLUPacked (GluMlp, gate first): fc1 to 2 halves, act(first) * second → (norm) → fc2."""

    def __init__(
        self, in_features: int, hidden_features: int, drop: float = 0.0, act: str = "silu", norm_eps: float | None = None
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden_features)
        self.act = make_act(act)
        self.norm = nn.LayerNorm(hidden_features // 2, eps=norm_eps) if norm_eps is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features // 2, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(self.norm(self.drop(self.act(x1) * x2))))


class SwiGLU(nn.Module):
    """timm's SwiGLU: act(fc1_g(x)) * fc1_x(x) → (norm) → fc2."""

    def __init__(
        self, in_features: int, hidden_features: int, drop: float = 0.0, act: str = "silu", norm_eps: float | None = None
    ) -> None:
        super().__init__()
        self.fc1_g = nn.Linear(in_features, hidden_features)
        self.fc1_x = nn.Linear(in_features, hidden_features)
        self.act = make_act(act)
        self.norm = nn.LayerNorm(hidden_features, eps=norm_eps) if norm_eps is not None else nn.Identity()
        self.fc2 = nn.Linear(hidden_features, in_features)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.norm(self.drop(self.act(self.fc1_g(x)) * self.fc1_x(x)))))


MLP_LAYERS: dict[str, type[Mlp] | type[SwiGLUPacked] | type[SwiGLU]] = {
    "mlp": Mlp, "swiglu_packed": SwiGLUPacked, "swiglu": SwiGLU,
}


def make_mlp(cfg: ViTConfig, dim: int, hidden: int) -> nn.Module:
    return MLP_LAYERS[cfg.mlp](dim, hidden, cfg.drop_rate, cfg.act, cfg.ln_eps if cfg.mlp_norm else None)


class LayerScale(nn.Module):
    """x * gamma per channel (timm's LayerScale, ``ls1.gamma``/``ls2.gamma``); fold_layer_scale folds it away."""

    def __init__(self, dim: int, init_values: float) -> None:
        super().__init__()
        self.gamma = nn.Parameter(init_values * torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.gamma


class Block(nn.Module):
    """Pre-norm encoder block: x + ls1(attn(norm1(x))), then x + ls2(mlp(norm2(x)))."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        d = cfg.embed_dim
        self.norm1 = nn.LayerNorm(d, eps=cfg.ln_eps)
        self.attn = Attention(
            d, cfg.num_heads, cfg.qkv_bias, cfg.attn_drop_rate, cfg.qk_norm, cfg.ln_eps,
            qv_bias=cfg.qv_bias, rel_pos_grid=cfg.grid_size if cfg.rel_pos_bias else None,
        )
        self.ls1: nn.Module = LayerScale(d, cfg.init_values) if cfg.init_values else nn.Identity()
        self.norm2 = nn.LayerNorm(d, eps=cfg.ln_eps)
        self.mlp = make_mlp(cfg, d, cfg.hidden_dim)
        self.ls2: nn.Module = LayerScale(d, cfg.init_values) if cfg.init_values else nn.Identity()

    def forward(
        self, x: torch.Tensor, return_attn: bool = False, rope: Rope | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        y, attn = self.attn(self.norm1(x), return_attn, rope)
        x = x + self.ls1(y)
        x = x + self.ls2(self.mlp(self.norm2(x)))
        return x, attn


class PatchEmbed(nn.Module):
    """Image → patch tokens as one strided Conv (equal to rearrange + Linear); no bias under a pre-norm (timm)."""

    def __init__(self, cfg: ViTConfig) -> None:
        super().__init__()
        self.proj = nn.Conv2d(
            cfg.in_chans, cfg.embed_dim, kernel_size=cfg.patch_size, stride=cfg.patch_size, bias=not cfg.pre_norm
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class VisionTransformer(nn.Module):
    """timm's VisionTransformer (and VisionTransformerDistilled) for the knobs ViTConfig has, with timm's names.

    Every module a knob adds is absent (None or an Identity) at its default, so the default model's state dict and
    exported graph are what they were before the knob.
    """

    def __init__(self, cfg: ViTConfig | None = None, weight_init: str = "", **kwargs: Any) -> None:
        """``cfg`` with ``kwargs`` applied. ``weight_init="skip"`` (timm's name) leaves the layers' own default
        initialisation, for a model whose weights are loaded next (a checkpoint's build, an importer's reference
        keys): the truncated-normal fill it skips costs 0.36 CPU-s at vit-base."""
        super().__init__()
        if weight_init not in ("", "skip"):
            raise ValueError(f"weight_init must be '' or 'skip', not {weight_init!r}")
        cfg = cfg.with_(**kwargs) if cfg is not None else ViTConfig(**kwargs)
        self.cfg = cfg
        d = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.patch_embed = PatchEmbed(cfg)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.class_token else None
        self.dist_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.distilled else None
        self.reg_token = nn.Parameter(torch.zeros(1, cfg.reg_tokens, d)) if cfg.reg_tokens else None
        self.pos_embed = nn.Parameter(torch.zeros(1, cfg.pos_embed_len, d)) if cfg.abs_pos_embed else None
        self.pos_drop = nn.Dropout(cfg.drop_rate)
        self.norm_pre = nn.LayerNorm(d, eps=cfg.ln_eps) if cfg.pre_norm else None
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.depth)])
        # Same parameter names as timm: fc_norm only exists (and norm is an Identity) for fc_norm models,
        # so the default model, its state dict and its exported graph are unchanged.
        fc = cfg.use_fc_norm
        self.norm = nn.LayerNorm(d, eps=cfg.ln_eps) if cfg.final_norm and not fc else nn.Identity()
        self.attn_pool = None
        if cfg.global_pool == "map":
            from vitdeploy.model.heads import AttentionPoolLatent

            mlp = Mlp(d, cfg.pool_mlp_dim or cfg.hidden_dim, act=cfg.act)
            self.attn_pool = AttentionPoolLatent(d, cfg.pool_heads or cfg.num_heads, mlp, cfg.ln_eps)
        pooled = cfg.pooled_dim
        self.fc_norm = nn.LayerNorm(pooled, eps=cfg.ln_eps) if fc and not cfg.embed_pool else None
        # CLIP's visual projection (timm's CLIP towers call it "head"; importers rename it): absent without proj_dim
        self.proj = nn.Linear(pooled, cfg.proj_dim, bias=cfg.proj_bias) if cfg.proj_dim else None
        self.head = nn.Linear(cfg.feature_dim, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.head_dist: nn.Module | None = None
        if cfg.distilled:
            self.head_dist = nn.Linear(d, cfg.num_classes) if cfg.num_classes > 0 else nn.Identity()
        self.rope_sin: torch.Tensor | None
        self.rope_cos: torch.Tensor | None
        self.rope_perm: torch.Tensor | None
        if cfg.rope:  # constant tables for this grid, recomputed at every build (never in a state dict)
            tables = sequence_tables(cfg, num_prefix=cfg.num_prefix_tokens)
            for name, t in zip(("rope_sin", "rope_cos", "rope_perm"), tables, strict=True):
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
        for tok in (self.dist_token, self.reg_token):
            if tok is not None:
                nn.init.normal_(tok, std=1e-6)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)
        w = self.patch_embed.proj.weight
        nn.init.trunc_normal_(w.view(w.shape[0], -1), std=0.02)
        if self.attn_pool is not None:
            nn.init.trunc_normal_(self.attn_pool.latent, std=self.cfg.embed_dim**-0.5)

    def _pos_embed(self, x: torch.Tensor) -> torch.Tensor:
        """Prefix tokens (class, distillation, registers: timm's order) and the position embeddings, which cover the
        prefix tokens too unless no_embed_class."""
        prefix = [t.expand(x.shape[0], -1, -1) for t in (self.cls_token, self.dist_token, self.reg_token) if t is not None]
        if self.pos_embed is None:  # RoPE or relative-bias models: position lives in the attention
            return torch.cat([*prefix, x], dim=1) if prefix else x
        if self.cfg.no_embed_class:
            x = x + self.pos_embed
            return torch.cat([*prefix, x], dim=1) if prefix else x
        if prefix:
            x = torch.cat([*prefix, x], dim=1)
        return x + self.pos_embed

    def forward_features(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        x = self.pos_drop(self._pos_embed(self.patch_embed(x)))
        if self.norm_pre is not None:
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

    def pool(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The head's input from the tokens (timm's VisionTransformer.pool), and the MAP head's attention."""
        gp, n = self.cfg.global_pool, self.num_prefix_tokens
        if self.cfg.embed_pool:  # an embedding model's pooling, as DINOv2 defines it (not the head's)
            ep = self.cfg.embed_pool
            if ep == "cls":
                return x[:, 0], None
            if ep == "mean":
                return x[:, n:].mean(dim=1), None
            return torch.cat([x[:, 0], x[:, n:].mean(dim=1)], dim=-1), None
        tokens = x if self.cfg.pool_include_prefix else x[:, n:]
        if self.attn_pool is not None:
            return self.attn_pool(tokens, return_attn)
        if gp == "avg":
            return tokens.mean(dim=1), None
        if gp == "token_avg":
            return torch.cat([x[:, 0], tokens.mean(dim=1)], dim=-1), None
        return x[:, 0], None

    def forward_head(self, x: torch.Tensor) -> torch.Tensor:
        if self.head_dist is not None and self.cfg.num_classes > 0:  # DeiT distilled: the mean of the two heads
            return (self.head(x[:, 0]) + self.head_dist(x[:, 1])) / 2
        return self.head(self.pre_logits(x))

    def pre_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The vector the head reads (timm's forward_head(pre_logits=True)), then the projection and the L2
        normalisation where the config has them: an embedding model's output when there is no head."""
        if self.head_dist is not None:
            x = (x[:, 0] + x[:, 1]) / 2
        else:
            x = self.pool(x)[0]
            if self.fc_norm is not None:
                x = self.fc_norm(x)
        if self.proj is not None:
            x = self.proj(x)
        if self.cfg.l2_norm:
            x = F.normalize(x, dim=-1)
        return x

    def patch_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """The patch tokens after the final norm, without class, distillation or register tokens (DINOv2's
        x_norm_patchtokens): [B, grid_h * grid_w, embed_dim]."""
        return x[:, self.num_prefix_tokens :]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x)[0])

    def forward_with_attention(self, x: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits and the attention probabilities of every block, each [B, heads, N, N] (N counts the prefix tokens:
        class, distillation and register tokens)."""
        feats, attns = self.forward_features(x, return_attn=True)
        return self.forward_head(feats), attns


class WithPatchTokens(nn.Module):
    """An embedding model answering (embedding, patch_tokens): export --tokens' two outputs."""

    def __init__(self, model: VisionTransformer) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        feats = self.model.forward_features(x)[0]
        return self.model.forward_head(feats), self.model.patch_tokens(feats)


def fold_layer_scale(model: VisionTransformer) -> VisionTransformer:
    """A copy of ``model`` with each LayerScale folded into the Linear before it (attn.proj, mlp.fc2): rows of the
    weight and the bias times gamma, so the exported graph has no extra Mul. The model itself is untouched; one
    without LayerScale is returned as is."""
    if not any(isinstance(m, LayerScale) for m in model.modules()):
        return model
    import copy

    folded = copy.deepcopy(model)
    with torch.no_grad():
        for blk in folded.blocks:
            assert isinstance(blk, Block)
            for ls_name, lin in (("ls1", blk.attn.proj), ("ls2", blk.mlp.fc2)):
                ls = getattr(blk, ls_name)
                if isinstance(ls, LayerScale):
                    assert isinstance(lin, nn.Linear)
                    lin.weight.mul_(ls.gamma[:, None])
                    if lin.bias is not None:
                        lin.bias.mul_(ls.gamma)
                    setattr(blk, ls_name, nn.Identity())
    return folded


def build_model(cfg: ViTConfig) -> VisionTransformer:
    return VisionTransformer(cfg)
