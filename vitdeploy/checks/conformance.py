"""Conformance: does an artifact, our TensorRT calls and our trtexec lines stay within what a TensorRT line supports?

Everything is checked against the version table (``core/trt_facts.json``, extracted from NVIDIA's sources by
``scripts/extract_trt_facts.py``), so it runs in CI with no TensorRT:

* an ONNX model: its opset against the parser's limit; every node's op against onnx-tensorrt's operators.md of
  that release (supported, the types of its data, the restrictions the list states that can be read off a graph:
  inputs that must be initializers/constants, zero points that must be zero, outputs that are not supported,
  Resize modes), and DequantizeLinear's scale type against the parser's reading of float16 scales;
* the TensorRT Python names our code touches, against that release's pybind11 bindings;
* the trtexec options we print or write, against that release's sampleOptions.cpp.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core import trt_table
from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.targets import TARGET_ROWS, row_fact

KINDS: tuple[str, ...] = ("fp32", "fp16", "int8", "raw-pixel", "deepstream")
# ONNX TensorProto element types as operators.md names them
ONNX_TYPES = {1: "FP32", 2: "UINT8", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL", 10: "FP16", 11: "DOUBLE",
              16: "BF16"}


@dataclass(frozen=True)
class Finding:
    """One thing a TensorRT line would refuse (or misread), with where and by which source."""

    check: str  # "opset" | "op" | "dtype" | "restriction" | "scale" | "python" | "trtexec"
    where: str
    problem: str
    row: str
    source: str = ""

    def line(self) -> str:
        return f"[TensorRT {self.row}] {self.where}: {self.problem}"


@dataclass
class Report:
    """Findings of one subject against one target; ``notes`` say where a fact was taken from an earlier release."""

    subject: str
    target: str
    findings: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    checked: int = 0

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        if self.ok:
            return f"pass ({self.checked} checked{'; ' + '; '.join(self.notes) if self.notes else ''})"
        first = self.findings[0]
        more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        return f"FAIL: {first.where}: {first.problem}{more}"


def rows_of(target: str) -> tuple[str, ...]:
    if target not in TARGET_ROWS:
        raise ValueError(f"unknown TensorRT target {target!r}: one of {', '.join(TARGET_ROWS)}")
    return TARGET_ROWS[target]


def _first_release(row: str) -> str:
    out: str = trt_table.row(row)["releases"][0]
    return out


# ---------------------------------------------------------------- ONNX graphs


def _row_ops(row: str, notes: list[str]) -> dict[str, Any]:
    ops = trt_table.value(row, "onnx_ops")
    if isinstance(ops, dict):
        return ops
    alt, ops2 = trt_table.ops_row(_first_release(row))
    notes.append(f"operators of {row} taken from {alt}'s list (no source of {row}'s own list was read)")
    return ops2


def _types(model: Any) -> dict[str, int]:
    """Element type of every tensor name (shape inference, initializers, Constant outputs)."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - inference is a help here; declared types still count
        inferred = model
    g = inferred.graph
    out: dict[str, int] = {}
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            out[vi.name] = vi.type.tensor_type.elem_type
    for init in g.initializer:
        out[init.name] = init.data_type
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = a.t.data_type
    return out


def _constants(model: Any) -> dict[str, Any]:
    """Names whose value is known at build time: initializers, Constant outputs, and DequantizeLinear of those."""
    from onnx import numpy_helper

    g = model.graph
    vals: dict[str, Any] = {i.name: numpy_helper.to_array(i) for i in g.initializer}
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    vals[n.output[0]] = numpy_helper.to_array(a.t)
    for n in g.node:  # weights arrive through DQ(initializer) in a Q/DQ graph: still build-time constants
        if n.op_type == "DequantizeLinear" and n.input and n.input[0] in vals:
            vals.setdefault(n.output[0], None)
    return vals


def _input_index(op: str, opset: int, name: str) -> int | None:
    import onnx.defs

    try:
        schema = onnx.defs.get_schema(op, opset)
    except Exception:  # noqa: BLE001 - an op ONNX does not know is reported by the op check
        return None
    for i, p in enumerate(schema.inputs):
        if p.name == name:
            return i
    return None


_MUST_CONST = re.compile(r"`(\w+)\s*`\s+(?:input\s+)?must be (?:an initializer|a constant tensor|a build-time constant|"
                         r"resolvable to a constant)")
