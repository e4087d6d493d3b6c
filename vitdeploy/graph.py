"""Small ONNX graph utilities shared by the graph rewriters (fp16 conversion, embedded preprocessing)."""

from __future__ import annotations

from typing import Any


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
        copies = [type(n)() for n in ordered]
        for c, n in zip(copies, ordered, strict=True):
            c.CopyFrom(n)
        del graph.node[:]
        graph.node.extend(copies)
