"""timm's architecture, as timm wrote it, onto ViTConfig: model names (--arch) and a folder's ``model_args``.

The one entry point for timm: ``load_timm`` (a state dict with its name) and ``load_timm_folder`` (a ``save_for_hf``
folder), whatever the family. Names resolve through timm_archs.json, which scripts/gen_timm_archs.py generates from
timm's own model registrations (per name its timm family, the kwargs its entry function passes to the model class,
and each pretrained cfg's preprocessing); timm is never imported here. The name's family routes it: Eva and Beit
(timm's eva.py, beit.py) to model/timm_eva.py's mapper over the class's defaults; VisionTransformer (vision_transformer,
deit, hybrids) to ``config_from_timm`` here, for a name's recorded kwargs and a folder's ``model_args`` alike. An
argument the vitdeploy ViT has no equivalent for is refused by name.
"""

from __future__ import annotations

import difflib
import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitdeploy.core.errors import BadField, UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.core.schema import Fields, load_json
from vitdeploy.model.presets import ViTConfig

if TYPE_CHECKING:  # torch behind it: imported where a checkpoint is made
    from vitdeploy.model.checkpoint import Checkpoint

ARCHS_FILE = Path(__file__).with_name("timm_archs.json")
EVA_BEIT = ("eva", "beit")  # the table's families that model/timm_eva.py maps

# timm kwargs that only train (dropout, init, stochastic depth) or that leave a fixed-size eval forward as it is.
_EVAL_NEUTRAL = {
    "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate", "drop_path_rate",
    "weight_init", "fix_init", "dynamic_img_size", "dynamic_img_pad", "out_indices", "pretrained_strict",
}
# timm kwargs with the same name and meaning in ViTConfig
_SAME = (
    "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio", "qkv_bias", "qk_norm",
    "init_values", "class_token", "no_embed_class", "reg_tokens", "pre_norm", "final_norm", "fc_norm",
    "pool_include_prefix",
)
_ACTS = {"gelu": "gelu", "GELU": "gelu", "gelu_tanh": "gelu_tanh", "quick_gelu": "quick_gelu", "QuickGELU": "quick_gelu",
         "silu": "silu", "SiLU": "silu", "swish": "silu"}
# what a timm option the ViT lacks is, in words
_MISSING = {
    "embed_layer": "a patch embedding other than a plain strided conv",
    "embed_norm_layer": "a norm inside the patch embedding (embed_norm_layer)",
    "block_fn": "blocks other than timm's pre-norm Block",
    "attn_layer": "an attention other than timm's Attention",
    "scale_attn_norm": "a norm inside the attention before its projection (scale_attn_norm)",
    "proj_bias": "projections without bias (proj_bias=False)",
    "pos_embed": "no absolute position embedding (pos_embed='none')",
}


def _name(v: Any) -> str | None:
    """A class or partial as the generator wrote it: "SwiGLU", {"name": "LayerNorm", "eps": 1e-5}."""
    if isinstance(v, dict):
        return str(v.get("name"))
    return None if v is None else str(v)