_MUST_ZERO = re.compile(r"`(\w+)`\s+must be (?:zero|0)\b")
_MODES = {"transformation modes": "coordinate_transformation_mode", "resize modes": "mode",
          "nearest modes": "nearest_mode"}


def _restriction_findings(node: Any, rtext: str, opset: int, consts: dict[str, Any], row: str, src: str,
                          where: str) -> list[Finding]:
    import numpy as np

    out: list[Finding] = []
    for name in _MUST_CONST.findall(rtext):
        i = _input_index(node.op_type, opset, name)
        if i is not None and i < len(node.input) and node.input[i] and node.input[i] not in consts:
            out.append(Finding("restriction", where, f"input `{name}` must be an initializer/constant ({rtext.strip()})",
                               row, src))
    for name in _MUST_ZERO.findall(rtext):
        i = _input_index(node.op_type, opset, name)
        if i is not None and i < len(node.input) and node.input[i]:
            v = consts.get(node.input[i])
            if v is None or np.any(np.asarray(v) != 0):
                out.append(Finding("restriction", where, f"`{name}` must be zero ({rtext.strip()})", row, src))
    m = re.search(r"Only the first output `\w+` is supported", rtext)
    if m and sum(1 for o in node.output[1:] if o):
        out.append(Finding("restriction", where, f"{node.op_type} with more than one output: {m.group(0)}", row, src))
    for label, attr in _MODES.items():
        mm = re.search(rf"Supported (?:resize )?{label}: ([^<.]*)", rtext)
        if not mm:
            continue
        allowed = set(re.findall(r"`(\w+)`", mm.group(1)))
        for a in node.attribute:
            if a.name == attr:
                val = a.s.decode()
                if allowed and val not in allowed:
                    out.append(Finding("restriction", where, f"{attr}={val!r} is not among the supported {sorted(allowed)}",
                                       row, src))
    return out


def check_onnx(model: Any, target: str, subject: str | None = None) -> Report:
    """Every node of ``model`` (a path or a ModelProto) against every row of ``target``."""
    return check_onnx_rows(model, rows_of(target), subject, target)


def check_onnx_rows(model: Any, rows: tuple[str, ...], subject: str | None = None, target: str = "") -> Report:
    """Every node of ``model`` against the given rows of the version table."""
    if isinstance(model, (str, Path, OnnxArtifact)):
        art = model if isinstance(model, OnnxArtifact) else OnnxArtifact.open(model)
        model = art.model
        subject = subject or art.path.name
    rep = Report(subject or "model", target or ", ".join(rows))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    types = _types(model)
    consts = _constants(model)
    for row in rows:
        unc: list[str] = []
        limit = row_fact(row, "max_opset", unc)
        f16_scales = row_fact(row, "fp16_dq_scales", unc)
        ops = _row_ops(row, rep.notes)
        rep.notes.extend(u for u in unc if u not in rep.notes)
        osrc = trt_table.source(row, "onnx_ops")
        if isinstance(limit, int) and opset > limit:
            rep.findings.append(Finding("opset", "the model", f"ONNX opset {opset}; the parser reads opsets up to {limit}",
                                        row, trt_table.source(row, "max_opset")))
        for k, node in enumerate(model.graph.node):
            rep.checked += 1
            where = f"node {k} {node.op_type} {node.name!r}"
            if node.domain not in ("", "ai.onnx"):
                rep.findings.append(Finding("op", where, f"op of domain {node.domain!r}: the parser needs a plugin", row,
                                            osrc))
                continue
            entry = ops.get(node.op_type)
            if entry is None or not entry["supported"]:
                rep.findings.append(Finding("op", where, f"{node.op_type} is not supported by this parser "
                                            f"(operators.md: {'N' if entry else 'not listed'}; an unknown op falls back "
                                            "to a plugin lookup that fails)", row, osrc))
                continue
            allowed = set(entry["types"])
            seen = [ONNX_TYPES.get(types.get(t, 0), "") for t in (node.input[:1] or []) + list(node.output[:1]) if t]
            seen = [t for t in seen if t]
            if allowed and seen and not any(t in allowed or (t == "INT64" and "INT32" in allowed) for t in seen):
                # 8.x casts INT64 down to INT32 (operators.md's note), so INT64 passes where INT32 is listed
                rep.findings.append(Finding("dtype", where, f"data type {'/'.join(sorted(set(seen)))} not among "
                                            f"{', '.join(sorted(allowed))}", row, osrc))
            for rtext in entry.get("restrictions", []):
                rep.findings.extend(_restriction_findings(node, rtext, opset, consts, row, osrc, where))
            if node.op_type == "DequantizeLinear" and len(node.input) > 1:
                st = ONNX_TYPES.get(types.get(node.input[1], 0), "")
                if st == "FP16" and f16_scales is not True:
                    rep.findings.append(Finding("scale", where, "float16 DequantizeLinear scale: this parser reads "
                                                "scales as float32", row, trt_table.source(row, "fp16_dq_scales")))
    return rep


