"""The accuracy guard: the INT8 graph against the FP32 one on --eval images, and the layers to keep in float.

What is measured and what budget it must meet is the model's task's (checks/judge.py, one place): for a classifier
the top-1 drop on labeled images and the top-1 agreement (``ClassifierCriterion``); for an embedding model the
per-image cosine to FP32 (mean, 1st percentile) and nearest-neighbour agreement of ``EmbeddingBudget``, and on a
labeled folder the kNN top-1 drop too (``EmbeddingCriterion``). When the budget is missed, every quantized layer is
scored alone (only that layer quantized: how far its output moves from FP32's), and the worst are put back in float
one at a time, re-measuring after each, until the budget fits or nothing is left to exclude. Everything runs on the
CPU (ONNX Runtime, OpenVINO, or the TensorRT oracle for a TensorRT target), before any GPU is involved.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from vitdeploy.checks.judge import EmbeddingBudget, EmbeddingJudge, judge_for, refuse_classifier_budget
from vitdeploy.checks.metrics import EmbeddingComparison, compare, top_k_accuracy
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.graph.quantize import LayerSwitch
from vitdeploy.runners.base import Runner

SENSITIVITY_IMAGES = 256


@dataclass
class EvalSet:
    """The --eval images, preprocessed once (float32 NCHW), and their labels: the model's class indices for a
    classifier; for an embedding model the folder's own class folders (None for a folder without them)."""

    x: np.ndarray
    y: np.ndarray | None
    root: Path
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def labels(self) -> np.ndarray:
        """The labels, where the judgement needs them (a classifier's eval set always has them)."""
        if self.y is None:
            raise VitdeployError(f"{self.root} has no class folders: top-1 needs labeled images")
        return self.y


def _own_classes(root: Path) -> list[str]:
    """The class folders of an ImageFolder (or of its val/ split, as read_labeled_folder reads it)."""
    from vitdeploy.model.data import scan_image_folder

    r = root / "val" if (root / "val").is_dir() and (root / "train").is_dir() else root
    return scan_image_folder(r)[0] if r.is_dir() else []


def eval_is_labeled(root: str | Path) -> bool:
    """Whether an embedding model's --eval folder is labeled (by its own class folders), read before any work: a
    top-1 budget (--max-drop) on an embedding model means the kNN top-1 drop, which needs labels."""
    from vitdeploy.model.data import read_labeled_folder

    r = Path(root)
    classes = _own_classes(r)
    return bool(classes) and read_labeled_folder(r, classes).labels is not None


def load_eval_set(root: str | Path, manifest: Manifest, batch_size: int = 64) -> EvalSet:
    """The --eval images decoded once. A classifier's: an ImageFolder (or its val/ split) whose class folders are
    named as the model's labels. An embedding model's: any folder of images; labeled by its own class folders when
    it is an ImageFolder (for the kNN top-1), else unlabeled."""
    from vitdeploy.model.imageset import ImageSet

    if judge_for(manifest) is not None:
        r = Path(root)
        images = ImageSet.labeled(r, _own_classes(r)) if r.is_dir() else ImageSet.folder(r, option="--eval")
    else:
        images = ImageSet.labeled(root, list(manifest.labels), require=True)
    _, x, y = images.arrays(manifest.pp(), batch_size)
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
class EmbeddingFigures:
    """An embedding model's INT8 against FP32 on the eval images (checks/judge.py's comparison)."""

    comparison: EmbeddingComparison

    @property
    def images(self) -> int:
        return self.comparison.rows

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"images": self.images}
        for k, v in self.comparison.to_dict().items():
            if k != "rows":
                d[k] = round(v, 6) if isinstance(v, float) and np.isfinite(v) else v
        if not np.isfinite(d["rel_frobenius"]):
            d["rel_frobenius"] = None  # strict JSON: a non-finite output has no finite error
        return d