def config_from_timm(model_cls: str, kwargs: dict[str, Any], where: str) -> ViTConfig:
    """The ViTConfig of timm's ``model_cls(**kwargs)``; VitdeployError naming the first argument it cannot have."""
    if model_cls not in ("VisionTransformer", "VisionTransformerDistilled"):
        raise VitdeployError(f"{where}: timm's {model_cls}, which the vitdeploy ViT does not implement")
    out: dict[str, Any] = {"ln_eps": 1e-6, "distilled": model_cls == "VisionTransformerDistilled"}
    for k, v in kwargs.items():
        if k in _EVAL_NEUTRAL:
            continue
        if k in _SAME:
            out[k] = v
        elif k == "img_size":
            out["image_size"] = (v, v) if isinstance(v, int) else tuple(v)
        elif k == "global_pool":
            if v not in ("token", "avg", "map"):
                raise VitdeployError(f"{where}: global_pool {v!r}, which the vitdeploy ViT does not have (token, avg, map)")
            out["global_pool"] = v
        elif k == "act_layer":
            act = _ACTS.get(_name(v) or "gelu")
            if act is None:
                raise VitdeployError(f"{where}: the activation {_name(v)!r}, which the vitdeploy ViT does not have")
            out["act"] = act
        elif k == "norm_layer":
            n = _name(v)
            if n in ("LayerNorm", "layernorm"):
                out["ln_eps"] = float(v.get("eps", 1e-6 if n != "LayerNorm" else 1e-6)) if isinstance(v, dict) else 1e-6
            else:
                raise VitdeployError(f"{where}: the norm layer {n!r}, which the vitdeploy ViT does not have (LayerNorm)")
        elif k == "mlp_layer":
            n = _name(v)
            if n == "Mlp":
                out["mlp"] = "mlp"
            elif n == "SwiGLU":
                out["mlp"] = "swiglu"
            elif n in ("SwiGLUPacked",) or (n == "GluMlp" and isinstance(v, dict) and v.get("gate_last") is False):
                out["mlp"] = "swiglu_packed"
            else:
                raise VitdeployError(f"{where}: the MLP {n!r}, which the vitdeploy ViT does not have (Mlp, SwiGLU, SwiGLUPacked)")
        elif k == "scale_mlp_norm":
            out["mlp_norm"] = bool(v)
        elif k == "embed_layer" and _name(v) == "PatchEmbed":
            continue
        elif k == "block_fn" and _name(v) == "Block":
            continue
        elif k == "attn_layer" and _name(v) in ("", "attn", "Attention"):
            continue
        elif k in ("scale_attn_norm", "embed_norm_layer") and not v:
            continue
        elif k == "proj_bias" and v:
            continue
        elif k == "pos_embed" and v == "learn":
            continue
        elif k == "embed_layer" and _name(v) == "HybridEmbed":
            raise VitdeployError(f"{where}: a timm ViT with a convolutional stem (hybrid), which the vitdeploy ViT does not have")
        elif k in _MISSING:
            raise VitdeployError(f"{where}: {_MISSING[k]} ({k}={_name(v) if isinstance(v, dict) else v!r}), which the vitdeploy ViT does not have")
        else:
            raise VitdeployError(f"{where}: the timm argument {k}={v!r}, which the vitdeploy ViT does not have")
    if out.get("global_pool") == "token" and out.get("class_token") is False:
        out["global_pool"] = "avg"  # not built by timm either; keep the config valid
    try:
        return ViTConfig(**out)
    except ValueError as e:
        raise VitdeployError(f"{where}: {e}") from None


@functools.cache
def _table() -> dict[str, Any]:
    return json.loads(ARCHS_FILE.read_text())


def timm_version() -> str:
    """The timm version timm_archs.json was read from."""
    return str(_table()["timm_version"])


def table_entry(name: str) -> dict[str, Any] | None:
    """The table's row for a timm name (a ``.tag`` ignored): family, class, args, preprocessing; None if unknown."""
    entry: dict[str, Any] | None = _table()["archs"].get(name.strip().partition(".")[0])
    return entry


# A projection maps the tower's width to a joint image-text width of the same order (CLIP-B: 768 → 512, PE-T:
# 192 → 512); a head with more outputs than this many times the width classifies (Bamboo's 115217 classes on a ViT-B).
PROJECTION_MAX_RATIO = 4


def registered_num_classes(name: str, tag: str | None = None) -> int | None:
    """The ``num_classes`` of timm's registered pretrained cfg for ``name`` and ``tag`` (the name's ``.tag``, else
    ``tag``, else the default tag): the width of the head of the weights timm publishes under that name."""
    base, _, name_tag = name.strip().partition(".")
    entry = table_entry(base)
    if entry is None:
        return None
    t = name_tag or tag or entry.get("default_tag")
    n = {**entry.get("preprocess", {}), **entry.get("tags", {}).get(t, {})}.get("num_classes")
    return int(n) if n is not None else None