# ---------------------------------------------------------------- TensorRT Python names our code touches

Cond = Callable[[str], bool]


def _always(row: str) -> bool:
    return True


def _fact(key: str) -> Cond:
    return lambda row: trt_table.value(row, key) is True


def _weak(row: str) -> bool:
    return trt_table.value(row, "strongly_typed") is not True


def _dla(row: str) -> bool:
    return trt_table.value(row, "dla") is True or (row == "11.x")  # 11.4.1+ (JetPack 7.2.2+) has DLA again


# Every TensorRT name the builder (runners/tensorrt/builder.py), the runner (runners/tensorrt/runner.py) and the bundle's run.py
# touch, with the rows on which the code path that touches it runs. tests/test_conformance.py scans those files and
# fails when a name is used that this list does not declare. BuilderFlag / NetworkDefinitionCreationFlag members are
# not listed: they come from versions.network_plan per row (see plan_names).
API_USED: dict[str, Cond] = {
    "module.__version__": _always, "module.nptype": _always,
    "Logger": _always, "Logger.WARNING": _always,
    "Builder": _always, "Builder.create_network": _always, "Builder.create_builder_config": _always,
    "Builder.create_optimization_profile": _always, "Builder.build_serialized_network": _always,
    "Builder.num_DLA_cores": _always,
    "OnnxParser": _always, "OnnxParser.parse_from_file": _always, "OnnxParser.num_errors": _always,
    "OnnxParser.get_error": _always, "ParserError.desc": _always,
    "IBuilderConfig.set_memory_pool_limit": _always, "MemoryPoolType.WORKSPACE": _always,
    "IBuilderConfig.set_flag": _always, "IBuilderConfig.default_device_type": _dla, "DeviceType.DLA": _dla,
    "IBuilderConfig.DLA_core": _dla, "IBuilderConfig.add_optimization_profile": _always,
    "IBuilderConfig.create_timing_cache": _always, "IBuilderConfig.set_timing_cache": _always,
    "IBuilderConfig.get_timing_cache": _always, "ITimingCache.serialize": _always,
    "IOptimizationProfile.set_shape": _always, "Dims": _always,
    "Runtime": _always, "Runtime.deserialize_cuda_engine": _always, "Runtime.DLA_core": _dla,
    "Runtime.engine_host_code_allowed": _fact("version_compatible"),
    "ICudaEngine.create_execution_context": _always, "ICudaEngine.num_io_tensors": _always,
    "ICudaEngine.get_tensor_name": _always, "ICudaEngine.get_tensor_mode": _always,
    "ICudaEngine.get_tensor_dtype": _always, "ICudaEngine.get_tensor_profile_shape": _always,
    "TensorIOMode.INPUT": _always, "TensorIOMode.OUTPUT": _always,
    "IExecutionContext.set_input_shape": _always, "IExecutionContext.get_tensor_shape": _always,
    "IExecutionContext.set_tensor_address": _always, "IExecutionContext.execute_async_v3": _always,
    # 8.x (weakly typed) FP16/INT8 builds pin LayerNorm/Softmax/reductions to float32 layer by layer
    "INetworkDefinition.num_layers": _weak, "INetworkDefinition.get_layer": _weak, "ILayer.type": _weak,
    "ILayer.name": _weak, "ILayer.precision": _weak, "ILayer.num_outputs": _weak, "ILayer.set_output_type": _weak,
    "LayerType.SOFTMAX": _weak, "LayerType.REDUCE": _weak, "module.float32": _weak,
    "BuilderFlag.OBEY_PRECISION_CONSTRAINTS": _weak,
    # the precision receipt: detailed layer information, read back through the engine inspector (builder, run.py)
    "IBuilderConfig.profiling_verbosity": _always, "ProfilingVerbosity.DETAILED": _always,
    "ICudaEngine.create_engine_inspector": _always, "IEngineInspector.get_engine_information": _always,
    "LayerInformationFormat.JSON": _always,
}


