"""Generate vitdeploy/model/timm_archs.json: every timm model name of the ViT families -> what timm builds for it.

Read from timm's own registrations, not typed by hand: each family's module has its ``build_model_with_cfg``
replaced by a recorder, every registered name's entry function is called (nothing is built), and the recorder keeps
the model class and the keyword arguments the entry function passed. One table for every family (timm's
vision_transformer, deit, eva, beit, and the hybrids, recorded so they are refused by name); the timm version it was
read from is written once at its top. Per name: its family (the timm module), its class, its arguments (classes and
partials written by name, a norm with its ``eps``) and its pretrained cfgs' preprocessing (per tag where tags
differ); per class, the constructor's own defaults, which the Eva/Beit mapper lays the arguments over.
vitdeploy/model/timm_import.py routes a name or a ``save_for_hf`` folder by its family: timm_import's mapper for
VisionTransformer, model/timm_eva.py's for Eva and Beit; an argument the vitdeploy ViT lacks is refused there, by
name. The product reads only the JSON; timm is needed here alone.

    PYTHONPATH=$PWD .venv/bin/python scripts/gen_timm_archs.py    # rewrites vitdeploy/model/timm_archs.json

A family is one entry of FAMILIES: the timm module whose entry functions call build_model_with_cfg. The output is
the same bytes for the same timm (sorted keys, one line per name).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import os
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "vitdeploy" / "model" / "timm_archs.json"

# family -> timm module
FAMILIES: dict[str, str] = {
    "vision_transformer": "timm.models.vision_transformer",
    "deit": "timm.models.deit",
    "eva": "timm.models.eva",
    "beit": "timm.models.beit",
    "vision_transformer_hybrid": "timm.models.vision_transformer_hybrid",  # recorded so they are refused by name
}

# build_model_with_cfg's own parameters: how to build, not what (timm/models/_builder.py)
BUILDER_ARGS = {
    "pretrained_cfg", "pretrained_cfg_overlay", "model_cfg", "feature_cfg", "pretrained_strict",
    "pretrained_filter_fn", "cache_dir", "kwargs_filter",
}
# Training-only or runtime-only constructor arguments, which do not change the eval forward at a fixed size; left out
# of the class defaults (a folder's model_args naming one is refused by the Eva/Beit path as not an argument).
RUNTIME_ARGS = {
    "device", "dtype", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
    "drop_path_rate", "head_init_scale", "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords", "out_indices",
}
# the preprocessing keys of a pretrained cfg (timm/models/_pretrained.py PretrainedCfg)
PP_KEYS = ("input_size", "mean", "std", "crop_pct", "crop_mode", "interpolation", "num_classes")


class _Recorded(Exception):
    def __init__(self, model_cls: type, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model_cls, self.kwargs = model_cls, kwargs


def _record(model_cls: type, variant: str, pretrained: bool = False, **kwargs: Any) -> Any:
    raise _Recorded(model_cls, {k: v for k, v in kwargs.items() if k not in BUILDER_ARGS | RUNTIME_ARGS})


def _defaults(fn: Any) -> dict[str, Any]:
    """A callable's parameters that have defaults (none where its signature cannot be read)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return {}
    return {k: p.default for k, p in params.items() if k != "self" and p.default is not inspect.Parameter.empty}


def _class_defaults(cls: type) -> dict[str, Any]:
    """The constructor's defaults; a subclass that passes ``*args, **kwargs`` on (VisionTransformerDistilled) has
    its base's."""
    for c in cls.__mro__:
        d = _defaults(c.__init__)
        if d:
            return d
    return {}


def jsonable(v: Any) -> Any:
    """A timm argument as JSON: a class or function by name, a partial as {"name", **keywords}; a norm (a callable
    with an ``eps`` default) as {"name", "eps", ...}, so torch's LayerNorm (1e-5) and timm's (1e-6) stay apart."""
    if isinstance(v, functools.partial):
        base = jsonable(v.func)
        return {**(base if isinstance(base, dict) else {"name": base}), **{k: jsonable(x) for k, x in v.keywords.items()}}
    if isinstance(v, type) or (callable(v) and hasattr(v, "__name__")):
        eps = _defaults(v).get("eps")
        return {"name": v.__name__, "eps": eps} if isinstance(eps, float) else v.__name__
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return type(v).__name__  # an object (a hybrid's backbone module): its class names what it is


def preprocess(cfg: Any) -> dict[str, Any]:
    d = cfg.to_dict() if hasattr(cfg, "to_dict") else dict(cfg)
    return {k: jsonable(d[k]) for k in PP_KEYS if k in d and d[k] is not None}


