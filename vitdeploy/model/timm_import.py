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
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import Preprocess
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
    _, h, w = (int(v) for v in pcfg.get("input_size") or (3, 224, 224))
    mode = pcfg.get("crop_mode") or "center"
    if mode not in ("center", "squash"):
        raise VitdeployError(f"{where}: crop_mode {mode!r} has no vitdeploy equivalent (center or squash)")
    crop_pct = float(pcfg.get("crop_pct") or 0.875)
    mean = [float(v) for v in pcfg.get("mean") or (0.485, 0.456, 0.406)]
    std = [float(v) for v in pcfg.get("std") or (0.229, 0.224, 0.225)]
    if not (crop_pct > 0 and all(math.isfinite(v) for v in mean + std) and min(std) > 0):
        raise VitdeployError(f"{where}: pretrained_cfg crop_pct {crop_pct}, mean {mean}, std {std}: crop_pct and every "
                             "std must be above 0, every number finite; fix the config")
    pp: dict[str, Any] = {
        "input_size": [h, w],
        "resize_mode": "shorter" if mode == "center" else "squash_crop",
        "crop_pct": crop_pct,
        "interpolation": str(pcfg.get("interpolation") or "bicubic"),
        "mean": mean,
        "std": std,
        "channel_order": "RGB",
    }
    try:  # refused here, before anything is written, not when the written checkpoint is first used
        Preprocess.from_dict(pp)
    except ValueError as e:
        raise VitdeployError(f"{where}: pretrained_cfg {e}") from None
    return pp


