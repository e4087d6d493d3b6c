"""Every file name vitdeploy derives from a model's name, in one place.

``model.onnx`` is the FP32 export; the other artifacts of that model sit beside it and are named from its stem:
``model.int8.onnx`` / ``model.fp16.onnx`` (precision artifacts), ``model.int8.engine`` (+ ``model.int8.engine.json``
sidecar), ``model.int8.calib.json`` (calibration cache), ``model.raw.onnx`` (preprocessing folded into the graph).
A command that picks artifacts in a folder reads names through these functions only.
"""

from __future__ import annotations

from pathlib import Path

PRECISIONS = ("fp32", "fp16", "int8")
PRECISION_SUFFIXES = tuple(f".{p}" for p in PRECISIONS)
ENGINE_SUFFIXES = (".engine", ".plan", ".trt")
# What a vitdeploy checkpoint (a torch zip file) is named: info and every loader tell it by these suffixes.
CHECKPOINT_SUFFIXES = (".pth", ".pt")
# The bundle's file of each precision (and what `infer`/`bundle` look for in a folder).
ONNX_NAMES = {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}


def base_stem(path: str | Path) -> str:
    """``model.int8.onnx`` → ``model``: the stem without the file suffix and a precision tag."""
    name = Path(path).name
    for suf in (".onnx", *ENGINE_SUFFIXES, ".pth", ".pt"):
        if name.endswith(suf):
            name = name[: -len(suf)]
            break
    for tag in PRECISION_SUFFIXES:
        if name.endswith(tag):
            return name[: -len(tag)]
    return name


def precision_name(model: str | Path, precision: str) -> Path:
    """model.onnx → model.int8.onnx / model.fp16.onnx (fp32: model.onnx), beside the input."""
    p = Path(model)
    tag = "" if precision == "fp32" else f".{precision}"
    return p.with_name(f"{base_stem(p)}{tag}.onnx")


def precision_from_name(path: str | Path) -> str:
    """The precision a file's name claims (``model.int8.engine`` → int8); fp32 when it names none."""
    parts = Path(path).name.lower().split(".")
    for p in ("int8", "fp16", "fp32"):
        if p in parts:
            return p
    return "fp32"


def engine_name(model: str | Path, precision: str) -> Path:
    """model.onnx + int8 → model.int8.engine (FP32: model.fp32.engine), beside the model."""
    p = Path(model)
    return p.with_name(f"{base_stem(p)}.{precision}.engine")


def sidecar_name(engine: str | Path) -> Path:
    """model.int8.engine → model.int8.engine.json: the engine's manifest and build record."""
    e = Path(engine)
    return e.with_name(e.name + ".json")


def calib_cache_name(int8_model: str | Path) -> Path:
    """model.int8.onnx → model.int8.calib.json: the calibration ranges beside the INT8 model."""
    o = Path(int8_model)
    return o.with_name(o.name[: -len(".onnx")] + ".calib.json" if o.name.endswith(".onnx") else o.name + ".calib.json")


def raw_variant_name(onnx_name: str | Path, suffix: str = "raw") -> str:
    """model.onnx → model.raw.onnx, model.int8.onnx → model.int8.raw.onnx (the preprocessing in the graph)."""
    name = Path(onnx_name).name
    stem = name[: -len(".onnx")] if name.endswith(".onnx") else name
    return f"{stem}.{suffix}.onnx"
