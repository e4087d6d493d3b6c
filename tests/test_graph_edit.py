"""The one graph editor (vitdeploy.graph.edit): opset, node replacement, unused initializers, order."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.graph.edit import drop_unused_initializers, opset, replace_nodes, toposort


def _model(opsets: list[tuple[str, int]]) -> onnx.ModelProto:
    w = numpy_helper.from_array(np.full((2,), 3.0, np.float32), "w")
    unused = numpy_helper.from_array(np.zeros((4,), np.float32), "unused")
    g = helper.make_graph(
        [helper.make_node("Relu", ["b"], ["y"], name="relu"), helper.make_node("Mul", ["x", "w"], ["b"], name="mul")],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
        [w, unused],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])


def test_opset_reads_the_default_domain() -> None:
    assert opset(_model([("com.microsoft", 1), ("", 17)])) == 17
    assert opset(_model([("ai.onnx", 13)])) == 13
    assert opset(_model([("com.microsoft", 1)])) == 0
    # listed twice (onnx.checker refuses it): the highest, which a runtime must support
    assert opset(_model([("", 13), ("ai.onnx", 19)])) == 19


def test_edit_gives_a_runnable_graph() -> None:
    m = _model([("", 17)])
    toposort(m.graph)
    assert [n.name for n in m.graph.node] == ["mul", "relu"]
    assert drop_unused_initializers(m.graph) == 1
    assert [t.name for t in m.graph.initializer] == ["w"]
    neg = helper.make_node("Neg", ["y0"], ["y"], name="neg")
    m.graph.node[1].output[0] = "y0"
    replace_nodes(m.graph, [*m.graph.node, neg])  # nodes of the graph itself plus a new one
    assert [n.name for n in m.graph.node] == ["mul", "relu", "neg"]
    onnx.checker.check_model(m, full_check=True)
    s = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    out = s.run(None, {"x": np.array([1.0, -1.0], np.float32)})[0]
    assert out.tolist() == [-3.0, 0.0]