def projection_head(name: str, tag: str | None, head_out: int, embed_dim: int, labelled: bool) -> bool:
    """Whether a timm model's ``head`` is its image tower's projection (CLIP's visual projection, PE's ``proj``, which
    timm's checkpoint filters load as ``head``: vision_transformer.py ``_convert_openai_clip``, eva.py ``_convert_pe``)
    rather than a classifier.

    timm says it only in its pretrained cfgs: the image-text weights (``.openai``, ``.laion2b``, ``.fb``, …) are
    registered with ``num_classes`` = the joint embedding width, their fine-tuned classifiers with a label set's size
    (1000, 11821: timm/data/imagenet_info.py, recorded in timm_archs.json's ``label_sets``). So a head is the
    projection when its width is the registered ``num_classes`` of the name and tag it was saved under, that width
    is no label set, it is of the order of the model's width (PROJECTION_MAX_RATIO), and no class names come with it
    (``--labels``, a folder's ``label_names``: a classifier fine-tuned to exactly that width is told by its names).
    Never read from the model's name."""
    if labelled or head_out <= 0:
        return False
    n = registered_num_classes(name, tag)
    return (n == head_out and str(n) not in _table().get("label_sets", {})
            and head_out <= PROJECTION_MAX_RATIO * embed_dim)


def as_projection(cfg: ViTConfig, state: dict[str, Any]) -> ViTConfig:
    """``state``'s ``head`` renamed ``proj`` (in place) and the config of the embedding model it then is: no classes,
    ``proj_dim`` the head's width, ``proj_bias`` where the weights have a non-zero bias (timm writes CLIP's bias-free
    projection with a zero bias, which is dropped: exact)."""
    w = state.pop("head.weight")
    b = state.pop("head.bias", None)
    bias = b is not None and bool(b.ne(0).any())
    state["proj.weight"] = w
    if bias:
        state["proj.bias"] = b
    return cfg.with_(num_classes=0, proj_dim=int(w.shape[0]), proj_bias=bias)


def class_args(entry: dict[str, Any]) -> dict[str, Any]:
    """A row's args laid over its class's constructor defaults: every argument timm's class is built with."""
    return {**_table()["class_defaults"].get(entry["class"], {}), **entry["args"]}


@dataclass(frozen=True)
class TimmArch:
    """A timm model name resolved to its architecture and its pretrained cfg's preprocessing."""

    name: str
    tag: str | None
    config: ViTConfig
    preprocess: dict[str, Any]
    model_cls: str
    kwargs: dict[str, Any]


def pp_from_pretrained_cfg(pcfg: dict[str, Any], where: str) -> dict[str, Any]:
    """A timm pretrained cfg (input_size, interpolation, crop_pct, crop_mode, mean, std) as a vitdeploy Preprocess
    dict, read as timm's resolve_data_config reads it (a missing or null field takes timm's default). Eval transform
    (timm/data/transforms_factory.py): center resizes the shorter side to size / crop_pct and center-crops; squash
    resizes both sides to size / crop_pct and center-crops (vitdeploy's squash_crop)."""
    r = Fields(where, pcfg, "pretrained_cfg.", null_is_default=True)
    size = r.raw("input_size", (3, 224, 224))
    if not isinstance(size, (list, tuple)) or len(size) != 3:
        raise r.refuse("input_size", size, "a list of three whole numbers (channels, height, width)")
    if r.as_int("input_size", size[0], lo=1, hi=1024) != 3:
        raise r.refuse("input_size", size, "of 3 channels (vitdeploy reads RGB images)")
    h, w = (r.as_int("input_size", v, idea="image_size") for v in size[1:])
    mode = r.text("crop_mode", "center", choices=("center", "squash"))
    crop_pct = r.number("crop_pct", 0.875, idea="crop_pct")
    mean = r.numbers("mean", (0.485, 0.456, 0.406))
    std = r.numbers("std", (0.229, 0.224, 0.225), above=0.0)
    pp: dict[str, Any] = {
        "input_size": [h, w],
        "resize_mode": "shorter" if mode == "center" else "squash_crop",
        "crop_pct": crop_pct,
        "interpolation": r.text("interpolation", "bicubic"),
        "mean": mean,
        "std": std,
        "channel_order": "RGB",
    }
    try:  # refused here, before anything is written, not when the written checkpoint is first used
        Preprocess.from_dict(pp)
    except ValueError as e:
        raise VitdeployError(f"{where}: pretrained_cfg {e}") from None
    return pp


