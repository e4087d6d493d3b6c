"""The accuracy guard: top-1 of the INT8 graph against the FP32 one on labeled images, and the layers to keep in float.

When the drop exceeds the budget, every quantized layer is scored alone
(only that layer quantized: how far its logits move from FP32's), and the
worst are put back in float one at a time, re-measuring top-1 after each,
until the drop fits or nothing is left to exclude. Everything runs in ONNX
Runtime on the CPU, before any GPU is involved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.checks.metrics import compare, top_k_accuracy
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.graph.quantize import LayerSwitch
from vitdeploy.runners.base import Runner

SENSITIVITY_IMAGES = 256


@dataclass
class EvalSet:
    """Labeled images, preprocessed once (float32 NCHW) and labels as model class indices."""

    x: np.ndarray
    y: np.ndarray
    root: Path
    skipped: list[tuple[str, str]] = field(default_factory=list)


def load_eval_set(root: str | Path, manifest: Manifest, batch_size: int = 64) -> EvalSet:
    """An ImageFolder (or its val/ split) whose class folders are named as the model's labels, decoded once."""
    from vitdeploy.model.imageset import ImageSet

    images = ImageSet.labeled(root, list(manifest.labels), require=True)
    _, x, y = images.arrays(manifest.pp(), batch_size)
    assert y is not None  # a required labeled folder has labels
    return EvalSet(x, y, Path(images.source), images.skipped)


# A runner for a candidate graph in memory (the guard's probes): where the INT8 model is measured.
RunnerFactory = Callable[[Any], Runner]
GUARD_BACKENDS = ("onnxruntime", "openvino", "oracle")


def runner_factory(backend: str = "onnxruntime", manifest: Manifest | None = None, target: str | None = None) -> RunnerFactory:
    """Runners for graphs in memory on ``backend``: onnxruntime or openvino (CPU targets), or the TensorRT oracle
    (what TensorRT computes, for a TensorRT ``target``)."""
    if backend not in GUARD_BACKENDS:
        raise VitdeployError(f"the guard evaluates on {', '.join(GUARD_BACKENDS)}, not {backend!r}")

    def make(model: Any) -> Runner:
        if backend == "openvino":
            from vitdeploy.runners.openvino.runner import OpenVinoRunner

            return OpenVinoRunner(model, cache=False, manifest=manifest)
        if backend == "oracle":
            from vitdeploy.runners.oracle.runner import OracleRunner

            return OracleRunner(model, target=target, manifest=manifest)
        from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

        return OnnxRuntimeRunner(model, manifest=manifest)

    return make


def logits(model: Any, x: np.ndarray, batch_size: int = 64, backend: str = "onnxruntime",
           factory: RunnerFactory | None = None) -> np.ndarray:
    """The model's logits on x, on the guard's backend (a ``factory``, or one made for ``backend``)."""
    from vitdeploy.checks.compare import run_arrays

    runner = (factory or runner_factory(backend, _manifest_of(model)))(model)
    try:
        return run_arrays([runner], x, batch_size)[0]
    finally:
        runner.close()


def _manifest_of(model: Any) -> Manifest | None:
    """The manifest of a model given as a path, an OnnxArtifact or an onnx.ModelProto (None when it has none)."""
    from vitdeploy.core.artifact import OnnxArtifact, manifest_from_onnx

    try:
        if isinstance(model, OnnxArtifact):
            return model.manifest
        if isinstance(model, (str, Path)):
            return OnnxArtifact.open_manifest(model)
        return manifest_from_onnx(model, "the model in memory")
    except VitdeployError:
        return None


@dataclass
class Figures:
    images: int
    fp32_top1: float
    int8_top1: float
    agreement: float
    max_abs_logit_diff: float

    @property
    def drop_points(self) -> float:
        return round(100.0 * (self.fp32_top1 - self.int8_top1), 4)

    def to_dict(self) -> dict[str, Any]:
        return {
            "images": self.images,
            "fp32_top1": round(self.fp32_top1, 6),
            "int8_top1": round(self.int8_top1, 6),
            "drop_points": self.drop_points,
            "agreement": round(self.agreement, 6),
            "max_abs_logit_diff": round(self.max_abs_logit_diff, 6),
        }


def figures(ref: np.ndarray, q: np.ndarray, y: np.ndarray) -> Figures:
    c = compare(ref, q)
    return Figures(
        images=len(y),
        fp32_top1=top_k_accuracy(ref, y),
        int8_top1=top_k_accuracy(q, y),
        agreement=c.agreement,
        max_abs_logit_diff=c.max_abs_diff,
    )


@dataclass
class GuardResult:
    excluded: list[str]
    before: Figures
    after: Figures
    max_drop: float | None
    sensitivity: dict[str, float]
    met: bool
    min_agreement: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "max_drop_points": self.max_drop,
            "min_agreement": self.min_agreement,
            "met": self.met,
            "excluded": self.excluded,
            "before": self.before.to_dict(),
            "after": self.after.to_dict(),
            "sensitivity": {k: round(v, 8) for k, v in self.sensitivity.items()},
        }


def guard(
    switch: LayerSwitch,
    ev: EvalSet,
    fp32_logits: np.ndarray,
    max_drop: float | None,
    progress: Callable[[str, dict[str, Any]], None] | None = None,
    min_agreement: float | None = None,
    backend: str = "onnxruntime",
    factory: RunnerFactory | None = None,
) -> tuple[Any, GuardResult]:
    """Exclude the most sensitive layers until the top-1 drop is within ``max_drop`` points
    (and, with ``min_agreement``, the top-1 agreement with FP32 at least that fraction).

    ``switch`` holds the INT8 graph of every layer (each weight quantized once); a probe only
    switches layers to float in place. Returns the final model (``switch.final``) and what was
    done; ``met`` is False when even excluding every layer did not meet the budget. ``backend``: where the
    INT8 model is evaluated (onnxruntime or openvino: the runtime it will be deployed on); ``factory``: the runners
    to measure on (default: one for ``backend``), e.g. the TensorRT oracle for a TensorRT target.
    """
    make = factory or runner_factory(backend, _manifest_of(switch.select([])))
    layers = [la.node for la in switch.layers]

    def ok(f: Figures) -> bool:
        return (max_drop is None or f.drop_points <= max_drop) and (min_agreement is None or f.agreement >= min_agreement)

    first = figures(fp32_logits, logits(switch.select([]), ev.x, factory=make), ev.y)
    if ok(first):
        return switch.final([]), GuardResult([], first, first, max_drop, {}, True, min_agreement)
    # per-layer sensitivity: only that layer quantized, mean squared logit error against FP32 on a subset
    n = min(len(ev.x), SENSITIVITY_IMAGES)
    xs, ref = ev.x[:n], fp32_logits[:n]
    sens: dict[str, float] = {}
    for i, name in enumerate(layers):
        if progress:
            progress("sensitivity", {"done": i, "total": len(layers), "layer": name})
        only = switch.select([other for other in layers if other != name])
        sens[name] = compare(ref, logits(only, xs, factory=make)).mean_sq_diff
    order = sorted(layers, key=lambda k: sens[k], reverse=True)
    excluded: list[str] = []
    last = first
    for name in order:
        excluded.append(name)
        if progress:
            progress("exclude", {"done": len(excluded), "total": len(order), "layer": name})
        last = figures(fp32_logits, logits(switch.select(excluded), ev.x, factory=make), ev.y)
        if ok(last):
            return switch.final(excluded), GuardResult(excluded, first, last, max_drop, sens, True, min_agreement)
    return switch.final(excluded), GuardResult(excluded, first, last, max_drop, sens, False, min_agreement)
