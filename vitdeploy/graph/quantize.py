"""INT8 as explicit Q/DQ in the ONNX graph: where the pairs go, the ranges they carry, and writing them.

The graph is edited here rather than by ONNX Runtime's quantizer because the
placement is the point: TensorRT builds exactly what the graph says, and a ViT
survives INT8 only when LayerNorm, Softmax, GELU and the residual stream stay
in float (FQ-ViT, PTQ4ViT). So Q/DQ go on both inputs of the encoder's linear
layers and the patch-embedding Conv (and, optionally, the two attention
matmuls), never on a tensor entering LayerNormalization, Softmax, Erf or a
residual Add. int8, symmetric (zero point 0), weights per output channel,
activations per tensor: the form TensorRT 8.5 … 11 accepts.

Ranges come from running the FP32 model in ONNX Runtime with the tensors to
quantize added as outputs, folded into |x| histograms whose bin width doubles
as the range grows, so one pass gives min-max, percentile and entropy (KL)
thresholds alike.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from vitdeploy.graph.edit import constant_values, drop_unused_initializers, replace_nodes

METHODS = ("minmax", "entropy", "percentile")
PERCENTILE = 99.99
HIST_BINS = 2048
QMAX = 127.0


@dataclass(frozen=True)
class Layer:
    """One quantizable layer: a node, the activation inputs it quantizes and its constant weight (if any)."""

    node: str  # node name (unique)
    kind: str  # "linear" (MatMul with constant weight), "conv", "attention" (MatMul of two activations)
    activations: tuple[str, ...]
    weight: str | None = None  # initializer holding the weight (after resolving Identity/Constant)
    weight_input: int = 1
    weight_axis: int = 0  # the output-channel axis of the weight as stored
    weight_bits: int = 8  # 7: the overflow fix of a CPU graph's first layer (first_layer_overflow_fix)


# --- reading the graph ---------------------------------------------------------------------


def _constants(model: Any) -> dict[str, np.ndarray]:
    """Every tensor name that holds a constant (graph.edit.constant_values of the model's graph)."""
    return constant_values(model.graph)


def ensure_node_names(model: Any) -> None:
    """Give every node a unique name; layers are reported and excluded by name."""
    seen: set[str] = set()
    for i, n in enumerate(model.graph.node):
        name = n.name or f"{n.op_type}_{i}"
        while name in seen:
            name = f"{name}_{i}"
        n.name = name
        seen.add(name)


def head_nodes(model: Any) -> set[str]:
    """The classification head: the linear node(s) producing the graph output through bias Adds/Identity only.

    A distilled model (DeiT) answers with the mean of two heads, ``(head(cls) + head_dist(dist)) / 2``: the walk
    goes through that Add of two activations and the division (or product) by a constant to both, so the
    distillation head stays in float like the class head."""
    producers = {o: n for n in model.graph.node for o in n.output}
    consts = _constants(model)
    out: set[str] = set()
    todo = [go.name for go in model.graph.output]
    seen: set[str] = set()
    while todo:
        t = todo.pop()
        if t in seen or t not in producers:
            continue
        seen.add(t)
        n = producers[t]
        if n.op_type in ("MatMul", "Gemm"):
            out.add(n.name)
            continue
        acts = [i for i in n.input if i not in consts]
        if n.op_type in ("Add", "Identity", "Reshape", "Flatten", "Squeeze") and len(acts) == 1:
            todo.append(acts[0])
        elif n.op_type == "Add" and len(acts) == 2 and all(_linear_output(a, producers, consts) for a in acts):
            todo.extend(acts)  # the sum of two heads (each a Linear): both branches, never a residual Add
        elif n.op_type in ("Div", "Mul") and len(acts) == 1 and n.input[0] == acts[0]:  # ... divided by 2
            todo.append(acts[0])
    return out


def _linear_output(t: str, producers: dict[str, Any], consts: dict[str, np.ndarray]) -> bool:
    """``t`` is a Linear's output: MatMul/Gemm with a constant weight, possibly followed by its bias Add."""
    n = producers.get(t)
    if n is not None and n.op_type == "Add":
        acts = [i for i in n.input if i not in consts]
        n = producers.get(acts[0]) if len(acts) == 1 else None
    return n is not None and n.op_type in ("MatMul", "Gemm") and any(i in consts for i in n.input[1:2])


def find_layers(model: Any) -> list[Layer]:
    """Every layer the INT8 graph may quantize, in graph order (attention matmuls included; callers filter).

    The classification head stays in float."""
    consts = _constants(model)
    head = head_nodes(model)
    layers: list[Layer] = []
    for n in model.graph.node:
        if n.name in head:
            continue
        if n.op_type == "Conv" and len(n.input) >= 2 and n.input[1] in consts and n.input[0] not in consts:
            if consts[n.input[1]].dtype == np.float32:
                layers.append(Layer(n.name, "conv", (n.input[0],), n.input[1], 1, 0))
        elif n.op_type == "MatMul":
            a, b = n.input[0], n.input[1]
            if b in consts and a not in consts:
                w = consts[b]
                if w.ndim == 2 and w.dtype == np.float32:
                    layers.append(Layer(n.name, "linear", (a,), b, 1, 1))
            elif a not in consts and b not in consts:
                layers.append(Layer(n.name, "attention", (a, b)))
    return layers


def is_quantized(model: Any) -> bool:
    return any(n.op_type in ("QuantizeLinear", "DequantizeLinear", "QLinearMatMul", "QLinearConv") for n in model.graph.node)


def is_fp16(model: Any) -> bool:
    from onnx import TensorProto

    return any(i.data_type == TensorProto.FLOAT16 for i in model.graph.initializer) or any(
        n.op_type == "Cast" and any(a.name == "to" and a.i == TensorProto.FLOAT16 for a in n.attribute)
        for n in model.graph.node
    )


# --- ranges ---------------------------------------------------------------------------------


class AbsHistogram:
    """Histogram of |x| over [0, bins·width); the width doubles (merging bin pairs) when the range grows."""

    def __init__(self, bins: int = HIST_BINS) -> None:
        self.bins = bins
        self.counts = np.zeros(bins, np.int64)
        self.width = 0.0
        self.amax = 0.0

    def add(self, x: np.ndarray) -> None:
        a = np.abs(np.asarray(x, np.float32).ravel())
        a = a[np.isfinite(a)]
        if a.size == 0:
            return
        m = float(a.max())
        self.amax = max(self.amax, m)
        if m == 0.0:
            self.counts[0] += a.size
            return
        if self.width == 0.0:
            self.width = m / self.bins * (1 + 1e-6)
        while m >= self.width * self.bins:
            self.counts = self.counts.reshape(-1, 2).sum(1)
            self.counts = np.concatenate([self.counts, np.zeros(self.bins - len(self.counts), np.int64)])
            self.width *= 2
        idx = np.minimum((a / self.width).astype(np.int64), self.bins - 1)
        self.counts += np.bincount(idx, minlength=self.bins)

    def used(self) -> np.ndarray:
        last = int(np.flatnonzero(self.counts)[-1]) + 1 if self.counts.any() else 1
        return self.counts[:last]

    def percentile(self, p: float = PERCENTILE) -> float:
        c = self.used()
        total = c.sum()
        if total == 0 or self.width == 0.0:
            return self.amax
        cdf = np.cumsum(c) / total
        i = int(np.searchsorted(cdf, p / 100.0))
        return float(min(self.amax, (i + 1) * self.width))

    def entropy(self, levels: int = 128) -> float:
        """The threshold minimising KL(P‖Q) between the clipped distribution and its 128-level quantization (TensorRT's legacy calibrator).

        What does not depend on the candidate threshold is computed once, before the loop over the candidates."""
        c = self.used().astype(np.float64)
        n = len(c)
        if n <= levels or self.width == 0.0:
            return self.amax
        best, best_i = np.inf, n
        step = max(1, (n - levels) // 256)
        tail = np.concatenate([np.cumsum(c[::-1])[::-1], [0.0]])  # tail[i] = mass at or beyond bin i
        nonempty = c > 0
        nonempty_count = nonempty.astype(np.float64)
        k = np.arange(levels)
        for i in range(levels, n + 1, step):
            p = c[:i].copy()
            p[i - 1] += tail[i]
            # quantize the first i bins into `levels` groups (np.linspace(0, i, levels + 1)'s starts), spreading each
            # group's mass over its non-empty bins
            starts = (k * (i / levels)).astype(np.int64)
            mean = np.add.reduceat(c[:i], starts) / np.maximum(np.add.reduceat(nonempty_count[:i], starts), 1.0)
            q = np.where(nonempty[:i], np.repeat(mean, np.diff(starts, append=i)), 0.0)
            ps, qs = p.sum(), q.sum()
            if ps == 0 or qs == 0:
                continue
            p /= ps
            q /= qs
            mask = p > 0
            pm = p[mask]
            kl = float(np.sum(pm * np.log(pm / np.maximum(q[mask], 1e-12))))
            if kl < best:
                best, best_i = kl, i
        return float(min(self.amax, best_i * self.width))

    def threshold(self, method: str) -> float:
        if method == "minmax":
            return self.amax
        if method == "percentile":
            return self.percentile()
        if method == "entropy":
            return self.entropy()
        raise ValueError(f"unknown calibration method {method!r}: choose one of {', '.join(METHODS)}")


def tensors_to_calibrate(layers: Iterable[Layer]) -> list[str]:
    seen: dict[str, None] = {}
    for layer in layers:
        for t in layer.activations:
            seen.setdefault(t, None)
    return list(seen)


def with_outputs(model: Any, names: list[str]) -> Any:
    """A copy of the model that also returns the named intermediate tensors (float32)."""
    from onnx import TensorProto, helper

    m = copy.deepcopy(model)
    have = {o.name for o in m.graph.output}
    for t in names:
        if t not in have:
            m.graph.output.append(helper.make_tensor_value_info(t, TensorProto.FLOAT, None))
    return m


@dataclass
class RangeCollector:
    """Accumulates |x| histograms of the tensors to calibrate over batches."""

    names: list[str]
    hists: dict[str, AbsHistogram] = field(default_factory=dict)
    images: int = 0

    def add(self, outputs: dict[str, np.ndarray], n: int) -> None:
        for t in self.names:
            self.hists.setdefault(t, AbsHistogram()).add(outputs[t])
        self.images += n

    def thresholds(self) -> dict[str, dict[str, float]]:
        """Per tensor: {method: amax} for every method, so a change of method needs no new pass."""
        return {t: {m: h.threshold(m) for m in METHODS} for t, h in self.hists.items()}


# --- writing Q/DQ ---------------------------------------------------------------------------


def _scale(amax: float) -> np.float32:
    return np.float32(max(float(amax), 1e-8) / QMAX)


def quantize_weight(w: np.ndarray, axis: int, bits: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric per-output-channel int8 ([-127, 127]; [-63, 63] with ``bits=7``) and the float32 scales."""
    qmax = float(2 ** (bits - 1) - 1)
    red = tuple(i for i in range(w.ndim) if i != axis)
    amax = np.abs(w).max(axis=red)
    scale = (np.maximum(amax, 1e-8) / qmax).astype(np.float32)
    shape = [1] * w.ndim
    shape[axis] = -1
    q = np.clip(np.round(w / scale.reshape(shape)), -qmax, qmax).astype(np.int8)
    return q, scale


QuantizedWeights = dict[str, tuple[np.ndarray, np.ndarray]]  # layer node → (int8 weight, scales)


def quantize_weights(model: Any, layers: Iterable[Layer]) -> QuantizedWeights:
    """Every weighted layer's int8 weight and scales, computed once for all the graphs built from them."""
    consts = _constants(model)
    return {la.node: quantize_weight(consts[la.weight], la.weight_axis, la.weight_bits) for la in layers
            if la.weight is not None}


def insert_qdq(
    model: Any,
    layers: list[Layer],
    amax: dict[str, float],
    weights: QuantizedWeights | None = None,
    keep_float: bool = False,
) -> Any:
    """A copy of the model with Q/DQ on the inputs of ``layers``; other consumers keep the float tensors.

    ``weights``: from ``quantize_weights`` (else each weight is quantized here). ``keep_float``
    keeps the float weights too, so the layers can switch back to them (``SwitchableQDQ``).
    """
    from onnx import helper, numpy_helper

    m = copy.deepcopy(model)
    if weights is None:
        weights = quantize_weights(m, layers)
    by_name = {n.name: n for n in m.graph.node}
    new_inits: list[Any] = []
    act_dq: dict[str, str] = {}  # activation tensor → its DQ output (one pair per tensor, shared by quantized consumers)
    qdq_nodes: dict[str, list[Any]] = {}  # insert before the first consumer, after the producer

    def tname(base: str, suffix: str) -> str:
        return f"{base}_{suffix}"

    for layer in layers:
        node = by_name[layer.node]
        new_nodes: list[Any] = []
        for t in layer.activations:
            if t not in act_dq:
                s_name, z_name = tname(t, "scale"), tname(t, "zero_point")
                new_inits.append(numpy_helper.from_array(np.array(_scale(amax[t]), np.float32), s_name))
                new_inits.append(numpy_helper.from_array(np.array(0, np.int8), z_name))
                q_out, dq_out = tname(t, "QuantizeLinear"), tname(t, "DequantizeLinear")
                new_nodes.append(helper.make_node("QuantizeLinear", [t, s_name, z_name], [q_out], name=f"{t}_QuantizeLinear"))
                new_nodes.append(helper.make_node("DequantizeLinear", [q_out, s_name, z_name], [dq_out], name=f"{t}_DequantizeLinear"))
                act_dq[t] = dq_out
            for i, inp in enumerate(node.input):
                if inp == t and i != (layer.weight_input if layer.weight else -1):
                    node.input[i] = act_dq[t]
        if layer.weight is not None:
            q, scale = weights[layer.node]
            base = f"{layer.node}_weight"
            new_inits.append(numpy_helper.from_array(q, f"{base}_quantized"))
            new_inits.append(numpy_helper.from_array(scale, f"{base}_scale"))
            new_inits.append(numpy_helper.from_array(np.zeros(scale.shape, np.int8), f"{base}_zero_point"))
            new_nodes.append(
                helper.make_node(
                    "DequantizeLinear",
                    [f"{base}_quantized", f"{base}_scale", f"{base}_zero_point"],
                    [f"{base}_DequantizeLinear"],
                    name=f"{base}_DequantizeLinear",
                    axis=layer.weight_axis,
                )
            )
            node.input[layer.weight_input] = f"{base}_DequantizeLinear"
        qdq_nodes[layer.node] = new_nodes
    nodes = []
    for n in m.graph.node:
        nodes.extend(qdq_nodes.get(n.name, []))
        nodes.append(n)
    replace_nodes(m.graph, nodes)
    m.graph.initializer.extend(new_inits)
    if not keep_float:
        drop_unused_initializers(m.graph)
    return m


class LayerSwitch(Protocol):
    """What the accuracy guard needs of an INT8 graph: its layers, and the graph with some of them in float."""

    layers: list[Layer]

    def select(self, excluded: Iterable[str]) -> Any: ...

    def final(self, excluded: Iterable[str]) -> Any: ...


class SwitchableQDQ:
    """One Q/DQ graph of every layer, whose layers switch between INT8 and float in place.

    The accuracy guard probes many subsets of layers; this quantizes each weight once and
    copies the model once, and a probe only rewires the switched layers' inputs (the unused
    Q/DQ branches are pruned by the runtime). ``final`` writes the clean graph of one subset,
    node for node what ``insert_qdq`` writes for it, from the same quantized weights.
    """

    def __init__(self, model: Any, layers: list[Layer], amax: dict[str, float]) -> None:
        self.source = model
        self.layers = list(layers)
        self.amax = amax
        self.weights = quantize_weights(model, self.layers)
        self.model = insert_qdq(model, self.layers, amax, self.weights, keep_float=True)
        floats = {n.name: list(n.input) for n in model.graph.node}
        self._nodes = {n.name: n for n in self.model.graph.node if n.name in floats}
        self._inputs = {la.node: (floats[la.node], list(self._nodes[la.node].input)) for la in self.layers}

    def select(self, excluded: Iterable[str]) -> Any:
        """The shared graph with ``excluded`` layers in float and the rest INT8 (valid until the next call)."""
        out = set(excluded)
        for name, (fl, q) in self._inputs.items():
            node = self._nodes[name]
            want = fl if name in out else q
            if list(node.input) != want:
                del node.input[:]
                node.input.extend(want)
        return self.model

    def final(self, excluded: Iterable[str]) -> Any:
        """A standalone model with ``excluded`` layers in float, without the unused float weights and Q/DQ."""
        out = set(excluded)
        return insert_qdq(self.source, [la for la in self.layers if la.node not in out], self.amax, self.weights)



# --- the CPU target (ort: ONNX Runtime / OpenVINO) ------------------------------------------


def attention_score_layers(model: Any, layers: Iterable[Layer]) -> list[Layer]:
    """The attention matmuls that make the scores (Q·Kᵀ), not the ones that weigh V by the Softmax output.

    NNCF's transformer scheme (nncf/openvino/quantization/ignored_patterns.py, the softmax→matmul patterns)
    quantizes Q·Kᵀ and leaves Softmax·V in float; measured on OpenVINO (README "calibrate --target ort"),
    Q·Kᵀ in int8 is where the CPU gains and Softmax·V in int8 costs accuracy for little speed.
    """
    producers = {o: n for n in model.graph.node for o in n.output}
    through = ("Reshape", "Transpose", "Squeeze", "Unsqueeze", "Identity", "Cast")

    def from_softmax(t: str) -> bool:
        n = producers.get(t)
        while n is not None and n.op_type in through:
            n = producers.get(n.input[0])
        return n is not None and n.op_type == "Softmax"

    return [la for la in layers if la.kind == "attention" and not any(from_softmax(t) for t in la.activations)]


def first_layer_overflow_fix(model: Any, layers: list[Layer]) -> list[Layer]:
    """The layers with the weights of the image-reading layer (the patch embedding's Conv) in 7 bits.

    On a CPU without VNNI (AVX2 only), OpenVINO's int8 kernel for a layer reading the image multiplies u8 by s8 and
    adds pairs in int16 with saturation (255 * 127 * 2 > 32767): measured here on an AVX2-only AMD EPYC, the digits
    ViT's patch-embedding Conv came out with max |error| 26% of its range on OpenVINO 2026.4 (ONNX Runtime exact), and
    91 of 360 top-1 answers changed. With 7-bit weights (255 * 63 * 2 < 32767) OpenVINO and ONNX Runtime agree
    exactly there. NNCF does the same by default (``AdvancedQuantizationParameters.overflow_fix="first_layer_only"``),
    and an artifact cannot know the CPU it will run on, so a CPU graph always gets it."""
    import dataclasses

    inputs = {i.name for i in model.graph.input}
    first = {la.node for la in layers if la.weight is not None and (la.kind == "conv" or set(la.activations) & inputs)}
    return [dataclasses.replace(la, weight_bits=7) if la.node in first else la for la in layers]


def cpu_layers(model: Any, layers: list[Layer], quantize_attention: bool) -> list[Layer]:
    """The layers an INT8 graph for a CPU quantizes: every linear/conv layer and Q·Kᵀ (Softmax·V too with
    ``quantize_attention``), in graph order; the patch embedding's weights in 7 bits (first_layer_overflow_fix)."""
    scores = {la.node for la in attention_score_layers(model, layers)}
    return first_layer_overflow_fix(model, [la for la in layers if la.kind != "attention" or quantize_attention
                                            or la.node in scores])


# --- a graph quantized elsewhere (NNCF's): its layers back to float ---------------------------


GEMM_OPS = ("MatMul", "Gemm", "Conv")
LAYOUT_OPS = ("Transpose", "Reshape", "Squeeze", "Unsqueeze", "Identity", "Flatten")


class QuantizedGraphSwitch:
    """The guard's switch (SwitchableQDQ's interface) over a graph that arrived quantized, e.g. NNCF's.

    A layer is a MatMul/Gemm/Conv fed by DequantizeLinear; in float it reads, instead, the tensor each DQ stands for
    (its QuantizeLinear's input: the weights must arrive as float initializer -> Q -> DQ), and its bias as ``original``
    (the FP32 model) has it where the quantizer changed it (NNCF's bias correction: the Conv's bias input, or the
    constant of the Add that follows a MatMul). Anything else the quantizer did (SmoothQuant's Mul and scaled weights,
    exact in FP32) stays, so reverting a layer changes nothing else. ``final`` drops the Q/DQ nodes and initializers
    no layer reads any more and stores each quantized weight as integers (Q folded), as NNCF itself does.
    """

    def __init__(self, model: Any, original: Any | None = None) -> None:
        from onnx import numpy_helper

        self.model = copy.deepcopy(model)
        ensure_node_names(self.model)
        graph = self.model.graph
        producers = {o: n for n in graph.node for o in n.output}
        consumers: dict[str, list[Any]] = {}
        for n in graph.node:
            for t in n.input:
                consumers.setdefault(t, []).append(n)
        consts = _constants(self.model)
        before = _constants(original) if original is not None else {}
        restored: dict[str, np.ndarray] = {}

        def float_of(t: str) -> str:
            """The FP32 tensor for ``t``: the original values of a constant the quantizer changed."""
            if t in consts and t in before and (consts[t].shape != before[t].shape or
                                                not np.array_equal(consts[t], before[t])):
                restored[f"{t}_fp32"] = before[t]
                return f"{t}_fp32"
            return t

        self.layers: list[Layer] = []
        self._edits: dict[str, list[tuple[Any, list[str], list[str]]]] = {}
        for n in graph.node:
            if n.op_type not in GEMM_OPS:
                continue
            fl = list(n.input)
            edits = []
            for i, t in enumerate(n.input[:2]):
                # from the GEMM's input back through layout ops (K's Transpose) to a DequantizeLinear
                reader, at, dq = n, i, producers.get(t)
                while dq is not None and dq.op_type in LAYOUT_OPS and dq.input:
                    reader, at, dq = dq, 0, producers.get(dq.input[0])
                q = producers.get(dq.input[0]) if dq is not None and dq.op_type == "DequantizeLinear" else None
                if q is None or q.op_type != "QuantizeLinear":
                    continue
                if reader is n:
                    fl[i] = str(q.input[0])
                else:
                    rf = list(reader.input)
                    rf[at] = str(q.input[0])
                    edits.append((reader, rf, list(reader.input)))
            if fl == list(n.input) and not edits:
                continue
            if n.op_type in ("Conv", "Gemm") and len(fl) > 2:  # its own bias input
                fl[2] = float_of(fl[2])
            edits.insert(0, (n, fl, list(n.input)))
            for c in consumers.get(n.output[0], []):  # the bias Add after a MatMul
                if c.op_type == "Add":
                    cf = [float_of(t) for t in c.input]
                    if cf != list(c.input):
                        edits.append((c, cf, list(c.input)))
            weighted = n.op_type == "Conv" or fl[1] in consts
            kind = "conv" if n.op_type == "Conv" else "linear" if weighted else "attention"
            acts = tuple(t for t in fl[:2] if t not in consts)
            self.layers.append(Layer(n.name, kind, acts, fl[1] if weighted else None))
            self._edits[n.name] = edits
        graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in restored.items())

    def select(self, excluded: Iterable[str]) -> Any:
        """The shared graph with ``excluded`` layers in float and the rest INT8 (valid until the next call)."""
        out = set(excluded)
        for name, edits in self._edits.items():
            for node, fl, q in edits:
                want = fl if name in out else q
                if list(node.input) != want:
                    del node.input[:]
                    node.input.extend(want)
        return self.model

    def final(self, excluded: Iterable[str]) -> Any:
        """A standalone model with ``excluded`` layers in float: the Q/DQ nodes and initializers left unread dropped,
        and each constant QuantizeLinear folded into an integer initializer (int8 weights on disk)."""
        from onnx import numpy_helper

        m = copy.deepcopy(self.select(excluded))
        graph = m.graph
        outputs = {o.name for o in graph.output}
        while True:  # drop nodes whose outputs nobody reads (the bypassed Q/DQ chains), until none is left
            read = {t for n in graph.node for t in n.input} | outputs
            keep = [n for n in graph.node if any(o in read for o in n.output)]
            if len(keep) == len(graph.node):
                break
            replace_nodes(graph, keep)
        consts = _constants(m)
        folded, nodes = [], []
        for n in graph.node:
            if n.op_type == "QuantizeLinear" and n.input[0] in consts and len(n.input) > 2 and n.input[2] in consts:
                x, scale, zp = consts[n.input[0]], consts[n.input[1]], consts[n.input[2]]
                axis = next((a.i for a in n.attribute if a.name == "axis"), 1)
                shape = [1] * x.ndim
                if scale.size > 1:
                    shape[axis % x.ndim] = -1
                info = np.iinfo(zp.dtype)
                q = np.round(x / scale.astype(np.float32).reshape(shape)) + zp.astype(np.float32).reshape(
                    shape if zp.size > 1 else ())
                folded.append(numpy_helper.from_array(np.clip(q, info.min, info.max).astype(zp.dtype), n.output[0]))
                continue
            nodes.append(n)
        replace_nodes(graph, nodes)
        graph.initializer.extend(folded)
        drop_unused_initializers(graph)
        return m
