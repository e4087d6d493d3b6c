"""The one place that edits ONNX graphs in place: node order, node replacement, unused weights, the opset.

Every rewriter (fp16 conversion, Q/DQ insertion, embedded preprocessing, export's clean-up)
goes through these, so a graph is always edited the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

DEFAULT_DOMAINS = ("", "ai.onnx")
# in the name of every node of a LayerNormalization spelled out in primitive ops (graph/target.py): fp16 keeps
# them in float32, the 8.x builder pins them to FP32
LN_MARKER = "/LayerNormDecomposed/"


def opset(model: Any) -> int:
    """The model's default-domain (ai.onnx) opset; 0 when it imports none.

    ``""`` and ``"ai.onnx"`` name the same domain. A valid model imports it once; a model
    that lists it twice (onnx.checker refuses those) is read at its highest version, the one
    a runtime must support to load it.
    """
    return max((int(o.version) for o in model.opset_import if o.domain in DEFAULT_DOMAINS), default=0)


def replace_nodes(graph: Any, nodes: Iterable[Any]) -> None:
    """Make ``nodes`` (NodeProtos, new or taken from ``graph`` itself) the graph's node list, in that order."""
    keep = list(nodes)
    del graph.node[:]
    graph.node.extend(keep)


def drop_unused_initializers(graph: Any) -> int:
    """Remove initializers no node reads and no output names, in place (weights are never copied). Returns how many."""
    used = {i for n in graph.node for i in n.input} | {o.name for o in graph.output}
    dropped = 0
    for i in reversed(range(len(graph.initializer))):
        if graph.initializer[i].name not in used:
            del graph.initializer[i]
            dropped += 1
    return dropped


def toposort(graph: Any, strict: bool = True) -> None:
    """Order the nodes of an onnx.GraphProto so every input is produced before it is read.

    Converters (ONNX Runtime's float16 one among them) append their Casts at the end, which
    runtimes accept but onnx.checker and TensorRT's parser do not. With ``strict=False``, nodes
    whose inputs come from outside the graph (subgraph scopes) keep their order instead of failing.
    """
    available = {i.name for i in graph.input} | {i.name for i in graph.initializer} | {""}
    pending = list(graph.node)
    ordered: list[Any] = []
    while pending:
        rest = []
        for n in pending:
            if all(i in available for i in n.input):
                ordered.append(n)
                available.update(n.output)
            else:
                rest.append(n)
        if len(rest) == len(pending):
            if strict:
                raise ValueError(f"graph has a cycle or a missing input at {rest[0].name}")
            ordered.extend(rest)
            break
        pending = rest
    if [id(n) for n in ordered] != [id(n) for n in graph.node]:
        replace_nodes(graph, ordered)


def constant_values(graph: Any) -> dict[str, Any]:
    """Every tensor name of ``graph`` that holds a constant (initializers, Constant nodes, Identity of either) → its
    value as a numpy array: what quantize, the numerics report and the oracle read weights and scales from."""
    from onnx import numpy_helper

    out = {i.name: numpy_helper.to_array(i) for i in graph.initializer}
    for n in graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    out[n.output[0]] = numpy_helper.to_array(a.t)
        elif n.op_type == "Identity" and n.input[0] in out:
            out[n.output[0]] = out[n.input[0]]
    return out
