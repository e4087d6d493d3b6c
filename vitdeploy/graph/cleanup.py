"""Graph clean-up after torch's exporter: onnxslim on a light copy, the I/O contract, the attention scale merged,
and onnx.checker on a copy without the weights.

onnxslim re-runs shape inference on the whole model many times (serializing every weight each time: ~40 s for
vit-base), so it is given a light copy in which every large initializer is a graph input of the same shape, and its
graph then replaces the model's around the weights, which never move. onnx.checker likewise sees the graph with stubs
for the weights (``check_graph``): the weights are never copied, which keeps vit-huge's 2.5 GB export within a few GB.
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitdeploy.core.artifact import BATCH_DIM
from vitdeploy.core.errors import VitdeployError
from vitdeploy.graph.edit import drop_unused_initializers, replace_nodes

if TYPE_CHECKING:
    import onnx

# Initializers with more elements than this are hidden from onnxslim (see the module docstring).
_LIGHT_NUMEL = 256


def node_counts(model: onnx.ModelProto) -> dict[str, int]:
    c = collections.Counter(n.op_type for n in model.graph.node)
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def initializer_bytes(model: onnx.ModelProto) -> int:
    import onnx

    total = 0
    for t in model.graph.initializer:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        total += n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
    return total


def _numel(t: onnx.TensorProto) -> int:
    return int(np.prod(t.dims)) if len(t.dims) else 1


def slim(model: onnx.ModelProto) -> None:
    """onnxslim's folding, dead-code and duplicate elimination, in place, without handing it the weights.

    onnxslim gets a light copy in which every large initializer is a graph input of the same
    shape; its graph then replaces the model's, whose large initializers never move (no copy
    of the weights, which matters at vit-huge's 2.5 GB).
    """
    import onnx
    import onnxslim

    g = model.graph
    big = {t.name for t in g.initializer if _numel(t) > _LIGHT_NUMEL}
    light = onnx.ModelProto()
    light.ir_version = model.ir_version
    light.opset_import.extend(model.opset_import)
    light.graph.name = g.name
    light.graph.node.extend(g.node)
    light.graph.input.extend(g.input)
    light.graph.output.extend(g.output)
    light.graph.initializer.extend(t for t in g.initializer if t.name not in big)
    light.graph.input.extend(
        onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in g.initializer if t.name in big
    )
    graph_inputs = [i.name for i in g.input]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        slim = onnxslim.slim(light)
    if slim is None:
        raise VitdeployError("onnxslim could not simplify the exported graph: report this with the checkpoint's preset")
    kept_inputs = [i for i in slim.graph.input if i.name not in big]
    if [i.name for i in kept_inputs] != graph_inputs:
        raise VitdeployError(f"graph inputs changed while cleaning ({[i.name for i in kept_inputs]}): re-run with --debug")
    sg = slim.graph
    used = {i for n in sg.node for i in n.input} | {o.name for o in sg.output}
    for field_name in ("input", "output", "value_info"):
        g.ClearField(field_name)
    replace_nodes(g, sg.node)
    g.input.extend(kept_inputs)
    g.output.extend(sg.output)
    g.value_info.extend(sg.value_info)
    # keep the large initializers still used, where they are; the small ones come from onnxslim
    for i in reversed(range(len(g.initializer))):
        t = g.initializer[i]
        if t.name not in big or t.name not in used:
            del g.initializer[i]
    g.initializer.extend(sg.initializer)
    model.ClearField("opset_import")
    model.opset_import.extend(slim.opset_import)


def fix_io(model: onnx.ModelProto, num_classes: int, h: int, w: int, outputs: list[list[str | int]] | None = None) -> None:
    """Input [batch, 3, H, W] and output [batch, classes] float32, batch the only symbolic dim; ``outputs``: the
    dims of every output instead (an embedding model's [batch, D] and patch tokens [batch, patches, width])."""
    import onnx

    inp = model.graph.input[0]
    out_dims: list[list[str | int]] = outputs if outputs is not None else [[BATCH_DIM, num_classes]]
    want: list[tuple[Any, list[str | int]]] = [(inp, [BATCH_DIM, 3, h, w])]
    want += [(model.graph.output[i], d) for i, d in enumerate(out_dims)]
    for vi, dims in want:
        if vi.type.tensor_type.elem_type != onnx.TensorProto.FLOAT:
            raise VitdeployError(f"exported {vi.name} is not float32: re-run with --debug")
        shape = vi.type.tensor_type.shape
        shape.ClearField("dim")
        for d in dims:
            dim = shape.dim.add()
            if isinstance(d, str):
                dim.dim_param = d
            else:
                dim.dim_value = int(d)


def merge_attention_scale(model: onnx.ModelProto) -> int:
    """Q·√s and Kᵀ·√s (how torch exports scaled_dot_product_attention) → Q·s, so one Mul scales Q.

    That is the pattern TensorRT fuses (scale on Q, then MatMul → Softmax → MatMul), and it
    saves one Mul per block. Returns the number of attention blocks rewritten.
    """
    from onnx import numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer}
    producer = {o: n for n in g.node for o in n.output}
    consumers: dict[str, int] = collections.Counter(i for n in g.node for i in n.input)
    softmax_in = {n.input[0] for n in g.node if n.op_type == "Softmax"}
    drop: set[int] = set()
    rewritten = 0
    new_inits: dict[bytes, onnx.TensorProto] = {}
    for n in g.node:
        if n.op_type != "MatMul" or n.output[0] not in softmax_in:
            continue
        mq, mk = producer.get(n.input[0]), producer.get(n.input[1])
        if not (mq and mk and mq.op_type == "Mul" and mk.op_type == "Mul"):
            continue
        sq, sk = mq.input[1], mk.input[1]
        if sq != sk or sq not in inits or consumers[mk.output[0]] != 1 or consumers[mq.output[0]] != 1:
            continue
        s = numpy_helper.to_array(inits[sq])
        if s.size != 1:
            continue
        s2 = (s.astype(np.float64) ** 2).astype(s.dtype)
        if s2.tobytes() not in new_inits:
            new_inits[s2.tobytes()] = numpy_helper.from_array(s2, f"attention_scale_{len(new_inits)}")
        mq.input[1] = new_inits[s2.tobytes()].name
        n.input[1] = mk.input[0]
        drop.add(id(mk))
        rewritten += 1
    if rewritten:
        replace_nodes(g, [n for n in g.node if id(n) not in drop])
        g.initializer.extend(new_inits.values())
        drop_unused_initializers(g)
    return rewritten


