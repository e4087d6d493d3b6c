"""ViTs trained elsewhere → vitdeploy checkpoints: Hugging Face ``save_pretrained`` folders and timm state dicts.

The weights are mapped onto the vitdeploy ViT (which uses timm's parameter names), so
export, precision, engines and attention maps work on them unchanged. The files are
read directly (json, safetensors, ``torch.load(weights_only=True)``): neither
transformers nor timm is needed at run time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from vitdeploy.core.artifact import read_manifest
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.loaded import SourceReads
from vitdeploy.core.manifest import ENGINE_SUFFIXES, Manifest
from vitdeploy.model.checkpoint import (
    CKPT_KEY,
    Checkpoint,
    _from_object,
    describe_foreign,
)
from vitdeploy.model.sources import HF_CONFIG, check_source
from vitdeploy.model.vit import ViTConfig
from vitdeploy.model.weights import (  # noqa: F401  (re-exported: callers import them from here)
    _check_fits,
    _check_label_count,
    _float32,
    _manifest,
    _safetensors_load,
    labels_for,
    read_labels,
    read_tensors,
    torch_load,
)

HF_PREPROCESSOR = "preprocessor_config.json"
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")

# PIL's resample integers, as transformers stores them in preprocessor_config.json.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

# transformers' ViTImageProcessor defaults (IMAGENET_STANDARD_MEAN/STD), used when a folder has no processor config.
HF_STANDARD_MEAN = (0.5, 0.5, 0.5)
HF_STANDARD_STD = (0.5, 0.5, 0.5)

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
    if out != (h, w):
        raise VitdeployError(
            f"{folder}: the image processor makes {out[0]}x{out[1]} inputs but config.json's image_size is {h}x{w}"
        )
    do_norm = pc.get("do_normalize", True)
    mean = [float(v) for v in pc.get("image_mean", HF_STANDARD_MEAN)] if do_norm else [0.0, 0.0, 0.0]
    std = [float(v) for v in pc.get("image_std", HF_STANDARD_STD)] if do_norm else [1.0, 1.0, 1.0]
    return {
        "input_size": [h, w],
        "resize_mode": mode,
        "crop_pct": crop_pct,
        "interpolation": interp,
        "mean": mean,
        "std": std,
        "channel_order": "RGB",
        "rescale": float(pc.get("rescale_factor", 1 / 255)) if pc.get("do_rescale", True) else 1.0,
    }


def _pair(v: Any) -> tuple[int, int]:
    if isinstance(v, (list, tuple)):
        return (int(v[0]), int(v[1]))
    return (int(v), int(v))


def convert_hf_state_dict(sd: dict[str, torch.Tensor], depth: int, where: str = "weights") -> dict[str, torch.Tensor]:
    """ViTForImageClassification / ViTModel names → vitdeploy (timm) names; query/key/value fused into qkv."""
    prefix = "vit." if "vit.embeddings.cls_token" in sd else ""
    if prefix + "embeddings.cls_token" not in sd:
        raise VitdeployError(f"{where}: no vit.embeddings.cls_token: not a Hugging Face ViT checkpoint")
    used: set[str] = set()

    def take(k: str) -> torch.Tensor:
        try:
            used.add(k)
            return sd[k]
        except KeyError:
            raise VitdeployError(f"{where}: tensor {k} is missing: not a complete ViT checkpoint") from None

    p = prefix
    out = {
        "cls_token": take(p + "embeddings.cls_token"),
        "pos_embed": take(p + "embeddings.position_embeddings"),
        "patch_embed.proj.weight": take(p + "embeddings.patch_embeddings.projection.weight"),
        "patch_embed.proj.bias": take(p + "embeddings.patch_embeddings.projection.bias"),
    }
    for i in range(depth):
        src, dst = f"{p}encoder.layer.{i}.", f"blocks.{i}."
        att = src + "attention.attention."
        pairs = {
            "norm1": "layernorm_before",
            "attn.proj": "attention.output.dense",
            "norm2": "layernorm_after",
            "mlp.fc1": "intermediate.dense",
            "mlp.fc2": "output.dense",
        }
        for d, s in pairs.items():
            out[f"{dst}{d}.weight"] = take(f"{src}{s}.weight")
            out[f"{dst}{d}.bias"] = take(f"{src}{s}.bias")
        out[dst + "attn.qkv.weight"] = torch.cat([take(att + n + ".weight") for n in ("query", "key", "value")])
        if att + "query.bias" in sd:
            out[dst + "attn.qkv.bias"] = torch.cat([take(att + n + ".bias") for n in ("query", "key", "value")])
    out["norm.weight"] = take(p + "layernorm.weight")
    out["norm.bias"] = take(p + "layernorm.bias")
    if "classifier.weight" in sd:
        out["head.weight"] = take("classifier.weight")
        out["head.bias"] = take("classifier.bias")
    ignored = ("pooler.", "embeddings.mask_token")  # unused by ViTForImageClassification's logits
    left = [k for k in sd if k not in used and not k[len(p) :].startswith(ignored)]
    if left:
        raise VitdeployError(f"{where}: tensors vitdeploy cannot map: {', '.join(left[:4])}")
    return out


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
    archs = ", ".join(cfg_json.get("architectures") or []) or "no architectures listed"
    if mtype != "vit":
        raise VitdeployError(
            f"{d}: a Hugging Face {mtype!r} model ({archs}); vitdeploy imports model_type 'vit' (ViTForImageClassification)"
        )
    act = cfg_json.get("hidden_act", "gelu")
    if act != "gelu":
        raise VitdeployError(
            f"{d}: hidden_act is {act!r}; the vitdeploy ViT uses exact (erf) GELU, so only 'gelu' converts with identical logits"
        )
    if int(cfg_json.get("num_channels", 3)) != 3:
        raise VitdeployError(f"{d}: num_channels {cfg_json.get('num_channels')}; vitdeploy reads RGB images (3 channels)")
    depth = int(cfg_json.get("num_hidden_layers", 12))
    sd, weights_name = _hf_state_dict(d)
    state = _float32(convert_hf_state_dict(sd, depth, str(d)))
    n_cls = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    hidden = int(cfg_json.get("hidden_size", 768))
    try:
        cfg = ViTConfig(
            image_size=_pair(cfg_json.get("image_size", 224)),
            patch_size=int(cfg_json.get("patch_size", 16)),
            in_chans=3,
            num_classes=n_cls,
            embed_dim=hidden,
            depth=depth,
            num_heads=int(cfg_json.get("num_attention_heads", 12)),
            mlp_ratio=int(cfg_json.get("intermediate_size", 3072)) / hidden,
            mlp_dim=int(cfg_json.get("intermediate_size", 3072)),
            qkv_bias=bool(cfg_json.get("qkv_bias", True)),
            ln_eps=float(cfg_json.get("layer_norm_eps", 1e-12)),
        )
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
    pp = _hf_preprocess(d, cfg.image_size)
    source = {"format": "huggingface", "path": str(d.resolve()), "weights": weights_name, "architectures": cfg_json.get("architectures")}
    return Checkpoint(_manifest(cfg, names, pp, d.resolve().name, source), state)


# --- timm: model/timm_import.py (names and folders read through the table timm's registrations generated) ---


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
    from vitdeploy.model.timm_import import pp_from_pretrained_cfg

    pp = pp_from_pretrained_cfg({"input_size": (3, *cfg.image_size), **pcfg}, str(p))
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
    """A timm ViT state dict with its timm model name: Eva/Beit names here, the rest in model/timm_import.py."""
    from vitdeploy.model.timm_eva import eva_beit_entry

    entry = eva_beit_entry(arch)
    if entry is not None:
        return _eva_beit_checkpoint(Path(path), arch, entry, labels, loaded)
    from vitdeploy.model.timm_import import load_timm as _load

    return _load(path, arch, labels, loaded)


def load_timm_folder(folder: str | Path, cfg_json: dict[str, Any] | None = None, labels: str | Path | None = None) -> Checkpoint:
    from vitdeploy.model.timm_import import load_timm_folder as _load

    d = Path(folder)
    if cfg_json is None:
        cfg_json = json.loads((d / HF_CONFIG).read_text())
    from vitdeploy.model.timm_eva import eva_beit_entry

    arch = str(cfg_json.get("architecture", ""))
    entry = eva_beit_entry(arch)
    if entry is None:
        return _load(folder, cfg_json, labels)
    pcfg = dict(cfg_json.get("pretrained_cfg") or {})
    model_args = dict(cfg_json.get("model_args") or {})
    wfile = next((d / n for n in ("model.safetensors", "pytorch_model.bin") if (d / n).is_file()), None)
    if wfile is None:
        raise VitdeployError(f"{d}: no model.safetensors or pytorch_model.bin beside config.json")
    ck = _eva_beit_checkpoint(wfile, arch, entry, labels, model_args=model_args, pcfg=pcfg)
    _folder_labels(ck.manifest, cfg_json, pcfg, labels)
    ck.manifest.source = {**ck.manifest.source, "format": "timm-hub", "path": str(d.resolve()), "weights": wfile.name}
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
    source: str | Path, out: str | Path = "ckpt.pth", arch: str | None = None, labels: str | Path | None = None
) -> tuple[Path, Manifest]:
    """Write any checkpoint load_any reads as a self-describing vitdeploy checkpoint; its path and manifest
    (so the caller need not read back what was just written).

    After this, every command takes it without --arch/--labels (verify, infer, benchmark, explain …).
    """
    from vitdeploy.model.checkpoint import save_checkpoint

    with SourceReads("import") as reads:
        ck = load_any(source, arch=arch, labels=labels)
    model = ck.build()
    src = dict(ck.manifest.source)
    src["sha256"] = reads.sha256(source)  # of the bytes converted, not of the file as it is after the work
    manifest = ck.manifest.derive(source=src)
    reads.require_unchanged()
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