def figures_line(f: dict[str, Any], short: bool = False) -> str:
    """One line for the guard's figures as the manifest records them (a classifier's or an embedding model's);
    ``short``: the INT8 side only (the 'with every layer quantized' line)."""
    if "cosine_mean" in f:
        s = (f"mean cosine {f['cosine_mean']:.5f}, 1st percentile {f['cosine_p1']:.5f}, "
             f"nearest-neighbour agreement {f['nn_agreement']:.2%}")
        if f.get("knn_top1") is not None:
            s += f", kNN top-1 {f['knn_top1']:.2%} (FP32 {f['knn_top1_reference']:.2%})"
        return s if short else f"on {f['images']} images, INT8 against FP32: {s}"
    if short:
        return f"INT8 top-1 {f['int8_top1']:.2%} (drop {f['drop_points']:.2f} points), agreement {f['agreement']:.2%}"
    return (f"on {f['images']} labeled images: FP32 top-1 {f['fp32_top1']:.2%}, INT8 top-1 {f['int8_top1']:.2%} "
            f"(drop {f['drop_points']:.2f} points), agreement {f['agreement']:.2%}")


class Criterion(Protocol):
    """What the guard measures and the budget it works toward: the task's (classifier or embedding model)."""

    @property
    def sensitivity_images(self) -> int: ...

    def figures(self, ref: np.ndarray, out: np.ndarray, ev: EvalSet) -> Any: ...

    def met(self, f: Any) -> bool: ...

    def error(self, ref: np.ndarray, out: np.ndarray) -> float: ...

    def rank(self, f: Any) -> tuple[float, ...]: ...

    def budget(self) -> dict[str, Any]: ...

    def missed(self, f: Any, excluded: int, what: str) -> str: ...

    @property
    def active(self) -> bool: ...


@dataclass(frozen=True)
class ClassifierCriterion:
    """A classifier: top-1 drop in points on labeled images, and (optionally) top-1 agreement with FP32."""

    max_drop: float | None = None
    min_agreement: float | None = None
    sensitivity_images: int = SENSITIVITY_IMAGES

    @property
    def active(self) -> bool:
        return self.max_drop is not None or self.min_agreement is not None

    def figures(self, ref: np.ndarray, out: np.ndarray, ev: EvalSet) -> Figures:
        return figures(ref, out, ev.labels)

    def met(self, f: Figures) -> bool:
        return (self.max_drop is None or f.drop_points <= self.max_drop) and (
            self.min_agreement is None or f.agreement >= self.min_agreement)

    def error(self, ref: np.ndarray, out: np.ndarray) -> float:
        return compare(ref, out).mean_sq_diff

    def rank(self, f: Figures) -> tuple[float, ...]:
        return (f.agreement, -f.drop_points)

    def budget(self) -> dict[str, Any]:
        return {"max_drop_points": self.max_drop, "min_agreement": self.min_agreement}

    def missed(self, f: Figures, excluded: int, what: str) -> str:
        want = " and ".join(([f"--max-drop {self.max_drop}"] if self.max_drop is not None else [])
                            + ([f"--min-agreement {self.min_agreement}"] if self.min_agreement is not None else []))
        return (f"{what}: top-1 drop {f.drop_points} points, agreement {round(f.agreement, 6)}: exceeds {want} "
                f"even with all {excluded} quantized layers kept in float")


