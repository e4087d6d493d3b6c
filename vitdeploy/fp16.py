"""FP16 ONNX: float16 weights and activations, float32 input/output, float32 islands where FP16 overflows.

LayerNormalization (the overflow TensorRT warns about for ViTs), Softmax and the
reductions stay in float32; in a strongly typed TensorRT build the graph's
types are the precision, so this is decided here and not by the builder.
Opset < 19 QuantizeLinear/DequantizeLinear take float32 only, so in an INT8
graph with FP16 around it the Q/DQ islands stay float32 behind Casts.
"""

from __future__ import annotations

from typing import Any

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


def opset_of(model: Any) -> int:
    return next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 0)


def to_fp16(model: Any, keep_fp32_nodes: list[str] | None = None) -> Any:
    """The model with float16 inside, float32 at its input/output and in FP32_OPS (and Q/DQ below opset 19)."""
    from onnxruntime.transformers.float16 import DEFAULT_OP_BLOCK_LIST, convert_float_to_float16

    block = list(DEFAULT_OP_BLOCK_LIST) + FP32_OPS
    if opset_of(model) < 19:
        block += QDQ_OPS
    return convert_float_to_float16(
        model,
        keep_io_types=True,
        op_block_list=block,
        node_block_list=list(keep_fp32_nodes or []),
    )


def fp32_islands(model: Any) -> list[str]:
    """Names of the nodes that compute in float32 inside an FP16 graph (for the manifest and tests)."""
    return [n.name for n in model.graph.node if n.op_type in FP32_OPS]
