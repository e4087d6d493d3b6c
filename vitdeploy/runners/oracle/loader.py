"""Lower a Q/DQ or FP16 ONNX graph to what TensorRT executes: int8 GEMMs as MatMulInteger/ConvInteger + scales.

Kept apart from the runner (Polygraphy's loader/runner split): the lowered graph is plain ONNX, so it can be
read, tested and saved; the runner only executes it. The rules are in the package docstring.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitdeploy.core.errors import VitdeployError
from vitdeploy.graph.edit import constant_values

GEMM_OPS = ("MatMul", "Gemm", "Conv")
PINNED_TARGETS = ("trt8.5", "trt8.6")  # weakly typed builds: stages/engine.py pins the FP32 islands
MAX_INT8_REDUCTION = 131072  # 131072 · 128 · 128 = 2^31: longer int8 dot products could overflow int32
# ops a weakly typed 8.x build pins to FP32 by layer type (pin_float32_layers: SOFTMAX and REDUCE layers)
PINNED_OPS = ("Softmax", "ReduceMean", "ReduceSum", "ReduceSumSquare", "ReduceMax", "ReduceMin", "ReduceProd",
              "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp")


@dataclass(frozen=True)
class Int8Source:
    """An int8 tensor a GEMM input dequantizes: its name, its scale (float32 values) and the DQ's output type."""

    tensor: str
    scale: np.ndarray  # float32 values of the DQ's scale (exact: float16 scales widen exactly)
    axis: int | None  # per-channel axis of the scale (None: per tensor)
    out_type: int  # onnx TensorProto elem type of the DequantizeLinear output
    rank: int | None  # rank of the int8 tensor where known


@dataclass
class Lowered:
    """The lowered graph, the nodes that compute in float32 whatever they declare, and what was fused."""

    model: Any  # onnx.ModelProto with MatMulInteger/ConvInteger in place of the fused GEMMs
    types: dict[str, int]  # declared elem type of every tensor shape inference could type
    pinned: set[str] = field(default_factory=set)
    fused: list[str] = field(default_factory=list)  # names of the GEMM nodes that run in int8
    target: str | None = None


def declared_types(model: Any) -> dict[str, int]:
    """Every tensor's declared elem type: graph inputs/outputs, initializers and ONNX shape inference."""
    import onnx

    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:  # an unusual graph: type what the file itself declares
        inferred = model
    g = inferred.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input) + list(g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    types[n.output[0]] = a.t.data_type
    return {k: v for k, v in types.items() if v}


def _attr(node: Any, name: str, default: Any = None) -> Any:
    from onnx import helper

    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def _zero(consts: dict[str, np.ndarray], node: Any) -> bool:
    """Whether a Q/DQ node's zero point is absent or all zeros (the only form TensorRT accepts)."""
    return len(node.input) < 3 or not node.input[2] or (node.input[2] in consts and not np.any(consts[node.input[2]]))


def int8_source(name: str, producers: dict[str, Any], consts: dict[str, np.ndarray], types: dict[str, int],
                ranks: dict[str, int]) -> Int8Source | None:
    """What ``name`` dequantizes, if it is DequantizeLinear of int8 with a constant scale and zero point 0:
    an activation's QuantizeLinear output or a constant int8 weight. None otherwise (the input stays float)."""
    from onnx import TensorProto

    dq = producers.get(name)
    if dq is None or dq.op_type != "DequantizeLinear" or dq.input[1] not in consts or not _zero(consts, dq):
        return None
    q_name = dq.input[0]
    q = producers.get(q_name)
    if q_name in consts:
        if consts[q_name].dtype != np.int8:
            return None
    elif q is None or q.op_type != "QuantizeLinear" or not _zero(consts, q) or types.get(q_name) != TensorProto.INT8:
        return None
    scale = np.asarray(consts[dq.input[1]]).astype(np.float32)
    axis = int(_attr(dq, "axis", 1)) if scale.size > 1 else None
    rank = consts[q_name].ndim if q_name in consts else ranks.get(q_name)
    if axis is not None and axis < 0 and rank is not None:
        axis += rank
    out_type = types.get(dq.output[0]) or types.get(dq.input[1]) or TensorProto.FLOAT
    return Int8Source(q_name, scale, axis, int(out_type), rank)


def _ranks(model: Any) -> dict[str, int]:
    import onnx

    try:
        g = onnx.shape_inference.infer_shapes(model, strict_mode=False).graph
    except Exception:
        g = model.graph
    return {vi.name: len(vi.type.tensor_type.shape.dim) for vi in list(g.value_info) + list(g.input) + list(g.output)
            if vi.type.tensor_type.HasField("shape")}


class _Emitter:
    """New nodes and constants for the lowered graph, with names that cannot clash with the graph's."""

    def __init__(self, node_name: str) -> None:
        self.base = f"{node_name}/oracle"
        self.nodes: list[Any] = []
        self.inits: list[Any] = []

    def name(self, what: str) -> str:
        return f"{self.base}/{what}"

    def const(self, what: str, value: np.ndarray) -> str:
        from onnx import numpy_helper

        self.inits.append(numpy_helper.from_array(value, self.name(what)))
        return self.name(what)

    def node(self, op: str, inputs: list[str], output: str | None, what: str, **attrs: Any) -> str:
        from onnx import helper

        out = output or self.name(what)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(what), **attrs))
        return out


