"""The numerics report: where the FP32 model's activations sit against FP16's range and INT8's levels.

FP16 tops out at 65504. A ViT's residual stream grows with depth, and a LayerNorm spelled out in
primitive ops (TensorRT 8.5's form, graph/target.py) squares its centred input: |x − mean| of 256
overflows. That is how HF ViT-B/16 fell from 85% to 19% under FP16 on an Orin Nano (|x| up to 1,418,
onnxsim/onnxsim#1742). INT8 with per-tensor activations gives every channel of a tensor the same step:
a few channels 50× wider than the rest leave the others a handful of levels (RepQ-ViT, FQ-ViT).

So the FP32 ONNX model runs on the user's images under ONNX Runtime with the tensors that matter added
as outputs (quantize.with_outputs), and per tensor the report gives max |x| and the FP16 headroom
(65504 / max) at every LayerNorm input, residual Add, Softmax input and LayerNorm squared term; and for
each activation calibrate would quantize, the inter-channel spread (max over channels of the channel's
max |x| / the median channel's) and the share of its range that 99.99% of values use.

Every other float tensor the images reach is watched too (role "activation", its max |x| reduced in the
graph, so no tensor is copied out): a stream that is large from the start overflows before its first
residual Add (a LayerScale model's patch embedding, position embedding and class token, which the small
γ of every branch leaves dominant), and a float32 LayerNorm does not help when the float16 node that
makes its input has already written inf. Such a tensor's node, and every node that reads it, stay float32.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.defaults import SAFETY, SPREAD_LIMIT  # flagging limits (light: the CLI's --help shows them)
from vitdeploy.core.errors import UsageError, VitdeployError

FP16_MAX = 65504.0
PERCENTILE = 99.99

ROLES = ("layernorm_input", "layernorm_square", "residual_add", "softmax_input", "quantized_input", "activation")

Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class TensorStat:
    """One tensor's figures; ``flags`` says what would go wrong ("fp16_overflow", "int8_spread")."""

    tensor: str  # the tensor to keep in float32 (for an unspelled LayerNorm's square: the LayerNorm's input)
    role: str
    node: str  # the node it enters (or, for a residual Add / spelled-out square, that makes it)
    max_abs: float = 0.0
    spread: float | None = None
    range_used: float | None = None  # p99.99 |x| / max |x|
    flags: list[str] = field(default_factory=list)

    @property
    def fp16_headroom(self) -> float | None:
        return FP16_MAX / self.max_abs if self.max_abs > 0 else None

    def to_dict(self) -> dict[str, Any]:
        h = self.fp16_headroom
        return {
            "tensor": self.tensor, "role": self.role, "node": self.node, "max_abs": _finite(self.max_abs),
            "fp16_headroom": _finite(h), "spread": _finite(self.spread), "range_used": _finite(self.range_used),
            "flags": list(self.flags),
        }


def _finite(v: float | None) -> float | None:
    """Strict JSON: an infinite or NaN figure is written as null (never a bare NaN)."""
    return None if v is None or not np.isfinite(v) else float(f"{v:.6g}")


@dataclass
class NumericsReport:
    model: str
    images: int
    tensors: list[TensorStat]
    safety: float = SAFETY
    spread_limit: float = SPREAD_LIMIT
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def flagged(self) -> list[TensorStat]:
        return [t for t in self.tensors if t.flags]

    def to_dict(self) -> dict[str, Any]:
        return {
            "model": self.model, "images": self.images, "fp16_max": FP16_MAX, "safety": self.safety,
            "spread_limit": self.spread_limit, "percentile": PERCENTILE,
            "flagged": [t.to_dict() for t in self.flagged],
            "tensors": [t.to_dict() for t in self.tensors],
            "fp16_unsafe_tensors": fp16_unsafe_tensors(self),
            "skipped": [{"file": p, "reason": why} for p, why in self.skipped],
        }


