"""ViTs trained elsewhere → vitdeploy checkpoints: Hugging Face ``save_pretrained`` folders and timm state dicts.

The weights are mapped onto the vitdeploy ViT (which uses timm's parameter names), so
export, precision, engines and attention maps work on them unchanged. The files are
read directly (json, safetensors, ``torch.load(weights_only=True)``): neither
transformers nor timm is needed at run time.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitdeploy.core.artifact import read_manifest
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import source_sha256
from vitdeploy.core.manifest import ENGINE_SUFFIXES, Manifest, tool_versions
from vitdeploy.model.checkpoint import (
    CKPT_KEY,
    Checkpoint,
    _from_object,
    describe_foreign,
    unwrap_state_dict,
)
from vitdeploy.model.sources import HF_CONFIG, LEGACY_MESSAGE, check_source, is_legacy_torch_file
from vitdeploy.model.vit import IMAGENET_MEAN, IMAGENET_STD, VisionTransformer, ViTConfig

HF_PREPROCESSOR = "preprocessor_config.json"
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")

# PIL's resample integers, as transformers stores them in preprocessor_config.json.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

# transformers' ViTImageProcessor defaults (IMAGENET_STANDARD_MEAN/STD), used when a folder has no processor config.
HF_STANDARD_MEAN = (0.5, 0.5, 0.5)
HF_STANDARD_STD = (0.5, 0.5, 0.5)

# timm's IMAGENET_INCEPTION_MEAN/STD (timm/data/constants.py).
INCEPTION_MEAN = (0.5, 0.5, 0.5)
INCEPTION_STD = (0.5, 0.5, 0.5)


# --- reading files -----------------------------------------------------------------------------


def read_labels(path: str | Path) -> list[str]:
    """Class names, one per line (blank lines at the end ignored)."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise UsageError(f"--labels {p}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"--labels {p}: cannot read it as text ({type(e).__name__})") from None
    while lines and not lines[-1].strip():
        lines.pop()
    names = [ln.strip() for ln in lines]
    if not names:
        raise UsageError(f"--labels {p}: empty; write one class name per line")
    if any(not n for n in names):
        raise UsageError(f"--labels {p}: line {names.index('') + 1} is blank; write one class name per line")
    return names


def labels_for(path: str | Path, num_classes: int) -> list[str]:
    """The class names in ``path``, checked against the head's class count."""
    return _check_label_count(read_labels(path), num_classes, str(path))


def _check_label_count(labels: list[str], n: int, where: str) -> list[str]:
    if len(labels) != n:
        raise VitdeployError(
            f"{where} has {len(labels)} class names but the classifier head has {n} classes: give one name per class"
        )
    return labels


def torch_load(p: Path) -> Any:
    """torch.load(weights_only=True); timm's training checkpoints also hold argparse.Namespace ``args``, allowed here."""
    import argparse

    if p.suffix == ".npz":
        raise VitdeployError(f"{p}: JAX/NumPy .npz weights; load them in timm (which converts them) and save model.state_dict()")
    if not zipfile.is_zipfile(p):
        if is_legacy_torch_file(p):
            raise VitdeployError(f"{p}: {LEGACY_MESSAGE}")
        raise VitdeployError(f"{p}: not a PyTorch zip file or a safetensors file (truncated or another format)")
    allow = getattr(torch.serialization, "safe_globals", None)  # torch >= 2.5
    try:
        if allow is None:
            return torch.load(p, map_location="cpu", weights_only=True)
        with allow([argparse.Namespace]):
            return torch.load(p, map_location="cpu", weights_only=True)
    except Exception as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        if "weights_only" in msg or "Unsupported global" in msg:
            raise VitdeployError(f"{p}: holds pickled Python objects besides tensors; save its state_dict() alone") from None
        raise VitdeployError(f"{p}: a truncated or corrupt file ({msg[:80]})") from None


def _safetensors_load(p: Path) -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(p))
    except (SafetensorError, OSError, ValueError) as e:
        raise VitdeployError(f"{p}: not a readable safetensors file ({str(e)[:80]})") from None