def _finish(e: _Emitter, acc: str, scale: np.ndarray, bias: str | None, out: str, out_type: int) -> None:
    """int32 accumulator → float32 → × scale product (→ + bias in float32) → output type, rounded once."""
    from onnx import TensorProto

    f = e.node("Cast", [acc], None, "acc_float32", to=TensorProto.FLOAT)
    last = bias is None and out_type == TensorProto.FLOAT
    y = e.node("Mul", [f, e.const("scale_product", scale.astype(np.float32))], out if last else None, "scaled")
    if bias is not None:
        b = e.node("Cast", [bias], None, "bias_float32", to=TensorProto.FLOAT)
        y = e.node("Add", [y, b], out if out_type == TensorProto.FLOAT else None, "biased")
    if out_type != TensorProto.FLOAT:
        e.node("Cast", [y], out, "to_output_type", to=out_type)


def _lower_matmul(node: Any, a: Int8Source, b: Int8Source) -> _Emitter | None:
    if a.axis is not None or (b.rank is not None and b.rank < 2):
        return None  # activations per tensor only; a vector weight is not a GEMM
    if b.axis is not None and b.axis != (b.rank or 2) - 1:
        return None  # per-channel only along the output columns (the scale must factor out of each dot product)
    e = _Emitter(node.name)
    acc = e.node("MatMulInteger", [a.tensor, b.tensor], None, "int32_acc")
    _finish(e, acc, a.scale.reshape(()) * b.scale, None, node.output[0], a.out_type)
    return e


def _lower_gemm(node: Any, a: Int8Source, b: Int8Source) -> _Emitter | None:
    ta, tb = int(_attr(node, "transA", 0)), int(_attr(node, "transB", 0))
    if a.axis is not None or (b.axis is not None and b.axis != (0 if tb else 1)):
        return None
    e = _Emitter(node.name)
    qa = e.node("Transpose", [a.tensor], None, "a_t", perm=[1, 0]) if ta else a.tensor
    qb = e.node("Transpose", [b.tensor], None, "b_t", perm=[1, 0]) if tb else b.tensor
    acc = e.node("MatMulInteger", [qa, qb], None, "int32_acc")
    scale = a.scale.reshape(()) * b.scale * np.float32(_attr(node, "alpha", 1.0))
    bias = None
    if len(node.input) > 2 and node.input[2]:
        beta = float(_attr(node, "beta", 1.0))
        bias = node.input[2] if beta == 1.0 else e.node("Mul", [node.input[2], e.const("beta", np.array(beta, np.float32))],
                                                        None, "beta_c")
    _finish(e, acc, scale, bias, node.output[0], a.out_type)
    return e


def _lower_conv(node: Any, x: Int8Source, w: Int8Source) -> _Emitter | None:
    if x.axis is not None or (w.axis is not None and w.axis != 0) or w.rank is None:
        return None
    e = _Emitter(node.name)
    attrs = {a.name: _attr(node, a.name) for a in node.attribute}
    acc = e.node("ConvInteger", [x.tensor, w.tensor], None, "int32_acc", **attrs)
    shape = [1, -1] + [1] * (w.rank - 2)
    scale = (x.scale.reshape(()) * w.scale).reshape(shape) if w.scale.size > 1 else x.scale.reshape(()) * w.scale
    bias = None
    if len(node.input) > 2 and node.input[2]:
        bias = e.node("Reshape", [node.input[2], e.const("bias_shape", np.array(shape, np.int64))], None, "bias_nchw")
    _finish(e, acc, np.asarray(scale, np.float32), bias, node.output[0], x.out_type)
    return e


