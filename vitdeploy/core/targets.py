"""What an artifact is made for: a TensorRT line's parser and builder, or a CPU runtime.

``trt8.5`` … ``trt11`` name what that TensorRT accepts (opset, LayerNormalization, float16 scales, strong typing,
precision flags, DLA, trtexec flags); ``ort`` is a CPU (ONNX Runtime / OpenVINO: float32 float parts). The graph
layer reads these facts to decide how to write an artifact; they are derived from the version table
(core/trt_table.py over trt_facts.json, each fact with its source). Nothing here imports anything heavy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vitdeploy.core import trt_table

TARGETS: tuple[str, ...] = ("trt8.5", "trt8.6", "trt10", "trt11", "ort")
CPU_TARGETS: tuple[str, ...] = ("ort",)


@dataclass(frozen=True)
class TargetFacts:
    """What the graph writer must respect for one target (the conservative value over the target's releases)."""

    name: str
    max_opset: int | None  # the highest ONNX opset the parser reads (None: a CPU runtime, any exported opset)
    layernorm_op: bool  # the parser imports LayerNormalization (else: spell it out in primitive ops)
    fp16_dq_scales: bool  # DequantizeLinear may carry float16 scales (opset >= 19), so DQ outputs float16
    float_dtype_int8: str  # the float type of an INT8 artifact's unquantized parts: "float16" or "float32"
    strongly_typed: bool  # the builder obeys the graph's types (no precision flags)
    source: str  # where these facts come from
    rows: tuple[str, ...] = ()  # the version-table rows the target stands for
    unconfirmed: tuple[str, ...] = ()  # facts taken from an earlier release because no source of the row gave them


# Which rows of the version table (core/trt_table.py) each TensorRT target stands for.
TARGET_ROWS: dict[str, tuple[str, ...]] = {
    "trt8.5": ("8.5",),
    "trt8.6": ("8.6",),
    "trt10": ("10.0-10.7", "10.8+"),
    "trt11": ("11.x",),
}


def row_fact(row: str, key: str, unconfirmed: list[str]) -> Any:
    """A row's fact; where the row's sources did not give it, the nearest earlier row that has it (noted).

    Parsers gain operators, opsets and importers release by release, so an earlier row's value is a lower bound.
    """
    v = trt_table.value(row, key)
    if v != trt_table.UNCONFIRMED:
        return v
    earlier = trt_table.ROWS[: trt_table.ROWS.index(row)]
    for alt in reversed(earlier):
        a = trt_table.value(alt, key)
        if a != trt_table.UNCONFIRMED:
            unconfirmed.append(f"{key} at {row} (taken from {alt})")
            return a
    raise ValueError(f"no source gives {key} for TensorRT {row}")


def _from_table(target: str) -> TargetFacts:
    rows = TARGET_ROWS[target]
    unc: list[str] = []
    opsets = [int(row_fact(r, "max_opset", unc)) for r in rows]
    ln = all(row_fact(r, "layernorm_importer", unc) is True for r in rows)
    f16 = all(row_fact(r, "fp16_dq_scales", unc) is True for r in rows)
    st = all(row_fact(r, "strongly_typed", unc) is True for r in rows)
    src = "core/trt_facts.json rows " + ", ".join(rows) + " (scripts/extract_trt_facts.py: NVIDIA/TensorRT, onnx/onnx-tensorrt)"
    return TargetFacts(target, min(opsets), ln, f16, "float16", st, src, rows, tuple(unc))


def _facts() -> dict[str, TargetFacts]:
    out = {t: _from_table(t) for t in TARGET_ROWS}
    out["ort"] = TargetFacts("ort", None, True, False, "float32", False, "ONNX Runtime / OpenVINO on a CPU")
    return out


FACTS: dict[str, TargetFacts] = _facts()


def target_of_version(version: str | tuple[int, ...]) -> str:
    """The target an installed TensorRT builds (8.5 -> trt8.5, 9.x/10.x -> trt10, 11+ -> trt11)."""
    v = trt_table.version_tuple(version)
    if v[0] == 8:
        return "trt8.5" if (v + (0,))[1] < 6 else "trt8.6"
    if v[0] in (9, 10):
        return "trt10"
    if v[0] >= 11:
        return "trt11"
    raise ValueError(f"TensorRT {'.'.join(map(str, v))} is older than 8.5, the oldest vitdeploy supports")


def target_facts(target: str) -> TargetFacts:
    """The facts of a target; a ValueError that lists the valid names for an unknown one."""
    try:
        return FACTS[target]
    except KeyError:
        raise ValueError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}") from None