def read_tensors(path: str | Path, loaded: Any = None) -> tuple[dict[str, torch.Tensor], str | None]:
    """The state dict in a .safetensors/.pth/.bin file, and which key of a training checkpoint it came from.

    Follows timm's own loader (``timm.models.load_state_dict(use_ema=True)``): ``state_dict_ema``,
    then ``model_ema``, ``state_dict``, ``model``; a DataParallel ``module.`` prefix is dropped.
    ``loaded``: the object already read from ``path`` (so it is not read twice).
    """
    p = Path(path)
    obj: Any = loaded
    if loaded is not None:
        pass
    elif not p.is_file():
        raise VitdeployError(f"{p}: no such file")
    elif p.stat().st_size == 0:
        raise VitdeployError(f"{p}: empty file, not a checkpoint")
    elif p.suffix == ".safetensors":
        obj = _safetensors_load(p)
    else:
        obj = torch_load(p)
    obj, key = unwrap_state_dict(obj)
    if not isinstance(obj, dict) or not any(isinstance(v, torch.Tensor) for v in obj.values()):
        raise VitdeployError(f"{p}: not a state dict — {describe_foreign(obj)}")
    return {k: v for k, v in obj.items() if isinstance(k, str) and isinstance(v, torch.Tensor)}, key


def _float32(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {k: (v.float() if v.is_floating_point() else v).contiguous() for k, v in sd.items()}


def _check_fits(state: dict[str, torch.Tensor], cfg: ViTConfig, where: str) -> None:
    """Compare names and shapes with the model the config describes, on the meta device (no memory)."""
    with torch.device("meta"):
        ref = VisionTransformer(cfg).state_dict()
    missing = [k for k in ref if k not in state]
    extra = [k for k in state if k not in ref]
    wrong = [f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}" for k, v in ref.items() if k in state and state[k].shape != v.shape]
    if missing or extra or wrong:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(missing[:3])}")
        if extra:
            parts.append(f"unexpected {', '.join(extra[:3])}")
        if wrong:
            parts.append(f"shape {'; '.join(wrong[:2])}")
        raise VitdeployError(f"{where}: the weights do not fit the architecture ({'; '.join(parts)})")


def _manifest(cfg: ViTConfig, labels: list[str], pp: dict[str, Any], name: str, source: dict[str, Any]) -> Manifest:
    return Manifest(
        model=cfg.to_dict(),
        labels=labels,
        preprocess=pp,
        name=name,
        source=source,
        versions=tool_versions("torch", "safetensors"),
    )


# --- Hugging Face --------------------------------------------------------------------------------


