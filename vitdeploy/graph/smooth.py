"""SmoothQuant-style migration: a per-channel factor moved from a LayerNorm's γ/β into the next MatMul's weight rows.

Pretrained ViTs carry a few LayerNorm output channels far wider than the rest (RepQ-ViT); per-tensor INT8 then
gives the other channels a handful of levels. SmoothQuant (Xiao et al., 2023) divides each activation channel j by
s_j and multiplies row j of the next weight by s_j, with s_j = max|X_j|^α / max|W_j|^(1−α): the product is
unchanged and the activation's range is shared with the per-output-channel quantized weight.

Here the division goes into the LayerNorm's own γ and β (LN(x)_j / s_j = LN(x; γ/s, β/s)_j), so the edit changes
initializers only: no node is added or moved, and the Q/DQ that calibrate places afterwards sit exactly where they
would have, in the LayerNorm → Q/DQ → MatMul pattern TensorRT fuses into an int8 GEMM. In FP32 it is exact up to
rounding. It applies where a LayerNormalization op's output feeds only MatMuls with constant 2-D weights (the
attention QKV and MLP fc1 of a ViT) and no initializer it edits is shared with another node; run it on the FP32
model before a target spells LayerNorm out.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

DEFAULT_ALPHA = 0.5  # SmoothQuant's default migration strength
_EPS = 1e-5  # floor on both maxima: a dead channel keeps s = 1 rather than dividing by zero


@dataclass(frozen=True)
class SmoothSite:
    """One LayerNorm whose output feeds only constant-weight MatMuls: what to measure and what to edit."""

    layernorm: str  # node name
    output: str  # the activation tensor whose per-channel max is measured
    gamma: str
    beta: str | None
    matmuls: tuple[str, ...]  # consuming MatMul node names
    weights: tuple[str, ...]  # their weight initializers ([K, N]: row j is input channel j)


@dataclass
class SmoothResult:
    model: Any
    alpha: float
    factors: dict[str, np.ndarray] = field(default_factory=dict)  # LayerNorm node → s

    def to_dict(self) -> dict[str, Any]:
        """The manifest's record: strength, where, and how far the factors reach."""
        return {
            "alpha": self.alpha,
            "layernorms": len(self.factors),
            "factor_range": [float(min(s.min() for s in self.factors.values())),
                             float(max(s.max() for s in self.factors.values()))] if self.factors else None,
        }


def sites(model: Any) -> list[SmoothSite]:
    """Every LayerNorm → MatMul pair the migration can edit by initializers alone, in graph order."""
    from onnx import helper

    inits = {i.name for i in model.graph.initializer}
    uses: dict[str, int] = {}
    consumers: dict[str, list[Any]] = {}
    for n in model.graph.node:
        for t in n.input:
            uses[t] = uses.get(t, 0) + 1
            consumers.setdefault(t, []).append(n)
    shapes = {i.name: list(i.dims) for i in model.graph.initializer}
    graph_outputs = {o.name for o in model.graph.output}
    out: list[SmoothSite] = []
    for n in model.graph.node:
        if n.op_type != "LayerNormalization" or len(n.input) < 2 or n.output[0] in graph_outputs:
            continue
        axis = next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), -1)
        gamma = n.input[1]
        beta = n.input[2] if len(n.input) > 2 and n.input[2] else None
        cons = consumers.get(n.output[0], [])
        if axis != -1 or not cons or any(c.op_type != "MatMul" or c.input[0] != n.output[0] for c in cons):
            continue
        weights = tuple(c.input[1] for c in cons)
        editable = [gamma] + ([beta] if beta else []) + list(weights)
        if any(t not in inits or uses.get(t, 0) != 1 for t in editable):
            continue  # a constant from a node, or shared: editing it would change another path
        if any(len(shapes[w]) != 2 or shapes[w][0] != shapes[gamma][-1] for w in weights):
            continue
        out.append(SmoothSite(n.name, n.output[0], gamma, beta, tuple(c.name for c in cons), weights))
    return out


def channel_max(outputs: Iterable[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """max |x| per channel (last axis) of each named activation over batches of model outputs (the caller runs the
    FP32 model with the sites' LayerNorm outputs added: graph.quantize.with_outputs)."""
    acc: dict[str, np.ndarray] = {}
    for named in outputs:
        for name, y in named.items():
            a = np.abs(np.asarray(y, np.float32)).reshape(-1, y.shape[-1]).max(axis=0)
            acc[name] = a if name not in acc else np.maximum(acc[name], a)
    return acc


def factors(x_max: np.ndarray, w_rows_max: np.ndarray, alpha: float) -> np.ndarray:
    """s_j = max|X_j|^α / max|W_j|^(1−α) (SmoothQuant eq. 4), float32."""
    x = np.maximum(np.asarray(x_max, np.float64), _EPS)
    w = np.maximum(np.asarray(w_rows_max, np.float64), _EPS)
    return (x**alpha / w ** (1.0 - alpha)).astype(np.float32)


def smooth(model: Any, x_max: dict[str, np.ndarray], alpha: float = DEFAULT_ALPHA) -> SmoothResult:
    """A copy of ``model`` with every site's factor moved from γ/β into the MatMul rows (``x_max``: from
    ``channel_max``, keyed by the LayerNorm output). Sites without a measurement are left as they are."""
    from onnx import numpy_helper

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha is a strength from 0 to 1, not {alpha}")
    m = copy.deepcopy(model)
    inits = {i.name: i for i in m.graph.initializer}

    def get(name: str) -> np.ndarray:
        return numpy_helper.to_array(inits[name]).astype(np.float32)

    def put(name: str, value: np.ndarray) -> None:
        inits[name].CopyFrom(numpy_helper.from_array(value.astype(np.float32), name))

    res = SmoothResult(m, alpha)
    for site in sites(m):
        if site.output not in x_max:
            continue
        ws = [get(w) for w in site.weights]
        s = factors(x_max[site.output], np.max([np.abs(w).max(axis=1) for w in ws], axis=0), alpha)
        put(site.gamma, get(site.gamma) / s)
        if site.beta:
            put(site.beta, get(site.beta) / s)
        for name, w in zip(site.weights, ws, strict=True):
            put(name, w * s[:, None])
        res.factors[site.layernorm] = s
    return res
