"""open_clip checkpoints → the vitdeploy ViT: the image tower of a folder as ``open_clip.push_to_hf_hub.save_for_hf``
writes it (``open_clip_config.json`` + ``open_clip_model.safetensors`` / ``open_clip_pytorch_model.bin``).

The files are read directly (json, safetensors, ``torch.load(weights_only=True)``): the image tower needs no open_clip.
What it answers is open_clip's ``encode_image`` (``model.visual``), an embedding; the text tower is
model/zero_shot.py's, which runs open_clip itself.

Two image towers are mapped, read from ``model_cfg.vision_cfg`` and the tensors:
- open_clip's own ``VisionTransformer`` (open_clip/transformer.py): ``conv1`` (no bias) → class token and position
  embeddings → ``ln_pre`` → ``transformer.resblocks`` (ln_1, nn.MultiheadAttention, ls_1, ln_2, mlp.c_fc/c_proj,
  ls_2) → ``ln_post`` (over every token, or after the pooling with ``final_ln_after_pool``) → pool ``tok`` | ``avg``
  → ``x @ proj``. QuickGELU where the config says ``quick_gelu``; LayerNorm eps 1e-5 (torch's default) unless
  ``norm_kwargs`` says otherwise.
- a timm trunk (``timm_model_name``: open_clip's TimmModel), read by the timm importer (model/timm_import.py), with
  its projection: ``head.proj`` (``timm_proj: linear``), or the trunk's own head when open_clip made it the projection
  (``timm_proj`` unset: ``create_model(name, num_classes=embed_dim)``).
Anything else (attentional pooling, CoCa, ResNets, custom attention blocks, MLP projections) is refused by naming it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.schema import load_json
from vitdeploy.model.checkpoint import Checkpoint
from vitdeploy.model.sources import OPEN_CLIP_CONFIG, OPEN_CLIP_WEIGHTS, weights_parts
from vitdeploy.model.vit import ViTConfig
from vitdeploy.model.weights import _check_fits, _float32, _manifest, _safetensors_load, read_tensors

# open_clip's PreprocessCfg defaults for the fields save_for_hf may leave out (open_clip/transform.py).
_PP_DEFAULTS = {"interpolation": "bicubic", "resize_mode": "shortest"}

# vision_cfg fields of open_clip's VisionTransformer that change what it computes: vitdeploy maps each one unset
# (false, empty, or block_type "default").
_VISION_UNMAPPED = {
    "attentional_pool": "attentional pooling (attentional_pool)",
    "block_type": "custom attention blocks (block_type)",
    "qk_norm": "q/k norm in open_clip's custom blocks (qk_norm)",
    "scaled_cosine_attn": "scaled cosine attention (scaled_cosine_attn)",
    "scale_heads": "per-head scales (scale_heads)",
    "scale_attn_inner": "a norm inside the attention (scale_attn_inner)",
    "scale_attn": "a norm after the attention (scale_attn)",
    "scale_fc": "a norm inside the MLP (scale_fc)",
    "act_kwargs": "activation arguments (act_kwargs)",
}


def read_open_clip_config(folder: Path) -> dict[str, Any]:
    """``open_clip_config.json``: its ``model_cfg`` (embed_dim, vision_cfg, text_cfg) and ``preprocess_cfg``."""
    f = folder / OPEN_CLIP_CONFIG
    cfg = load_json(f)
    if not isinstance(cfg, dict) or not isinstance(cfg.get("model_cfg"), dict):
        raise VitdeployError(f"{f}: no model_cfg (open_clip writes it with save_for_hf); not an open_clip checkpoint")
    if not isinstance(cfg["model_cfg"].get("vision_cfg"), dict):
        raise VitdeployError(f"{f}: model_cfg has no vision_cfg (the image tower)")
    return cfg


def open_clip_state_dict(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    """The weights save_for_hf wrote, read once (hashed for lineage), and the file's name."""
    found = weights_parts(folder, OPEN_CLIP_WEIGHTS)  # checked: a regular file of a bounded size, inside the folder
    if found is not None:
        name = found[0]
        f = folder / name
        sd = _safetensors_load(f) if name.endswith(".safetensors") else read_tensors(f)[0]
        return sd, name
    raise VitdeployError(f"{folder}: no {' or '.join(OPEN_CLIP_WEIGHTS)} beside {OPEN_CLIP_CONFIG} "
                         "(open_clip's save_for_hf writes them)")


