"""Preprocessing folded into the graph: raw RGB pixels (0–255) in, logits out.

The most common deployment bug is preprocessing re-implemented differently on
the device (jetson-inference hard-codes ImageNet mean/std, DeepStream has one
scale factor for all channels). A graph that takes the resized image as it
comes from a camera or decoder and does the scaling, mean/std and layout change
itself cannot disagree with training. Only resize/crop stays outside.

Graph surgery on an existing ONNX model, so it works the same for the FP32, the
FP16 (float16 tensors) and the Q/DQ INT8 artifacts: new input → Cast → (channel
reorder) → ·rescale → −mean → ÷std → Transpose → Cast to the old input's type →
the original graph, which reads the old input name as an inner tensor. The ops
are exactly those of ``preprocess.to_array``, in float32, so the logits equal the
normal pipeline's on the same resized image.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.naming import raw_variant_name as raw_variant_name  # re-exported: callers import it from here
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.graph.edit import replace_nodes, toposort

RAW_INPUT = "images"
LAYOUTS = ("nhwc", "nchw")
DTYPES = ("uint8", "float32")


@dataclass(frozen=True)
class InputSpec:
    """What the embedded graph's input is: recorded in its manifest as ``input``."""

    name: str
    dtype: str  # "uint8" | "float32"
    layout: str  # "NHWC" | "NCHW"
    shape: list[Any]  # [batch, H, W, 3] or [batch, 3, H, W]; batch is a name when dynamic

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "dtype": self.dtype, "layout": self.layout, "shape": list(self.shape),
            "range": [0, 255], "preprocess_in_graph": True,
        }


def _dims(vi: Any) -> list[Any]:
    return [d.dim_param if d.dim_param else (d.dim_value if d.HasField("dim_value") else "?") for d in vi.type.tensor_type.shape.dim]


def _image_input(g: Any, pp: Preprocess, input_name: str) -> tuple[Any, int, Any]:
    """The graph's one image input [batch, 3, H, W] (float or float16), its element type and batch dim."""
    from onnx import TensorProto

    inits = {i.name for i in g.initializer}
    inputs = [i for i in g.input if i.name not in inits]
    if len(inputs) != 1:
        raise VitdeployError(f"expected a model with one image input, found {len(inputs)}: {[i.name for i in inputs]}")
    old = inputs[0]
    old_type = old.type.tensor_type.elem_type
    dims = _dims(old)
    h, w = pp.input_size
    if len(dims) != 4 or dims[1] != 3 or (dims[2], dims[3]) != (h, w):
        raise VitdeployError(
            f"input {old.name} has shape {dims}, expected [batch, 3, {h}, {w}] as the manifest says; "
            "is preprocessing already in this graph?"
        )
    if old_type not in (TensorProto.FLOAT, TensorProto.FLOAT16):
        raise VitdeployError(f"input {old.name} is {TensorProto.DataType.Name(old_type)}, expected a float image batch")
    if input_name == old.name or any(input_name in (n.name, *n.output) for n in g.node):
        raise VitdeployError(f"the name {input_name!r} is taken in this graph; choose another input name")
    return old, old_type, dims[0]