def _representative_versions(row: str) -> list[str]:
    rels: list[str] = trt_table.row(row)["releases"]
    return [rels[0], rels[-1]] if len(rels) > 1 else rels


def plan_names(row: str) -> set[str]:
    """The enum members versions.network_plan asks of this row's TensorRT (every precision, DLA, version-compatible)."""
    from vitdeploy.runners.tensorrt.versions import network_plan

    names: set[str] = set()
    for v in _representative_versions(row):
        for precision in ("fp32", "fp16", "int8"):
            for dla in (False, True):
                if dla and trt_table.has_dla(v) is not True and not (row == "11.x"):
                    continue
                for vc in (False, True):
                    if vc and trt_table.value(row, "version_compatible") is not True:
                        continue
                    try:
                        p = network_plan(v if not (dla and row == "11.x") else "11.4.1", precision, dla=dla,
                                         version_compatible=vc)
                    except Exception:  # noqa: BLE001 - a combination the plan refuses is not a name we touch
                        continue
                    names.update(f"BuilderFlag.{f}" for f in p.builder_flags)
                    if p.explicit_batch:
                        names.add("NetworkDefinitionCreationFlag.EXPLICIT_BATCH")
                    if p.strongly_typed:
                        names.add("NetworkDefinitionCreationFlag.STRONGLY_TYPED")
    return names


def name_exists(name: str, row: str) -> bool:
    """Whether ``Class.member`` / ``Enum.MEMBER`` / ``module.x`` / ``Class`` exists in this row's bindings."""
    py = trt_table.python_names(row)
    head, _, tail = name.partition(".")
    if head == "module":
        return tail in py["module"]
    if not tail:
        return head in py["module"] or head in py["classes"] or head in py["enums"]
    if head in py["enums"]:
        return tail in py["enums"][head]
    if head in py["classes"]:
        return tail in py["classes"][head]
    return False


def check_python_names(target: str, used: dict[str, Cond] | None = None) -> Report:
    """Every TensorRT name our code touches on a row exists in that row's bindings."""
    rep = Report("TensorRT Python names", target)
    used = API_USED if used is None else used
    for row in rows_of(target):
        src = trt_table.source(row, "python")
        wanted = {n for n, cond in used.items() if cond(row)} | plan_names(row)
        for name in sorted(wanted):
            rep.checked += 1
            if not name_exists(name, row):
                rep.findings.append(Finding("python", name, f"`{name}` does not exist in this TensorRT's Python API",
                                            row, src))
    return rep


_RECEIVERS = {"builder": "Builder", "config": "IBuilderConfig", "parser": "OnnxParser", "runtime": "Runtime",
              "_runtime": "Runtime", "engine": "ICudaEngine", "context": "IExecutionContext", "ctx": "IExecutionContext",
              "prof": "IOptimizationProfile", "timing": "ITimingCache", "network": "INetworkDefinition",
              "layer": "ILayer"}


def scan_trt_names(text: str) -> set[str]:
    """TensorRT names a source file touches: ``trt.X.Y`` chains and members called on the usual receivers."""
    found: set[str] = set()
    for chain in re.findall(r"\btrt\.(\w+(?:\.\w+)?)", text):
        head = chain.split(".")[0]
        if head in ("__version__", "nptype", "float32", "float16", "int8"):
            found.add(f"module.{head}")
        elif head in ("BuilderFlag", "NetworkDefinitionCreationFlag") and "." not in chain:
            continue  # read by name from the plan (getattr): plan_names covers them
        else:
            found.add(chain)
    for recv, member in re.findall(r"\b(?:self\.)?(\w+)\.([A-Za-z_]\w*)\b", text):
        cls = _RECEIVERS.get(recv)
        if cls and not member.startswith("__"):
            found.add(f"{cls}.{member}")
    return found


# ---------------------------------------------------------------- trtexec


def trtexec_flags_of(line: str) -> set[str]:
    """The --options of a trtexec command line (what follows '=' dropped)."""
    try:
        argv = shlex.split(line.split("#", 1)[1] if line.lstrip().startswith("#") else line)
    except ValueError:
        argv = line.split()
    if "trtexec" in " ".join(argv):
        argv = argv[[i for i, a in enumerate(argv) if a.endswith("trtexec")][0] + 1:]
    return {a.split("=", 1)[0] for a in argv if a.startswith("--")}


