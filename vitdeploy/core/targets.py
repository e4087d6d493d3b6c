"""What an artifact is made for: a TensorRT line's parser and builder, or a CPU runtime.

``trt8.5`` … ``trt11`` name what that TensorRT accepts (opset, LayerNormalization, float16 scales, strong typing,
precision flags, DLA, trtexec flags); ``cpu`` is a CPU (ONNX Runtime or OpenVINO: float32 float parts; ``ort`` is its
old name) and ``openvino`` a CPU where OpenVINO runs the model (the same graph; the accuracy guard judges it there). The graph
layer reads these facts to decide how to write an artifact; they are derived from the version table
(core/trt_table.py over trt_facts.json, each fact with its source). Nothing here imports anything heavy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from vitdeploy.core import trt_table
from vitdeploy.core.devices import DeviceFacts, known_names, parse_device

TARGETS: tuple[str, ...] = ("trt8.5", "trt8.6", "trt10", "trt11", "cpu", "openvino")
# "ort" is the CPU target's old name: `-t ort` resolves to cpu, and artifacts whose manifests say "ort" stay CPU ones
CPU_TARGETS: tuple[str, ...] = ("cpu", "openvino", "ort")
ALIASES: dict[str, str] = {"ort": "cpu"}


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
    device: DeviceFacts | None = None  # the JetPack / module the user named, where they named one (core/devices.py)


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
    out["cpu"] = TargetFacts("cpu", None, True, False, "float32", False, "ONNX Runtime / OpenVINO on a CPU")
    out["openvino"] = dataclasses.replace(out["cpu"], name="openvino", source="OpenVINO on a CPU")
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
        return FACTS[ALIASES.get(target, target)]
    except KeyError:
        raise ValueError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}") from None


def resolve_target(name: str | None) -> TargetFacts | None:
    """The one way a command reads ``--target``: a TensorRT line (trt8.5, trt8.6, trt10, trt11, or a version such as
    trt10.3), ``cpu`` (``ort``), ``openvino``, or what users know — a JetPack release and/or a Jetson module (core/devices.py). None for none.

    The facts' ``name`` is always the TensorRT line (what the manifest records); ``device`` keeps what was said.
    An unknown name is UnknownTarget (exit 2) in one line listing the known ones; an impossible pair (a module the
    JetPack does not support) is ImpossibleRequest.
    """
    from vitdeploy.core.errors import UnknownTarget

    if name is None:
        return None
    key = name.strip().lower()
    key = ALIASES.get(key, key)
    if key in FACTS:
        return FACTS[key]
    ver = key.removeprefix("tensorrt").removeprefix("trt").strip("-_ ")
    if ver != key and ver[:1].isdigit():  # a version (trt10.3): its line, where the line's rows stand for it (not 9.x)
        try:
            line = target_of_version(ver)
            if trt_table.row_of(ver) in TARGET_ROWS[line]:
                return FACTS[line]
        except ValueError:
            pass
    dev = parse_device(name)
    if dev is None:
        raise UnknownTarget(f"unknown target {name!r}: choose one of {', '.join(TARGETS)} (a TensorRT line, or cpu / openvino: a CPU), "
                            f"or {known_names()}")
    from vitdeploy.core.devices import jetpack

    trt = dev.tensorrt
    if trt is None:  # a module alone: every JetPack it runs ships the same TensorRT line (checked when parsed)
        from vitdeploy.core.devices import JETPACKS

        trt = next(j.tensorrt for j in JETPACKS if dev.module in j.modules)
    else:
        jetpack(dev.jetpack or "")  # the row exists
    return dataclasses.replace(FACTS[target_of_version(trt)], device=dev)


def check_request(facts: TargetFacts | None, *, dla_core: int | None = None, fp8: bool = False, int8: bool = False,
                  dynamic_batch: bool = False) -> None:
    """Refuse, before any work, what cannot work on the named device (ImpossibleRequest, exit 2, one line).

    Only facts the device table confirms refuse: an unconfirmed one (DLA on JetPack 7.x) lets the request through.
    """
    from vitdeploy.core.devices import module
    from vitdeploy.core.errors import ImpossibleRequest

    dev = facts.device if facts is not None else None
    if dla_core is not None:
        if facts is not None and facts.name in CPU_TARGETS:
            raise ImpossibleRequest(f"--dla-core with --target {facts.name}: DLA is on a Jetson, not a CPU target")
        if dev is not None and dev.module is not None:
            title = module(dev.module).title
            if dev.dla_cores == 0:
                raise ImpossibleRequest(f"{title} has no DLA: drop --dla-core (the engine runs on the GPU)")
            if dev.dla is False:
                raise ImpossibleRequest(f"TensorRT {dev.tensorrt} on JetPack {dev.jetpack} has no DLA (10.7 was the last "
                                        "10.x release with it): drop --dla-core")
            if dev.dla_cores is not None and dla_core >= dev.dla_cores:
                raise ImpossibleRequest(f"--dla-core {dla_core}: the {title} has {dev.dla_cores} DLA core(s), "
                                        f"numbered from 0")
        if int8 and dynamic_batch:
            raise ImpossibleRequest("a DLA engine has one fixed batch: drop --min-batch/--max-batch and give the batch "
                                    "with --opt-batch")
    if fp8:
        if facts is not None and facts.name in ("trt8.5", "trt8.6"):
            raise ImpossibleRequest(f"FP8 with {facts.name}: TensorRT 8.x has no FP8 ONNX path; use a 10.x target")
        if dev is not None and dev.fp8 is False:
            title = module(dev.module).title if dev.module else dev.describe()
            raise ImpossibleRequest(f"FP8 on the {title}: FP8 needs compute capability 8.9+ (Jetson Thor); "
                                    "use --int8 or --fp16")