def _preprocess_nodes(
    pp: Preprocess, dtype: str, layout: str, input_name: str, target: str, target_type: int
) -> tuple[list[Any], list[Any]]:
    """Nodes and constants from the raw input to ``target`` (the model's old input): cast, BGR, rescale, mean, std, NCHW."""
    from onnx import TensorProto, helper, numpy_helper

    p = f"{input_name}/pre"  # prefix of the new nodes and constants
    nodes: list[Any] = []
    consts: list[Any] = []

    def const(name: str, arr: np.ndarray) -> str:
        consts.append(numpy_helper.from_array(arr, f"{p}/{name}"))
        return f"{p}/{name}"

    chan_axis = 3 if layout == "nhwc" else 1
    bshape = [1, 1, 1, 3] if layout == "nhwc" else [1, 3, 1, 1]
    x = input_name
    if dtype != "float32":
        nodes.append(helper.make_node("Cast", [x], [f"{p}/float"], to=TensorProto.FLOAT, name=f"{p}/Cast"))
        x = f"{p}/float"
    if pp.channel_order == "BGR":  # to_array reverses RGB → BGR before the mean/std, which are given in BGR order
        idx = const("bgr", np.array([2, 1, 0], np.int64))
        nodes.append(helper.make_node("Gather", [x, idx], [f"{p}/bgr_out"], axis=chan_axis, name=f"{p}/ToBGR"))
        x = f"{p}/bgr_out"
    steps = [
        ("Mul", "rescale", np.array(pp.rescale, np.float32).reshape(1, 1, 1, 1)),
        ("Sub", "mean", np.asarray(pp.mean, np.float32).reshape(bshape)),
        ("Div", "std", np.asarray(pp.std, np.float32).reshape(bshape)),
    ]
    for op, cname, arr in steps:
        c = const(cname, arr)
        nodes.append(helper.make_node(op, [x, c], [f"{p}/{cname}_out"], name=f"{p}/{op}"))
        x = f"{p}/{cname}_out"
    if layout == "nhwc":
        out = target if target_type == TensorProto.FLOAT else f"{p}/nchw"
        nodes.append(helper.make_node("Transpose", [x], [out], perm=[0, 3, 1, 2], name=f"{p}/ToNCHW"))
        x = out
    if target_type != TensorProto.FLOAT:
        nodes.append(helper.make_node("Cast", [x], [target], to=target_type, name=f"{p}/CastToModel"))
    elif x != target:
        nodes.append(helper.make_node("Identity", [x], [target], name=f"{p}/Identity"))
    return nodes, consts


def _append_softmax(g: Any) -> None:
    """Replace the one (logits) output by float32 softmax probabilities named ``probs``."""
    from onnx import TensorProto, helper

    if len(g.output) != 1:
        raise VitdeployError(f"expected one output (logits), found {len(g.output)}")
    lo = g.output[0]
    y = lo.name
    if lo.type.tensor_type.elem_type != TensorProto.FLOAT:
        g.node.append(helper.make_node("Cast", [y], [f"{y}/float"], to=TensorProto.FLOAT, name="post/Cast"))
        y = f"{y}/float"
    g.node.append(helper.make_node("Softmax", [y], ["probs"], axis=-1, name="post/Softmax"))
    out_dims = _dims(lo)
    del g.output[:]
    g.output.append(helper.make_tensor_value_info("probs", TensorProto.FLOAT, out_dims))


def embed_model(
    model: Any,
    pp: Preprocess,
    dtype: str = "uint8",
    layout: str = "nhwc",
    input_name: str = RAW_INPUT,
    softmax: bool = False,
) -> tuple[Any, InputSpec]:
    """A copy of the onnx.ModelProto that takes raw 0–255 RGB pixels; ``softmax`` adds a float32 ``probs`` output."""
    import onnx
    from onnx import TensorProto, helper

    if dtype not in DTYPES:
        raise VitdeployError(f"input dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    if layout not in LAYOUTS:
        raise VitdeployError(f"layout must be one of {', '.join(LAYOUTS)}, not {layout!r}")
    m = onnx.ModelProto()
    m.CopyFrom(model)
    g = m.graph
    old, old_type, batch = _image_input(g, pp, input_name)
    nodes, consts = _preprocess_nodes(pp, dtype, layout, input_name, old.name, old_type)
    h, w = pp.input_size
    shape = [batch, h, w, 3] if layout == "nhwc" else [batch, 3, h, w]
    new_in = helper.make_tensor_value_info(input_name, TensorProto.UINT8 if dtype == "uint8" else TensorProto.FLOAT, shape)
    kept_inputs = [i for i in g.input if i.name != old.name]
    del g.input[:]
    g.input.extend([new_in, *kept_inputs])
    replace_nodes(g, [*nodes, *g.node])
    g.initializer.extend(consts)
    if softmax:
        _append_softmax(g)
    toposort(g, strict=False)
    onnx.checker.check_model(m)
    return m, InputSpec(input_name, dtype, layout.upper(), shape)


def raw_batch(images: list[np.ndarray] | np.ndarray, spec: dict[str, Any]) -> np.ndarray:
    """Resized uint8 HWC images → the batch an embedded graph with this ``input`` spec takes."""
    a = np.stack(list(images)) if not isinstance(images, np.ndarray) else images
    if spec.get("layout", "NHWC") == "NCHW":
        a = a.transpose(0, 3, 1, 2)
    return np.ascontiguousarray(a, dtype=np.uint8 if spec.get("dtype", "uint8") == "uint8" else np.float32)