def fp16_unsafe_tensors(report: NumericsReport) -> list[str]:
    """The tensors an FP16 artifact must keep in float32: every one whose headroom is under the safety margin."""
    out: dict[str, None] = {}
    for t in report.tensors:
        if "fp16_overflow" in t.flags:
            out.setdefault(t.tensor, None)
    return list(out)


def fp16_unsafe_nodes(report: NumericsReport, model: Any = None) -> list[str]:
    """The nodes behind ``fp16_unsafe_tensors`` (what graph/fp16.to_fp16's ``keep_fp32_nodes`` takes). With the
    ``model`` measured, also every node that reads such a tensor: a float16 reader gets it through a Cast to float16,
    that is as inf."""
    out: dict[str, None] = {}
    for t in report.tensors:
        if "fp16_overflow" in t.flags:
            out.setdefault(t.node, None)
    if model is not None:
        unsafe = set(fp16_unsafe_tensors(report))
        for n in model.graph.node:
            if n.op_type not in ("Shape", "Size") and unsafe.intersection(n.input):  # those two read no values
                out.setdefault(n.name, None)
    return list(out)


# --- which tensors ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Probe:
    """A tensor to watch: its role, the node, and for an unspelled LayerNorm's square the axes to centre over."""

    tensor: str
    role: str
    node: str
    axes: tuple[int, ...] = ()
    channel_axis: int = -1


def _is_square(n: Any, consts: dict[str, np.ndarray]) -> bool:
    if n.op_type == "Mul" and len(n.input) == 2 and n.input[0] == n.input[1]:
        return True
    if n.op_type == "Pow" and len(n.input) == 2 and n.input[1] in consts:
        return bool(np.all(np.asarray(consts[n.input[1]]) == 2))
    return False


def _is_centred(t: str, producers: dict[str, Any]) -> bool:
    """``t`` is Sub(x, ReduceMean(x)): the centred input a spelled-out LayerNorm squares."""
    sub = producers.get(t)
    if sub is None or sub.op_type != "Sub" or len(sub.input) != 2:
        return False
    mean = producers.get(sub.input[1])
    return mean is not None and mean.op_type == "ReduceMean" and mean.input[0] == sub.input[0]


def probes(model: Any) -> list[Probe]:
    """Every tensor the report watches, in graph order (a tensor may have several roles)."""
    from onnx import helper

    from vitdeploy.graph.edit import constant_values
    from vitdeploy.graph.quantize import ensure_node_names, find_layers, tensors_to_calibrate

    ensure_node_names(model)
    consts = constant_values(model.graph)
    producers = {o: n for n in model.graph.node for o in n.output}
    out: list[Probe] = []
    for n in model.graph.node:
        if n.op_type == "LayerNormalization":
            axis = int(next((helper.get_attribute_value(a) for a in n.attribute if a.name == "axis"), -1))
            out.append(Probe(n.input[0], "layernorm_input", n.name))
            # the square TensorRT 8.5's spelled-out form computes: (x - mean)², mean over axis..last
            out.append(Probe(n.input[0], "layernorm_square", n.name, axes=(axis,)))
        elif _is_square(n, consts) and _is_centred(n.input[0], producers):
            # a spelled-out LayerNorm (TensorRT 8.5's form, or an exporter's): (x - ReduceMean(x))², then x
            out.append(Probe(n.output[0], "layernorm_square", n.name))
            sub = producers[n.input[0]]
            out.append(Probe(sub.input[0], "layernorm_input", sub.name))
        elif n.op_type == "Add" and len(n.input) == 2 and not any(i in consts for i in n.input):
            out.append(Probe(n.output[0], "residual_add", n.name))
        elif n.op_type == "Softmax":
            out.append(Probe(n.input[0], "softmax_input", n.name))
    for la in find_layers(model):
        if la.kind == "attention":
            continue
        axis = 1 if la.kind == "conv" else -1  # the channels a per-tensor scale must cover
        for t in tensors_to_calibrate([la]):
            out.append(Probe(t, "quantized_input", la.node, channel_axis=axis))
    made_at = {p.tensor for p in out if p.tensor in producers and p.node == producers[p.tensor].name}
    return out + _activations(model, made_at)