def check_trtexec_flags(flags: Iterable[str], row: str, where: str = "trtexec line") -> list[Finding]:
    known = set(trt_table.trtexec_flags(row))
    src = trt_table.source(row, "trtexec_flags")
    return [Finding("trtexec", where, f"trtexec of TensorRT {row} has no option {f} (an unknown option is fatal)",
                    row, src) for f in sorted(set(flags) - known)]


def printed_trtexec_lines(row: str) -> dict[str, str]:
    """The trtexec lines commands.trtexec_command prints for this row (every precision, DLA where it exists)."""
    from vitdeploy.runners.tensorrt.builder import BuildSpec
    from vitdeploy.runners.tensorrt.commands import trtexec_command
    from vitdeploy.runners.tensorrt.versions import Profile, make_profile

    out: dict[str, str] = {}
    for v in _representative_versions(row):
        for precision in ("fp32", "fp16", "int8"):
            for dla in (None, 0):
                if dla is not None and (precision == "fp32" or trt_table.has_dla(v) is not True):
                    continue
                prof = make_profile(1, 8, 32, dla) if dla is not None else Profile(1, 8, 32)
                for vc in (False, True):
                    if vc and trt_table.value(row, "version_compatible") is not True:
                        continue
                    key = f"{v} {precision}{' dla' if dla is not None else ''}{' vc' if vc else ''}"
                    spec = BuildSpec(Path("m.onnx"), Path("m.engine"), "x", [-1, 3, 32, 32], prof, precision,
                                     workspace=1.0, timing_cache=Path("t.cache"), dla_core=dla, version_compatible=vc)
                    out[key] = trtexec_command(spec, v)
    return out


def check_printed_trtexec(target: str) -> Report:
    rep = Report("trtexec lines vitdeploy prints", target)
    for row in rows_of(target):
        for key, line in printed_trtexec_lines(row).items():
            rep.checked += 1
            rep.findings.extend(check_trtexec_flags(trtexec_flags_of(line), row, f"trtexec line for {key}"))
    return rep


# ---------------------------------------------------------------- intent: what the build makes of the graph


def _producers(model: Any) -> dict[str, Any]:
    return {o: n for n in model.graph.node for o in n.output}


def _consumers(model: Any) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for i in n.input:
            out.setdefault(i, []).append(n)
    return out


def _scale_types(model: Any) -> dict[str, int]:
    """Element type of every initializer and Constant output (where DequantizeLinear scales live), without shape
    inference."""
    out = {t.name: t.data_type for t in model.graph.initializer}
    for n in model.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = a.t.data_type
    return out


def quantized_gemm_casts(model: Any, types: dict[str, int] | None = None) -> list[str]:
    """Casts next to a quantized MatMul/Gemm (an input from DequantizeLinear): FP32 islands a strongly typed
    build keeps in float32 (issue 14, defect 2). Returns the GEMMs' names.

    A strongly typed network types every layer from its inputs ("Every tensor in the network has a data type defined
    ... following only type inference rules and the inputs/operator annotations"; "the computation precision is
    typically controlled by casting the input tensors": NvInfer.h, NetworkDefinitionCreationFlag::kSTRONGLY_TYPED and
    ILayer::setPrecision, TensorRT release/10.3, 10.16, 11.1). So a Cast *before* a quantized GEMM, or a GEMM whose
    DequantizeLinear scales are float32 (its DQ outputs, hence the GEMM, float32), is a float32 GEMM. A Cast *after*
    a GEMM fed by float16 DequantizeLinears only widens its float16 result for the next layer (a LayerNorm kept in
    float32, as the attention-pooling head's norm reads its projection directly): the GEMM itself stays INT8 with a
    float16 output, and is not reported."""
    from onnx import TensorProto

    prod, cons = _producers(model), _consumers(model)
    types = types if types is not None else _scale_types(model)
    narrow = (TensorProto.FLOAT16, TensorProto.BFLOAT16)
    out = []
    for n in model.graph.node:
        if n.op_type not in ("MatMul", "Gemm"):
            continue
        ins = [prod.get(i) for i in n.input[:2]]
        dqs = [p for p in ins if p is not None and p.op_type == "DequantizeLinear"]
        if not dqs:
            continue
        casts_in = any(p is not None and p.op_type == "Cast" for p in ins) or any(
            p is not None and p.op_type == "DequantizeLinear" and prod.get(p.input[0]) is not None
            and prod[p.input[0]].op_type == "Cast" for p in ins)
        # float16 typed: every input from a float16-scaled DQ (an input not from a DQ, a float32 or unknown scale:
        # judged float32, as before)
        f16_gemm = all(p is not None and p.op_type == "DequantizeLinear" and len(p.input) > 1
                       and types.get(p.input[1]) in narrow for p in ins)
        casts = [c for c in cons.get(n.output[0], []) if c.op_type == "Cast"]
        casts_out = any(not f16_gemm or _cast_to(c) in narrow for c in casts)
        if casts_in or casts_out:
            out.append(n.name or n.output[0])
    return out