def pretrained_cfgs(name: str) -> dict[str, Any]:
    """The default tag's preprocessing, and each other tag's keys that differ from it."""
    from timm.models._registry import _model_default_cfgs  # timm's registry of tags

    dc = _model_default_cfgs.get(name)
    if dc is None or not dc.tags:
        return {}
    all_tags = list(dc.tags)
    default_tag = all_tags[0]
    base = preprocess(dc.cfgs[default_tag])
    tags = {}
    for tag in all_tags[1:]:
        pp = preprocess(dc.cfgs[tag])
        diff = {k: v for k, v in pp.items() if base.get(k) != v}
        tags[tag] = diff
    return {"default_tag": default_tag, "preprocess": base, "tags": {t: d for t, d in tags.items() if d}, "all_tags": all_tags}


def family_entries(family: str) -> tuple[dict[str, Any], dict[str, type]]:
    """{name: entry} for every name timm registers in the family's module, and the classes they build."""
    import timm
    import timm.models as tm

    mod = importlib.import_module(FAMILIES[family])
    archs: dict[str, Any] = {}
    classes: dict[str, type] = {}
    saved = mod.build_model_with_cfg
    mod.build_model_with_cfg = _record
    try:
        for name in timm.list_models(module=family):
            try:
                tm.model_entrypoint(name)(pretrained=False)
            except _Recorded as r:
                classes[r.model_cls.__name__] = r.model_cls
                archs[name] = {
                    "family": family,
                    "class": r.model_cls.__name__,
                    "args": {k: jsonable(v) for k, v in r.kwargs.items()},
                    **pretrained_cfgs(name),
                }
                continue
            except Exception as e:  # an entry point that cannot even be called without weights
                print(f"{name}: skipped ({type(e).__name__}: {e})", file=sys.stderr)
                continue
            print(f"{name}: its entry function did not call build_model_with_cfg; skipped", file=sys.stderr)
    finally:
        mod.build_model_with_cfg = saved
    return archs, classes


def table() -> dict[str, Any]:
    """The whole table, as the installed timm registers it."""
    import timm

    naflex = os.environ.pop("TIMM_USE_NAFLEX", None)  # eva.py would build its names as NaFlexVit instead
    try:
        archs: dict[str, Any] = {}
        classes: dict[str, type] = {}
        for family in FAMILIES:
            a, c = family_entries(family)
            archs.update(a)
            classes.update(c)
    finally:
        if naflex is not None:
            os.environ["TIMM_USE_NAFLEX"] = naflex
    defaults = {n: {k: jsonable(v) for k, v in _class_defaults(cls).items() if k not in RUNTIME_ARGS}
                for n, cls in classes.items()}
    return {"timm_version": timm.__version__, "generated_by": "scripts/gen_timm_archs.py", "families": FAMILIES,
            "label_sets": label_sets(), "class_defaults": defaults, "archs": archs}


def label_sets() -> dict[str, str]:
    """The class counts timm knows as labelled sets (timm/data/imagenet_info.py: 1000 → imagenet-1k, 11821 →
    imagenet-12k, …): a head of one of these widths classifies. vitdeploy reads it to tell a classifier from a CLIP
    tower's projection, which timm also holds as its ``head`` (model/timm_import.py ``projection_head``)."""
    from timm.data import imagenet_info

    return {str(n): str(s) for n, s in sorted(imagenet_info._NUM_CLASSES_TO_SUBSET.items())}


def dumps(t: dict[str, Any]) -> str:
    """Sorted keys, one line per name and per class: the same bytes for the same timm, and diffs a line per name."""
    def block(d: dict[str, Any]) -> str:
        rows = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(d.items())]
        return "{\n" + ",\n".join(rows) + "\n }"

    head = {k: v for k, v in t.items() if k not in ("class_defaults", "archs")}
    parts = [f" {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in sorted(head.items())]
    parts += [f' "class_defaults": {block(t["class_defaults"])}', f' "archs": {block(t["archs"])}']
    return "{\n" + ",\n".join(parts) + "\n}\n"


def main() -> int:
    t = table()
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(dumps(t))
    tmp.replace(OUT)
    counts: dict[str, int] = {}
    for e in t["archs"].values():
        counts[e["family"]] = counts.get(e["family"], 0) + 1
    print(f"{OUT}: {len(t['archs'])} names from timm {t['timm_version']} ({', '.join(f'{f} {n}' for f, n in counts.items())})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