@dataclass(frozen=True)
class EmbeddingCriterion:
    """An embedding model: the precision's EmbeddingBudget (mean and 1st-percentile per-image cosine to FP32,
    nearest-neighbour agreement) and, on a labeled folder with ``max_knn_drop``, the kNN top-1 drop in points.
    ``budget_`` None: measured and recorded, nothing excluded (--eval alone)."""

    judge: EmbeddingJudge
    budget_: EmbeddingBudget | None = None
    max_knn_drop: float | None = None
    sensitivity_images: int = SENSITIVITY_IMAGES

    @property
    def active(self) -> bool:
        return self.budget_ is not None

    def figures(self, ref: np.ndarray, out: np.ndarray, ev: EvalSet) -> EmbeddingFigures:
        return EmbeddingFigures(self.judge.compare(ref, out, ev.y))

    def failures(self, f: EmbeddingFigures) -> list[str]:
        out = self.budget_.failures(f.comparison) if self.budget_ is not None else []
        drop = f.comparison.knn_drop_points
        if self.max_knn_drop is not None and drop is not None and drop > self.max_knn_drop:
            out.append(f"kNN top-1 drop {drop} points > {self.max_knn_drop}")
        return out

    def met(self, f: EmbeddingFigures) -> bool:
        return not self.failures(f)

    def error(self, ref: np.ndarray, out: np.ndarray) -> float:
        return float(np.mean(1.0 - self.judge.compare(ref, out).per_image_cosine))

    def rank(self, f: EmbeddingFigures) -> tuple[float, ...]:
        c = f.comparison
        return (c.nn_agreement, c.cosine_p1, c.cosine_mean)

    def budget(self) -> dict[str, Any]:
        d: dict[str, Any] = {"judged_as": "embedding"}
        if self.budget_ is not None:
            d.update(self.budget_.to_dict())
        if self.max_knn_drop is not None:
            d["max_knn_drop_points"] = self.max_knn_drop
        return d

    def missed(self, f: EmbeddingFigures, excluded: int, what: str) -> str:
        return f"{what}: {'; '.join(self.failures(f))} even with all {excluded} quantized layers kept in float"


def criterion_for(manifest: Manifest, max_drop: float | None = None, min_agreement: float | None = None,
                  min_cosine: float | None = None, eval_dir: str | Path | None = None) -> Criterion:
    """The guard's criterion for this model's task, from calibrate's budget options; checked before any work.

    A classifier: --max-drop (top-1 points) and --min-agreement (top-1 agreement); --min-cosine is refused (exit 2).
    An embedding model: any budget option puts the INT8 EmbeddingBudget in force (checks/judge.py: mean cosine
    ≥ --min-cosine, default 0.99; 1st percentile ≥ 0.97; nearest-neighbour agreement ≥ 0.97, or --min-agreement);
    --max-drop is the kNN top-1 drop, so it needs a labeled --eval folder, else one line naming --min-cosine
    (judge.refuse_classifier_budget, exit 2)."""
    judge = judge_for(manifest)
    if judge is None:
        if min_cosine is not None:
            raise UsageError("--min-cosine is a budget for embedding models (mean per-image cosine to FP32); this is "
                             "a classifier: use --max-drop (top-1 points) or --min-agreement")
        return ClassifierCriterion(max_drop, min_agreement)
    if max_drop is not None and (eval_dir is None or not eval_is_labeled(eval_dir)):
        refuse_classifier_budget(manifest)
    if max_drop is None and min_agreement is None and min_cosine is None:
        return EmbeddingCriterion(judge)
    b = judge.budget("int8", min_cosine)
    if min_agreement is not None:
        b = EmbeddingBudget(b.min_cosine, b.min_cosine_p1, min_agreement)
    return EmbeddingCriterion(judge, b, max_drop)


