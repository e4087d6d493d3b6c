"""Graph edits a target needs: LayerNormalization spelled out for TensorRT 8.5, float16 Q/DQ for 10 and 11.

What a target accepts is read from the version table (``core.targets``); this module only rewrites graphs.

* **LayerNormalization for a parser without its importer** (TensorRT 8.5: onnx-tensorrt 8.5-GA lists it "N"):
  each node becomes ReduceMean → Sub → Mul → ReduceMean → Add(ε) → Sqrt → Div → Mul(γ) → Add(β), the
  definition of the ONNX op (stash_type float32), at the same opset. The nodes carry ``LN_MARKER`` in their
  names, so the FP16 converter keeps the whole pattern in float32 and the 8.x builder pins it to FP32.
* **float16 Q/DQ** (TensorRT 10 and 11 read float16 DequantizeLinear scales, opset ≥ 19): the model goes to
  opset 19, and the FP16 converter then leaves Q/DQ unblocked, so scales, DQ outputs and the quantized GEMMs are
  float16 with no Cast next to a GEMM (a strongly typed build would keep a Cast-wrapped GEMM in float32).
"""

from __future__ import annotations

from typing import Any

from vitdeploy.graph.edit import LN_MARKER, opset, replace_nodes

FP16_QDQ_OPSET = 19  # DequantizeLinear/QuantizeLinear take float16 scales from opset 19


def has_layernorm_op(model: Any) -> bool:
    return any(n.op_type == "LayerNormalization" for n in model.graph.node)


def _rank(model: Any, name: str) -> int | None:
    for vi in list(model.graph.value_info) + list(model.graph.input) + list(model.graph.output):
        if vi.name == name and vi.type.tensor_type.HasField("shape"):
            return len(vi.type.tensor_type.shape.dim)
    return None


def decompose_layernorm(model: Any) -> int:
    """Replace every LayerNormalization by the primitive ops TensorRT 8.5 parses, in place. Returns how many.

    The outputs keep their names (Mean/InvStdDev outputs, which an exported ViT never reads, are refused).
    """
    import numpy as np
    from onnx import helper, numpy_helper

    from vitdeploy.core.errors import VitdeployError

    g = model.graph
    if not has_layernorm_op(model):
        return 0
    if opset(model) >= 18:
        raise VitdeployError(f"LayerNormalization can be spelled out at opset 17 only (ReduceMean's axes attribute); "
                             f"this model is opset {opset(model)}: export it with --opset 17")
    nodes: list[Any] = []
    inits: list[Any] = []
    done = 0
    for n in g.node:
        if n.op_type != "LayerNormalization":
            nodes.append(n)
            continue
        if any(o for o in n.output[1:]):
            raise VitdeployError(f"LayerNormalization {n.name!r} has its Mean/InvStdDev outputs in use: cannot spell it out")
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        axis, eps = int(attrs.get("axis", -1)), float(attrs.get("epsilon", 1e-5))
        if axis < 0:
            axes = list(range(axis, 0))
        else:
            rank = _rank(model, n.input[0])
            if rank is None:
                raise VitdeployError(f"LayerNormalization {n.name!r}: axis {axis} on an input of unknown rank")
            axes = list(range(axis - rank, 0))
        base = f"{n.name or n.output[0]}{LN_MARKER}"
        x, y = n.input[0], n.output[0]
        eps_name = f"{base}epsilon"
        inits.append(numpy_helper.from_array(np.array(eps, np.float32), eps_name))

        def t(s: str) -> str:
            return f"{base}{s}"  # noqa: B023 - used within this iteration only

        nodes += [
            helper.make_node("ReduceMean", [x], [t("mean")], name=t("ReduceMean"), axes=axes, keepdims=1),
            helper.make_node("Sub", [x, t("mean")], [t("centered")], name=t("Sub")),
            helper.make_node("Mul", [t("centered"), t("centered")], [t("squared")], name=t("Mul_square")),
            helper.make_node("ReduceMean", [t("squared")], [t("var")], name=t("ReduceMean_var"), axes=axes, keepdims=1),
            helper.make_node("Add", [t("var"), eps_name], [t("var_eps")], name=t("Add_eps")),
            helper.make_node("Sqrt", [t("var_eps")], [t("std")], name=t("Sqrt")),
            helper.make_node("Div", [t("centered"), t("std")], [t("normed")], name=t("Div")),
        ]
        scale = n.input[1]
        bias = n.input[2] if len(n.input) > 2 and n.input[2] else None
        nodes.append(helper.make_node("Mul", [t("normed"), scale], [t("scaled") if bias else y], name=t("Mul_scale")))
        if bias:
            nodes.append(helper.make_node("Add", [t("scaled"), bias], [y], name=t("Add_bias")))
        done += 1
    replace_nodes(g, nodes)
    g.initializer.extend(inits)
    return done


def decomposed_layernorm_nodes(model: Any) -> list[str]:
    """Names of the nodes of spelled-out LayerNorms (kept in float32 by FP16 conversion, pinned on 8.x builds)."""
    return [n.name for n in model.graph.node if LN_MARKER in n.name]


def to_opset(model: Any, version: int) -> Any:
    """The model at ``version`` (onnx's version converter; the same model where it already is)."""
    if opset(model) >= version:
        return model
    from onnx import version_converter

    converted = version_converter.convert_version(model, version)
    del converted.metadata_props[:]
    converted.metadata_props.extend(model.metadata_props)
    return converted