def _activations(model: Any, measured: set[str]) -> list[Probe]:
    """Every float tensor a node makes from the images (not from constants alone), at the node that makes it, but
    those already watched there (a residual Add, a spelled-out square): what the FP16 graph would compute in float16."""
    from onnx import TensorProto

    from vitdeploy.runners.oracle.loader import declared_types

    types = declared_types(model)
    inits = {i.name for i in model.graph.initializer}
    live = {i.name for i in model.graph.input if i.name not in inits}
    out: list[Probe] = []
    for n in model.graph.node:
        if not live.intersection(n.input):
            continue
        live.update(o for o in n.output if o)
        out += [Probe(o, "activation", n.name) for o in n.output
                if o and o not in measured and types.get(o) == TensorProto.FLOAT]
    return out


# --- accumulating -----------------------------------------------------------------------------


class _Acc:
    """Running max |x|, per-channel max |x| and a |x| histogram of one probe over batches."""

    def __init__(self, probe: Probe) -> None:
        from vitdeploy.graph.quantize import AbsHistogram

        self.probe = probe
        self.max_abs = 0.0
        self.channels: np.ndarray | None = None
        self.hist = AbsHistogram() if probe.role == "quantized_input" else None

    def add(self, x: np.ndarray) -> None:
        a = np.asarray(x, np.float64)
        if self.probe.role == "layernorm_square" and self.probe.axes:
            axes = tuple(range(self.probe.axes[0] % a.ndim, a.ndim))
            a = np.square(a - a.mean(axis=axes, keepdims=True))
        a = np.abs(a)
        if a.size == 0:
            return
        self.max_abs = max(self.max_abs, float(a.max()))
        if self.hist is not None:
            self.hist.add(a)
            ax = self.probe.channel_axis % a.ndim
            ch = a.max(axis=tuple(i for i in range(a.ndim) if i != ax))
            self.channels = ch if self.channels is None else np.maximum(self.channels, ch)

    def stat(self, safety: float, spread_limit: float) -> TensorStat:
        p = self.probe
        s = TensorStat(p.tensor, p.role, p.node, self.max_abs)
        if self.hist is not None and self.channels is not None and self.max_abs > 0:
            med = float(np.median(self.channels))
            s.spread = float(self.channels.max() / med) if med > 0 else float("inf")
            s.range_used = self.hist.percentile(PERCENTILE) / self.max_abs
            if s.spread > spread_limit:
                s.flags.append("int8_spread")
        if p.role != "quantized_input" and self.max_abs * safety > FP16_MAX:
            s.flags.append("fp16_overflow")
        return s


# --- running ----------------------------------------------------------------------------------


def _load(model_onnx: str | Path) -> tuple[Any, Any]:
    """The FP32 model and its manifest; no manifest, an INT8/FP16 model or a folder is a usage error (exit 2)."""
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.graph.quantize import is_fp16, is_quantized

    p = Path(model_onnx)
    try:
        art = OnnxArtifact.open(p)
        manifest = art.manifest
        model = art.load_weights()
    except UsageError:
        raise
    except VitdeployError as e:
        raise UsageError(str(e)) from None
    if is_quantized(model) or is_fp16(model) or manifest.precision in ("int8", "fp16"):
        raise UsageError(f"{p} is an INT8/FP16 model: the numerics report reads the FP32 model it was made from "
                         "(e.g. model.onnx)")
    return model, manifest


def _check_input_size(model: Any, manifest: Any, path: Path) -> None:
    """The images come out at the manifest's size; a graph that takes another size cannot read them."""
    dims = model.graph.input[0].type.tensor_type.shape.dim
    hw = [d.dim_value if d.HasField("dim_value") else None for d in dims][-2:]
    want = list(manifest.input_size)
    if len(hw) == 2 and all(v is not None for v in hw) and hw != want:
        raise UsageError(f"{path} takes {hw[0]}×{hw[1]} images but its manifest preprocesses to {want[0]}×{want[1]}: "
                         "re-export the model so the two agree")


