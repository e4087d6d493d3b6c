"""timm's Eva (eva.py: EVA-02, DINOv3, the SBB ``vit_*_rope_*``) and Beit (beit.py) constructor arguments → ViTConfig.

The arguments come from what timm wrote, never from a model's name: the generated name table (timm's own
registrations, scripts/gen_timm_archs.py), laid over the class's defaults it records (model/timm_import.py
``class_args``), and a folder's ``model_args``.
Callables are recorded by the generator by name (``norm_layer: {"name": "LayerNorm", "eps": 1e-6}``).
Anything these classes can do that the ViT cannot is refused with the argument's name.

How timm's choices land on the ViT:
- ``qkv_bias`` (EvaAttention, Beit): q and v biases with a fixed zero k bias → ``qv_bias`` (exact; model/vit.py
  Attention); AttentionRope (``attn_type="rope"``, the Naver RoPE-ViTs) has a plain fused qkv bias;
  ``qkv_fused=False`` names are renamed onto the fused layout by model/layouts.py.
- ``use_rot_pos_emb`` with ``rope_type`` 'cat' (EVA-02, SBB) or 'dinov3' → ``rope`` and its grid parameters.
- ``use_rel_pos_bias`` (Beit) → ``rel_pos_bias``.
- ``swiglu_mlp``: GluMlp (packed fc1, SiLU gate first) unless ``scale_mlp`` asks for the normed SwiGLU
  (fc1_g, fc1_x, norm, fc2); ``scale_mlp`` on a plain MLP: LayerNorm before fc2 (timm's Mlp(norm_layer)).
- ``init_values`` → LayerScale (``gamma_1``/``gamma_2`` renamed to ``ls1.gamma``/``ls2.gamma``).
- pooling: ``global_pool`` 'avg' (patch tokens only), 'token', or Eva's 'map' (an attention pool over every token with
  ``attn_pool_num_heads``/``attn_pool_mlp_ratio``: PE-core); ``use_fc_norm`` None means "on for avg", and Eva's
  ``use_post_transformer_norm`` None means "on unless fc_norm" (Beit: norm exactly when no fc_norm).
- ``use_pre_transformer_norm`` (PE): a LayerNorm before the blocks and a patch embedding without bias → ``pre_norm``.
"""

from __future__ import annotations

from typing import Any

from vitdeploy.core.errors import VitdeployError
from vitdeploy.model.presets import ViTConfig


def _pair(v: Any) -> tuple[int, int]:
    return (int(v), int(v)) if isinstance(v, (int, float)) else (int(v[0]), int(v[1]))


def _refuse(where: str, what: str) -> VitdeployError:
    return VitdeployError(f"{where}: a timm model with {what}, which the vitdeploy ViT does not have")


def _norm_eps(a: dict[str, Any], where: str) -> float:
    norm = a.get("norm_layer") or {"name": "LayerNorm", "eps": 1e-6}
    if isinstance(norm, str):  # a class by name, with its default eps (timm.layers.LayerNorm: 1e-6)
        norm = {"name": norm}
    if not isinstance(norm, dict) or norm.get("name") not in ("LayerNorm", "nn.LayerNorm"):
        raise _refuse(where, f"norm_layer {norm!r} (vitdeploy has LayerNorm)")
    return float(norm.get("eps", 1e-6 if norm.get("name") == "LayerNorm" else 1e-5))