def check_arch(name: str, named_by: str | None = None) -> dict[str, Any]:
    """The table's row of a timm model name, or one line: UsageError (exit 2) for ``--arch``, with the closest names;
    for a name a file gives (``named_by``: "FILE: architecture"), BadField naming the file and its field.
    Called before any weights are read."""
    base, _, tag = name.strip().partition(".")
    archs = _table()["archs"]
    entry: dict[str, Any] | None = archs.get(base)
    what = f"{named_by} {name!r}" if named_by else f"--arch {name}"
    error = BadField if named_by else UsageError
    fix = f"; fix {named_by.rsplit(': ', 1)[0].rsplit('/', 1)[-1]}" if named_by else ""
    if entry is None:
        close = difflib.get_close_matches(base, list(archs), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `timm.list_models('vit_*')` lists timm's names"
        raise error(f"{what}: not a timm ViT name vitdeploy knows (timm {timm_version()}){hint}{fix}")
    if tag and tag not in entry.get("all_tags", [tag]):
        raise error(f"{what}: timm has no tag {tag!r} for {base}; its tags: {', '.join(entry.get('all_tags', []))}{fix}")
    return entry


def timm_arch(name: str, overrides: dict[str, Any] | None = None, named_by: str | None = None) -> TimmArch:
    """Architecture and eval preprocessing of a timm model name (``vit_base_patch16_224`` or ``...224.augreg_in1k``),
    from the table timm's registrations generated. ``overrides``: timm kwargs over the name's (a folder's model_args).
    ``named_by``: the file and field the name comes from (a folder's "config.json: architecture"), else ``--arch``.

    An unknown name: UsageError (exit 2) with the closest names (BadField where a file named it); a known name whose
    features the ViT lacks: VitdeployError (exit 1) naming the feature.
    """
    base, _, tag = name.strip().partition(".")
    entry = check_arch(name, named_by)
    where = named_by or f"--arch {name}"
    kwargs = {**entry["args"], **(overrides or {})}
    cfg = config_from_timm(entry["class"], kwargs, where)
    pcfg = {**entry.get("preprocess", {}), **entry.get("tags", {}).get(tag or entry.get("default_tag"), {})}
    pp = pp_from_pretrained_cfg(pcfg, where)
    if "img_size" in kwargs or tuple(pp["input_size"]) != cfg.image_size:
        pp["input_size"] = list(cfg.image_size)
    if "img_size" not in kwargs and tuple(pcfg.get("input_size", (3, *cfg.image_size))[1:]) != cfg.image_size:
        try:  # timm builds at the pretrained cfg's size
            cfg = cfg.with_(image_size=tuple(pcfg["input_size"][1:]))
        except ValueError as e:
            raise VitdeployError(f"{where}: {e}") from None
        pp["input_size"] = list(cfg.image_size)
    return TimmArch(base, tag or None, cfg, pp, entry["class"], kwargs)


# --- loading -------------------------------------------------------------------------------------


def _fit_to_weights(cfg: ViTConfig, sd: dict[str, Any], where: str, arch: str, named_by: str | None = None) -> ViTConfig:
    """The name's config with what a timm user may change at create_model without changing the name, read from the
    weights: the class count (``num_classes``), ``global_pool='avg'`` (fc_norm instead of norm) and ``qkv_bias``.
    Widths, depth, patch size or an input size that differ are named, with the --arch that fits where one can."""
    pw = sd["patch_embed.proj.weight"]
    depth = 1 + max((int(k.split(".")[1]) for k in sd if k.startswith("blocks.")), default=-1)
    got = {"embed_dim": int(pw.shape[0]), "depth": depth, "patch_size": int(pw.shape[-1])}
    want = {"embed_dim": cfg.embed_dim, "depth": cfg.depth, "patch_size": cfg.patch_size}
    if got != want:
        diff = ", ".join(f"{k} {got[k]} (not {want[k]})" for k in want if got[k] != want[k])
        fix = f"fix {named_by}" if named_by else "pass the --arch they were trained as"
        raise VitdeployError(f"{where}: the weights are not {arch}: {diff}; {fix}")
    head = sd.get("head.weight")
    changes: dict[str, Any] = {"num_classes": int(head.shape[0]) if head is not None else 0}
    if "fc_norm.weight" in sd and "norm.weight" not in sd and not cfg.use_fc_norm and cfg.global_pool == "token":
        changes.update(global_pool="avg", fc_norm=True)  # timm.create_model(name, global_pool='avg')
    if ("blocks.0.attn.qkv.bias" in sd) != cfg.qkv_bias:
        changes["qkv_bias"] = "blocks.0.attn.qkv.bias" in sd
    cfg = cfg.with_(**changes)
    pe = sd.get("pos_embed")
    if pe is not None and pe.ndim == 3 and int(pe.shape[1]) != cfg.pos_embed_len:
        n = int(pe.shape[1]) - (cfg.pos_embed_len - cfg.grid_size[0] * cfg.grid_size[1])
        side = int(round(max(n, 0) ** 0.5))
        if side * side == n and side > 0:
            size = side * cfg.patch_size
            base = arch.partition(".")[0]
            hint = re.sub(r"_(\d+)$", f"_{size}", base)
            fix = f"pass --arch {hint}" if hint != base and hint in _table()["archs"] else "pass the --arch they were trained as"
            if named_by:
                fix = f"fix {named_by}" + (f" ({hint})" if hint != base and hint in _table()["archs"] else "")
            raise VitdeployError(
                f"{where}: the position embeddings are for {size}x{size} inputs, not {arch}'s "
                f"{cfg.image_size[0]}x{cfg.image_size[1]}; {fix}"
            )
    return cfg


def load_timm(path: str | Path, arch: str, labels: str | Path | None = None, loaded: Any = None,
              overrides: dict[str, Any] | None = None, labelled: bool = False, named_by: str | None = None) -> Checkpoint:
    """A timm ViT state dict (plain, or inside a timm training checkpoint) with its timm model name, any family.
    A head that is the tower's projection (``projection_head``; ``labelled``: class names come with the weights)
    makes an embedding model. ``named_by``: the file and field the name comes from (else it is ``--arch``)."""
    from vitdeploy.model.checkpoint import describe_foreign
    from vitdeploy.model.weights import _check_fits, _float32, read_tensors

    p = Path(path)
    entry = table_entry(arch)
    if entry is not None and entry["family"] in EVA_BEIT:
        return _eva_beit_checkpoint(p, arch, entry, labels, loaded, model_args=overrides, labelled=labelled)
    spec = timm_arch(arch, overrides, named_by)
    sd, key = read_tensors(p, loaded)
    sd = {k: v for k, v in sd.items() if not k.startswith("pre_logits.")}  # unused representation layer of old weights
    if "patch_embed.proj.weight" not in sd:
        raise VitdeployError(f"{p}: not a timm ViT state dict — {describe_foreign(sd)}")
    cfg = _fit_to_weights(spec.config, sd, str(p), arch, named_by)
    state = _float32(sd, str(p))
    if projection_head(arch, None, cfg.num_classes, cfg.embed_dim, labelled or labels is not None):
        cfg = as_projection(cfg, state)
    _check_fits(state, cfg, f"{p} (as {arch})")
    name = spec.name + (f".{spec.tag}" if spec.tag else "")
    return _checkpoint(p, arch, key, cfg, state, dict(spec.preprocess), name, labels, timm_table=timm_version())


def _checkpoint(p: Path, arch: str, key: str | None, cfg: ViTConfig, state: dict[str, Any], pp: dict[str, Any],
                name: str, labels: str | Path | None, **source: Any) -> Checkpoint:
    """The checkpoint of a timm state dict that fits ``cfg``, any family: class names from --labels or numbered."""
    from vitdeploy.model.checkpoint import Checkpoint
    from vitdeploy.model.weights import _manifest, labels_for

    n = cfg.num_classes
    names = labels_for(labels, n) if labels is not None else [f"class_{i}" for i in range(n)]
    src = {"format": "timm", "path": str(p.resolve()), "arch": arch, "state_dict_key": key, **source}
    return Checkpoint(_manifest(cfg, names, pp, name, src), state)


def load_timm_folder(folder: str | Path, cfg_json: dict[str, Any] | None = None, labels: str | Path | None = None) -> Checkpoint:
    """A timm model folder as timm's ``save_for_hf``/``push_to_hub`` writes it (and the Hub serves it).

    config.json holds ``architecture``, ``model_args`` (timm kwargs over the name's: read with the same mapper as the
    name's own), ``pretrained_cfg`` (preprocessing) and optionally ``label_names``; the weights are model.safetensors
    or pytorch_model.bin (timm/models/_hub.py: save_config_for_hf, _parse_model_cfg).
    """
    from vitdeploy.model.sources import HF_CONFIG, TIMM_WEIGHTS, weights_parts

    d = Path(folder)
    cfg_path = d / HF_CONFIG
    if cfg_json is None:
        cfg_json = load_json(cfg_path)
    cf = Fields(cfg_path, cfg_json, null_is_default=True)
    arch = cf.text("architecture")
    if "pretrained_cfg" in cfg_json:
        pr = cf.sub("pretrained_cfg")
        pcfg = dict(pr.obj) if pr is not None else {}
    else:  # timm's legacy single-dict config
        pcfg = {k: v for k, v in cfg_json.items() if k != "architecture"}
    tag = Fields(cfg_path, pcfg, "pretrained_cfg.", null_is_default=True).raw("tag")
    if tag is not None and not isinstance(tag, str):
        raise Fields(cfg_path, pcfg, "pretrained_cfg.").refuse("tag", tag, "a string (timm's pretrained tag)")
    ma = cf.sub("model_args")
    model_args = check_model_args(ma) if ma is not None else {}
    names = label_names(cf, pcfg)
    named_by = f"{cfg_path}: architecture"
    entry = check_arch(arch, named_by)  # before any weights are read
    found = weights_parts(d, TIMM_WEIGHTS)  # checked: a regular file of a bounded size, inside the folder
    weights = d / found[0] if found is not None else None
    if weights is None:
        raise VitdeployError(f"{d}: no model.safetensors or pytorch_model.bin beside config.json")
    if entry["family"] in EVA_BEIT:
        ck = _eva_beit_checkpoint(weights, arch, entry, labels, model_args=model_args, pcfg=pcfg,
                                  labelled=bool(names), pcfg_where=str(cfg_path))
        return _folder_checkpoint(ck, d, cfg_path, names, labels, weights)
    name = f"{arch}.{tag}" if tag and "." not in arch else arch
    ck = load_timm(weights, name, labels, overrides=model_args, labelled=bool(names), named_by=named_by)
    m = ck.manifest
    pp = pp_from_pretrained_cfg({**pcfg, "input_size": pcfg.get("input_size", (3, *m.model["image_size"]))}, str(cfg_path))
    if tuple(pp["input_size"]) != tuple(m.model["image_size"]):
        raise VitdeployError(f"{d}: pretrained_cfg input_size {pp['input_size']} differs from the model's {m.model['image_size']}")
    m.preprocess = pp
    return _folder_checkpoint(ck, d, cfg_path, names, labels, weights)


def _folder_checkpoint(ck: Checkpoint, d: Path, cfg_path: Path, names: list[str] | None, labels: str | Path | None,
                       weights: Path) -> Checkpoint:
    """A folder's checkpoint, any family: its label names and the folder as the source."""
    folder_labels(ck.manifest, cfg_path, names, labels)
    ck.manifest.source = {**ck.manifest.source, "format": "timm-hub", "path": str(d.resolve()), "weights": weights.name}
    return ck


# model_args a timm folder may set, each read by its type and range (core/schema.py); the rest pass on to the mappers,
# which refuse by name what the ViT lacks. VisionTransformer's names and Eva/Beit's alike.
_ARG_INTS = {"in_chans": {"lo": 1, "hi": 1024}, "num_classes": {"idea": "classes"}, "embed_dim": {"idea": "width"},
             "depth": {"idea": "depth"}, "num_heads": {"idea": "heads"}, "reg_tokens": {"lo": 0, "hi": 1024},
             "num_reg_tokens": {"lo": 0, "hi": 1024}, "attn_pool_num_heads": {"idea": "heads"}}
_ARG_FLOATS = {"mlp_ratio": {"above": 0.0, "hi": 64.0}, "attn_pool_mlp_ratio": {"above": 0.0, "hi": 64.0},
               "init_values": {"lo": 0.0, "hi": 1e3}, "rope_temperature": {"idea": "rope_temperature"},
               "rope_grid_offset": {"lo": -1e3, "hi": 1e3}}
_ARG_SIZES = {"img_size": "image_size", "patch_size": "patch_size", "ref_feat_shape": "image_size"}
_ARG_BOOLS = ("qkv_bias", "class_token", "no_embed_class", "pre_norm", "qk_norm", "dynamic_img_size",
              "use_abs_pos_emb", "use_rot_pos_emb", "use_rel_pos_bias", "swiglu_mlp", "scale_mlp", "qkv_fused",
              "rope_rotate_half", "use_pre_transformer_norm")


def check_model_args(ma: Fields) -> dict[str, Any]:
    """A folder's ``model_args``, each field timm would read as a number, size or flag checked (null: timm's default)."""
    for k, kw in _ARG_INTS.items():
        if ma.has(k):
            ma.integer(k, **kw)  # type: ignore[arg-type]
    for k, fkw in _ARG_FLOATS.items():
        if ma.has(k):
            ma.number(k, **fkw)  # type: ignore[arg-type]
    for k, idea in _ARG_SIZES.items():
        if ma.has(k):
            ma.size(k, idea=idea)
    for k in _ARG_BOOLS:
        if ma.has(k):
            ma.flag(k)
    norm = ma.raw("norm_layer")
    if isinstance(norm, dict):
        nf = Fields(ma.where, norm, f"{ma.prefix}norm_layer.", null_is_default=True)
        if nf.has("eps"):
            nf.number("eps", above=0.0, idea="ln_eps")
    return dict(ma.obj)


def label_names(cf: Fields, pcfg: dict[str, Any]) -> list[str] | None:
    """A timm folder's ``label_names`` (top level, or in its pretrained cfg): a list of class names, or an object
    keyed "0" .. "n-1"; None where it has none. A string is refused (it would be read as one name per letter)."""
    src = cf if cf.has("label_names") else Fields(cf.where, pcfg, "pretrained_cfg.", null_is_default=True)
    names = src.raw("label_names")
    if names is None:
        return None
    if isinstance(names, dict):
        try:
            keys = sorted(names, key=int)
        except ValueError:
            raise src.refuse("label_names", names, 'a list of class names, or an object keyed "0", "1", ...') from None
        if [int(k) for k in keys] != list(range(len(keys))):
            raise src.refuse("label_names", names, "one name for each class id from 0, without gaps")
        names = [names[k] for k in keys]
    if not isinstance(names, list):
        raise src.refuse("label_names", names, "a list of class names (one string per class)")
    for i, n in enumerate(names):
        if not isinstance(n, str) or not n.strip() or "\n" in n:
            raise src.refuse(f"label_names[{i}]", n, "a class name (a non-empty string of one line)")
    return list(names)


def folder_labels(m: Manifest, cfg_path: Path, names: list[str] | None, labels: str | Path | None) -> None:
    """A timm folder's label_names, where no --labels file replaces them; they must fit the head."""
    if labels is None and names:
        if len(names) != m.num_classes:
            raise BadField(f"{cfg_path}: label_names has {len(names)} names but the head has {m.num_classes} classes; "
                           f"fix {cfg_path.name} or pass --labels")
        m.labels = list(names)


def _eva_beit_checkpoint(
    p: Path,
    arch: str,
    entry: dict[str, Any],
    labels: str | Path | None,
    loaded: Any = None,
    model_args: dict[str, Any] | None = None,
    pcfg: dict[str, Any] | None = None,
    labelled: bool = False,
    pcfg_where: str | None = None,
) -> Checkpoint:
    """A timm Eva/Beit state dict: its arguments from the generated table under the folder's ``model_args``,
    its names through the one layout filter (model/layouts.py), its preprocessing from the pretrained cfg."""
    from vitdeploy.model.layouts import rename_eva_beit
    from vitdeploy.model.timm_eva import eva_beit_config
    from vitdeploy.model.weights import (
        INDEX_DTYPES,
        WEIGHT_DTYPES,
        _check_fits,
        _float32,
        check_weight_dtypes,
        read_tensors,
    )

    model_args = dict(model_args or {})
    defaults = class_args(entry)
    unknown = sorted(set(model_args) - set(defaults))
    if unknown:
        raise VitdeployError(f"{pcfg_where or p}: model_args {', '.join(unknown)} are not arguments of timm's {entry['class']}")
    args = {**defaults, **model_args}
    cfg = eva_beit_config(entry["class"], args, pcfg_where or arch)  # what vitdeploy cannot hold: said before reading
    sd, key = read_tensors(p, loaded)
    check_weight_dtypes(sd, str(p), WEIGHT_DTYPES + INDEX_DTYPES)  # before q, k, v are concatenated
    state = _float32(rename_eva_beit(sd), str(p))
    pcfg = {**entry.get("preprocess", {}), **(pcfg or {})}
    pp = pp_from_pretrained_cfg({"input_size": (3, *cfg.image_size), **pcfg}, pcfg_where or str(p))
    if (args.get("dynamic_img_size") and not cfg.abs_pos_embed) or "img_size" not in {**entry["args"], **model_args}:
        # timm runs it at whatever size the preprocessing makes, its rotary tables computed for that grid; or, the
        # name passing no img_size, builds it at its pretrained cfg's input size (timm's _update_default_model_kwargs:
        # PE-core-T at 384, where Eva's own default is 224)
        try:
            cfg = cfg.with_(image_size=tuple(pp["input_size"]))
        except ValueError as e:
            raise VitdeployError(f"{p}: {e}") from None
    if tuple(pp["input_size"]) != tuple(cfg.image_size):
        raise VitdeployError(f"{p}: the preprocessing's input size {pp['input_size']} differs from the model's {list(cfg.image_size)}")
    n = int(state["head.weight"].shape[0]) if "head.weight" in state else 0
    cfg = cfg.with_(num_classes=n)
    tag = (pcfg or {}).get("tag")
    if projection_head(arch, tag if isinstance(tag, str) else None, n, cfg.embed_dim, labelled or labels is not None):
        cfg = as_projection(cfg, state)  # the Eva CLIP towers' and PE-core's projection
    _check_fits(state, cfg, str(p))
    return _checkpoint(p, arch, key, cfg, state, pp, arch, labels, timm_class=entry["class"])