@dataclass
class GuardResult:
    excluded: list[str]
    before: Any  # Figures (classifier) or EmbeddingFigures
    after: Any
    max_drop: float | None
    sensitivity: dict[str, float]
    met: bool
    min_agreement: float | None = None
    criterion: Criterion | None = None

    def to_dict(self) -> dict[str, Any]:
        budget = (self.criterion or ClassifierCriterion(self.max_drop, self.min_agreement)).budget()
        return {
            **budget,
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
    criterion: Criterion | None = None,
    written: Callable[[Any, list[str]], Any] | None = None,
) -> tuple[Any, GuardResult]:
    """Exclude the most sensitive layers until the top-1 drop is within ``max_drop`` points
    (and, with ``min_agreement``, the top-1 agreement with FP32 at least that fraction); or, with ``criterion``, until
    its budget is met (an embedding model's: ``criterion_for``). ``fp32_logits``: the FP32 model's output on ev.x.
``written``: the graph as it will be written from ``switch.final(excluded)`` (e.g. its float16 form for a TensorRT
target); the budget is judged on that form, the per-layer ranking on the switch's graph (cheaper, same order).

    ``switch`` holds the INT8 graph of every layer (each weight quantized once); a probe only
    switches layers to float in place. Returns the final model (``switch.final``) and what was
    done; ``met`` is False when even excluding every layer did not meet the budget. ``backend``: where the
    INT8 model is evaluated (onnxruntime or openvino: the runtime it will be deployed on); ``factory``: the runners
    to measure on (default: one for ``backend``), e.g. the TensorRT oracle for a TensorRT target.
    """
    crit: Criterion = criterion or ClassifierCriterion(max_drop, min_agreement)
    make = factory or runner_factory(backend, _manifest_of(switch.select([])))
    layers = [la.node for la in switch.layers]

    def result(excluded: list[str], first: Any, last: Any, sens: dict[str, float], met: bool) -> GuardResult:
        return GuardResult(excluded, first, last, max_drop, sens, met, min_agreement, crit)

    def measure(excluded: list[str]) -> Any:
        m = switch.select(excluded) if written is None else written(switch.final(excluded), excluded)
        return crit.figures(fp32_logits, logits(m, ev.x, factory=make), ev)

    first = measure([])
    if crit.met(first):
        return switch.final([]), result([], first, first, {}, True)
    # per-layer sensitivity: only that layer quantized, its error against FP32 on a subset (the criterion's: mean
    # squared logit error for a classifier, mean 1 − cosine for an embedding model)
    n = min(len(ev.x), crit.sensitivity_images)
    xs, ref = ev.x[:n], fp32_logits[:n]
    sens: dict[str, float] = {}
    for i, name in enumerate(layers):
        if progress:
            progress("sensitivity", {"done": i, "total": len(layers), "layer": name})
        only = switch.select([other for other in layers if other != name])
        sens[name] = crit.error(ref, logits(only, xs, factory=make))
    order = sorted(layers, key=lambda k: sens[k], reverse=True)
    excluded: list[str] = []
    last = first
    for name in order:
        excluded.append(name)
        if progress:
            progress("exclude", {"done": len(excluded), "total": len(order), "layer": name})
        last = measure(excluded)
        if crit.met(last):
            return switch.final(excluded), result(excluded, first, last, sens, True)
    return switch.final(excluded), result(excluded, first, last, sens, False)


# --- the one verdict on an INT8's budget ------------------------------------------------------------------------

WITHIN, OUTSIDE, UNJUDGED = "within", "outside", "unjudged"


@dataclass(frozen=True)
class Verdict:
    """Whether an INT8 model is within its task's budget: one verdict, the guard's, measured on the guard's image set
    (every image of calibrate's --eval folder, or of the bundle's --images). It is what the bundle's receipt shows and
    what decides the bundle's default precision. The bundle's reference images (16 by default) are not a second vote:
    they check that the device reproduces the references (run.py --check); one nearest neighbour among 16 images is
    6 points, so a budget judged there measures nothing.

    ``status``: within, outside, or unjudged (no eval set: calibrated without --eval, or no labeled images for a
    classifier). ``by``: who measured it (the guard when it made the model, or the bundle on --images)."""

    status: str
    images: int = 0
    eval: str = ""
    figures: str = ""
    failures: tuple[str, ...] = ()
    by: str = ""

    @property
    def outside(self) -> bool:
        return self.status == OUTSIDE

    def label(self) -> str:
        """The receipt's cell: 'within budget' / 'OUTSIDE BUDGET' / 'not judged'."""
        return {WITHIN: "within budget", OUTSIDE: "OUTSIDE BUDGET"}.get(self.status, "not judged")

    def line(self) -> str:
        """One line for a note: the verdict, where it was measured and why."""
        if self.status == UNJUDGED:
            return f"not judged against a budget ({self.figures or 'no eval images'})"
        where = f"on {self.images} images of {self.eval}" + (f" ({self.by})" if self.by else "")
        why = f": {'; '.join(self.failures)}" if self.failures else (f": {self.figures}" if self.figures else "")
        return f"{self.label()} {where}{why}"

    def to_dict(self) -> dict[str, Any]:
        return {"status": self.status, "images": self.images, "eval": self.eval, "figures": self.figures,
                "failures": list(self.failures), "by": self.by}