def timm_arch(name: str, overrides: dict[str, Any] | None = None) -> TimmArch:
    """Architecture and eval preprocessing of a timm model name (``vit_base_patch16_224`` or ``...224.augreg_in1k``),
    from the table timm's registrations generated. ``overrides``: timm kwargs over the name's (a folder's model_args).

    An unknown name: UsageError (exit 2) with the closest names; a known name whose features the ViT lacks:
    VitdeployError (exit 1) naming the feature.
    """
    base, _, tag = name.strip().partition(".")
    archs = _table()["archs"]
    entry = archs.get(base)
    if entry is None:
        close = difflib.get_close_matches(base, list(archs), n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else "; `timm.list_models('vit_*')` lists timm's names"
        raise UsageError(f"--arch {name}: not a timm ViT name vitdeploy knows (timm {timm_version()}){hint}")
    if tag and tag not in entry.get("all_tags", [tag]):
        raise UsageError(f"--arch {name}: timm has no tag {tag!r} for {base}; its tags: {', '.join(entry.get('all_tags', []))}")
    kwargs = {**entry["args"], **(overrides or {})}
    cfg = config_from_timm(entry["class"], kwargs, f"--arch {name}")
    pcfg = {**entry.get("preprocess", {}), **entry.get("tags", {}).get(tag or entry.get("default_tag"), {})}
    pp = pp_from_pretrained_cfg(pcfg, f"--arch {name}")
    if "img_size" in kwargs or tuple(pp["input_size"]) != cfg.image_size:
        pp["input_size"] = list(cfg.image_size)
    if "img_size" not in kwargs and tuple(pcfg.get("input_size", (3, *cfg.image_size))[1:]) != cfg.image_size:
        try:  # timm builds at the pretrained cfg's size
            cfg = cfg.with_(image_size=tuple(pcfg["input_size"][1:]))
        except ValueError as e:
            raise VitdeployError(f"--arch {name}: {e}") from None
        pp["input_size"] = list(cfg.image_size)
    return TimmArch(base, tag or None, cfg, pp, entry["class"], kwargs)


# --- loading -------------------------------------------------------------------------------------


def _fit_to_weights(cfg: ViTConfig, sd: dict[str, Any], where: str, arch: str) -> ViTConfig:
    """The name's config with what a timm user may change at create_model without changing the name, read from the
    weights: the class count (``num_classes``), ``global_pool='avg'`` (fc_norm instead of norm) and ``qkv_bias``.
    Widths, depth, patch size or an input size that differ are named, with the --arch that fits where one can."""
    pw = sd["patch_embed.proj.weight"]
    depth = 1 + max((int(k.split(".")[1]) for k in sd if k.startswith("blocks.")), default=-1)
    got = {"embed_dim": int(pw.shape[0]), "depth": depth, "patch_size": int(pw.shape[-1])}
    want = {"embed_dim": cfg.embed_dim, "depth": cfg.depth, "patch_size": cfg.patch_size}
    if got != want:
        diff = ", ".join(f"{k} {got[k]} (not {want[k]})" for k in want if got[k] != want[k])
        raise VitdeployError(f"{where}: the weights are not {arch}: {diff}; pass the --arch they were trained as")
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
            raise VitdeployError(
                f"{where}: the position embeddings are for {size}x{size} inputs, not {arch}'s "
                f"{cfg.image_size[0]}x{cfg.image_size[1]}; {fix}"
            )
    return cfg


def load_timm(path: str | Path, arch: str, labels: str | Path | None = None, loaded: Any = None,
              overrides: dict[str, Any] | None = None, labelled: bool = False) -> Checkpoint:
    """A timm ViT state dict (plain, or inside a timm training checkpoint) with its timm model name, any family.
    A head that is the tower's projection (``projection_head``; ``labelled``: class names come with the weights)
    makes an embedding model."""
    from vitdeploy.model.checkpoint import describe_foreign
    from vitdeploy.model.weights import _check_fits, _float32, read_tensors

    p = Path(path)
    entry = table_entry(arch)
    if entry is not None and entry["family"] in EVA_BEIT:
        return _eva_beit_checkpoint(p, arch, entry, labels, loaded, model_args=overrides, labelled=labelled)
    spec = timm_arch(arch, overrides)
    sd, key = read_tensors(p, loaded)
    sd = {k: v for k, v in sd.items() if not k.startswith("pre_logits.")}  # unused representation layer of old weights
    if "patch_embed.proj.weight" not in sd:
        raise VitdeployError(f"{p}: not a timm ViT state dict — {describe_foreign(sd)}")
    cfg = _fit_to_weights(spec.config, sd, str(p), arch)
    state = _float32(sd)
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
    if cfg_json is None:
        cfg_json = json.loads((d / HF_CONFIG).read_text())
    arch = str(cfg_json["architecture"])
    pcfg = dict(cfg_json.get("pretrained_cfg") or {})
    if "pretrained_cfg" not in cfg_json:  # timm's legacy single-dict config
        pcfg = {k: v for k, v in cfg_json.items() if k != "architecture"}
    tag = pcfg.get("tag")
    model_args = dict(cfg_json.get("model_args") or {})
    found = weights_parts(d, TIMM_WEIGHTS)  # checked: a regular file of a bounded size, inside the folder
    weights = d / found[0] if found is not None else None
    if weights is None:
        raise VitdeployError(f"{d}: no model.safetensors or pytorch_model.bin beside config.json")
    entry = table_entry(arch)
    if entry is not None and entry["family"] in EVA_BEIT:
        ck = _eva_beit_checkpoint(weights, arch, entry, labels, model_args=model_args, pcfg=pcfg,
                                  labelled=_has_label_names(cfg_json, pcfg))
        return _folder_checkpoint(ck, d, cfg_json, pcfg, labels, weights)
    name = f"{arch}.{tag}" if tag and "." not in arch else arch
    try:
        ck = load_timm(weights, name, labels, overrides=model_args, labelled=_has_label_names(cfg_json, pcfg))
    except UsageError as e:  # an unknown name in a folder is the folder's problem, not an option's
        raise VitdeployError(f"{d / HF_CONFIG}: {e}") from None
    m = ck.manifest
    pp = pp_from_pretrained_cfg({**pcfg, "input_size": pcfg.get("input_size", (3, *m.model["image_size"]))}, str(d / HF_CONFIG))
    if tuple(pp["input_size"]) != tuple(m.model["image_size"]):
        raise VitdeployError(f"{d}: pretrained_cfg input_size {pp['input_size']} differs from the model's {m.model['image_size']}")
    m.preprocess = pp
    return _folder_checkpoint(ck, d, cfg_json, pcfg, labels, weights)


def _folder_checkpoint(ck: Checkpoint, d: Path, cfg_json: dict[str, Any], pcfg: dict[str, Any], labels: str | Path | None,
                       weights: Path) -> Checkpoint:
    """A folder's checkpoint, any family: its label names and the folder as the source."""
    folder_labels(ck.manifest, cfg_json, pcfg, labels)
    ck.manifest.source = {**ck.manifest.source, "format": "timm-hub", "path": str(d.resolve()), "weights": weights.name}
    return ck


def _has_label_names(cfg_json: dict[str, Any], pcfg: dict[str, Any]) -> bool:
    """Whether a timm folder names its classes (``label_names``, as save_for_hf writes them)."""
    return bool(cfg_json.get("label_names", pcfg.get("label_names")))


def folder_labels(m: Manifest, cfg_json: dict[str, Any], pcfg: dict[str, Any], labels: str | Path | None) -> None:
    """A timm folder's label_names, where no --labels file replaces them and they fit the head."""
    names = cfg_json.get("label_names", pcfg.get("label_names"))
    if labels is None and names:
        if isinstance(names, dict):
            names = [names[k] for k in sorted(names, key=int)]
        if len(names) == m.num_classes:
            m.labels = [str(n) for n in names]


def _eva_beit_checkpoint(
    p: Path,
    arch: str,
    entry: dict[str, Any],
    labels: str | Path | None,
    loaded: Any = None,
    model_args: dict[str, Any] | None = None,
    pcfg: dict[str, Any] | None = None,
    labelled: bool = False,
) -> Checkpoint:
    """A timm Eva/Beit state dict: its arguments from the generated table under the folder's ``model_args``,
    its names through the one layout filter (model/layouts.py), its preprocessing from the pretrained cfg."""
    from vitdeploy.model.layouts import rename_eva_beit
    from vitdeploy.model.timm_eva import eva_beit_config
    from vitdeploy.model.weights import _check_fits, _float32, read_tensors

    model_args = dict(model_args or {})
    defaults = class_args(entry)
    unknown = sorted(set(model_args) - set(defaults))
    if unknown:
        raise VitdeployError(f"{p}: model_args {', '.join(unknown)} are not arguments of timm's {entry['class']}")
    args = {**defaults, **model_args}
    cfg = eva_beit_config(entry["class"], args, arch)  # an architecture vitdeploy cannot hold: said before reading
    sd, key = read_tensors(p, loaded)
    state = _float32(rename_eva_beit(sd))
    pcfg = {**entry.get("preprocess", {}), **(pcfg or {})}
    pp = pp_from_pretrained_cfg({"input_size": (3, *cfg.image_size), **pcfg}, str(p))
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