def _reduction_length(node: Any, src: Int8Source, consts: dict[str, np.ndarray]) -> int | None:
    """The int8 dot-product length of a fused GEMM, where known (to refuse an int32 overflow)."""
    if src.tensor not in consts:
        return None
    w = consts[src.tensor]
    if node.op_type == "Conv":
        return int(np.prod(w.shape[1:]))
    if node.op_type == "Gemm" and int(_attr(node, "transB", 0)):
        return int(w.shape[1])
    return int(w.shape[-2])


def pinned_nodes(model: Any, target: str | None) -> set[str]:
    """The nodes an 8.x build pins to FP32 (stages/engine.py pin_float32_layers): none for other targets."""
    if target not in PINNED_TARGETS:
        return set()
    from vitdeploy.graph.fp16 import pinned_fp32_nodes

    return pinned_fp32_nodes(model) | {n.name for n in model.graph.node if n.op_type in PINNED_OPS}


def _named(model: Any) -> Any:
    m = copy.deepcopy(model)
    seen: set[str] = set()
    for i, n in enumerate(m.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        n.name = name
        seen.add(name)
    return m


def _prune(graph: Any) -> None:
    """Drop nodes and initializers no graph output needs (the float DQ of a fused GEMM's weight, for one)."""
    need = {o.name for o in graph.output}
    keep: list[Any] = []
    for n in reversed(list(graph.node)):
        if any(o in need for o in n.output):
            keep.append(n)
            need.update(i for i in n.input if i)
            for a in n.attribute:  # subgraphs (If/Loop) read outer names: keep what they may read
                if a.g is not None and a.g.node:
                    need.update(i for sn in a.g.node for i in sn.input)
    keep.reverse()
    del graph.node[:]
    graph.node.extend(keep)
    inits = [i for i in graph.initializer if i.name in need]
    del graph.initializer[:]
    graph.initializer.extend(inits)


def lower(model: Any, target: str | None = None) -> Lowered:
    """The graph TensorRT would execute, as ONNX: every DQ→GEMM with two int8 inputs becomes an integer GEMM.

    ``target``: what the artifact is made for (the manifest's); trt8.5/trt8.6 pin the FP32 islands.
    """
    from vitdeploy.core.targets import TARGETS

    if target is not None and target not in TARGETS:
        raise VitdeployError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    m = _named(model)
    g = m.graph
    types = declared_types(m)
    ranks = _ranks(m)
    consts = constant_values(g)
    producers = {o: n for n in g.node for o in n.output}
    lowered: dict[str, _Emitter] = {}
    for n in g.node:
        if n.op_type not in GEMM_OPS or len(n.input) < 2:
            continue
        a = int8_source(n.input[0], producers, consts, types, ranks)
        b = int8_source(n.input[1], producers, consts, types, ranks)
        if a is None or b is None:
            continue
        k = _reduction_length(n, b, consts)
        if k is not None and k > MAX_INT8_REDUCTION:
            continue  # int32 could overflow: leave it to the float path rather than guess TensorRT's split
        lower_one = {"MatMul": _lower_matmul, "Gemm": _lower_gemm, "Conv": _lower_conv}[n.op_type]
        e = lower_one(n, a, b)
        if e is not None:
            lowered[n.name] = e
    nodes: list[Any] = []
    for n in g.node:
        if n.name in lowered:
            nodes.extend(lowered[n.name].nodes)
            g.initializer.extend(lowered[n.name].inits)
        else:
            nodes.append(n)
    del g.node[:]
    g.node.extend(nodes)
    _prune(g)
    new_types = declared_types(m) if lowered else types
    return Lowered(m, {**types, **new_types}, pinned_nodes(m, target), list(lowered), target)


def load_model(artifact: Any) -> Any:
    """An onnx.ModelProto from a path, an OnnxArtifact (core.artifact: the one reader) or a ModelProto (as is)."""
    from pathlib import Path

    from vitdeploy.core.artifact import OnnxArtifact

    if isinstance(artifact, (str, Path)):
        artifact = OnnxArtifact.open(artifact)
    if isinstance(artifact, OnnxArtifact):
        return artifact.load_weights()
    return artifact
