"""How an artifact is judged, decided by its task (core/task.py) in this one place.

A classifier is judged by top-1, agreement and |Δlogit| (checks/metrics.compare); an embedding model by per-image
cosine (mean, 1st percentile, minimum), relative Frobenius error, nearest-neighbour agreement and, with labels, kNN
top-1 (checks/metrics.compare_embeddings). The embedding gates follow NVIDIA's TensorRT-Model-Connect (cosine ≥
0.999 per image for FP32/FP16 feature extraction, relative Frobenius ≤ 0.01) and, for INT8, the budget this project
holds itself to (mean cosine ≥ 0.99, p1 ≥ 0.97, nearest-neighbour agreement ≥ 97%). verify, the INT8 guard, the
bundle's reference check and run.py --check ask ``judge_for(manifest)``; none of them branch on the family.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from vitdeploy.checks.metrics import EmbeddingComparison, compare_embeddings
from vitdeploy.core.errors import UsageError
from vitdeploy.core.task import Task, task_of


@dataclass(frozen=True)
class EmbeddingBudget:
    """The least an embedding artifact must keep of its reference: mean and 1st-percentile per-image cosine, and the
    share of images whose nearest neighbour in the set is the reference's."""

    min_cosine: float = 0.99
    min_cosine_p1: float = 0.97
    min_nn_agreement: float = 0.97

    def failures(self, c: EmbeddingComparison) -> list[str]:
        out = []
        if c.nonfinite:
            out.append(f"NaN or Inf embeddings on {c.nonfinite} of {c.rows} images")
        if c.cosine_mean < self.min_cosine:
            out.append(f"mean cosine {c.cosine_mean:.5f} < {self.min_cosine}")
        if c.cosine_p1 < self.min_cosine_p1:
            out.append(f"1st-percentile cosine {c.cosine_p1:.5f} < {self.min_cosine_p1}")
        if c.rows > 1 and c.nn_agreement < self.min_nn_agreement:
            out.append(f"nearest-neighbour agreement {c.nn_agreement:.4f} < {self.min_nn_agreement}")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"min_cosine": self.min_cosine, "min_cosine_p1": self.min_cosine_p1,
                "min_nn_agreement": self.min_nn_agreement}


# Per precision: what an artifact of that precision must keep of the FP32 reference.
EMBEDDING_BUDGETS = {
    "fp32": EmbeddingBudget(0.9999, 0.9999, 0.99),
    "fp16": EmbeddingBudget(0.999, 0.995, 0.97),
    "int8": EmbeddingBudget(0.99, 0.97, 0.97),
}


# A classifier's INT8 budget where nothing else is given (the one-command path's guard, and the verdict on a guard record
# that measured without a budget): top-1 points lost against FP32 on the labeled images. Published W8A8 PTQ of ViTs
# with LayerNorm/Softmax in float loses about 0.3 points (PTQ4ViT; shared/TENSORRT.md): over 1 point is below the state
# of the art.
CLASSIFIER_INT8_MAX_DROP = 1.0


def int8_failures(task: Task, figures: dict[str, Any], max_drop: float | None = None,
                  min_agreement: float | None = None, min_cosine: float | None = None) -> list[str]:
    """Why the INT8 figures the guard records (checks/guard.py: ``Figures.to_dict`` or ``EmbeddingFigures.to_dict``)
    miss the task's INT8 budget, [] when within it: the one place that says what "within budget" means for an INT8.

    A classifier: the top-1 drop in points within ``max_drop`` (default CLASSIFIER_INT8_MAX_DROP) and, when given,
    the top-1 agreement at least ``min_agreement``. An embedding model: the INT8 EmbeddingBudget (``min_cosine``
    replaces the mean gate), its nearest-neighbour gate where the set has two images at least."""
    def num(key: str) -> float:
        v = figures.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else float("nan")

    if not task.is_embedding:
        drop, agreement = num("drop_points"), num("agreement")
        limit = CLASSIFIER_INT8_MAX_DROP if max_drop is None else max_drop
        out = [] if drop <= limit else [f"top-1 drop {drop:.2f} points > {limit}"]
        if min_agreement is not None and not agreement >= min_agreement:
            out.append(f"top-1 agreement {agreement:.4f} < {min_agreement}")
        return out
    b = embedding_budget("int8", min_cosine)
    out = []
    if figures.get("nonfinite"):
        out.append(f"NaN or Inf embeddings on {figures['nonfinite']} images")
    if not num("cosine_mean") >= b.min_cosine:
        out.append(f"mean cosine {num('cosine_mean'):.5f} < {b.min_cosine}")
    if not num("cosine_p1") >= b.min_cosine_p1:
        out.append(f"1st-percentile cosine {num('cosine_p1'):.5f} < {b.min_cosine_p1}")
    nn = min_agreement if min_agreement is not None else b.min_nn_agreement
    if num("images") > 1 and not num("nn_agreement") >= nn:
        out.append(f"nearest-neighbour agreement {num('nn_agreement'):.4f} < {nn}")
    return out


def embedding_budget(precision: str, min_cosine: float | None = None) -> EmbeddingBudget:
    """The default budget of a precision; ``min_cosine`` (the guard's --min-cosine) replaces the mean gate."""
    b = EMBEDDING_BUDGETS.get(precision, EMBEDDING_BUDGETS["int8"])
    if min_cosine is not None:
        from vitdeploy.core.limits import check_range

        check_range("--min-cosine", min_cosine, "fraction")  # the range --help shows: [0.0<=x<=1.0]
        b = EmbeddingBudget(min_cosine, min(b.min_cosine_p1, min_cosine), b.min_nn_agreement)
    return b


@dataclass(frozen=True)
class EmbeddingJudge:
    """Judges an embedding model's artifacts against its reference."""

    task: Task

    def compare(self, reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray | None = None,
                knn_reference: float | None = None) -> EmbeddingComparison:
        return compare_embeddings(reference, candidate, labels, knn_reference)

    def budget(self, precision: str, min_cosine: float | None = None) -> EmbeddingBudget:
        return embedding_budget(precision, min_cosine)


def judge_for(manifest: Any) -> EmbeddingJudge | None:
    """The embedding judge for an embedding model's manifest; None for a classifier (judged by checks/metrics.compare
    with top-1 and agreement, as before tasks existed)."""
    task = task_of(manifest)
    return EmbeddingJudge(task) if task.is_embedding else None


def refuse_classifier_budget(manifest: Any, option: str = "--max-drop") -> None:
    """A top-1 budget (--max-drop) means nothing for an embedding model: one line naming the embedding budget."""
    task = task_of(manifest)
    if task.is_embedding:
        raise UsageError(
            f"{option} is a top-1 budget for classifiers; this is an {task.describe()}: "
            "use --min-cosine (mean per-image cosine to FP32, e.g. 0.99) instead"
        )