def _hf_state_dict(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    for name in HF_WEIGHTS:
        f = folder / name
        if not f.is_file():
            continue
        if name.endswith(".index.json"):
            try:
                shards = sorted(set(json.loads(f.read_text())["weight_map"].values()))
            except (json.JSONDecodeError, KeyError, TypeError):
                raise VitdeployError(f"{f}: not a valid shard index (no weight_map)") from None
            sd: dict[str, torch.Tensor] = {}
            for s in shards:
                part = folder / s
                if not part.is_file():
                    raise VitdeployError(f"{folder}: shard {s} named in {name} is missing")
                sd.update(_safetensors_load(part) if s.endswith(".safetensors") else read_tensors(part)[0])
            return sd, name
        if name.endswith(".safetensors"):
            return _safetensors_load(f), name
        return read_tensors(f)[0], name
    others = sorted(x.name for x in folder.iterdir() if x.suffix in (".h5", ".msgpack", ".ckpt"))
    hint = f" (it has {', '.join(others)}: TensorFlow/Flax weights; re-save them with PyTorch)" if others else ""
    raise VitdeployError(f"{folder}: no model.safetensors or pytorch_model.bin beside config.json{hint}")


def _hf_preprocess(folder: Path, image_size: tuple[int, int]) -> dict[str, Any]:
    """The image processor's config as a vitdeploy Preprocess dict (ViTImageProcessor: squash-resize)."""
    f = folder / HF_PREPROCESSOR
    pc: dict[str, Any] = {}
    if f.is_file():
        try:
            pc = json.loads(f.read_text())
        except json.JSONDecodeError as e:
            raise VitdeployError(f"{f}: not valid JSON ({e})") from None
    h, w = image_size
    size = pc.get("size", {"height": h, "width": w})
    if isinstance(size, int):
        size = {"height": size, "width": size}
    resample = pc.get("resample", 2)
    # an int (PIL's enum value) as transformers writes it; tolerate a name such as "PILImageResampling.BICUBIC"
    interp = PIL_RESAMPLE.get(int(resample)) if isinstance(resample, int) else str(resample).rsplit(".", 1)[-1].lower()
    if interp not in PIL_RESAMPLE.values():
        raise VitdeployError(f"{f}: unknown resample {resample!r}")
    crop = pc.get("crop_size") if pc.get("do_center_crop") else None
    if "height" in size and "width" in size and crop is None:
        mode, crop_pct, out = "squash", 1.0, (int(size["height"]), int(size["width"]))
    elif "height" in size and "width" in size and isinstance(crop, dict) and "height" in crop and "width" in crop:
        # DeiT/BEiT: squash to size, then center-crop crop_size; one crop_pct must give both sides
        sh, sw, ch, cw = int(size["height"]), int(size["width"]), int(crop["height"]), int(crop["width"])
        crop_pct = ch / sh
        if int(ch / crop_pct) != sh:
            crop_pct = ch / (sh + 1e-6)
        if (int(cw / crop_pct), int(ch / crop_pct)) != (sw, sh) or ch > sh or cw > sw:
            raise VitdeployError(f"{f}: resize {size} then crop {crop}: the crop is not one fraction of both sides")
        mode, out = "squash_crop", (ch, cw)
    elif "shortest_edge" in size and isinstance(crop, dict) and crop.get("height") == crop.get("width"):
        # resize the shorter side, then center-crop: timm's eval transform with crop_pct = crop / shorter side
        short, c = int(size["shortest_edge"]), int(crop["height"])
        mode, crop_pct, out = "shorter", c / short, (c, c)
        if int(c / crop_pct) != short:  # guard against float rounding in floor(c / crop_pct)
            crop_pct = c / (short + 1e-6)
    else:
        raise VitdeployError(
            f"{f}: resize {size} with center crop {crop} has no vitdeploy equivalent "
            "(supported: size {height, width}; or shortest_edge with a square crop_size)"
        )
    do_norm = pc.get("do_normalize", True)
    mean = [float(v) for v in _three(pc.get("image_mean", HF_STANDARD_MEAN))] if do_norm else [0.0, 0.0, 0.0]
    std = [float(v) for v in _three(pc.get("image_std", HF_STANDARD_STD))] if do_norm else [1.0, 1.0, 1.0]
    if not all(math.isfinite(v) for v in mean) or not all(math.isfinite(v) and v > 0 for v in std):
        raise VitdeployError(f"{f}: image_mean {mean} / image_std {std}: every std must be a finite number above 0 "
                             "and every mean finite; fix the processor config")
    return {
        "input_size": [out[0], out[1]],
        "resize_mode": mode,
        "crop_pct": crop_pct,
        "interpolation": interp,
        "mean": mean,
        "std": std,
        "channel_order": "RGB",
        "rescale": float(pc.get("rescale_factor", 1 / 255)) if pc.get("do_rescale", True) else 1.0,
        **({"crop_offset": "floor"} if mode != "squash" else {}),  # transformers' center_crop: (size - crop) // 2
    }


def _three(v: Any) -> list[Any]:
    """A processor's mean/std: three numbers, or one for every channel."""
    return list(v) if isinstance(v, (list, tuple)) else [v, v, v]


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))


