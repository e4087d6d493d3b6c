"""Hugging Face ViT families → the vitdeploy ViT: tensor names and architecture, read from what transformers wrote.

One mapping covers ViT, ViT-MSN, DeiT (with and without teacher), DINOv2 (with and without registers), BEiT,
data2vec-vision, SigLIP and CLIP vision towers. The architecture is read from the config's fields and from the
tensors themselves (a distillation token, register tokens, LayerScale ``lambda``s, a pre-LayerNorm, a k projection
without bias, a relative position bias table, a head twice as wide as the model), never from ``model_type``:
a family member with a feature vitdeploy lacks is refused by naming the feature.

What each ``*ForImageClassification`` computes after the encoder (transformers 5, modeling_<family>.py):
- ViT, ViT-MSN, DeiT: final LayerNorm, class token → classifier; DeiT with teacher: the mean of
  ``cls_classifier(token 0)`` and ``distillation_classifier(token 1)``.
- DINOv2 (+registers): final LayerNorm, classifier on [class token, mean of the patch tokens].
- BEiT / data2vec-vision with ``use_mean_pooling``: no final norm; LayerNorm of the mean of the patch tokens.
- SigLIP: no class token; ``post_layernorm`` over all tokens, then their mean.
- CLIP: ``pre_layrnorm`` before the blocks; the mean of the patch tokens of the un-normed last hidden state.

What the towers without a classifier answer (their ``pooler_output`` / ``image_embeds``, an embedding model's vector):
- CLIP (``CLIPVisionModel``, ``CLIPVisionModelWithProjection``, the image side of ``CLIPModel``): ``post_layernorm`` of
  the class token, then ``visual_projection`` where there is one (``get_image_features``).
- SigLIP (``SiglipVisionModel``, the image side of ``SiglipModel``): ``post_layernorm`` over every token, then the
  attention-pooling head (``SiglipMultiheadAttentionPoolingHead``: timm's MAP, ``attn_pool``).
The text side of an image–text pair is not the image tower's: it is left out here (model/zero_shot.py reads it).
"""

from __future__ import annotations

import re
from typing import Any

import torch

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.schema import Fields

# The base model's attribute in each *ForImageClassification (stripped from every name). transformers 5 may also
# write a name without it (ViT-MSN's encoder), so each is optional.
_PREFIXES = ("vit.", "deit.", "dinov2_with_registers.", "dinov2.", "beit.", "data2vec_vision.", "vision_model.")

# Per-block names (after "encoder.layer.N." / "encoder.layers.N." / "layers.N."): transformers' saved (legacy) and
# in-memory (v5) spellings → timm's. The longest names come first so "attention.output.dense" wins over
# "output.dense".
_BLOCK = (
    ("attention.attention.relative_position_bias.relative_position_bias_table", "attn.relative_position_bias_table"),
    ("attention.relative_position_bias.relative_position_bias_table", "attn.relative_position_bias_table"),
    ("relative_position_bias.relative_position_bias_table", "attn.relative_position_bias_table"),
    ("attention.attention.query", "attn.q"), ("attention.attention.key", "attn.k"), ("attention.attention.value", "attn.v"),
    ("attention.q_proj", "attn.q"), ("attention.k_proj", "attn.k"), ("attention.v_proj", "attn.v"),
    ("self_attn.q_proj", "attn.q"), ("self_attn.k_proj", "attn.k"), ("self_attn.v_proj", "attn.v"),
    ("attention.output.dense", "attn.proj"), ("attention.o_proj", "attn.proj"), ("self_attn.out_proj", "attn.proj"),
    ("intermediate.dense", "mlp.fc1"), ("output.dense", "mlp.fc2"), ("mlp.fc1", "mlp.fc1"), ("mlp.fc2", "mlp.fc2"),
    ("layernorm_before", "norm1"), ("layer_norm1", "norm1"), ("norm1", "norm1"),
    ("layernorm_after", "norm2"), ("layer_norm2", "norm2"), ("norm2", "norm2"),
    ("layer_scale1.lambda1", "ls1.gamma"), ("layer_scale2.lambda1", "ls2.gamma"),
    ("lambda_1", "ls1.gamma"), ("lambda_2", "ls2.gamma"),
)
_BLOCK_RE = re.compile(r"^(?:encoder\.layers?|layers)\.(\d+)\.(.+)$")