def numerics(
    model_onnx: str | Path,
    images: str | Path,
    num_images: int = 256,
    batch_size: int = 32,
    safety: float = SAFETY,
    spread_limit: float = SPREAD_LIMIT,
    seed: int = 0,
    progress: Progress | None = None,
) -> NumericsReport:
    """Run the FP32 model on ``images`` and report every watched tensor's range (see the module docstring)."""
    from vitdeploy.model.imageset import ImageSet

    if num_images < 1 or batch_size < 1 or safety < 1 or spread_limit <= 1:
        raise UsageError("--num-images and --batch-size must be at least 1, --safety at least 1, --spread-limit over 1")
    path = Path(model_onnx)
    if path.suffix != ".onnx" and path.exists():  # a checkpoint (a 0-class backbone too): its export is measured
        raise UsageError(f"{path}: numerics measures the FP32 ONNX model, not a checkpoint: export it first "
                         f"(`vitdeploy export {path}`), then `vitdeploy numerics model.onnx -i {images}`")
    model, manifest = _load(path)
    _check_input_size(model, manifest, path)
    root = Path(images)
    if not root.exists():
        raise UsageError(f"{root}: no such folder of images; pass --images DIR with images like the deployment's")
    try:
        chosen = ImageSet.folder(root, num_images, seed)  # the one rule: a seeded sample, in folder order
    except VitdeployError:
        raise UsageError(f"{root} holds no image files: pass a folder of images like the deployment's") from None
    return measure(model, manifest, chosen, batch_size, safety, spread_limit, progress, str(path))


def measure(model: Any, manifest: Any, images: Any, batch_size: int = 32, safety: float = SAFETY,
            spread_limit: float = SPREAD_LIMIT, progress: Progress | None = None, name: str = "model") -> NumericsReport:
    """The report for an FP32 graph in memory over an ImageSet (what convert-fp16 and calibrate call before they
    decide which tensors stay float32): one ONNX Runtime session with the watched tensors as outputs."""
    from vitdeploy.graph.quantize import with_outputs
    from vitdeploy.runners.onnxruntime import session

    watch = probes(model)
    names = list(dict.fromkeys(p.tensor for p in watch if p.role != "activation"))
    peaks = [t for t in dict.fromkeys(p.tensor for p in watch if p.role == "activation") if t not in set(names)]
    graph, peak_outputs = _with_peaks(with_outputs(model, names), peaks)
    sess = session(graph)
    inp = sess.get_inputs()[0].name
    fetch = names + peak_outputs
    accs = [_Acc(p) for p in watch]
    done = read = 0
    for b in images.batches(manifest.pp(), batch_size):
        if len(b.paths):
            got = sess.run(fetch, {inp: b.array})
            outs = dict(zip(names + peaks, got, strict=True))
            for acc in accs:
                acc.add(outs[acc.probe.tensor])
            read += len(b.paths)
        done += len(b.paths) + len(b.skipped)
        if progress:
            progress("numerics", {"done": done, "total": len(images)})
    skipped = list(images.skipped)
    if read == 0:
        first = f" (e.g. {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise VitdeployError(f"none of the {len(images)} images could be read{first}")
    stats = [a.stat(safety, spread_limit) for a in accs]
    return NumericsReport(name, read, stats, safety, spread_limit, skipped)


def _with_peaks(model: Any, tensors: list[str]) -> tuple[Any, list[str]]:
    """``model`` (changed in place) also answering max |x| of each tensor as a scalar (Abs, then ReduceMax over every
    axis), and those outputs' names in order: the whole graph's range at the memory of one inference."""
    from onnx import TensorProto, helper

    outs = []
    for i, t in enumerate(tensors):
        a, m = f"numerics_abs_{i}", f"numerics_peak_{i}"
        model.graph.node.extend([helper.make_node("Abs", [t], [a], name=a),
                                 helper.make_node("ReduceMax", [a], [m], name=m, keepdims=0)])
        model.graph.output.append(helper.make_tensor_value_info(m, TensorProto.FLOAT, []))
        outs.append(m)
    return model, outs