def _cast_to(node: Any) -> int | None:
    return next((int(a.i) for a in node.attribute if a.name == "to"), None)


def check_int8_intent(model: Any, target: str, subject: str | None = None) -> Report:
    """An INT8 artifact for a strongly typed TensorRT (10, 11): float16 float parts around the quantized GEMMs —
    no Cast islands, float16 DequantizeLinear scales where the parser reads them (defect 2 of issue 14)."""
    if isinstance(model, (str, Path, OnnxArtifact)):
        art = model if isinstance(model, OnnxArtifact) else OnnxArtifact.open(model)
        subject = subject or art.path.name
        model = art.model
    rep = Report(f"{subject or 'model'} (INT8 precision)", target)
    types = _types(model)
    dqs = [n for n in model.graph.node if n.op_type == "DequantizeLinear"]
    if not dqs:
        return rep
    for row in rows_of(target):
        unc: list[str] = []
        if row_fact(row, "strongly_typed", unc) is not True:
            continue
        f16 = row_fact(row, "fp16_dq_scales", unc)
        src = trt_table.source(row, "strongly_typed")
        for name in quantized_gemm_casts(model, types):
            rep.findings.append(Finding("precision", f"GEMM {name}", "Cast next to a quantized GEMM: a strongly typed "
                                        "build keeps this layer in float32", row, src))
        scales = {ONNX_TYPES.get(types.get(n.input[1], 0), "") for n in dqs if len(n.input) > 1}
        rep.checked += len(dqs)
        if f16 is True and scales and scales != {"FP16"}:
            rep.findings.append(Finding("precision", "DequantizeLinear scales",
                                        f"scales are {'/'.join(sorted(scales))}: a strongly typed build runs the "
                                        "dequantized GEMMs and everything after them in float32; write float16 scales",
                                        row, trt_table.source(row, "fp16_dq_scales")))
    return rep


def check_precision_plan(target: str, plan_fn: Callable[..., Any] | None = None) -> Report:
    """On weakly typed rows (8.x), FP16/INT8 builds must make the graph's float32 islands binding:
    OBEY_PRECISION_CONSTRAINTS (or PREFER_…) among the builder flags (defect 3 of issue 14)."""
    if plan_fn is None:
        from vitdeploy.runners.tensorrt.versions import network_plan

        plan_fn = network_plan
    rep = Report("builder precision flags", target)
    for row in rows_of(target):
        if trt_table.value(row, "strongly_typed") is True:
            continue
        for v in _representative_versions(row):
            for precision in ("fp16", "int8"):
                rep.checked += 1
                flags = set(plan_fn(v, precision).builder_flags)
                if not flags & {"OBEY_PRECISION_CONSTRAINTS", "PREFER_PRECISION_CONSTRAINTS"}:
                    rep.findings.append(Finding("python", f"{precision} build on {v}", "no OBEY_PRECISION_CONSTRAINTS: "
                                                "the float32 LayerNorm/Softmax/reductions are only hints under FP16",
                                                row, trt_table.source(row, "obey_precision_constraints")))
    return rep


_LABEL = re.compile(r"#\s*or,\s*TensorRT ([0-9][0-9.]*)")


def check_dla_lines(lines: Iterable[str], target: str = "any") -> Report:
    """DLA command lines ("# or, TensorRT X: trtexec ... --useDLACore") only for versions that have DLA."""
    rep = Report("DLA lines", target)
    for line in lines:
        m = _LABEL.search(line)
        if not m or "--useDLACore" not in line:
            continue
        rep.checked += 1
        v = m.group(1).rstrip(".")
        has = trt_table.has_dla(v)
        if has is False:
            row = trt_table.row_of(v)
            rep.findings.append(Finding("dla", f"line for TensorRT {v}", "DLA offered, but this TensorRT has no DLA",
                                        row, trt_table.source(row, "dla")))
    return rep