# Model-level names → timm's. None: a tensor the classification logits never use (dropped).
_TOP: dict[str, str | None] = {
    "embeddings.cls_token": "cls_token",
    "embeddings.class_embedding": "cls_token",
    "embeddings.distillation_token": "dist_token",
    "embeddings.register_tokens": "reg_token",
    "embeddings.position_embeddings": "pos_embed",
    "embeddings.position_embedding.weight": "pos_embed",
    "embeddings.patch_embeddings.projection.weight": "patch_embed.proj.weight",
    "embeddings.patch_embeddings.projection.bias": "patch_embed.proj.bias",
    "embeddings.patch_embedding.weight": "patch_embed.proj.weight",
    "embeddings.patch_embedding.bias": "patch_embed.proj.bias",
    "embeddings.mask_token": None,
    "pre_layrnorm.weight": "norm_pre.weight",
    "pre_layrnorm.bias": "norm_pre.bias",
    "layernorm.weight": "norm.weight",
    "layernorm.bias": "norm.bias",
    "post_layernorm.weight": "norm.weight",
    "post_layernorm.bias": "norm.bias",
    "pooler.layernorm.weight": "fc_norm.weight",
    "pooler.layernorm.bias": "fc_norm.bias",
    "encoder.relative_position_bias.relative_position_bias_table": "shared_rel_pos",
    "classifier.weight": "head.weight",
    "classifier.bias": "head.bias",
    "cls_classifier.weight": "head.weight",
    "cls_classifier.bias": "head.bias",
    "distillation_classifier.weight": "head_dist.weight",
    "distillation_classifier.bias": "head_dist.bias",
}
# Unused by the logits: ViT's pooler (dense + tanh), SigLIP's attention-pooling head (SiglipForImageClassification
# averages the tokens instead), fixed index buffers.
_DROPPED = re.compile(r"^(pooler\.dense\.|head\.|.*relative_position_index$|.*\.position_ids$|embeddings\.position_ids$)")

# transformers' hidden_act names → ViTConfig.act (activations.py: gelu_new, gelu_pytorch_tanh and gelu_fast are the
# tanh approximation; "gelu" is erf).
_ACTS = {"gelu": "gelu", "quick_gelu": "quick_gelu", "gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh",
         "silu": "silu", "swish": "silu"}


# The text side of an image–text pair (CLIPModel, SiglipModel): the zero-shot importer's (model/zero_shot.py).
PAIR_TEXT = re.compile(r"^(text_model\.|text_projection\.|logit_scale$|logit_bias$)")
# SigLIP's attention-pooling head (transformers' SiglipMultiheadAttentionPoolingHead) → timm's attn_pool; its
# nn.MultiheadAttention's packed in_proj is split into the q and kv projections (clip_siglip_tower).
_MAP_HEAD = {
    "probe": "latent",
    "attention.out_proj.weight": "proj.weight", "attention.out_proj.bias": "proj.bias",
    "layernorm.weight": "norm.weight", "layernorm.bias": "norm.bias",
    "mlp.fc1.weight": "mlp.fc1.weight", "mlp.fc1.bias": "mlp.fc1.bias",
    "mlp.fc2.weight": "mlp.fc2.weight", "mlp.fc2.bias": "mlp.fc2.bias",
}


