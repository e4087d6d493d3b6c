"""timm's Eva and Beit registrations → their resolved constructor arguments (JSON-able), for the timm name table.

Read from timm itself, never typed: every name timm registers in ``timm.models.eva`` and ``timm.models.beit`` is
called with the module's ``_create_eva`` / ``_create_beit`` replaced by a recorder, which keeps the arguments the
registration passes; they are laid over the class's own defaults (``inspect.signature``). No model is built.
Callables are written by name: ``norm_layer`` as ``{"name": "LayerNorm", "eps": ...}`` (functools.partial's
keywords, else the class default), other callables as their ``__name__``. The product's
vitdeploy/model/timm_eva.py turns these into a ViTConfig, or refuses naming the argument.

Used by scripts/gen_timm_archs.py (``eva_beit_entries()``); run alone it prints the table rows as JSON.
"""

from __future__ import annotations

import functools
import inspect
import json
from typing import Any

# What timm.layers.LayerNorm and torch's LayerNorm default to.
_DEFAULT_EPS = {"LayerNorm": 1e-6, "nn.LayerNorm": 1e-5}
# Training-only or runtime-only arguments, which do not change the eval forward at a fixed size.
_RUNTIME = {"device", "dtype", "drop_rate", "pos_drop_rate", "patch_drop_rate", "proj_drop_rate", "attn_drop_rate",
            "drop_path_rate", "head_init_scale", "rope_shift_coords", "rope_jitter_coords", "rope_rescale_coords",
            "out_indices"}
# The default pretrained cfg's preprocessing (timm/data: resolve_data_config reads these).
_PP_KEYS = ("input_size", "interpolation", "crop_pct", "crop_mode", "mean", "std")


def _callable_name(v: Any) -> Any:
    import torch

    if isinstance(v, functools.partial):
        base = _callable_name(v.func)
        if isinstance(base, dict):
            return {**base, **{k: w for k, w in v.keywords.items() if isinstance(w, (int, float, str, bool))}}
        return {"name": base, **v.keywords}
    if isinstance(v, type):
        name = v.__name__
        if name == "LayerNorm":
            name = "nn.LayerNorm" if v is torch.nn.LayerNorm else "LayerNorm"
            return {"name": name, "eps": _DEFAULT_EPS[name]}
        return {"name": name}
    if callable(v):
        return {"name": getattr(v, "__name__", type(v).__name__)}
    return v


def _jsonable(v: Any) -> Any:
    v = _callable_name(v)
    if isinstance(v, tuple):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    return v


def _record(module: Any, creator: str, cls: type) -> dict[str, dict[str, Any]]:
    import timm

    defaults = {
        k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
        if k != "self" and p.default is not inspect.Parameter.empty
    }
    seen: dict[str, Any] = {}

    def recorder(variant: str, pretrained: bool = False, **kwargs: Any) -> None:
        seen["args"] = kwargs

    real = getattr(module, creator)
    setattr(module, creator, recorder)
    rows: dict[str, dict[str, Any]] = {}
    try:
        for name in timm.list_models(module=module.__name__.rsplit(".", 1)[-1]):
            seen.clear()
            timm.models.model_entrypoint(name)(pretrained=False)
            if "args" not in seen:
                continue  # a registration that builds another class
            args = {**defaults, **seen["args"]}
            pcfg = timm.models.get_pretrained_cfg(name).to_dict()
            rows[name] = {
                "class": cls.__name__,
                "args": {k: _jsonable(v) for k, v in sorted(args.items()) if k not in _RUNTIME},
                "pretrained_cfg": {k: _jsonable(pcfg[k]) for k in _PP_KEYS if pcfg.get(k) is not None},
            }
    finally:
        setattr(module, creator, real)
    return rows


def eva_beit_entries() -> dict[str, dict[str, Any]]:
    """{timm name: {"class": "Eva" | "Beit", "args": resolved constructor arguments, "pretrained_cfg": preprocessing}}."""
    import timm.models.beit as beit
    import timm.models.eva as eva

    return {**_record(eva, "_create_eva", eva.Eva), **_record(beit, "_create_beit", beit.Beit)}


def main() -> None:
    import argparse
    from pathlib import Path

    import timm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--out", default=str(Path(__file__).resolve().parents[1] / "vitdeploy/model/timm_eva_beit.json"))
    out = Path(ap.parse_args().out)
    table = {"generated_by": "scripts/timm_eva_beit_args.py", "timm": timm.__version__, "models": eva_beit_entries()}
    out.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}: {len(table['models'])} names from timm {timm.__version__}")


if __name__ == "__main__":
    main()
