"""ViTs trained elsewhere → vitdeploy checkpoints: Hugging Face ``save_pretrained`` folders and timm state dicts.

This module dispatches; timm sources (a state dict with ``--arch``, a ``save_for_hf`` folder, any family) are read by
model/timm_import.py, Hugging Face folders here with their architecture from model/hf_import.py.

The weights are mapped onto the vitdeploy ViT (which uses timm's parameter names), so
export, precision, engines and attention maps work on them unchanged. The files are
read directly (json, safetensors, ``torch.load(weights_only=True)``): neither
transformers nor timm is needed at run time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from vitdeploy.core.artifact import read_manifest
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.limits import bounds
from vitdeploy.core.loaded import SourceReads
from vitdeploy.core.manifest import ENGINE_SUFFIXES, Manifest
from vitdeploy.core.schema import Fields, load_json
from vitdeploy.model.checkpoint import (
    CKPT_KEY,
    Checkpoint,
    _from_object,
    describe_foreign,
)
from vitdeploy.model.sources import (  # noqa: F401  (HF_WEIGHTS re-exported)
    HF_CONFIG,
    HF_PREPROCESSOR,
    HF_PROCESSOR,
    HF_WEIGHTS,
    OPEN_CLIP_CONFIG,
    check_source,
    folder_parts,
    is_hf_folder,
    is_open_clip_folder,
    weights_parts,
)
from vitdeploy.model.timm_import import load_timm, load_timm_folder
from vitdeploy.model.vit import ViTConfig
from vitdeploy.model.weights import (  # noqa: F401  (re-exported: callers import them from here)
    INDEX_DTYPES,
    WEIGHT_DTYPES,
    _check_fits,
    _check_label_count,
    _float32,
    _manifest,
    _safetensors_load,
    check_weight_dtypes,
    labels_for,
    read_labels,
    read_tensors,
    torch_load,
)

if TYPE_CHECKING:
    from vitdeploy.model.zero_shot import ZeroShotRequest


# PIL's resample integers, as transformers stores them in preprocessor_config.json.
PIL_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}

# transformers' ViTImageProcessor defaults (IMAGENET_STANDARD_MEAN/STD), used when a folder has no processor config.
HF_STANDARD_MEAN = (0.5, 0.5, 0.5)
HF_STANDARD_STD = (0.5, 0.5, 0.5)

# --- Hugging Face --------------------------------------------------------------------------------


def _hf_state_dict(folder: Path) -> tuple[dict[str, torch.Tensor], str]:
    found = weights_parts(folder, HF_WEIGHTS)  # the weights, or an index and its shards, checked (model/sources.py)
    if found is not None:
        name, files = found
        sd: dict[str, torch.Tensor] = {}
        for s in files if len(files) == 1 else files[1:]:  # an index: its shards
            part = folder / s
            sd.update(_safetensors_load(part) if s.endswith(".safetensors") else read_tensors(part)[0])
        return sd, name
    others = sorted(x.name for x in folder.iterdir() if x.suffix in (".h5", ".msgpack", ".ckpt"))
    hint = f" (it has {', '.join(others)}: TensorFlow/Flax weights; re-save them with PyTorch)" if others else ""
    raise VitdeployError(f"{folder}: no model.safetensors or pytorch_model.bin beside config.json{hint}")


def _hf_preprocess(folder: Path, image_size: tuple[int, int]) -> dict[str, Any]:
    """The image processor's config as a vitdeploy Preprocess dict (ViTImageProcessor: squash-resize).

    Read from preprocessor_config.json, or, where a processor of several parts was saved (transformers 5's
    ``CLIPProcessor.save_pretrained`` writes no preprocessor_config.json), from processor_config.json's
    ``image_processor``."""
    f = folder / HF_PREPROCESSOR
    pc: dict[str, Any] = {}
    if not f.is_file() and (folder / HF_PROCESSOR).is_file():
        f = folder / HF_PROCESSOR
    prefix = ""
    if f.is_file():
        pc = load_json(f)
        if f.name == HF_PROCESSOR:
            part = pc.get("image_processor") if isinstance(pc, dict) else None
            if not isinstance(part, dict):
                raise VitdeployError(f"{f}: no image_processor entry (the image processor's settings)")
            pc, prefix = part, "image_processor."
    r = Fields(f, pc, prefix)
    h, w = image_size
    size = r.raw("size", {"height": h, "width": w})
    if isinstance(size, int) and not isinstance(size, bool):
        size = {"height": size, "width": size}
    sz = Fields(f, size, f"{prefix}size.")
    resample = r.raw("resample", 2)
    # an int (PIL's enum value) as transformers writes it; tolerate a name such as "PILImageResampling.BICUBIC"
    interp = (PIL_RESAMPLE.get(resample) if isinstance(resample, int) and not isinstance(resample, bool)
              else str(resample).rsplit(".", 1)[-1].lower() if isinstance(resample, str) else None)
    if interp not in PIL_RESAMPLE.values():
        raise r.refuse("resample", resample, f"one of PIL's filters ({', '.join(f'{k} {v}' for k, v in PIL_RESAMPLE.items())})")
    crop = r.raw("crop_size") if r.flag("do_center_crop", False) else None
    if isinstance(crop, int) and not isinstance(crop, bool):
        crop = {"height": crop, "width": crop}
    cr = Fields(f, crop, f"{prefix}crop_size.") if crop is not None else None
    if sz.has("height") and sz.has("width") and cr is None:
        mode, crop_pct, out = "squash", 1.0, (sz.integer("height", idea="image_size"), sz.integer("width", idea="image_size"))
    elif sz.has("height") and sz.has("width") and cr is not None and cr.has("height") and cr.has("width"):
        # DeiT/BEiT: squash to size, then center-crop crop_size; one crop_pct must give both sides
        sh, sw = sz.integer("height", idea="image_size"), sz.integer("width", idea="image_size")
        ch, cw = cr.integer("height", idea="image_size"), cr.integer("width", idea="image_size")
        crop_pct = ch / sh
        if int(ch / crop_pct) != sh:
            crop_pct = ch / (sh + 1e-6)
        if (int(cw / crop_pct), int(ch / crop_pct)) != (sw, sh) or ch > sh or cw > sw:
            raise VitdeployError(f"{f}: resize {size} then crop {crop}: the crop is not one fraction of both sides")
        mode, out = "squash_crop", (ch, cw)
    elif sz.has("shortest_edge") and cr is not None and cr.raw("height") == cr.raw("width"):
        # resize the shorter side, then center-crop: timm's eval transform with crop_pct = crop / shorter side
        short, c = sz.integer("shortest_edge", idea="image_size"), cr.integer("height", idea="image_size")
        mode, crop_pct, out = "shorter", c / short, (c, c)
        if int(c / crop_pct) != short:  # guard against float rounding in floor(c / crop_pct)
            crop_pct = c / (short + 1e-6)
    else:
        raise VitdeployError(
            f"{f}: resize {size} with center crop {crop} has no vitdeploy equivalent "
            "(supported: size {height, width}; or shortest_edge with a square crop_size)"
        )
    b = bounds("crop_pct")
    if not b["min"] <= crop_pct <= b["max"]:
        raise r.refuse("crop_size", crop, f"from {b['min']} to {b['max']} times the resize ({crop_pct:.3g} here: "
                       "the eval resize is input / crop_pct)")
    do_norm = r.flag("do_normalize", True)
    mean = r.numbers("image_mean", HF_STANDARD_MEAN, lengths=(1, 3)) if do_norm else [0.0, 0.0, 0.0]
    std = r.numbers("image_std", HF_STANDARD_STD, lengths=(1, 3), above=0.0) if do_norm else [1.0, 1.0, 1.0]
    rescale = r.number("rescale_factor", 1 / 255, idea="rescale") if r.flag("do_rescale", True) else 1.0
    return {
        "input_size": [out[0], out[1]],
        "resize_mode": mode,
        "crop_pct": crop_pct,
        "interpolation": interp,
        "mean": mean * 3 if len(mean) == 1 else mean,
        "std": std * 3 if len(std) == 1 else std,
        "channel_order": "RGB",
        "rescale": rescale,
        **({"crop_offset": "floor"} if mode != "squash" else {}),  # transformers' center_crop: (size - crop) // 2
    }


def hf_labels(cfg_json: dict[str, Any], config_path: Path, n_cls: int, notes: list[str] | None = None) -> list[str]:
    """config.json's ``id2label`` as the head's class names: an object whose keys are exactly "0" .. "n-1" and whose
    values are strings, one per class (a backbone's head of 0 classes keeps transformers' default names unread).
    A name repeated under two ids (ImageNet's "crane" is a bird and a machine) gets its id appended on the later
    ones, so each class keeps a name of its own, and ``notes`` gets one line saying so (the import prints it: a
    conversion is said, never silent). No id2label: transformers' own default names, LABEL_i."""
    cf = Fields(config_path, cfg_json, null_is_default=True)
    raw = cf.raw("id2label")
    if not raw or n_cls == 0:
        return [f"LABEL_{i}" for i in range(n_cls)]
    if not isinstance(raw, dict):
        raise cf.refuse("id2label", raw, 'an object {"0": "name", "1": "name", ...}')
    keys: list[int] = []
    for k in raw:
        try:
            keys.append(int(k))
        except ValueError:
            raise cf.refuse("id2label", {k: raw[k]}, 'keyed by class ids "0", "1", ...') from None
    if sorted(keys) != list(range(n_cls)):
        missing = sorted(set(range(n_cls)) - set(keys))
        why = f"no id {missing[0]}" if missing else f"{len(keys)} ids"
        raise cf.refuse("id2label", raw, f"one name for each of the head's {n_cls} classes, ids 0 to {n_cls - 1} ({why})")
    by_id = dict(zip(keys, raw.values(), strict=True))
    names: list[str] = []
    for i in range(n_cls):
        v = by_id[i]
        if not isinstance(v, str) or not v.strip() or "\n" in v:
            raise cf.refuse(f"id2label.{i}", v, "a class name (a non-empty string of one line)")
        if v in names:
            first = names.index(v)
            names.append(f"{v} ({i})")
            if notes is not None:
                notes.append(f"{config_path}: id2label names {v!r} under ids {first} and {i}: class {i} is named "
                             f"{names[-1]!r}")
        else:
            names.append(v)
    return names


def load_hf_folder(folder: str | Path, labels: str | Path | None = None) -> Checkpoint:
    """A ``save_pretrained`` folder of ViTForImageClassification (or ViTModel) as a vitdeploy Checkpoint."""
    d = Path(folder)
    cfg_json = load_json(d / HF_CONFIG)
    Fields(d / HF_CONFIG, cfg_json)  # an object, or one line saying what it is instead
    mtype = cfg_json.get("model_type")
    if mtype is None and isinstance(cfg_json.get("architecture"), str):
        return load_timm_folder(d, cfg_json, labels)
    from vitdeploy.model.hf_import import hf_architecture, hf_vision_config, interpolate_like_transformers

    sd, weights_name = _hf_state_dict(d)
    check_weight_dtypes(sd, str(d / weights_name), WEIGHT_DTYPES + INDEX_DTYPES)
    fields, state = hf_architecture(cfg_json, sd, str(d))
    state = _float32(state, str(d / weights_name))
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
    notes: list[str] = []
    names = labels_for(labels, n_cls) if labels is not None else hf_labels(cfg_json, d / HF_CONFIG, n_cls, notes)
    source = {"format": "huggingface", "path": str(d.resolve()), "weights": weights_name,
              "architectures": cfg_json.get("architectures"), **({"notes": notes} if notes else {})}
    return Checkpoint(_manifest(cfg, names, pp, d.resolve().name, source), state)


# --- conversion to a vitdeploy checkpoint ------------------------------------------------------------


def import_checkpoint(
    source: str | Path,
    out: str | Path = "ckpt.pth",
    arch: str | None = None,
    labels: str | Path | None = None,
    image_size: tuple[int, int] | None = None,
    zero_shot: ZeroShotRequest | None = None,
    progress: Callable[..., None] | None = None,
) -> tuple[Path, Manifest]:
    """Write any checkpoint load_any reads as a self-describing vitdeploy checkpoint; its path and manifest
    (so the caller need not read back what was just written).

    ``image_size`` (H, W): deploy at that input size; absolute position embeddings are resampled as timm does
    (model/pos_embed.py), RoPE tables recomputed, the preprocessing's input size follows.

    ``zero_shot`` (class names, templates): ``source`` is an image–text pair and the checkpoint a zero-shot
    classifier of those classes (model/zero_shot.py); ``progress(done, total, phase)`` follows its text tower.

    After this, every command takes it without --arch/--labels (verify, infer, benchmark, explain …).
    """
    from vitdeploy.model.checkpoint import save_checkpoint

    if image_size is not None:  # before any weights are read (a library caller skips the CLI's parse)
        from vitdeploy.core.image_size import check_image_size

        check_image_size(tuple(image_size), "image_size")
    if labels is not None and zero_shot is None:  # (with zero_shot, --labels is refused below)
        read_labels(labels)  # a FIFO, a device or an unreadable file: refused before any weights are read
    if image_size is not None and zero_shot is None:
        from vitdeploy.model.pos_embed import check_resize

        planned = planned_model(source, arch)  # from the names and configs alone: refused before any weights
        if planned is not None:
            check_resize(planned, image_size, str(source))
    with SourceReads("import") as reads:
        if zero_shot is not None:
            from vitdeploy.model.zero_shot import plan_zero_shot, zero_shot_classifier

            if arch or labels is not None:
                raise UsageError("--classes names the classes of a zero-shot classifier of an image-text pair: drop "
                                 f"{'--arch' if arch else '--labels'}")
            plan = plan_zero_shot(source, zero_shot)  # the class names, templates and folder: before any weights
            ck = zero_shot_classifier(load_any(plan.folder), plan, progress)
        else:
            ck = load_any(source, arch=arch, labels=labels)
        if image_size is not None:
            from vitdeploy.model.pos_embed import resize_checkpoint

            ck, _ = resize_checkpoint(ck, image_size, str(source))
    model = ck.build()
    src = dict(ck.manifest.source)
    folder = Path(source).parent if Path(source).name in (HF_CONFIG, OPEN_CLIP_CONFIG) else Path(source)
    files = None
    if folder.is_dir():  # only the files the model is made of (not a 60 GB file beside it): recorded for lineage
        files = folder_parts(folder)
        src["files"] = files
    src["sha256"] = reads.sha256(folder, files)  # of the bytes converted, not of the file as it is after the work
    manifest = ck.manifest.derive(source=src)
    reads.require_unchanged()
    return save_checkpoint(out, model, manifest), manifest


def planned_model(source: str | Path, arch: str | None) -> dict[str, Any] | None:
    """What ``check_resize`` needs of the model ``load_any`` would read (patch size, and for a timm name its input size
    and position encoding), from ``--arch`` or the folder's config alone, so an ``--image-size`` it refuses is refused
    before the weights are read; None where the config does not say (the check then runs after loading)."""
    from vitdeploy.model.timm_import import EVA_BEIT, check_arch, class_args, timm_arch

    p = check_source(source, arch)
    if arch:
        entry = check_arch(arch)
        if entry["family"] in EVA_BEIT:
            from vitdeploy.model.timm_eva import eva_beit_config

            return eva_beit_config(entry["class"], class_args(entry), f"--arch {arch}").to_dict()
        return timm_arch(arch).config.to_dict()
    if not is_hf_folder(p) or is_open_clip_folder(p):
        return None
    cfg_json = load_json(p / HF_CONFIG)
    cf = Fields(p / HF_CONFIG, cfg_json, null_is_default=True)
    if cfg_json.get("model_type") is None and isinstance(cfg_json.get("architecture"), str):  # a timm folder
        ma = cf.sub("model_args")
        if ma is not None and ma.has("patch_size"):
            return {"patch_size": ma.size("patch_size", idea="patch_size")[0]}
        entry = check_arch(cf.text("architecture"), f"{p / HF_CONFIG}: architecture")
        ps = class_args(entry).get("patch_size", 16)
        return {"patch_size": ps[0] if isinstance(ps, (list, tuple)) else ps}
    from vitdeploy.model.hf_import import hf_vision_fields

    vc = hf_vision_fields(cfg_json, str(p / HF_CONFIG))
    return {"patch_size": vc.size("patch_size", 16, idea="patch_size")[0]} if vc.has("patch_size") else None


def load_any(path: str | Path, arch: str | None = None, labels: str | Path | None = None) -> Checkpoint:
    """A checkpoint from any source vitdeploy reads.

    A vitdeploy checkpoint; a Hugging Face ``save_pretrained`` folder of a ViT (or its
    config.json); or, with ``arch`` (a timm model name such as ``vit_base_patch16_224``),
    a timm ViT state dict in a .pth/.bin/.safetensors file or a timm training checkpoint.
    ``labels`` names a file of class names, one per line, replacing the source's.
    """
    p = check_source(path, arch)  # what needs no torch (model/sources.py): a plain folder, a missing or non-zip file …
    if arch:
        from vitdeploy.model.timm_import import check_arch

        check_arch(arch)  # an unknown --arch: exit 2 before the weights are read
    if is_open_clip_folder(p):  # an image-text pair's image tower, as an embedding model (--classes: model/zero_shot.py)
        from vitdeploy.model.open_clip_import import load_open_clip_folder

        if labels is not None:
            raise UsageError(f"--labels {labels}: {p} is an open_clip embedding model without classes; "
                             "make a classifier from class names with `vitdeploy import --classes FILE`")
        return load_open_clip_folder(p)
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