def load_hf_folder(folder: str | Path, labels: str | Path | None = None) -> Checkpoint:
    """A ``save_pretrained`` folder of ViTForImageClassification (or ViTModel) as a vitdeploy Checkpoint."""
    d = Path(folder)
    try:
        cfg_json = json.loads((d / HF_CONFIG).read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise VitdeployError(f"{d / HF_CONFIG}: cannot read it ({type(e).__name__})") from None
    mtype = cfg_json.get("model_type")
    if mtype is None and isinstance(cfg_json.get("architecture"), str):
        return load_timm_folder(d, cfg_json, labels)
    from vitdeploy.model.hf_import import hf_architecture, hf_vision_config, interpolate_like_transformers

    sd, weights_name = _hf_state_dict(d)
    fields, state = hf_architecture(cfg_json, sd, str(d))
    state = _float32(state)
    n_cls = int(fields["num_classes"])
    pp = _hf_preprocess(d, fields["image_size"])
    size = (int(pp["input_size"][0]), int(pp["input_size"][1]))
    if size != fields["image_size"]:
        # The processor makes inputs of another size than the position embeddings were made for (DINOv2: config 518,
        # crop 224): transformers interpolates them at run time; vitdeploy does it once, the same way, at import.
        p = fields["patch_size"]
        if size[0] % p or size[1] % p:
            raise VitdeployError(f"{d}: the image processor makes {size[0]}x{size[1]} inputs, not a multiple of the patch size {p}")
        if "pos_embed" not in state:
            raise VitdeployError(
                f"{d}: the image processor makes {size[0]}x{size[1]} inputs but config.json's image_size is "
                f"{fields['image_size'][0]}x{fields['image_size'][1]} and the model has no absolute position embeddings to resample"
            )
        prefix = int(fields["class_token"]) + int(fields["distilled"]) + int(fields["reg_tokens"])
        antialias = "num_register_tokens" in hf_vision_config(cfg_json)
        state["pos_embed"] = interpolate_like_transformers(state["pos_embed"], prefix, (size[0] // p, size[1] // p), antialias)
        fields["image_size"] = size
    try:
        cfg = ViTConfig(**fields)
    except ValueError as e:
        raise VitdeployError(f"{d / HF_CONFIG}: {e}") from None
    _check_fits(state, cfg, str(d))
    if labels is not None:
        names = labels_for(labels, n_cls)
    else:
        id2label = cfg_json.get("id2label") or {}
        try:
            names = [str(id2label[k]) for k in sorted(id2label, key=int)]
        except ValueError:
            names = []
        if len(names) != n_cls or sorted(int(k) for k in id2label) != list(range(n_cls)):
            names = [f"LABEL_{i}" for i in range(n_cls)]  # transformers' own default names
    source = {"format": "huggingface", "path": str(d.resolve()), "weights": weights_name, "architectures": cfg_json.get("architectures")}
    return Checkpoint(_manifest(cfg, names, pp, d.resolve().name, source), state)


# --- timm ----------------------------------------------------------------------------------------

# Widths of timm's plain ViTs (timm/models/vision_transformer.py and deit.py, the register_model functions).
TIMM_SIZES: dict[str, dict[str, Any]] = {
    "tiny": {"embed_dim": 192, "depth": 12, "num_heads": 3},
    "small": {"embed_dim": 384, "depth": 12, "num_heads": 6},
    "base": {"embed_dim": 768, "depth": 12, "num_heads": 12},
    "large": {"embed_dim": 1024, "depth": 24, "num_heads": 16},
    "huge": {"embed_dim": 1280, "depth": 32, "num_heads": 16},
    "giant": {"embed_dim": 1408, "depth": 40, "num_heads": 16, "mlp_ratio": 48 / 11},
}
_TIMM_NAME = re.compile(r"^(vit|deit)_(tiny|small|base|large|huge|giant)_patch(\d+)_(\d+)(_miil)?$")
# h3 stand-in until h1's generated name table lands: DINOv2 without registers, for --image-size's test against timm.
_TIMM_DINOV2 = re.compile(r"^vit_(small|base|large)_patch14_dinov2$")
SUPPORTED_TIMM = (
    "vit_{tiny,small,base,large,huge,giant}_patch{8,14,16,32}_{224,384}[.tag], vit_base_patch16_224_miil, "
    "deit_{tiny,small,base}_patch16_{224,384}"
)


@dataclass(frozen=True)
class TimmArch:
    """A timm model name resolved to its architecture and its pretrained cfg's preprocessing."""

    name: str
    tag: str | None
    config: ViTConfig
    preprocess: dict[str, Any]


def timm_arch(name: str) -> TimmArch:
    """Architecture and eval preprocessing of a timm ViT name (``vit_base_patch16_224`` or ``...224.augreg_in1k``).

    Values from timm's pretrained cfgs (huggingface/pytorch-image-models, timm/models/vision_transformer.py
    ``_cfg`` and ``default_cfgs``; timm/models/deit.py ``_cfg``):
    - vit_*: mean = std = IMAGENET_INCEPTION (0.5, 0.5, 0.5), crop_pct 0.9, bicubic; the 384 cfgs use crop_pct 1.0;
      the ``.dino`` and ``.mae`` tags use IMAGENET_DEFAULT mean/std.
    - vit_base_patch16_224_miil: mean 0, std 1, crop_pct 0.875, bilinear.
    - deit_*: IMAGENET_DEFAULT mean/std, crop_pct 0.9 (1.0 at 384), bicubic.
    Eval transform (timm/data/transforms_factory.py): resize the shorter side to floor(size / crop_pct), center crop.
    LayerNorm eps is 1e-6 (timm.layers.LayerNorm's default).
    """
    base, _, tag = name.strip().partition(".")
    if "distilled" in base:
        raise UsageError(
            f"--arch {name}: distilled DeiT models carry a distillation token and a second head (head_dist) that the "
            "vitdeploy ViT does not have; use the non-distilled deit_* weights or a vit_* model"
        )
    if base.startswith("deit3_"):
        raise UsageError(f"--arch {name}: DeiT III uses layer scale and class-free position embeddings, which vitdeploy does not map")
    dino = _TIMM_DINOV2.match(base)
    if dino:  # timm's vit_{small,base,large}_patch14_dinov2: LayerScale, 518 px, ImageNet mean/std, crop_pct 1.0
        cfg = ViTConfig(image_size=(518, 518), patch_size=14, ln_eps=1e-6, init_values=1e-5, **TIMM_SIZES[dino.group(1)])
        pp = {"input_size": [518, 518], "resize_mode": "shorter", "crop_pct": 1.0, "interpolation": "bicubic",
              "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "channel_order": "RGB"}
        return TimmArch(base, tag or None, cfg, pp)
    m = _TIMM_NAME.match(base)
    if not m:
        raise UsageError(
            f"--arch {name}: not a timm ViT vitdeploy can map; supported: {SUPPORTED_TIMM} "
            "(models with register tokens, layer scale, CLIP pre-norm or attention pooling are not)"
        )
    family, size, patch, img, miil = m.group(1), m.group(2), int(m.group(3)), int(m.group(4)), bool(m.group(5))
    if family == "deit" and size not in ("tiny", "small", "base"):
        raise UsageError(f"--arch {name}: timm has no deit_{size}; use deit_tiny/small/base or vit_{size}")
    dims = dict(TIMM_SIZES[size])
    try:
        cfg = ViTConfig(image_size=(img, img), patch_size=patch, ln_eps=1e-6, qkv_bias=not miil, **dims)
    except ValueError as e:
        raise UsageError(f"--arch {name}: {e}") from None
    crop_pct, interp = (0.9 if img < 384 else 1.0), "bicubic"
    if family == "deit" or tag in ("dino", "mae"):
        mean, std = IMAGENET_MEAN, IMAGENET_STD
    else:
        mean, std = INCEPTION_MEAN, INCEPTION_STD
    if miil:
        mean, std, crop_pct, interp = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0), 0.875, "bilinear"
    pp = {
        "input_size": [img, img],
        "resize_mode": "shorter",
        "crop_pct": crop_pct,
        "interpolation": interp,
        "mean": list(mean),
        "std": list(std),
        "channel_order": "RGB",
    }
    return TimmArch(base, tag or None, cfg, pp)


# Keys of timm ViT features the vitdeploy ViT does not have, and what they mean.
_TIMM_UNSUPPORTED = (
    ("dist_token", "a distilled DeiT (dist_token, head_dist)"),
    ("reg_token", "register tokens (reg_token)"),
    ("norm_pre.", "a pre-norm (CLIP-style) ViT (norm_pre)"),
    (".gamma_1", "layer scale (gamma_1/gamma_2)"),
    (".q_norm.", "QK-norm (q_norm/k_norm)"),
    ("attn_pool.", "attention pooling (attn_pool)"),
    ("visual.", "an OpenCLIP/OpenAI CLIP checkpoint (visual.*)"),
)


def _timm_layout(sd: dict[str, torch.Tensor], where: str) -> dict[str, Any]:
    """What the tensors themselves say about the architecture (and refusals for what cannot be mapped)."""
    keys = list(sd)
    for marker, what in _TIMM_UNSUPPORTED:
        if any(marker in k or k.startswith(marker) for k in keys):
            raise VitdeployError(f"{where}: a timm ViT with {what}, which the vitdeploy ViT does not have")
    if "patch_embed.proj.weight" not in sd or "pos_embed" not in sd:
        raise VitdeployError(f"{where}: not a timm ViT state dict — {describe_foreign(sd)}")
    if "cls_token" not in sd:
        raise VitdeployError(f"{where}: a timm ViT without a class token (class_token=False), which vitdeploy does not map")
    pw = sd["patch_embed.proj.weight"]
    if pw.ndim != 4:
        raise VitdeployError(f"{where}: patch_embed.proj.weight has {pw.ndim} dims; expected a Conv2d weight (4 dims)")
    depth = 1 + max((int(k.split(".")[1]) for k in keys if k.startswith("blocks.")), default=-1)
    n_tokens = int(sd["pos_embed"].shape[1]) - 1
    side = int(round(n_tokens**0.5))
    return {
        "embed_dim": int(sd["cls_token"].shape[-1]),
        "depth": depth,
        "patch_size": int(pw.shape[-1]),
        "in_chans": int(pw.shape[1]),
        "grid": side if side * side == n_tokens else None,
        "mlp_dim": int(sd["blocks.0.mlp.fc1.weight"].shape[0]) if "blocks.0.mlp.fc1.weight" in sd else None,
        "qkv_bias": "blocks.0.attn.qkv.bias" in sd,
        "fc_norm": "fc_norm.weight" in sd,
        "layer_scale": any(".ls1." in k for k in keys),
        "num_classes": int(sd["head.weight"].shape[0]) if "head.weight" in sd else 0,
    }


def _eva_beit_checkpoint(
    p: Path,
    arch: str,
    entry: dict[str, Any],
    labels: str | Path | None,
    loaded: Any = None,
    model_args: dict[str, Any] | None = None,
    pcfg: dict[str, Any] | None = None,
) -> Checkpoint:
    """A timm Eva/Beit state dict: its arguments from the generated table under the folder's ``model_args``,
    its names through the one layout filter (model/layouts.py), its preprocessing from the pretrained cfg."""
    from vitdeploy.model.layouts import rename_eva_beit
    from vitdeploy.model.timm_eva import eva_beit_config

    model_args = dict(model_args or {})
    unknown = sorted(set(model_args) - set(entry["args"]))
    if unknown:
        raise VitdeployError(f"{p}: model_args {', '.join(unknown)} are not arguments of timm's {entry['class']}")
    args = {**entry["args"], **model_args}
    cfg = eva_beit_config(entry["class"], args, arch)  # an architecture vitdeploy cannot hold: said before reading
    sd, key = read_tensors(p, loaded)
    state = _float32(rename_eva_beit(sd))
    pcfg = {**entry.get("pretrained_cfg", {}), **(pcfg or {})}
    base = {"input_size": list(cfg.image_size), "resize_mode": "shorter", "crop_pct": 0.9, "interpolation": "bicubic",
            "mean": list(IMAGENET_MEAN), "std": list(IMAGENET_STD), "channel_order": "RGB"}
    pp = _timm_cfg_preprocess(pcfg, base, str(p))
    if args.get("dynamic_img_size") and not cfg.abs_pos_embed:
        # timm runs it at whatever size the preprocessing makes, its rotary tables computed for that grid
        try:
            cfg = cfg.with_(image_size=tuple(pp["input_size"]))
        except ValueError as e:
            raise VitdeployError(f"{p}: {e}") from None
    if tuple(pp["input_size"]) != tuple(cfg.image_size):
        raise VitdeployError(f"{p}: the preprocessing's input size {pp['input_size']} differs from the model's {list(cfg.image_size)}")
    n = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    cfg = cfg.with_(num_classes=n)
    _check_fits(state, cfg, str(p))
    names = labels_for(labels, n) if labels is not None else [f"class_{i}" for i in range(n)]
    source = {"format": "timm", "path": str(p.resolve()), "arch": arch, "state_dict_key": key, "timm_class": entry["class"]}
    return Checkpoint(_manifest(cfg, names, pp, arch, source), state)


def load_timm(path: str | Path, arch: str, labels: str | Path | None = None, loaded: Any = None) -> Checkpoint:
    """A timm ViT state dict (plain, or inside a timm training checkpoint) with its timm model name."""
    from vitdeploy.model.timm_eva import eva_beit_entry

    p = Path(path)
    entry = eva_beit_entry(arch)
    if entry is not None:
        return _eva_beit_checkpoint(p, arch, entry, labels, loaded)
    spec = timm_arch(arch)
    sd, key = read_tensors(p, loaded)
    sd = {k: v for k, v in sd.items() if not k.startswith("pre_logits.")}  # unused representation layer of old weights
    lay = _timm_layout(sd, str(p))
    cfg = spec.config
    want = {"embed_dim": cfg.embed_dim, "depth": cfg.depth, "patch_size": cfg.patch_size, "mlp_dim": cfg.hidden_dim}
    got = {k: lay[k] for k in want}
    if got != want or lay["in_chans"] != 3:
        diff = ", ".join(f"{k} {got[k]} (not {want[k]})" for k in want if got[k] != want[k]) or f"in_chans {lay['in_chans']}"
        raise VitdeployError(f"{p}: the weights are not {arch}: {diff}; pass the --arch they were trained as")
    grid = cfg.grid_size[0]
    if lay["grid"] != grid:
        if lay["grid"]:
            size = lay["grid"] * cfg.patch_size
            hint = f"{spec.name.rsplit('_', 1)[0]}_{size}"
            raise VitdeployError(f"{p}: the position embeddings are for {size}x{size} inputs, not {arch}'s; pass --arch {hint}")
        raise VitdeployError(f"{p}: the position embeddings do not form a square grid; vitdeploy maps square inputs")
    if lay["qkv_bias"] != cfg.qkv_bias:
        cfg = cfg.with_(qkv_bias=lay["qkv_bias"])
    cfg = cfg.with_(num_classes=lay["num_classes"])
    if lay["fc_norm"]:  # trained with global_pool='avg': mean of the patch tokens, LayerNorm after the pooling
        cfg = cfg.with_(pool="mean", final_norm="fc_norm")
    if lay["layer_scale"] and cfg.init_values is None:
        raise VitdeployError(f"{p}: a timm ViT with layer scale (ls1/ls2), which {arch} does not have")
    state = _float32(sd)
    _check_fits(state, cfg, str(p))
    n = cfg.num_classes
    names = labels_for(labels, n) if labels is not None else [f"class_{i}" for i in range(n)]
    source = {"format": "timm", "path": str(p.resolve()), "arch": arch, "state_dict_key": key}
    name = spec.name + (f".{spec.tag}" if spec.tag else "")
    return Checkpoint(_manifest(cfg, names, dict(spec.preprocess), name, source), state)


def _timm_cfg_preprocess(pcfg: dict[str, Any], base: dict[str, Any], where: str) -> dict[str, Any]:
    """A timm pretrained_cfg (input_size, interpolation, crop_pct, crop_mode, mean, std) over the name's defaults."""
    pp = dict(base)
    if "input_size" in pcfg:
        _, h, w = (int(v) for v in pcfg["input_size"])
        pp["input_size"] = [h, w]
    if "interpolation" in pcfg:
        pp["interpolation"] = str(pcfg["interpolation"])
    if "crop_pct" in pcfg:
        pp["crop_pct"] = float(pcfg["crop_pct"])
    mode = pcfg.get("crop_mode", "center")
    if mode not in ("center", "squash"):
        raise VitdeployError(f"{where}: crop_mode {mode!r} has no vitdeploy equivalent (center or squash)")
    pp["resize_mode"] = "shorter" if mode == "center" else "squash"
    for k in ("mean", "std"):
        if k in pcfg:
            pp[k] = [float(v) for v in pcfg[k]]
    return pp


def load_timm_folder(folder: str | Path, cfg_json: dict[str, Any] | None = None, labels: str | Path | None = None) -> Checkpoint:
    """A timm model folder as timm's ``save_for_hf``/``push_to_hub`` writes it (and the Hub serves it).

    config.json holds ``architecture``, ``pretrained_cfg`` (preprocessing) and optionally
    ``label_names`` and ``model_args``; the weights are model.safetensors or pytorch_model.bin
    (timm/models/_hub.py: save_config_for_hf, _parse_model_cfg).
    """
    d = Path(folder)
    if cfg_json is None:
        cfg_json = json.loads((d / HF_CONFIG).read_text())
    arch = str(cfg_json["architecture"])
    pcfg = dict(cfg_json.get("pretrained_cfg") or {})
    if "pretrained_cfg" not in cfg_json:  # timm's legacy single-dict config
        pcfg = {k: v for k, v in cfg_json.items() if k != "architecture"}
    tag = pcfg.get("tag")
    model_args = dict(cfg_json.get("model_args") or {})
    from vitdeploy.model.timm_eva import eva_beit_entry

    entry = eva_beit_entry(arch)
    if entry is not None:
        wfile = next((d / n for n in ("model.safetensors", "pytorch_model.bin") if (d / n).is_file()), None)
        if wfile is None:
            raise VitdeployError(f"{d}: no model.safetensors or pytorch_model.bin beside config.json")
        ck = _eva_beit_checkpoint(wfile, arch, entry, labels, model_args=model_args, pcfg=pcfg)
        _folder_labels(ck.manifest, cfg_json, pcfg, labels)
        ck.manifest.source = {**ck.manifest.source, "format": "timm-hub", "path": str(d.resolve()), "weights": wfile.name}
        return ck
    unknown = sorted(set(model_args) - {"img_size", "num_classes", "global_pool"})
    if unknown:
        raise VitdeployError(f"{d}: model_args {', '.join(unknown)} change the timm architecture in ways vitdeploy does not map")
    weights = next((d / n for n in ("model.safetensors", "pytorch_model.bin") if (d / n).is_file()), None)
    if weights is None:
        raise VitdeployError(f"{d}: no model.safetensors or pytorch_model.bin beside config.json")
    name = f"{arch}.{tag}" if tag and "." not in arch else arch
    if "img_size" in model_args:
        size = model_args["img_size"]
        size = size if isinstance(size, int) else int(size[0])
        name = re.sub(r"_(\d+)$", f"_{size}", arch)
    ck = load_timm(weights, name, labels)
    m = ck.manifest
    m.preprocess = _timm_cfg_preprocess(pcfg, m.preprocess, str(d / HF_CONFIG))
    if tuple(m.preprocess["input_size"]) != tuple(m.model["image_size"]):
        raise VitdeployError(f"{d}: pretrained_cfg input_size {m.preprocess['input_size']} differs from the model's {m.model['image_size']}")
    _folder_labels(m, cfg_json, pcfg, labels)
    m.source = {**m.source, "format": "timm-hub", "path": str(d.resolve()), "weights": weights.name}
    return ck


def _folder_labels(m: Manifest, cfg_json: dict[str, Any], pcfg: dict[str, Any], labels: str | Path | None) -> None:
    """The folder's label_names, where no --labels file replaces them and they fit the head."""
    names = cfg_json.get("label_names", pcfg.get("label_names"))
    if labels is None and names:
        if isinstance(names, dict):
            names = [names[k] for k in sorted(names, key=int)]
        if len(names) == m.num_classes:
            m.labels = [str(n) for n in names]


# --- conversion to a vitdeploy checkpoint ------------------------------------------------------------


def import_checkpoint(
    source: str | Path,
    out: str | Path = "ckpt.pth",
    arch: str | None = None,
    labels: str | Path | None = None,
    image_size: tuple[int, int] | None = None,
) -> tuple[Path, Manifest]:
    """Write any checkpoint load_any reads as a self-describing vitdeploy checkpoint; its path and manifest
    (so the caller need not read back what was just written).

    ``image_size`` (H, W): deploy at that input size; absolute position embeddings are resampled as timm does
    (model/pos_embed.py), RoPE tables recomputed, the preprocessing's input size follows.

    After this, every command takes it without --arch/--labels (verify, infer, benchmark, explain …).
    """
    from vitdeploy.model.checkpoint import save_checkpoint

    ck = load_any(source, arch=arch, labels=labels)
    if image_size is not None:
        from vitdeploy.model.pos_embed import resize_checkpoint

        ck, _ = resize_checkpoint(ck, image_size, str(source))
    model = ck.build()
    src = dict(ck.manifest.source)
    src["sha256"] = source_sha256(source)
    manifest = ck.manifest.derive(source=src)
    return save_checkpoint(out, model, manifest), manifest


def load_any(path: str | Path, arch: str | None = None, labels: str | Path | None = None) -> Checkpoint:
    """A checkpoint from any source vitdeploy reads.

    A vitdeploy checkpoint; a Hugging Face ``save_pretrained`` folder of a ViT (or its
    config.json); or, with ``arch`` (a timm model name such as ``vit_base_patch16_224``),
    a timm ViT state dict in a .pth/.bin/.safetensors file or a timm training checkpoint.
    ``labels`` names a file of class names, one per line, replacing the source's.
    """
    p = check_source(path, arch)  # what needs no torch (model/sources.py): a plain folder, a missing or non-zip file …
    if p.is_dir():
        return load_hf_folder(p, labels)
    if p.suffix == ".safetensors":
        if arch:
            return load_timm(p, arch, labels)
        sd, _ = read_tensors(p)
        raise VitdeployError(f"{p}: not a vitdeploy checkpoint — {describe_foreign(sd)}")
    obj = torch_load(p)  # a zip file: check_source refused the rest
    if isinstance(obj, dict) and CKPT_KEY in obj:
        ck = _from_object(p, obj)
    elif arch:
        return load_timm(p, arch, labels, loaded=obj)
    else:
        raise VitdeployError(f"{p}: not a vitdeploy checkpoint — {describe_foreign(obj)}")
    if labels is not None:
        ck.manifest.labels = labels_for(labels, ck.manifest.num_classes)
    return ck


def read_any_manifest(path: str | Path) -> Manifest:
    """The manifest of any artifact: ONNX model or engine (core.manifest), else a checkpoint or HF folder."""
    p = Path(path)
    if p.suffix == ".onnx" or p.suffix in ENGINE_SUFFIXES:
        return read_manifest(p)
    return load_any(p).manifest