def fold_constant_linears(model: onnx.ModelProto) -> int:
    """A Linear applied to a constant (MatMul of two float32 initializers, then its bias Add) → its value.

    onnxslim cannot fold it (it never sees the large weights), and torch's exporter does not fold MatMul. The one
    in a ViT is the attention-pooling head's projection of its learned query: folded, no GEMM of a constant is left
    for the INT8 placement to quantize. Computed in float64 and rounded once (as exact as float32 allows). Returns
    how many MatMuls were folded; a graph without one is left untouched.
    """
    from onnx import TensorProto, numpy_helper

    g = model.graph
    inits = {t.name: t for t in g.initializer if t.data_type == TensorProto.FLOAT}
    outputs = {o.name for o in g.output}
    folded: dict[str, np.ndarray] = {}
    drop: set[int] = set()  # node indices
    matmuls = 0
    for k, n in enumerate(g.node):
        if n.op_type not in ("MatMul", "Add") or len(n.input) != 2 or n.output[0] in outputs:
            continue
        if n.op_type == "Add" and not any(i in folded for i in n.input):
            continue  # only the bias of a folded MatMul
        if not all(i in inits or i in folded for i in n.input):
            continue
        a, b = (folded[i] if i in folded else numpy_helper.to_array(inits[i]).astype(np.float64) for i in n.input)
        folded[n.output[0]] = np.matmul(a, b) if n.op_type == "MatMul" else a + b
        drop.add(k)
        matmuls += n.op_type == "MatMul"
    if not drop:
        return 0
    kept = [n for k, n in enumerate(g.node) if k not in drop]
    used = {i for n in kept for i in n.input}
    replace_nodes(g, kept)
    g.initializer.extend(numpy_helper.from_array(v.astype(np.float32), k) for k, v in folded.items() if k in used)
    drop_unused_initializers(g)
    return matmuls


def check_graph(model: onnx.ModelProto, workdir: Path) -> None:
    """onnx.checker (full check: strict shape inference too) on a copy that leaves the weights behind.

    The checker serializes and copies the model several times (9 GB peak for vit-large's 1.2 GB);
    given stubs of the large initializers (name, type, dims, marked external) it checks the
    same graph in megabytes (the stubs point into a sparse file in ``workdir``). What it then
    cannot see, each weight's byte count against its shape, is checked here directly.
    """
    import onnx

    g = model.graph
    skeleton = onnx.ModelProto()
    for f in ("ir_version", "producer_name", "producer_version", "domain", "model_version", "doc_string"):
        setattr(skeleton, f, getattr(model, f))
    skeleton.opset_import.extend(model.opset_import)
    skeleton.metadata_props.extend(model.metadata_props)
    sg = skeleton.graph
    sg.name = g.name
    sg.node.extend(g.node)
    sg.input.extend(g.input)
    sg.output.extend(g.output)
    sg.value_info.extend(g.value_info)
    offset = 0
    for t in g.initializer:
        if _numel(t) <= _LIGHT_NUMEL or t.data_location == onnx.TensorProto.EXTERNAL:
            sg.initializer.append(t)
            continue
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        have = len(t.raw_data) if t.HasField("raw_data") else len(t.float_data) * 4
        if have != _numel(t) * itemsize:
            raise VitdeployError(f"exported weight {t.name} holds {have} bytes for shape {list(t.dims)}: re-run with --debug")
        stub = sg.initializer.add()
        stub.name, stub.data_type = t.name, t.data_type
        stub.dims.extend(t.dims)
        stub.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (("location", "weights.bin"), ("offset", str(offset)), ("length", str(have))):
            entry = stub.external_data.add()
            entry.key, entry.value = k, v
        offset += have
    path = workdir / "skeleton.onnx"
    weights = workdir / "weights.bin"
    onnx.save_model(skeleton, str(path))
    with open(weights, "wb") as fh:
        fh.truncate(offset)  # sparse: no bytes written
    try:
        onnx.checker.check_model(str(path), full_check=True)
    except Exception as e:  # onnx raises ValidationError / InferenceError
        raise VitdeployError(f"the exported graph fails onnx.checker: {str(e).splitlines()[0][:200]}") from None
    finally:
        path.unlink()
        weights.unlink()