def eva_beit_config(cls: str, args: dict[str, Any], where: str) -> ViTConfig:
    """The ViTConfig of timm's ``Eva`` or ``Beit`` built with ``args`` (its full, resolved constructor arguments)."""
    a = dict(args)
    off = {
        "num_kv_heads": (None, "grouped-query attention (num_kv_heads)"),
        "scale_attn_inner": (False, "a norm inside attention (scale_attn_inner)"),
        "use_post_norm": (False, "post-norm blocks (use_post_norm)"),
        "attn_only_layer_scale": (False, "layer scale on the attention branch only"),
        "swiglu_align_to": (0, "an aligned SwiGLU width (swiglu_align_to)"),
        "use_shared_rel_pos_bias": (False, "one shared relative position bias (use_shared_rel_pos_bias)"),
        "dynamic_img_pad": (False, "dynamic image padding"),
    }
    for k, (ok, what) in off.items():
        if k in a and a[k] not in (ok, None if ok is False else ok):
            raise _refuse(where, what)
    attn_type = a.get("attn_type", "eva")
    if attn_type not in ("eva", "rope"):
        raise _refuse(where, f"attn_type {attn_type!r}")
    pool = a.get("global_pool", "avg")
    if pool not in ("avg", "token", "map") or (pool == "map" and cls != "Eva"):
        raise _refuse(where, f"global_pool {pool!r} (vitdeploy maps 'avg', 'token' and Eva's 'map' for Eva/Beit)")
    fc_norm = a.get("use_fc_norm")
    fc_norm = pool == "avg" if fc_norm is None else bool(fc_norm)
    post = a.get("use_post_transformer_norm") if cls == "Eva" else None
    post = (not fc_norm) if post is None else bool(post)
    if post and fc_norm:
        raise _refuse(where, "a final norm both before and after the pooling")
    dim, heads = int(a.get("embed_dim", 768)), int(a.get("num_heads", 12))
    hidden = int(dim * float(a.get("mlp_ratio", 4.0)))
    swiglu, scale_mlp = bool(a.get("swiglu_mlp", False)), bool(a.get("scale_mlp", False))
    mlp = "mlp" if not swiglu else ("swiglu" if scale_mlp else "swiglu_packed")
    init_values = a.get("init_values")
    ring1: dict[str, Any] = {
        "class_token": bool(a.get("class_token", True)),
        "no_embed_class": bool(a.get("no_embed_class", False)),
        "qk_norm": bool(a.get("qk_norm", False)),
        "reg_tokens": int(a.get("num_reg_tokens", 0) or 0),
        "init_values": float(init_values) if init_values else None,  # Beit: `if init_values:`; Eva: not None
        "global_pool": pool,
        "fc_norm": fc_norm,
        "final_norm": post or fc_norm,
        "mlp": mlp,
        "act": "gelu" if mlp == "mlp" else "silu",  # Eva/Beit: nn.GELU in Mlp, SiLU in GluMlp/SwiGLU
        "mlp_norm": scale_mlp,
    }
    if cls == "Eva" and init_values is not None and not init_values:
        raise _refuse(where, "layer scale initialised to 0 (init_values=0)")
    if cls == "Eva" and a.get("use_pre_transformer_norm"):
        ring1["pre_norm"] = True  # norm_pre after the position embeddings, a patch embedding without bias: CLIP's
    if pool == "map":
        # Eva's AttentionPoolLatent reads every token (class token included), with its own heads and MLP ratio and
        # nn.GELU in its MLP (the blocks' Mlp has GELU too; a SwiGLU model's pool would not)
        if mlp != "mlp":
            raise _refuse(where, "an attention pool beside SwiGLU blocks (its MLP's GELU differs from theirs)")
        pool_ratio = a.get("attn_pool_mlp_ratio") or a.get("mlp_ratio", 4.0)
        ring1.update(pool_include_prefix=True, pool_heads=int(a.get("attn_pool_num_heads") or heads),
                     pool_mlp_dim=int(dim * float(pool_ratio)))
    # EvaAttention and Beit's Attention: q/v biases, k fixed at zero; AttentionRope (attn_type 'rope'): a plain qkv bias
    qv = cls == "Beit" or attn_type == "eva"
    ring2: dict[str, Any] = {
        "abs_pos_embed": bool(a.get("use_abs_pos_emb", True)),
        "qv_bias": qv and bool(a.get("qkv_bias", True)),
        "qkv_bias": not qv and bool(a.get("qkv_bias", True)),
    }
    if cls == "Eva" and a.get("use_rot_pos_emb"):
        rtype = a.get("rope_type", "cat")
        if rtype not in ("cat", "dinov3"):
            raise _refuse(where, f"rope_type {rtype!r} (vitdeploy computes 'cat' and 'dinov3')")
        ref = a.get("ref_feat_shape")
        ring2.update(
            rope=rtype,
            rope_temperature=float(a.get("rope_temperature", 10000.0)),
            rope_ref_grid=_pair(ref) if ref is not None and rtype == "cat" else None,
            rope_half=bool(a.get("rope_rotate_half", False)),
            rope_grid_offset=float(a.get("rope_grid_offset", 0.0)),
            rope_grid_indexing=str(a.get("rope_grid_indexing", "ij")),
        )
    if cls == "Beit":
        ring2["rel_pos_bias"] = bool(a.get("use_rel_pos_bias", False))
    elif cls != "Eva":
        raise VitdeployError(f"{where}: timm class {cls!r} is not Eva or Beit")
    try:
        return ViTConfig(
            image_size=_pair(a.get("img_size", 224)),
            patch_size=int(_pair(a.get("patch_size", 16))[0]),
            in_chans=int(a.get("in_chans", 3)),
            num_classes=int(a.get("num_classes", 1000)),
            embed_dim=dim,
            depth=int(a.get("depth", 12)),
            num_heads=heads,
            mlp_dim=hidden * 2 if mlp == "swiglu_packed" else hidden,  # GluMlp(hidden_features=hidden * 2): fc1's width
            ln_eps=_norm_eps(a, where),
            **ring1,
            **ring2,
        )
    except ValueError as e:
        raise VitdeployError(f"{where}: {e}") from None
