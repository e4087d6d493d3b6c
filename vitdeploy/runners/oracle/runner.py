"""Execute a lowered graph in numpy, each op in its declared type (rules: the package docstring).

numpy and nothing else, so the answer does not depend on which ONNX Runtime or OpenVINO is installed:
integer GEMMs are exact, float16 results are rounded op by op, and the 8.x pinned layers run in float32.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.runners.base import Runner
from vitdeploy.runners.oracle.loader import Lowered, load_model, lower

TRT_TARGETS = ("trt8.5", "trt8.6", "trt10", "trt11")


def _np_type(elem_type: int) -> Any:
    from onnx import helper

    return helper.tensor_dtype_to_np_dtype(elem_type)


def _is_float(a: np.ndarray) -> bool:
    return a.dtype in (np.float16, np.float32, np.float64)


def _attrs(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


# --- float16 ↔ float32 ---------------------------------------------------------------------

# numpy's own conversion of every float16 bit pattern: widening is a lookup, bit for bit numpy's astype (NaN payloads
# included) at about twice its speed on a contiguous array
_HALF_TO_FLOAT = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def widen(a: np.ndarray) -> np.ndarray:
    """float16 → float32, exact: a lookup where ``a`` is contiguous (an array of the same layout, as astype gives),
    astype otherwise (where the lookup is no faster)."""
    if not (isinstance(a, np.ndarray) and a.dtype == np.float16 and a.flags.c_contiguous):
        return np.asarray(a).astype(np.float32)
    out = np.empty(a.shape, np.float32)
    np.take(_HALF_TO_FLOAT, a.view(np.uint16), out=out, mode="clip")  # "clip": unbuffered; every index is in range
    return out


def convert(a: np.ndarray, dtype: Any) -> np.ndarray:
    """``a.astype(dtype, copy=False)``, with the float16 → float32 case by ``widen`` (the same bits, faster)."""
    if a.dtype == np.float16 and np.dtype(dtype) == np.float32:
        return widen(a)
    return a.astype(dtype, copy=False)


# --- integer and float GEMMs -------------------------------------------------------------------


def _matmul(a: np.ndarray, b: np.ndarray, dtype: Any) -> np.ndarray:
    """a @ b in ``dtype``; a stack times a matrix as one 2-D GEMM (numpy's stacked matmul is far slower)."""
    a, b = a.astype(dtype, copy=False), b.astype(dtype, copy=False)
    if a.ndim > 2 and b.ndim == 2:
        return np.matmul(a.reshape(-1, a.shape[-1]), b).reshape(*a.shape[:-1], b.shape[-1])
    return np.matmul(a, b)


def int_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """int8 × int8 with exact int32 accumulation. Every product and partial sum is an integer of magnitude at most
    K · 2^14, so a float GEMM gives it exactly in any summation order: float32 up to K = 1024 (2^24), else float64
    (2^53)."""
    k = a.shape[-1]
    out = _matmul(a, b, np.float32 if k * 128 * 128 <= 1 << 24 else np.float64)
    bounded = a.dtype == b.dtype == np.int8 and k * 128 * 128 <= np.iinfo(np.int32).max  # |sum| ≤ K · 2^14: no check
    if not bounded and out.size and np.abs(out).max() > np.iinfo(np.int32).max:
        raise VitdeployError("an int8 GEMM overflowed int32 accumulation; the oracle refuses to guess TensorRT's result")
    return out.astype(np.int32)


def float_matmul(a: np.ndarray, b: np.ndarray, out_type: Any) -> np.ndarray:
    """A float GEMM in float32 (float16 inputs widen exactly), rounded once to the output type."""
    return _matmul(a, b, np.float32).astype(out_type)


def _im2col(x: np.ndarray, kshape: tuple[int, ...], strides: list[int], dilations: list[int],
            pads: list[int], pad_value: float = 0) -> np.ndarray:
    """[N, C, *spatial] → [N, *out_spatial, C·prod(kernel)] patches (2-D and 1-D convolutions)."""
    nd = len(kshape)
    pad_width = [(0, 0), (0, 0)] + [(pads[i], pads[i + nd]) for i in range(nd)]
    xp = np.pad(x, pad_width, constant_values=pad_value)
    eff = [(k - 1) * d + 1 for k, d in zip(kshape, dilations, strict=True)]
    win = np.lib.stride_tricks.sliding_window_view(xp, eff, axis=tuple(range(2, 2 + nd)))
    sl = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in strides) + tuple(
        slice(None, None, d) for d in dilations)
    win = win[sl]  # [N, C, *out, *k]
    n, c = win.shape[:2]
    out_sp = win.shape[2 : 2 + nd]
    perm = (0,) + tuple(range(2, 2 + nd)) + (1,) + tuple(range(2 + nd, 2 + 2 * nd))
    return win.transpose(perm).reshape(n, *out_sp, c * int(np.prod(kshape)))