def open_clip_preprocess(cfg: dict[str, Any], image_size: tuple[int, int], where: str) -> dict[str, Any]:
    """open_clip's eval transform (``image_transform(is_train=False)``) as a vitdeploy Preprocess dict: ``shortest``
    resizes the shorter side to the input size and center-crops it (torchvision on PIL: vitdeploy's ``shorter`` with
    crop_pct 1), ``squash`` resizes to it."""
    pc = {**_PP_DEFAULTS, **(cfg.get("preprocess_cfg") or {})}
    if "mean" not in pc or "std" not in pc:
        raise VitdeployError(f"{where}: preprocess_cfg has no mean/std (save_for_hf writes both)")
    mean, std = [float(v) for v in pc["mean"]], [float(v) for v in pc["std"]]
    if len(mean) != 3 or len(std) != 3 or not all(math.isfinite(v) for v in mean) \
            or not all(math.isfinite(v) and v > 0 for v in std):
        raise VitdeployError(f"{where}: preprocess_cfg mean {mean} / std {std}: three finite numbers each, every std above 0")
    interp = "bilinear" if pc["interpolation"] == "bilinear" else "bicubic"  # open_clip: 'random' is bicubic at eval
    mode = {"shortest": "shorter", "squash": "squash"}.get(str(pc["resize_mode"]))
    if mode is None:
        raise VitdeployError(f"{where}: preprocess_cfg resize_mode {pc['resize_mode']!r} (a resize with padding) has no "
                             "vitdeploy equivalent (supported: shortest, squash)")
    if mode == "shorter" and image_size[0] != image_size[1]:
        raise VitdeployError(f"{where}: resize_mode shortest to a non-square {image_size[0]}x{image_size[1]} input "
                             "(open_clip's ResizeKeepRatio) has no vitdeploy equivalent")
    return {
        "input_size": [image_size[0], image_size[1]],
        "resize_mode": mode,
        "crop_pct": 1.0,
        "interpolation": interp,
        "mean": mean,
        "std": std,
        "channel_order": "RGB",
    }


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))