def _record_budget(record: dict[str, Any]) -> dict[str, Any]:
    """The budget a guard record was measured under, as int8_failures' keywords (None: none was in force)."""
    return {"max_drop": record.get("max_drop_points", record.get("max_drop")),
            "min_agreement": record.get("min_agreement") if record.get("judged_as") != "embedding"
            else record.get("min_nn_agreement"),
            "min_cosine": record.get("min_cosine")}


def recorded_verdict(manifest: Manifest, budget: dict[str, Any] | None = None) -> Verdict:
    """The verdict an INT8 model's guard record gives (calibrate's ``guard`` manifest entry): its figures on its eval
    images judged by the task (checks/judge.int8_failures) against ``budget`` (int8_failures' keywords: the bundle's
    own), else against the budget the guard was run under, else, when it measured without one, the task's default INT8
    budget. No record: unjudged."""
    from vitdeploy.checks.judge import int8_failures
    from vitdeploy.core.task import task_of

    rec = manifest.extra.get("guard")
    if not isinstance(rec, dict) or not isinstance(rec.get("after"), dict):
        return Verdict(UNJUDGED, figures="calibrated without --eval images: no guard record")
    after = rec["after"]
    if budget is None:
        recorded = _record_budget(rec)
        budget = recorded if any(v is not None for v in recorded.values()) else {}
    fails = int8_failures(task_of(manifest), after, **budget)
    if not fails and rec.get("met") is False:  # a record that says so itself
        fails = ["the guard's record says the budget was not met"]
    images = after.get("images")
    return Verdict(OUTSIDE if fails else WITHIN, int(images) if isinstance(images, int) else 0, str(rec.get("eval", "")),
                   figures_line(after, short=True) if _has_figures(after) else "", tuple(fails),
                   f"the guard on {rec.get('backend', 'its backend')}")


def _has_figures(f: dict[str, Any]) -> bool:
    keys = ("cosine_mean", "cosine_p1", "nn_agreement") if "cosine_mean" in f else ("int8_top1", "drop_points",
                                                                                     "agreement")
    return all(isinstance(f.get(k), (int, float)) for k in keys)


def measured_verdict(fp32: Any, int8: Any, eval_dir: str | Path, target: str | None,
                     budget: dict[str, Any]) -> Verdict:
    """The verdict on ``int8`` measured here as the guard measures (every image of ``eval_dir``, FP32 on ONNX Runtime,
    the INT8 on the guard's backend for ``target``: the TensorRT oracle, OpenVINO or ONNX Runtime), with nothing
    excluded: for an INT8 reused from an earlier calibrate whose record was not measured on these images."""
    from vitdeploy.checks.judge import int8_failures
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.targets import CPU_TARGETS
    from vitdeploy.core.task import task_of

    a32 = fp32 if isinstance(fp32, OnnxArtifact) else OnnxArtifact.open(fp32)
    a8 = int8 if isinstance(int8, OnnxArtifact) else OnnxArtifact.open(int8)
    manifest = a32.manifest
    crit = criterion_for(manifest, min_cosine=budget.get("min_cosine"), eval_dir=eval_dir,
                         max_drop=budget.get("max_drop") if judge_for(manifest) is None else None)
    backend = ("oracle" if target is not None and target not in CPU_TARGETS
               else "openvino" if target == "openvino" else "onnxruntime")
    ev = load_eval_set(eval_dir, manifest)
    ref = logits(a32.model, ev.x)
    out = logits(a8.model, ev.x, factory=runner_factory(backend, a8.manifest, target))
    f = crit.figures(ref, out, ev).to_dict()
    fails = int8_failures(task_of(manifest), f, **budget)
    return Verdict(OUTSIDE if fails else WITHIN, int(f["images"]), str(Path(eval_dir)), figures_line(f, short=True),
                   tuple(fails), f"measured by bundle on {backend}")