def conv(x: np.ndarray, w: np.ndarray, attrs: dict[str, Any], mm: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """ONNX Conv (group 1, NOTSET/explicit pads) by im2col and ``mm`` (the float or the integer GEMM)."""
    nd = w.ndim - 2
    if int(attrs.get("group", 1)) != 1:
        raise VitdeployError("the oracle runs grouped convolutions only with group=1; this graph has another")
    if attrs.get("auto_pad", b"NOTSET") not in (b"NOTSET", "NOTSET", b"VALID", "VALID"):
        raise VitdeployError("the oracle runs Conv with explicit pads only (auto_pad SAME_* is not supported)")
    kshape = tuple(w.shape[2:])
    strides = list(attrs.get("strides", [1] * nd))
    dil = list(attrs.get("dilations", [1] * nd))
    pads = list(attrs.get("pads", [0] * (2 * nd)))
    cols = _im2col(x, kshape, strides, dil, pads)
    y = mm(cols, w.reshape(w.shape[0], -1).T)  # [N, *out, O]
    return np.moveaxis(y, -1, 1)


# --- the float ops -------------------------------------------------------------------------


def _erf(x: np.ndarray) -> np.ndarray:
    from scipy.special import erf

    return np.asarray(erf(x.astype(np.float32)), np.float32)


def _axes(node: Any, vals: list[np.ndarray], attrs: dict[str, Any]) -> tuple[int, ...] | None:
    if len(vals) > 1 and vals[1] is not None and vals[1].size:
        return tuple(int(a) for a in vals[1])
    a = attrs.get("axes")
    return tuple(int(v) for v in a) if a is not None else None


def _reduce(fn: Callable[..., np.ndarray]) -> Callable[[Any, list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    def op(node: Any, vals: list[np.ndarray], attrs: dict[str, Any]) -> list[np.ndarray]:
        axes = _axes(node, vals, attrs)
        if axes is None and int(attrs.get("noop_with_empty_axes", 0)):
            return [vals[0]]
        return [fn(vals[0].astype(np.float32), axis=axes, keepdims=bool(attrs.get("keepdims", 1)))]

    return op


def _softmax(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    """exp(x − max) / sum in float32; the same operations in the same order, in one buffer (out=)."""
    x = v[0].astype(np.float32, copy=False)
    ax = int(at.get("axis", -1))
    e = x - x.max(axis=ax, keepdims=True)
    np.exp(e, out=e)
    np.divide(e, e.sum(axis=ax, keepdims=True), out=e)
    return [e]


def _layernorm(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    """ONNX LayerNormalization computed in float32 (stash_type 1, the default)."""
    x = v[0].astype(np.float32, copy=False)
    ax = int(at.get("axis", -1))
    axes = tuple(range(ax if ax >= 0 else x.ndim + ax, x.ndim))
    mean = x.mean(axis=axes, keepdims=True)
    d = x - mean
    var = (d * d).mean(axis=axes, keepdims=True)
    y = np.divide(d, np.sqrt(var + np.float32(at.get("epsilon", 1e-5))), out=d)  # in place: d is not read again
    for i, op in ((1, np.multiply), (2, np.add)):
        if len(v) > i and v[i] is not None:
            p = v[i].astype(np.float32, copy=False)
            y = op(y, p, out=y) if np.broadcast_shapes(y.shape, p.shape) == y.shape else op(y, p)
    return [y]


def _quantize(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    """x / scale in float32, rounded half to even, saturated to int8 (zero point 0: the only form fused)."""
    x, s = convert(v[0], np.float32), v[1].astype(np.float32)
    zp = v[2] if len(v) > 2 and v[2] is not None else np.zeros((), np.int8)
    if s.size > 1:
        shape = [1] * x.ndim
        shape[int(at.get("axis", 1))] = -1
        s, zp = s.reshape(shape), zp.reshape(shape)
    info = np.iinfo(zp.dtype) if zp.dtype != np.int8 else np.iinfo(np.int8)
    q = x / s
    np.rint(q, out=q)
    if np.any(zp):  # adding a zero point of 0 changes no integer (only −0.0 to +0.0): skipped
        q = q + zp.astype(np.float32)
    return [np.clip(q, info.min, info.max, out=q).astype(zp.dtype)]  # q is this op's own buffer


def _dequantize(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    """(q − zero point) · scale in the scale's type (a DQ no GEMM fuses: ONNX's definition)."""
    q, s = v[0], v[1]
    zp = v[2] if len(v) > 2 and v[2] is not None else np.zeros((), q.dtype)
    if s.size > 1:
        shape = [1] * q.ndim
        shape[int(at.get("axis", 1))] = -1
        s, zp = s.reshape(shape), zp.reshape(shape)
    return [((q.astype(np.int32) - zp.astype(np.int32)).astype(s.dtype) * s).astype(s.dtype)]


def _gemm(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    a = v[0].T if int(at.get("transA", 0)) else v[0]
    b = v[1].T if int(at.get("transB", 0)) else v[1]
    y = float_matmul(a, b, np.float32) * np.float32(at.get("alpha", 1.0))
    if len(v) > 2 and v[2] is not None:
        y = y + np.float32(at.get("beta", 1.0)) * v[2].astype(np.float32)
    return [y]


def _slice(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    x = v[0]
    starts, ends = v[1], v[2]
    axes = v[3] if len(v) > 3 and v[3] is not None else np.arange(len(starts))
    steps = v[4] if len(v) > 4 and v[4] is not None else np.ones(len(starts), np.int64)
    sl = [slice(None)] * x.ndim
    for s, e, a, st in zip(starts, ends, axes, steps, strict=True):
        sl[int(a)] = slice(int(s), int(e), int(st))
    return [x[tuple(sl)]]


def _reshape(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    shape = [int(d) for d in v[1]]
    if not int(at.get("allowzero", 0)):
        shape = [v[0].shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [v[0].reshape(shape)]


def _split(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    ax = int(at.get("axis", 0))
    sizes = v[1] if len(v) > 1 and v[1] is not None else at.get("split")
    if sizes is None:
        return list(np.array_split(v[0], len(node.output), axis=ax))
    return list(np.split(v[0], np.cumsum([int(s) for s in sizes])[:-1], axis=ax))


def _unsqueeze(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    axes = [int(a) for a in (v[1] if len(v) > 1 else at["axes"])]
    x = v[0]
    for a in sorted(a if a >= 0 else a + x.ndim + len(axes) for a in axes):
        x = np.expand_dims(x, a)
    return [x]


def _squeeze(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    axes = v[1] if len(v) > 1 and v[1] is not None else at.get("axes")
    return [np.squeeze(v[0], axis=tuple(int(a) for a in axes) if axes is not None else None)]


def _cast(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    return [convert(v[0], _np_type(int(at["to"])))]  # no copy when the type is already right: values are never mutated


def _constant(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    from onnx import numpy_helper

    for a in node.attribute:
        if a.name == "value":
            return [numpy_helper.to_array(a.t)]
        if a.name in ("value_float", "value_int"):
            return [np.array(at[a.name], np.float32 if a.name == "value_float" else np.int64)]
        if a.name in ("value_floats", "value_ints"):
            return [np.array(at[a.name], np.float32 if a.name == "value_floats" else np.int64)]
    raise VitdeployError(f"Constant {node.name!r}: no value the oracle can read")


def _constant_of_shape(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    from onnx import numpy_helper

    val = numpy_helper.to_array(at["value"]) if "value" in at else np.zeros(1, np.float32)
    return [np.full([int(d) for d in v[0]], val.reshape(-1)[0], val.dtype)]


def _conv_float(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    y = conv(v[0].astype(np.float32), v[1].astype(np.float32), at, lambda a, b: float_matmul(a, b, np.float32))
    if len(v) > 2 and v[2] is not None:
        y = y + v[2].astype(np.float32).reshape([1, -1] + [1] * (y.ndim - 2))
    return [y]


def _conv_integer(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    if any(len(v) > i and v[i] is not None and np.any(v[i]) for i in (2, 3)):
        raise VitdeployError(f"ConvInteger {node.name!r}: non-zero zero points are not TensorRT's form")
    return [conv(v[0], v[1], at, int_matmul)]


def _matmul_integer(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    if any(len(v) > i and v[i] is not None and np.any(v[i]) for i in (2, 3)):
        raise VitdeployError(f"MatMulInteger {node.name!r}: non-zero zero points are not TensorRT's form")
    return [int_matmul(v[0], v[1])]


def _unary32(fn: Callable[[np.ndarray], np.ndarray]) -> Callable[[Any, list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    """An op computed in float32 from its (exactly widened) inputs; the caller rounds to the declared type."""
    return lambda node, v, at: [fn(v[0].astype(np.float32) if _is_float(v[0]) else v[0])]


def _where(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    return [np.where(v[0], v[1], v[2])]


def _gather(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    return [np.take(v[0], v[1].astype(np.int64), axis=int(at.get("axis", 0)))]


def _expand(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    shape = np.broadcast_shapes(v[0].shape, tuple(int(d) for d in v[1]))
    return [np.broadcast_to(v[0], shape).copy()]


def _flatten(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    ax = int(at.get("axis", 1))
    ax = ax if ax >= 0 else ax + v[0].ndim
    return [v[0].reshape(int(np.prod(v[0].shape[:ax])), -1)]


def _clip(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
    """min(max(x, lo), hi): the bounds as inputs (opset 11+, each optional) or attributes; a selection, exact in any
    type (F.normalize's clamp of the norm)."""
    x = v[0]
    lo = v[1] if len(v) > 1 and v[1] is not None else at.get("min")
    hi = v[2] if len(v) > 2 and v[2] is not None else at.get("max")
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, x.dtype))
    return [x]


def _l2(x: np.ndarray, axis: tuple[int, ...] | None, keepdims: bool) -> np.ndarray:
    return np.sqrt(np.sum(np.square(x), axis=axis, keepdims=keepdims))


def _binary(fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> Callable[[Any, list[np.ndarray], dict[str, Any]], list[np.ndarray]]:
    return lambda node, v, at: [fn(v[0], v[1])]


OPS: dict[str, Callable[[Any, list[np.ndarray], dict[str, Any]], list[np.ndarray]]] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply),
    "Div": _binary(lambda a, b: (a // b) if a.dtype.kind in "iu" else np.divide(a, b)),
    "Pow": lambda n, v, at: [np.power(v[0].astype(np.float32), v[1].astype(np.float32))],
    "Equal": _binary(np.equal), "Less": _binary(np.less), "Greater": _binary(np.greater),
    "Max": lambda n, v, at: [np.maximum.reduce(v)], "Min": lambda n, v, at: [np.minimum.reduce(v)],
    "Sqrt": _unary32(np.sqrt), "Exp": _unary32(np.exp), "Tanh": _unary32(np.tanh), "Erf": _unary32(_erf),
    "Log": _unary32(np.log), "Reciprocal": _unary32(lambda x: np.float32(1) / x),
    "Sigmoid": _unary32(lambda x: np.float32(1) / (np.float32(1) + np.exp(-x))),
    "Relu": lambda n, v, at: [np.maximum(v[0], np.zeros((), v[0].dtype))],
    "Neg": lambda n, v, at: [np.negative(v[0])], "Abs": lambda n, v, at: [np.abs(v[0])],
    "Not": lambda n, v, at: [np.logical_not(v[0])],
    "Identity": lambda n, v, at: [v[0]],
    "MatMul": lambda n, v, at: [float_matmul(v[0], v[1], np.float32)], "Gemm": _gemm, "Conv": _conv_float,
    "MatMulInteger": _matmul_integer, "ConvInteger": _conv_integer,
    "QuantizeLinear": _quantize, "DequantizeLinear": _dequantize,
    "Softmax": _softmax, "LayerNormalization": _layernorm,
    "ReduceMean": _reduce(np.mean), "ReduceSum": _reduce(np.sum), "ReduceMax": _reduce(np.max),
    "ReduceMin": _reduce(np.min), "ReduceL2": _reduce(_l2), "Clip": _clip,
    "Reshape": _reshape, "Transpose": lambda n, v, at: [np.transpose(v[0], at.get("perm"))],
    "Concat": lambda n, v, at: [np.concatenate(v, axis=int(at["axis"]))],
    "Gather": _gather, "Slice": _slice, "Split": _split, "Squeeze": _squeeze, "Unsqueeze": _unsqueeze,
    "Flatten": _flatten, "Expand": _expand, "Where": _where,
    "Shape": lambda n, v, at: [np.array(v[0].shape[int(at.get("start", 0)):at.get("end")], np.int64)],
    "Cast": _cast, "Constant": _constant, "ConstantOfShape": _constant_of_shape,
}
# ops whose inputs keep their own types (a conversion, an int8 GEMM, a shape op): no widening or narrowing
_TYPE_OPS = {"Cast", "QuantizeLinear", "DequantizeLinear", "MatMulInteger", "ConvInteger", "Shape", "Constant",
             "ConstantOfShape", "Reshape", "Transpose", "Gather", "Slice", "Split", "Squeeze", "Unsqueeze",
             "Flatten", "Expand", "Concat", "Identity", "Where", "Equal", "Less", "Greater", "Not"}
# ops that widen every float input to float32 themselves: a float16 node of these gets its inputs widened by the
# faster ``widen`` (the same values)
_WIDE_OPS = {"MatMul", "Gemm", "Conv", "Pow", "Softmax", "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax",
             "ReduceMin", "ReduceL2", "Sqrt", "Exp", "Tanh", "Log", "Reciprocal", "Sigmoid"}
# float16 elementwise ops numpy computes in float32 from the exact widening and rounds once (24 ≥ 2·11 + 2 bits: the
# double rounding is exact), one element at a time: computed on widened arrays instead, the same bits
_HALF_OPS = {"Add", "Sub", "Mul", "Div"}
# elementwise ops whose every result element depends on that element's inputs alone, however the array is laid out
# (correctly rounded IEEE operations; scipy's erf, evaluated element by element): a float16 chain of them with one
# varying input is a function of 16 bits, evaluated once on all 65,536 values (a lookup table)
_TABLE_OPS = {"Add", "Sub", "Mul", "Div", "Erf", "Sqrt", "Reciprocal", "Neg", "Abs", "Relu"}

OpFn = Callable[[Any, list[np.ndarray], dict[str, Any]], list[np.ndarray]]


class _Step(NamedTuple):
    """One node with what ``run`` needs, looked up once per session instead of once per batch."""

    node: Any
    fn: OpFn
    attrs: dict[str, Any]
    inputs: list[tuple[str, np.ndarray | None]]  # (name, the value where known at load time, already cast) per input
    outputs: list[str]
    want: np.dtype | None  # the type its float outputs are rounded to (None: not a float op)
    cast: bool  # whether its float inputs are cast to ``want`` first
    kind: str  # "plain", "wide" (_WIDE_OPS) or "half" (_HALF_OPS): a float16 node run a faster, equal way
    free: tuple[str, ...]  # values no later node reads: dropped after this one (fresh buffers stay in cache)


class OracleSession:
    """Runs a lowered graph: every node's float inputs in its declared type, its output rounded to it (pinned
    nodes: float32 in, float32 out).

    Made for speed without changing a bit of the answer: what does not depend on the batch is done once here (each
    node's types, attributes and cast plan, the constants cast to the type each node reads them in, the nodes of
    constants alone); values are dropped after their last reader; float16 data is widened by lookup and float16
    Add/Sub/Mul/Div computed on widened arrays (numpy's float16 loops convert element by element); chains of float16
    elementwise nodes with one varying input are lookup tables.
    """

    def __init__(self, lowered: Lowered) -> None:
        from onnx import TensorProto, numpy_helper

        self.lowered = lowered
        g = lowered.model.graph
        unknown = sorted({n.op_type for n in g.node if n.op_type not in OPS or n.domain not in ("", "ai.onnx")})
        if unknown:
            raise VitdeployError(f"the TensorRT oracle cannot run op(s) {', '.join(unknown)}; verify this model with "
                                 "--backend onnxruntime or openvino")
        self.nodes = list(g.node)
        self.consts = {i.name: numpy_helper.to_array(i) for i in g.initializer}
        inits = set(self.consts)
        self.inputs = [i.name for i in g.input if i.name not in inits]
        self.outputs = [o.name for o in g.output]
        floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
        self.out_type = {n.name: _np_type(lowered.types[n.output[0]])
                         for n in self.nodes if lowered.types.get(n.output[0]) in floats}
        self.attrs = {n.name: _attrs(n) for n in self.nodes}
        self.input_types = {i.name: _np_type(i.type.tensor_type.elem_type) for i in g.input if i.name not in inits}
        self.steps = self._plan()

    def _step(self, n: Any) -> _Step:
        pinned = n.name in self.lowered.pinned and n.name in self.out_type
        want = np.dtype(np.float32) if pinned else self.out_type.get(n.name)
        cast = want is not None and n.op_type not in _TYPE_OPS
        kind = "plain"
        if want == np.float16 and cast:
            kind = "wide" if n.op_type in _WIDE_OPS else "half" if n.op_type in _HALF_OPS else "plain"
        ins: list[tuple[str, np.ndarray | None]] = []
        for name in n.input:
            c = self.consts.get(name) if name else None
            if c is not None and cast and _is_float(c):
                c = c.astype(want, copy=False)
                if kind == "wide" and c.dtype == np.float16:
                    c = widen(c)
            ins.append((name, c))
        return _Step(n, OPS[n.op_type], self.attrs[n.name], ins, list(n.output), want, cast, kind, ())

    def _plan(self) -> list[_Step]:
        """The steps to run per batch: nodes of constants alone are computed here (a node that fails stays a step,
        to fail where it always did), and each value is freed after its last reader."""
        steps: list[_Step] = []
        for n in self.nodes:
            step = self._step(n)
            if all(c is not None or not name for name, c in step.inputs):
                try:
                    self.consts.update(self._exec(step, {}))
                    continue
                except Exception:  # noqa: BLE001 - it raises again when run, as it did before
                    pass
            steps.append(step)
        steps = self._tabulate(steps)
        last: dict[str, int] = {}
        for k, st in enumerate(steps):
            for name in [name for name, c in st.inputs if name and c is None] + st.outputs:
                last[name] = k
        keep = set(self.outputs)
        frees: list[list[str]] = [[] for _ in steps]
        for name, k in last.items():
            if name and name not in keep:
                frees[k].append(name)
        return [st._replace(free=tuple(f)) for st, f in zip(steps, frees, strict=True)]

    def _tabulate(self, steps: list[_Step]) -> list[_Step]:
        """Chains of float16 ``_TABLE_OPS`` nodes whose only varying input is one tensor, optionally ending in the
        QuantizeLinear they feed (GELU's Div, Erf, Add, Mul, Mul, then the next GEMM's Q; a Mul by a scalar; a Q
        alone), become one lookup: the chain is run once on all 65,536 float16 values, so the table holds exactly what
        it computes for each, and its intermediate values (each read by the next node alone) are never formed."""
        from onnx import TensorProto

        readers: dict[str, set[int]] = {o: {-1} for o in self.outputs}
        for k, st in enumerate(steps):
            for name, c in st.inputs:
                if name and c is None:
                    readers.setdefault(name, set()).add(k)
        chains: list[tuple[str, list[int]]] = []  # (the varying input, the chain's steps)
        open_at: dict[str, int] = {}  # the last output of a chain that may go on → the chain
        for k, st in enumerate(steps):
            varying = {name for name, c in st.inputs if name and c is None}
            quantize = st.node.op_type == "QuantizeLinear"
            elementwise = st.want == np.float16 and st.cast and st.node.op_type in _TABLE_OPS
            # constants of one element each: every output element depends on its input element alone
            if not ((elementwise or quantize) and len(st.outputs) == 1 and varying
                    and all(c is None or c.size == 1 for _, c in st.inputs)):
                continue
            joins = [open_at.pop(v) for v in varying if v in open_at and readers.get(v) == {k}]
            if joins and varying <= {chains[joins[0]][0], steps[chains[joins[0]][1][-1]].outputs[0]}:
                chains[joins[0]][1].append(k)
                chain = joins[0]
            elif len(varying) == 1:
                chains.append((varying.pop(), [k]))
                chain = len(chains) - 1
            else:
                continue
            if not quantize:  # an int8 output ends the chain
                open_at[st.outputs[0]] = chain
        fused: dict[int, _Step | None] = {}
        for source, ks in chains:
            if self.lowered.types.get(source) != TensorProto.FLOAT16:
                continue  # a float32 source (a Q of float32) is not a function of 16 bits
            table = self._table(source, [steps[k] for k in ks])
            if table is not None:
                fused.update({k: None for k in ks[:-1]})
                fused[ks[-1]] = table
        kept = [fused.get(k, st) for k, st in enumerate(steps)]
        return [st for st in kept if st is not None]

    def _table(self, source: str, chain: list[_Step]) -> _Step | None:
        """The chain as one lookup step (None where it does not reduce to a table of 65,536 values). A source that
        is not float16 when run goes through the chain node by node."""

        def through(x: np.ndarray) -> np.ndarray:
            env = {source: x}
            for st in chain:
                env.update(self._exec(st, env))
            return env[chain[-1].outputs[0]]

        try:
            with np.errstate(all="ignore"):  # the table holds NaN, inf and overflowing inputs too
                table = through(np.arange(1 << 16, dtype=np.uint16).view(np.float16))
        except Exception:  # noqa: BLE001 - left to run node by node, and to fail there as it always did
            return None
        if table.size != 1 << 16:
            return None
        table = table.reshape(-1)
        shapes = [c.shape for st in chain for _, c in st.inputs if c is not None]

        def lookup(node: Any, v: list[np.ndarray], at: dict[str, Any]) -> list[np.ndarray]:
            if v[0].dtype != np.float16:
                return [through(v[0])]
            y = np.take(table, v[0].view(np.uint16), mode="clip")
            return [y.reshape(np.broadcast_shapes(v[0].shape, *shapes))]

        return _Step(chain[-1].node, lookup, {}, [(source, None)], chain[-1].outputs, None, False, "plain", ())

    @staticmethod
    def _exec(s: _Step, env: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        vals: list[Any] = [c if c is not None or not name else env[name] for name, c in s.inputs]  # None: absent
        if s.cast:
            vals = [convert(v, s.want) if v is not None and _is_float(v) else v for v in vals]
        if s.kind == "wide":
            outs = s.fn(s.node, [widen(v) if v is not None and v.dtype == np.float16 else v for v in vals], s.attrs)
        elif s.kind == "half" and all(v is not None and v.dtype == np.float16 for v in vals):
            outs = s.fn(s.node, [widen(v) for v in vals], s.attrs)
            if outs[0].size and np.isnan(np.max(outs[0])):  # NaN ∘ NaN: which one survives is numpy's float16 loop's
                outs = s.fn(s.node, vals, s.attrs)
        else:
            outs = s.fn(s.node, vals, s.attrs)
        res = {}
        for name, val in zip(s.outputs, outs, strict=False):
            if name:
                if s.want is not None and _is_float(val):
                    val = convert(val, s.want)
                res[name] = np.asarray(val)
        return res

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        env: dict[str, np.ndarray] = {}
        for name in self.inputs:
            env[name] = np.asarray(feeds[name]).astype(self.input_types[name], copy=False)
        for s in self.steps:
            env.update(self._exec(s, env))
            for name in s.free:
                env.pop(name, None)
        return [env[o] if o in env else self.consts[o] for o in self.outputs]


# --- the Runner ----------------------------------------------------------------------------


class OracleRunner(Runner):
    """What TensorRT computes for an INT8 Q/DQ or FP16 artifact, on the CPU (numpy)."""

    backend = "oracle"

    def __init__(self, artifact: str | Path | Any, target: str | None = None, manifest: Manifest | None = None,
                 threads: int | None = None) -> None:
        """``artifact``: a path or an onnx.ModelProto (the calibrate guard's candidates). ``target``: what it is
        made for (default: the manifest's). ``threads`` is accepted for the Runner signature; numpy's BLAS decides."""
        from vitdeploy.core.artifact import manifest_from_onnx

        path = artifact if isinstance(artifact, (str, Path)) else "<in-memory model>"
        model = load_model(artifact)
        if manifest is None:
            manifest = manifest_from_onnx(model, path)
        super().__init__(manifest, path)
        self.target = target if target is not None else manifest.target
        self.lowered = lower(model, self.target)
        self.session = OracleSession(self.lowered)
        self.input_name = self.session.inputs[0]

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = self.check_input(batch)
        return np.asarray(self.session.run({self.input_name: x})[0], dtype=np.float32)

    def run_with_tokens(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        from vitdeploy.core.task import TOKENS_OUTPUT

        if TOKENS_OUTPUT not in self.session.outputs[1:]:
            return super().run_with_tokens(batch)
        outs = self.session.run({self.input_name: self.check_input(batch)})
        tokens = outs[self.session.outputs.index(TOKENS_OUTPUT)]
        return np.asarray(outs[0], dtype=np.float32), np.asarray(tokens, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(target=self.target, int8_gemms=len(self.lowered.fused), pinned_fp32=len(self.lowered.pinned))
        return d


def runner_for_target(artifact: str | Path | Any, target: str | None, threads: int | None = None) -> Runner:
    """The runner that judges an artifact made for ``target``: the oracle for a TensorRT target (trt8.5, trt8.6,
    trt10, trt11), the CPU runtime it will run on for a CPU target (cpu, its old name ort, openvino) or no target (OpenVINO where installed, else ONNX
    Runtime). ``artifact``: a path or an onnx.ModelProto."""
    from vitdeploy.core.targets import CPU_TARGETS, TARGETS

    if target is not None and target not in TARGETS and target not in CPU_TARGETS:
        raise VitdeployError(f"unknown target {target!r}: choose one of {', '.join(TARGETS)}")
    if target in TRT_TARGETS:
        return OracleRunner(artifact, target, threads=threads)
    if isinstance(artifact, (str, Path)):
        from vitdeploy.runners import open_runner

        return open_runner(artifact, "auto", threads=threads)
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner(artifact, threads=threads)  # a ModelProto in memory: the guard's candidates
