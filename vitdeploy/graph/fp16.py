"""FP16 ONNX: float16 weights and activations, float32 input/output, float32 islands where FP16 overflows.

LayerNormalization (the overflow TensorRT warns about for ViTs), Softmax and the
reductions stay in float32; in a strongly typed TensorRT build the graph's
types are the precision, so this is decided here and not by the builder.
Opset < 19 QuantizeLinear/DequantizeLinear take float32 only, so in an INT8
graph with FP16 around it the Q/DQ islands stay float32 behind Casts.
"""

from __future__ import annotations

from typing import Any

from vitdeploy.graph.edit import LN_MARKER, opset, replace_nodes, toposort

# Ops kept in float32: normalisation and reductions overflow or lose too much in float16.
FP32_OPS = [
    "LayerNormalization",
    "Softmax",
    "ReduceMean",
    "ReduceSum",
    "ReduceSumSquare",
    "ReduceMax",
    "ReduceMin",
    "ReduceProd",
    "ReduceL1",
    "ReduceL2",
    "ReduceLogSum",
    "ReduceLogSumExp",
    "Pow",
    "Sqrt",
]
QDQ_OPS = ["QuantizeLinear", "DequantizeLinear"]


def to_fp16(model: Any, keep_fp32_nodes: list[str] | None = None) -> Any:
    """The model with float16 inside, float32 at its input/output and in FP32_OPS and spelled-out LayerNorms (and
    Q/DQ below opset 19: from 19 they take float16 scales, so the quantized layers are float16 too)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    block = list(DEFAULT_OP_BLOCK_LIST) + FP32_OPS
    if opset(model) < 19:
        block += QDQ_OPS
    m16 = convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=block,
        node_block_list=list(keep_fp32_nodes or []) + [n.name for n in model.graph.node if LN_MARKER in n.name],
    )
    drop_cast_round_trips(m16)
    drop_repeated_nodes(m16.graph)
    toposort(m16.graph)
    return m16


def drop_repeated_nodes(graph: Any) -> int:
    """Remove nodes that repeat an earlier node exactly (same op, inputs, outputs and attributes).

    The float16 converter gives an initializer shared by several float32-kept consumers one Cast per
    consumer, all with the same node and output name (when the exporter has deduplicated equal weights),
    which ONNX Runtime refuses to load; one Cast serves them all.
    """
    seen: dict[tuple[str, ...], Any] = {}
    keep, dropped = [], 0
    for n in graph.node:
        key = (n.op_type, n.domain, *n.input, "->", *n.output, *sorted(a.SerializeToString().hex() for a in n.attribute))
        if n.output and key in seen:
            dropped += 1
            continue
        seen[key] = n
        keep.append(n)
    if dropped:
        replace_nodes(graph, keep)
    return dropped


def drop_cast_round_trips(model: Any) -> int:
    """Remove float32 → Cast(float16) → Cast(float32) chains between two float32 nodes (lossy and useless).

    The converter casts every blocked node's output to float16 and every blocked node's input back to float32,
    so two float32 islands side by side (LayerNorm → QuantizeLinear, DequantizeLinear → MatMul) get a round trip
    that would also keep TensorRT from fusing DequantizeLinear into its MatMul. Returns the number removed.
    """
    from onnx import TensorProto

    g = model.graph
    types = {vi.name: vi.type.tensor_type.elem_type for vi in list(g.value_info) + list(g.input) + list(g.output)}
    types.update({i.name: i.data_type for i in g.initializer})
    producer = {o: n for n in g.node for o in n.output}

    def cast_to(n: Any) -> int | None:
        return next((a.i for a in n.attribute if a.name == "to"), None) if n.op_type == "Cast" else None

    rename: dict[str, str] = {}
    for n in g.node:
        if cast_to(n) != TensorProto.FLOAT:
            continue
        first = producer.get(n.input[0])
        if first is None or cast_to(first) != TensorProto.FLOAT16:
            continue
        src = first.input[0]
        src_node = producer.get(src)
        src_type = types.get(src)
        if src_type is None and src_node is not None and cast_to(src_node) is not None:
            src_type = cast_to(src_node)
        if src_type == TensorProto.FLOAT:
            rename[n.output[0]] = src
    if not rename:
        return 0
    outputs = {o.name for o in g.output}
    for n in g.node:
        for i, name in enumerate(n.input):
            if name in rename:
                n.input[i] = rename[name]
    for o in list(outputs & set(rename)):  # a graph output keeps its name: leave that Cast in place
        del rename[o]
    used = {i for n in g.node for i in n.input} | outputs
    changed = True
    while changed:  # drop Casts nothing reads any more
        keep = [n for n in g.node if n.op_type != "Cast" or n.output[0] in used]
        changed = len(keep) != len(g.node)
        if changed:
            replace_nodes(g, keep)
            used = {i for n in g.node for i in n.input} | outputs
    return len(rename)


def fp32_islands(model: Any) -> list[str]:
    """Names of the nodes that compute in float32 inside an FP16 graph (for the manifest and tests), and that an 8.x
    FP16/INT8 build pins to FP32: LayerNorm (one op or spelled out), Softmax, the reductions."""
    return [n.name for n in model.graph.node if n.op_type in FP32_OPS or LN_MARKER in n.name]


def pinned_fp32_nodes(model: Any) -> set[str]:
    """The nodes an 8.x (weakly typed) FP16/INT8 build pins to FP32: the islands every FP16 graph keeps
    (fp32_islands), and the nodes convert-fp16 / calibrate kept float32 because numerics measured a tensor they make
    or read past float16's range (the manifest's numerics.kept_fp32_nodes). Declaring them float32 in the graph is
    not enough there: under the FP16 flag the builder may still pick FP16 for a float32 layer unless its precision is
    constrained (TensorRT "Precision Control"), and FP16 is where those tensors overflow."""
    from vitdeploy.core.artifact import manifest_from_onnx

    names = set(fp32_islands(model))
    try:
        record = manifest_from_onnx(model, "the graph").extra.get("numerics") or {}
    except Exception:  # no vitdeploy manifest: only the islands every FP16 graph has
        return names
    kept = record.get("kept_fp32_nodes") if isinstance(record, dict) else None
    return names | {n for n in (kept or []) if isinstance(n, str)}