def _own_tower(model_cfg: dict[str, Any], sd: dict[str, torch.Tensor], where: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """open_clip's VisionTransformer (``visual.*``) as a ViTConfig with timm-named tensors."""
    vc = model_cfg["vision_cfg"]
    if isinstance(vc.get("layers"), (list, tuple)):
        raise VitdeployError(f"{where}: a ResNet image tower (vision_cfg.layers is a list), not a ViT")
    if "multimodal_cfg" in model_cfg:
        raise VitdeployError(f"{where}: a CoCa model (multimodal_cfg): its image tower pools with attention queries, "
                             "which vitdeploy does not map")
    for key, what in _VISION_UNMAPPED.items():
        if vc.get(key) and vc.get(key) != "default":
            raise VitdeployError(f"{where}: vision_cfg has {what}, which vitdeploy does not map")
    norm_kwargs = dict(vc.get("norm_kwargs") or {})
    eps = float(norm_kwargs.pop("eps", 1e-5))
    if norm_kwargs:
        raise VitdeployError(f"{where}: vision_cfg.norm_kwargs {sorted(norm_kwargs)} other than eps")
    pool = str(vc.get("pool_type", "tok"))
    if pool not in ("tok", "avg"):
        raise VitdeployError(f"{where}: vision_cfg.pool_type {pool!r}: the tower answers tokens, not one vector")
    v = {k[len("visual."):]: t for k, t in sd.items() if k.startswith("visual.")}
    if "conv1.weight" not in v or "proj" not in v:
        raise VitdeployError(f"{where}: no visual.conv1 / visual.proj among the tensors: not open_clip's ViT image tower")
    st: dict[str, torch.Tensor] = {}
    depth = 0
    for k, t in v.items():
        if k.startswith("transformer.resblocks."):
            i, rest = k[len("transformer.resblocks."):].split(".", 1)
            depth = max(depth, int(i) + 1)
            name = {"ln_1.weight": "norm1.weight", "ln_1.bias": "norm1.bias", "ln_2.weight": "norm2.weight",
                    "ln_2.bias": "norm2.bias", "attn.in_proj_weight": "attn.qkv.weight",
                    "attn.in_proj_bias": "attn.qkv.bias", "attn.out_proj.weight": "attn.proj.weight",
                    "attn.out_proj.bias": "attn.proj.bias", "mlp.c_fc.weight": "mlp.fc1.weight",
                    "mlp.c_fc.bias": "mlp.fc1.bias", "mlp.c_proj.weight": "mlp.fc2.weight",
                    "mlp.c_proj.bias": "mlp.fc2.bias", "ls_1.gamma": "ls1.gamma", "ls_2.gamma": "ls2.gamma"}.get(rest)
            if name is None:
                raise VitdeployError(f"{where}: visual.{k} has no vitdeploy equivalent")
            st[f"blocks.{i}.{name}"] = t
            continue
        name = {"conv1.weight": "patch_embed.proj.weight", "class_embedding": "cls_token",
                "positional_embedding": "pos_embed", "ln_pre.weight": "norm_pre.weight", "ln_pre.bias": "norm_pre.bias",
                "proj": "proj.weight"}.get(k)
        post = {"ln_post.weight": "weight", "ln_post.bias": "bias"}.get(k)
        if name is not None:
            st[name] = t
        elif post is not None:
            st[f"__ln_post.{post}"] = t
        else:
            raise VitdeployError(f"{where}: visual.{k} has no vitdeploy equivalent")
    dim = int(st["patch_embed.proj.weight"].shape[0])
    st["cls_token"] = st["cls_token"].reshape(1, 1, dim)
    st["pos_embed"] = st["pos_embed"].reshape(1, -1, dim)
    st["proj.weight"] = st["proj.weight"].t().contiguous()  # x @ proj  →  Linear(width, embed_dim).weight
    pre_norm = "norm_pre.weight" in st
    if not pre_norm:  # no_ln_pre: a bias-free patch embedding without the norm (the ViT's has a bias then)
        st["patch_embed.proj.bias"] = torch.zeros(dim)
    # ln_post over every token, pooled after (tok: the class token, avg: the mean of the patch tokens); or, with
    # final_ln_after_pool, after the pooling (the same for tok, fc_norm for avg)
    fc = pool == "avg" and bool(vc.get("final_ln_after_pool", False))
    post = "fc_norm" if fc else "norm"
    st[f"{post}.weight"], st[f"{post}.bias"] = st.pop("__ln_post.weight"), st.pop("__ln_post.bias")
    width = int(vc.get("width", dim))
    heads = width // int(vc.get("head_width", 64))
    fc1 = st["blocks.0.mlp.fc1.weight"]
    try:
        cfg = ViTConfig(
            image_size=_pair(vc.get("image_size", 224)),
            patch_size=int(st["patch_embed.proj.weight"].shape[-1]),
            num_classes=0,
            embed_dim=dim,
            depth=depth,
            num_heads=heads,
            mlp_dim=int(fc1.shape[0]),
            mlp_ratio=int(fc1.shape[0]) / dim,
            ln_eps=eps,
            act="quick_gelu" if model_cfg.get("quick_gelu") else "gelu",
            pre_norm=pre_norm,
            init_values=1.0 if "blocks.0.ls1.gamma" in st else None,
            global_pool="token" if pool == "tok" else "avg",
            fc_norm=fc,
            proj_dim=int(st["proj.weight"].shape[0]),
        )
    except ValueError as e:
        raise VitdeployError(f"{where}: {e}") from None
    if width != dim or depth != int(vc.get("layers", depth)):
        raise VitdeployError(f"{where}: vision_cfg says width {width}, {vc.get('layers')} layers; the weights hold "
                             f"{dim}, {depth}")
    return cfg, st


def _timm_tower(model_cfg: dict[str, Any], sd: dict[str, torch.Tensor], weights: Path,
                where: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """open_clip's TimmModel: the timm trunk (``visual.trunk.*``, read by the timm importer as open_clip creates it)
    and its projection (``visual.head.proj``, or the trunk's head when open_clip made that the projection)."""
    from vitdeploy.model.timm_import import load_timm

    vc = model_cfg["vision_cfg"]
    name = str(vc["timm_model_name"])
    pool, proj = vc.get("timm_pool", "avg"), vc.get("timm_proj", "linear")
    if pool in ("abs_attn", "rot_attn") or proj == "mlp":
        raise VitdeployError(f"{where}: a timm image tower with {'timm_pool ' + pool if proj != 'mlp' else 'an MLP projection'}"
                             ", which vitdeploy does not map")
    trunk = {k[len("visual.trunk."):]: t for k, t in sd.items() if k.startswith("visual.trunk.")}
    head = {k[len("visual.head."):]: t for k, t in sd.items() if k.startswith("visual.head.")}
    overrides = {"global_pool": pool} if pool else None
    ck = load_timm(weights, name, loaded=trunk, overrides=overrides)
    cfg, st = ViTConfig.from_dict(ck.manifest.model), dict(ck.state_dict)
    if proj == "linear":
        if "proj.weight" not in head:
            raise VitdeployError(f"{where}: timm_proj linear but no visual.head.proj.weight among the tensors")
        st["proj.weight"] = head["proj.weight"]
        if "proj.bias" in head:
            st["proj.bias"] = head["proj.bias"]
    elif "head.weight" in st:  # the trunk's classifier is the projection (TimmModel: num_classes=embed_dim)
        st["proj.weight"] = st.pop("head.weight")
        if "head.bias" in st:
            st["proj.bias"] = st.pop("head.bias")
    if "proj.weight" in st:
        cfg = cfg.with_(num_classes=0, proj_dim=int(st["proj.weight"].shape[0]), proj_bias="proj.bias" in st)
    else:
        cfg = cfg.with_(num_classes=0)
    return cfg, st


def open_clip_tower(cfg_json: dict[str, Any], sd: dict[str, torch.Tensor], weights: Path,
                    where: str) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """The image tower (``encode_image``, before the normalisation) as a ViTConfig with its state dict, float32."""
    model_cfg = cfg_json["model_cfg"]
    if model_cfg["vision_cfg"].get("timm_model_name"):
        cfg, st = _timm_tower(model_cfg, sd, weights, where)
    else:
        cfg, st = _own_tower(model_cfg, sd, where)
    st = _float32(st, where)
    _check_fits(st, cfg, where)
    return cfg, st


def load_open_clip_folder(folder: str | Path) -> Checkpoint:
    """An open_clip folder's image tower as an embedding model (what ``encode_image`` answers)."""
    d = Path(folder)
    cfg_json = read_open_clip_config(d)
    sd, weights = open_clip_state_dict(d)
    cfg, state = open_clip_tower(cfg_json, sd, d / weights, str(d / OPEN_CLIP_CONFIG))
    pp = open_clip_preprocess(cfg_json, cfg.image_size, str(d / OPEN_CLIP_CONFIG))
    source = {"format": "open_clip", "path": str(d.resolve()), "weights": weights}
    return Checkpoint(_manifest(cfg, [], pp, d.resolve().name, source), state)
