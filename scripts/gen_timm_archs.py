"""Generate vitdeploy/model/timm_archs.json: every timm model name of the ViT families -> what timm builds for it.

Read from timm's own registrations, not typed by hand: each family's module has its ``build_model_with_cfg``
replaced by a recorder, every registered name's entry function is called (nothing is built), and the recorder keeps
the model class and the keyword arguments the entry function passed. Those raw timm kwargs (classes and partials
written as names) go into the table beside each name's pretrained cfgs (preprocessing, per tag where tags differ);
vitdeploy/model/timm_import.py maps them onto ViTConfig at run time, the same mapper that reads a timm folder's
``model_args``. The product reads only the JSON; timm is needed here alone.

    PYTHONPATH=$PWD .venv/bin/python scripts/gen_timm_archs.py    # rewrites vitdeploy/model/timm_archs.json

A family is one entry of FAMILIES: the timm module whose entry functions call build_model_with_cfg.
"""

from __future__ import annotations

import functools
import importlib
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "vitdeploy" / "model" / "timm_archs.json"

# family -> timm module. eva.py / beit.py (ring 2) are added here the same way.
FAMILIES: dict[str, str] = {
    "vision_transformer": "timm.models.vision_transformer",
    "deit": "timm.models.deit",
    "vision_transformer_hybrid": "timm.models.vision_transformer_hybrid",  # recorded so they are refused by name
}

# build_model_with_cfg's own parameters: how to build, not what (timm/models/_builder.py)
BUILDER_ARGS = {
    "pretrained_cfg", "pretrained_cfg_overlay", "model_cfg", "feature_cfg", "pretrained_strict",
    "pretrained_filter_fn", "cache_dir", "kwargs_filter",
}
# the preprocessing keys of a pretrained cfg (timm/models/_pretrained.py PretrainedCfg)
PP_KEYS = ("input_size", "mean", "std", "crop_pct", "crop_mode", "interpolation", "num_classes")


class _Recorded(Exception):
    def __init__(self, model_cls: type, kwargs: dict[str, Any]) -> None:
        super().__init__()
        self.model_cls, self.kwargs = model_cls, kwargs


def _record(model_cls: type, variant: str, pretrained: bool = False, **kwargs: Any) -> Any:
    raise _Recorded(model_cls, {k: v for k, v in kwargs.items() if k not in BUILDER_ARGS})


def jsonable(v: Any) -> Any:
    """A timm kwarg as JSON: classes and functions by name, a partial as {"name", **keywords}."""
    if isinstance(v, functools.partial):
        return {"name": getattr(v.func, "__name__", repr(v.func)), **{k: jsonable(x) for k, x in v.keywords.items()}}
    if isinstance(v, type) or (callable(v) and hasattr(v, "__name__")):
        return v.__name__
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


def main() -> int:
    import timm
    import timm.models as tm

    archs: dict[str, Any] = {}
    for family, modname in FAMILIES.items():
        mod = importlib.import_module(modname)
        saved = mod.build_model_with_cfg
        mod.build_model_with_cfg = _record
        try:
            for name in timm.list_models(module=family.rsplit(".", 1)[-1]):
                try:
                    tm.model_entrypoint(name)(pretrained=False)
                except _Recorded as r:
                    entry = {
                        "family": family,
                        "class": r.model_cls.__name__,
                        "kwargs": {k: jsonable(v) for k, v in sorted(r.kwargs.items())},
                        **pretrained_cfgs(name),
                    }
                    archs[name] = entry
                    continue
                except Exception as e:  # an entry point that cannot even be called without weights
                    print(f"{name}: skipped ({type(e).__name__}: {e})", file=sys.stderr)
                    continue
                print(f"{name}: its entry function did not call build_model_with_cfg; skipped", file=sys.stderr)
        finally:
            mod.build_model_with_cfg = saved
    table = {"timm_version": timm.__version__, "families": FAMILIES, "archs": dict(sorted(archs.items()))}
    tmp = OUT.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(table, indent=0, sort_keys=False) + "\n")
    tmp.replace(OUT)
    print(f"{OUT}: {len(archs)} names from timm {timm.__version__}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