def clip_siglip_tower(sd: dict[str, torch.Tensor], where: str) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An image–text pair's or vision tower's state dict without its text side, and the tensors of what CLIP and
    SigLIP towers answer after the blocks, timm-named: CLIP's ``visual_projection`` (→ ``proj``) and, in a model
    without a classifier, SigLIP's attention-pooling head (→ ``attn_pool``; SiglipForImageClassification averages the
    tokens instead, so its head stays unused)."""
    rest: dict[str, torch.Tensor] = {}
    out: dict[str, torch.Tensor] = {}
    head: dict[str, torch.Tensor] = {}
    classifier = "classifier.weight" in sd
    for key, v in sd.items():
        if PAIR_TEXT.match(key):
            continue
        if key == "visual_projection.weight":
            out["proj.weight"] = v
            continue
        k = _strip(key)
        if k.startswith("head.") and not classifier:
            head[k[len("head."):]] = v
            continue
        rest[key] = v
    if head:
        packed = ("attention.in_proj_weight", "attention.in_proj_bias")
        unexpected = sorted(set(head) - set(_MAP_HEAD) - set(packed))
        missing = sorted((set(_MAP_HEAD) | set(packed)) - set(head))
        if unexpected or missing:
            what = f"unexpected head.{unexpected[0]}" if unexpected else f"no head.{missing[0]}"
            raise VitdeployError(f"{where}: an attention-pooling head that is not SigLIP's ({what})")
        w, b = head.pop(packed[0]), head.pop(packed[1])
        d = int(w.shape[1])
        out.update({f"attn_pool.{_MAP_HEAD[n]}": t for n, t in head.items()})
        out["attn_pool.latent"] = out["attn_pool.latent"].reshape(1, 1, d)
        out["attn_pool.q.weight"], out["attn_pool.kv.weight"] = w[:d], w[d:]
        out["attn_pool.q.bias"], out["attn_pool.kv.bias"] = b[:d], b[d:]
    return rest, out


def _clip_siglip_pooling(fields: dict[str, Any], st: dict[str, torch.Tensor], where: str) -> bool:
    """The pooling of a CLIP or SigLIP tower without a classifier (its pooler_output, then CLIP's projection), set in
    ``fields``; False for any other model (the classifiers' poolings are hf_architecture's)."""
    if fields["num_classes"]:
        return False
    if "proj.weight" in st:
        fields.update(proj_dim=int(st["proj.weight"].shape[0]), proj_bias=False)
    if "attn_pool.latent" in st:  # SigLIP: post_layernorm over every token, then the MAP head
        fields.update(global_pool="map")
        return True
    if fields["class_token"] and fields["pre_norm"]:  # CLIP: post_layernorm of the class token (pooler_output)
        fields.update(global_pool="token")
        return True
    if "proj.weight" in st:
        raise VitdeployError(f"{where}: a visual_projection on a tower that is not CLIP's (no class token or pre-norm)")
    return False


def _strip(k: str) -> str:
    for p in _PREFIXES:
        if k.startswith(p):
            return k[len(p):]
    return k


def rename(sd: dict[str, torch.Tensor], where: str, what: str = "") -> dict[str, torch.Tensor]:
    """transformers names → timm names; q/k/v stay separate here (``blocks.N.attn.q.weight``)."""
    out: dict[str, torch.Tensor] = {}
    left: list[str] = []
    for key, v in sd.items():
        k = _strip(key)
        m = _BLOCK_RE.match(k)
        if m:
            i, rest = m.group(1), m.group(2)
            for src, name in _BLOCK:
                if rest == src or rest.startswith(src + "."):
                    out[f"blocks.{i}.{name}{rest[len(src):]}"] = v
                    break
            else:
                if not _DROPPED.match(rest):
                    left.append(key)
            continue
        if k in _TOP:
            top = _TOP[k]
            if top is not None:
                out[top] = v
        elif not _DROPPED.match(k):
            left.append(key)
    if left:
        raise VitdeployError(f"{where}: {what or 'a model'} whose tensors vitdeploy cannot map to a ViT: {', '.join(left[:4])} "
                             "(vitdeploy imports ViT, ViT-MSN, DeiT, DINOv2, BEiT, data2vec-vision, SigLIP and CLIP vision)")
    return out


def hf_vision_config(cfg_json: dict[str, Any]) -> dict[str, Any]:
    """The vision tower's fields: ``vision_config`` (SigLIP, CLIP) or the config itself."""
    vc = cfg_json.get("vision_config")
    return dict(vc) if isinstance(vc, dict) else cfg_json


def hf_vision_fields(cfg_json: dict[str, Any], config_path: str) -> Fields:
    """The vision tower's fields as checked reads (core/schema.py): ``vision_config`` where there is one."""
    cf = Fields(config_path, cfg_json, null_is_default=True)
    return cf.sub("vision_config") or cf


def hf_architectures(cfg_json: dict[str, Any], config_path: str) -> list[str]:
    """config.json's ``architectures``: a list of class names (or absent)."""
    v = cfg_json.get("architectures") or []
    if not isinstance(v, list) or not all(isinstance(a, str) and len(a) <= 200 for a in v) or len(v) > 64:
        raise Fields(config_path, cfg_json).refuse("architectures", v, "a list of class names (strings)")
    return list(v)


def _check_patch_size(vc: Fields, kernel: torch.Tensor) -> None:
    """config.json's patch_size, where it gives one, must be the patch embedding's kernel: a config that contradicts
    its weights (-8, or 16 beside a kernel of 8) is a foreign file to fix, not a value to override silently with the
    weights' (issue 40)."""
    if not vc.has("patch_size"):
        return
    size = vc.size("patch_size", idea="patch_size")  # not a whole number in range: refused naming the field
    kh, kw = (int(k) for k in kernel.shape[-2:])
    if size != (kh, kw):
        k = str(kh) if kh == kw else f"{kh}x{kw}"
        raise vc.refuse("patch_size", vc.raw("patch_size"),
                        f"the weights' patch size {k} (the patch embedding's kernel is {kh}x{kw})")


def hf_architecture(cfg_json: dict[str, Any], sd: dict[str, torch.Tensor], where: str) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """ViTConfig fields and the timm-named state dict of a transformers ViT-family checkpoint.

    ``image_size`` is the config's (the size the position embeddings were made for).
    """
    config_path = f"{where}/config.json"
    vc = hf_vision_fields(cfg_json, config_path)
    if vc.flag("use_swiglu_ffn", False):
        raise VitdeployError(f"{where}: use_swiglu_ffn (DINOv2-giant's SwiGLU FFN, weights_in/weights_out) is not mapped")
    act = vc.text("hidden_act", "gelu")
    if act not in _ACTS:
        raise VitdeployError(f"{where}: hidden_act {act!r} has no vitdeploy equivalent ({', '.join(_ACTS)})")
    if vc.integer("num_channels", 3, lo=1, hi=1024) != 3:
        raise VitdeployError(f"{where}: num_channels {vc.raw('num_channels')}; vitdeploy reads RGB images (3 channels)")
    archs = ", ".join(hf_architectures(cfg_json, config_path)) or "a model"
    if "image_size" in vc.obj and vc.obj["image_size"] is None:  # the size the position embeddings are for: no guess
        raise vc.refuse("image_size", None, "the input size the model was trained at (a whole number, or [height, width])")
    image_size = vc.size("image_size", 224)
    heads = vc.integer("num_attention_heads", 12, idea="heads")
    ln_eps = vc.number("layer_norm_eps", 1e-12, above=0.0, idea="ln_eps")
    layers = vc.integer("num_hidden_layers", None, idea="depth") if vc.has("num_hidden_layers") else None
    hidden = vc.integer("hidden_size", None, idea="width") if vc.has("hidden_size") else None
    mlp_ratio = vc.number("mlp_ratio", None, above=0.0, hi=64.0) if vc.has("mlp_ratio") else None
    inter = vc.integer("intermediate_size", None, idea="width") if vc.has("intermediate_size") else None
    n_reg = vc.integer("num_register_tokens", None, lo=0, hi=1024) if vc.has("num_register_tokens") else None
    sd, towers = clip_siglip_tower(sd, where)
    st = rename(sd, where, archs)
    st.update(towers)
    if "patch_embed.proj.weight" not in st:
        raise VitdeployError(f"{where}: no patch embedding among the tensors: not a Hugging Face ViT-family checkpoint")
    depth = 1 + max((int(k.split(".")[1]) for k in st if k.startswith("blocks.")), default=-1)
    if layers is not None and depth != layers:
        raise VitdeployError(f"{where}: config.json says {layers} layers but the weights hold {depth}")
    dim = int(st["patch_embed.proj.weight"].shape[0])
    _check_patch_size(vc, st["patch_embed.proj.weight"])
    if hidden is not None and hidden != dim:
        raise vc.refuse("hidden_size", hidden, f"the weights' width {dim} (the patch embedding has {dim} rows)")
    # the (class) token as a [1, 1, D] parameter; CLIP stores a [D] vector, SigLIP none
    if "cls_token" in st:
        st["cls_token"] = st["cls_token"].reshape(1, 1, dim)
    if "patch_embed.proj.bias" not in st and "norm_pre.weight" not in st:  # the ViT has a bias-free one for pre-norm only
        st["patch_embed.proj.bias"] = torch.zeros(dim)
    pre = int("cls_token" in st) + int("dist_token" in st)
    distilled = "dist_token" in st and "head_dist.weight" in st
    reg = 0
    if "dist_token" in st and not distilled:  # DeiTForImageClassification: the token rides along, no second head
        st["reg_token"] = st.pop("dist_token")
        reg, pre = 1, pre
    if "reg_token" in st and reg == 0:
        reg = int(st["reg_token"].shape[1]) if st["reg_token"].ndim >= 2 else 0
    if n_reg is not None and n_reg != reg:
        raise vc.refuse("num_register_tokens", n_reg, f"the weights' {reg} register tokens (embeddings.register_tokens)")
    if "pos_embed" in st:
        pe = st["pos_embed"]
        st["pos_embed"] = pe = pe.reshape(1, -1, dim)
        # DINOv2 with registers adds position embeddings to [class, patches] and inserts the registers after: the
        # same as zero position embeddings at the register slots.
        if n_reg is not None and reg:
            st["pos_embed"] = torch.cat([pe[:, :1], torch.zeros(1, reg, dim), pe[:, 1:]], dim=1)
    for i in range(depth):  # fuse q, k, v into timm's qkv (+ q_bias/v_bias where k has no bias: BEiT)
        b = f"blocks.{i}.attn."
        try:
            st[b + "qkv.weight"] = torch.cat([st.pop(b + n + ".weight") for n in "qkv"])
        except KeyError:
            raise VitdeployError(f"{where}: block {i} lacks a query, key or value projection") from None
        biases = {n: st.pop(b + n + ".bias", None) for n in "qkv"}
        if all(v is not None for v in biases.values()):
            st[b + "qkv.bias"] = torch.cat([biases[n] for n in "qkv"])  # type: ignore[misc]
        elif biases["q"] is not None and biases["v"] is not None and biases["k"] is None:
            st[b + "q_bias"], st[b + "v_bias"] = biases["q"], biases["v"]  # type: ignore[assignment]
        elif any(v is not None for v in biases.values()):
            raise VitdeployError(f"{where}: block {i} has biases on {[n for n, v in biases.items() if v is not None]} only")
    shared = st.pop("shared_rel_pos", None)
    if shared is not None:  # use_shared_relative_position_bias: one table for all blocks = a copy in each
        for i in range(depth):
            st[f"blocks.{i}.attn.relative_position_bias_table"] = shared.clone()
    rel = "blocks.0.attn.relative_position_bias_table" in st
    fc1 = st.get("blocks.0.mlp.fc1.weight")
    if fc1 is None:
        raise VitdeployError(f"{where}: block 0 has no MLP (fc1 / intermediate.dense)")
    has_ls = "blocks.0.ls1.gamma" in st
    # the MLP width config.json gives (DINOv2 by mlp_ratio, the others by intermediate_size) must be the weights'
    want = int(dim * mlp_ratio) if mlp_ratio is not None else inter
    if want is not None and int(want) != int(fc1.shape[0]):
        raise VitdeployError(f"{where}: the weights do not fit config.json (an MLP of {int(want)}, "
                             f"but fc1 has {int(fc1.shape[0])} rows)")
    # the head: token_avg reads a classifier twice as wide as the model (Dinov2ForImageClassification)
    n_cls = int(st["head.weight"].shape[0]) if "head.weight" in st else 0
    head_in = int(st["head.weight"].shape[1]) if "head.weight" in st else dim
    if head_in not in (dim, 2 * dim):
        raise VitdeployError(f"{where}: classifier takes {head_in} features; the model's width is {dim}")
    fields: dict[str, Any] = {
        "image_size": image_size,
        "patch_size": int(st["patch_embed.proj.weight"].shape[-1]),
        "num_classes": n_cls,
        "embed_dim": dim,
        "depth": depth,
        "num_heads": heads,
        "mlp_dim": int(fc1.shape[0]),
        "mlp_ratio": int(fc1.shape[0]) / dim,
        "ln_eps": ln_eps,
        "act": _ACTS[act],
        "class_token": "cls_token" in st,
        "reg_tokens": reg,
        "distilled": distilled,
        "abs_pos_embed": "pos_embed" in st,
        "rel_pos_bias": rel,
        "qkv_bias": "blocks.0.attn.qkv.bias" in st,
        "qv_bias": "blocks.0.attn.q_bias" in st,
        "pre_norm": "norm_pre.weight" in st,
        "init_values": 1.0 if has_ls else None,
    }
    if _clip_siglip_pooling(fields, st, where):
        pass
    elif head_in == 2 * dim:
        fields["global_pool"] = "token_avg"
    elif "fc_norm.weight" in st:  # BEiT's use_mean_pooling: LayerNorm of the mean of the patch tokens
        fields.update(global_pool="avg", fc_norm=True)
    elif not fields["class_token"]:  # SigLIP: mean over every token after post_layernorm
        fields.update(global_pool="avg", fc_norm=False)
    elif fields["pre_norm"]:  # CLIP: the mean of the patch tokens before post_layernorm (which the logits skip)
        fields.update(global_pool="avg", final_norm=False)
        st.pop("norm.weight", None), st.pop("norm.bias", None)
    return fields, st


def interpolate_like_transformers(pos: torch.Tensor, prefix: int, new_grid: tuple[int, int], antialias: bool) -> torch.Tensor:
    """Dinov2Embeddings.interpolate_pos_encoding at a fixed size: bicubic (align_corners False) in float32 over the
    square grid of patch positions; the ``prefix`` rows untouched. DINOv2 interpolates without antialias, DINOv2 with
    registers with it (transformers 5, modeling_dinov2*.py)."""
    import torch.nn.functional as F

    head, grid = pos[:, :prefix], pos[:, prefix:]
    n, dim = int(grid.shape[1]), int(grid.shape[2])
    side = int(round(n**0.5))
    if side * side != n:
        raise VitdeployError(f"{n} patch position embeddings do not form a square grid")
    g = grid.reshape(1, side, side, dim).permute(0, 3, 1, 2).float()
    g = F.interpolate(g, size=new_grid, mode="bicubic", align_corners=False, antialias=antialias)
    return torch.cat([head, g.permute(0, 2, 3, 1).reshape(1, -1, dim).to(pos.dtype)], dim=1)
