"""Comparing outputs: one comparator, one tolerance rule, one softmax and one top-k for every check.

Modelled on Polygraphy's comparator (``polygraphy/comparator``): ``compare`` turns a reference
and a candidate (rows of logits, or of anything else row-shaped) into one ``Comparison`` of
the figures every check reports; extra per-row compare functions plug in by name (as
``CompareFunc`` does there), and ``softmax``/``top_k`` are the one post-processing
(``PostprocessFunc.top_k``). Export's parity, verify, the engine's compare, the guard,
bundle's raw-pixel check and explain's map comparison all read their figures from here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A per-row figure: reference rows, candidate rows (float64, [N, ...]) → one value per row.
RowFunc = Callable[[np.ndarray, np.ndarray], np.ndarray]


def logit_limit(rtol: float, ref_max_abs_logit: float) -> float:
    """The largest |Δlogit| allowed: rtol × max(1, max |reference logit|), the rule export and verify share."""
    return rtol * max(1.0, ref_max_abs_logit)


def embedding_limit(rtol: float, ref_max_abs: float) -> float:
    """The largest |Δ| allowed in an embedding: rtol × max |reference value|, with no floor at 1 (an embedding's scale
    is its own: a unit vector's values are far below 1, where a floor would allow a 100% error)."""
    return rtol * ref_max_abs


def softmax(logits: np.ndarray) -> np.ndarray:
    """Probabilities over the last axis, in float64 (shifted by the row maximum, so large logits do not overflow)."""
    z = np.asarray(logits, dtype=np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def top_k(scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices and values of the k highest scores per row, best first; ties keep the lower class index first."""
    s = np.asarray(scores)
    squeeze = s.ndim == 1
    s2 = s[None] if squeeze else s
    idx = np.argsort(-s2, axis=-1, kind="stable")[..., : max(1, k)]
    vals = np.take_along_axis(s2, idx, axis=-1)
    return (idx[0], vals[0]) if squeeze else (idx, vals)


def finite_rows(values: np.ndarray) -> np.ndarray:
    """Per row: whether every value is finite (a NaN row's argmax is 0, so it would count as class 0 otherwise)."""
    v = np.asarray(values)
    if v.ndim == 0:
        return np.asarray(bool(np.isfinite(v)))
    return np.asarray(np.isfinite(v.reshape(len(v), -1)).all(axis=1)) if len(v) else np.zeros(0, bool)


def nonfinite_note(count: int, rows: int, who: str = "the candidate", values: str = "logits") -> str:
    """The one line every check says about NaN/Inf outputs; ``values``: what the model answers (a classifier's
    "logits", an embedding model's "embeddings": the line names what the model gave, issue 40)."""
    return f"{who} gave NaN or Inf {values} on {count} of {rows} images (a non-finite output is never a pass)"


def top_k_accuracy(logits: np.ndarray, labels: np.ndarray, k: int = 1) -> float:
    """Share of rows whose label is among the k highest logits (k=1: argmax equals the label); a row with a
    non-finite logit is never correct."""
    if not len(labels):
        return 0.0
    ok = finite_rows(logits)
    if k == 1:
        return float(((np.asarray(logits).argmax(-1) == labels) & ok).mean())
    top = np.argpartition(-np.asarray(logits), kth=k - 1, axis=-1)[:, :k]
    return float(((top == np.asarray(labels)[:, None]).any(axis=1) & ok).mean())


def cosine_rows(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Cosine similarity per row (1 where either row is all zeros)."""
    dot = (cand * ref).sum(1)
    norms = np.linalg.norm(cand, axis=1) * np.linalg.norm(ref, axis=1)
    return np.asarray(np.where(norms > 0, dot / np.maximum(norms, 1e-300), 1.0))


def pearson_rows(ref: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """Pearson correlation per row; a constant row correlates 1 with an equal row and 0 with any other."""
    out = np.empty(len(ref))
    for i, (a, b) in enumerate(zip(ref, cand, strict=True)):
        if a.std() == 0 or b.std() == 0:
            out[i] = 1.0 if np.array_equal(a, b) else 0.0
        else:
            out[i] = float(np.corrcoef(a, b)[0, 1])
    return out


@dataclass(frozen=True)
class Comparison:
    """The candidate's rows against the reference's. ``agreement``: share of rows with the same argmax."""

    rows: int
    max_abs_diff: float
    mean_abs_diff: float
    mean_sq_diff: float
    max_abs_reference: float
    max_abs_candidate: float
    agreement: float
    mismatches: int  # rows whose argmax differs
    cosine: float  # mean over rows
    min_cosine: float
    extra: dict[str, np.ndarray] = field(default_factory=dict)  # the plugged-in per-row figures
    nonfinite: int = 0  # candidate rows with a NaN or Inf value: they never agree, and |Δ| is then inf
    nonfinite_reference: int = 0  # the same for the reference (nothing can be judged against it there)

    @property
    def finite(self) -> bool:
        return not (self.nonfinite or self.nonfinite_reference)

    def nonfinite_message(self) -> str | None:
        """One line naming how many images gave NaN/Inf, or None when all were finite."""
        parts = []
        if self.nonfinite:
            parts.append(nonfinite_note(self.nonfinite, self.rows))
        if self.nonfinite_reference:
            parts.append(nonfinite_note(self.nonfinite_reference, self.rows, "the reference"))
        return "; ".join(parts) or None

    @property
    def max_rel_diff(self) -> float:
        """max |Δ| relative to the largest reference value."""
        return self.max_abs_diff / max(self.max_abs_reference, 1e-12)

    def limit(self, rtol: float) -> float:
        return logit_limit(rtol, self.max_abs_reference)

    def within(self, rtol: float) -> bool:
        """max |Δ| ≤ rtol × max(1, max |reference|), with every value finite."""
        return self.finite and self.max_abs_diff <= self.limit(rtol)

    def to_dict(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff,
            "max_rel_diff": self.max_rel_diff,
            "max_abs_reference": self.max_abs_reference,
            "agreement": self.agreement,
            "mismatches": self.mismatches,
            "cosine": self.cosine,
            "min_cosine": self.min_cosine,
            "nonfinite": self.nonfinite,
            "nonfinite_reference": self.nonfinite_reference,
        }


def compare(
    reference: np.ndarray,
    candidate: np.ndarray,
    extra: Mapping[str, RowFunc] | None = None,
    postprocess: Callable[[np.ndarray], np.ndarray] | None = None,
) -> Comparison:
    """The one comparator: the candidate's [N, ...] rows against the reference's.

    ``postprocess`` (e.g. ``softmax``) is applied to both before comparing; ``extra`` adds
    named per-row figures (e.g. ``{"correlation": pearson_rows}``). Empty inputs compare
    as equal (zero differences, full agreement). Finite numbers are part of parity: a row with a
    NaN or Inf (in either) never agrees, and makes the |Δ| figures inf, so every tolerance fails;
    ``nonfinite`` counts the rows (``nonfinite_message`` says it in one line).
    """
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"reference has shape {list(ref.shape)}, candidate {list(cand.shape)}")
    if postprocess is not None:
        ref, cand = postprocess(ref), postprocess(cand)
    n = len(ref)
    if n == 0 or ref.size == 0:
        return Comparison(n, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0, 1.0, 1.0, {k: np.zeros(0) for k in extra or {}})
    r2, c2 = ref.reshape(n, -1), cand.reshape(n, -1)
    ok_r, ok_c = finite_rows(r2), finite_rows(c2)
    ok = ok_r & ok_c
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.where(ok[:, None], np.abs(c2 - r2), np.inf)
        same = (r2.argmax(-1) == c2.argmax(-1)) & ok
        cos = np.where(ok, cosine_rows(np.where(ok[:, None], r2, 0.0), np.where(ok[:, None], c2, 0.0)), 0.0)
        return Comparison(
            rows=n,
            max_abs_diff=float(diff.max()),
            mean_abs_diff=float(diff.mean()),
            mean_sq_diff=float(np.mean(diff**2)),
            max_abs_reference=float(np.abs(r2[ok_r]).max()) if ok_r.any() else 0.0,
            max_abs_candidate=float(np.abs(c2).max()),
            agreement=float(same.mean()),
            mismatches=int((~same).sum()),
            cosine=float(cos.mean()),
            min_cosine=float(cos.min()),
            extra={k: np.asarray(f(r2, c2)) for k, f in (extra or {}).items()},
            nonfinite=int((~ok_c).sum()),
            nonfinite_reference=int((~ok_r).sum()),
        )


def require_finite(logits: np.ndarray, what: str = "the model", values: str = "logits") -> None:
    """Raise NonFiniteOutput (one line, how many images) when any row of ``logits`` holds NaN or Inf; ``values``
    names them as ``nonfinite_note`` does."""
    from vitdeploy.core.errors import NonFiniteOutput

    ok = finite_rows(logits)
    if not ok.all():
        raise NonFiniteOutput(nonfinite_note(int((~ok).sum()), len(ok), what, values))


# --- embedding models: the figures TensorRT-Model-Connect gates on, and DINOv2's kNN ---------------------------

KNN_K = 20  # DINOv2's eval/knn.py: k=20 neighbours, temperature 0.07, votes weighted exp(cos / T)
KNN_T = 0.07


def l2_normalize(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (an all-zero row stays zero)."""
    v = np.asarray(x, dtype=np.float64)
    n = np.linalg.norm(v, axis=1, keepdims=True)
    return np.asarray(v / np.where(n > 0, n, 1.0))


SIM_ROWS = 1024  # query rows per block of cosine similarities: one [N, N] matrix of 50,000 images would be 20 GB


def _similarity_blocks(queries: np.ndarray, gallery: np.ndarray, leave_one_out: bool) -> Iterator[tuple[int, np.ndarray]]:
    """(first row, cosine similarities [rows, gallery]) per block of SIM_ROWS unit-length queries; with
    ``leave_one_out`` (the queries are the gallery) each row's similarity to itself is -inf."""
    for s in range(0, len(queries), SIM_ROWS):
        sim = queries[s : s + SIM_ROWS] @ gallery.T
        if leave_one_out:
            rows = np.arange(len(sim))
            sim[rows, rows + s] = -np.inf
        yield s, sim


def nearest_neighbours(x: np.ndarray) -> np.ndarray:
    """Each row's nearest other row by cosine (leave-one-out), as an index."""
    z = l2_normalize(x)
    out = np.zeros(len(z), np.int64)
    for s, sim in _similarity_blocks(z, z, leave_one_out=True):
        out[s : s + len(sim)] = sim.argmax(axis=1)
    return out


def knn_predict(gallery: np.ndarray, gallery_labels: np.ndarray, queries: np.ndarray, num_classes: int,
                k: int = KNN_K, temperature: float = KNN_T, leave_one_out: bool = False,
                exclude: np.ndarray | None = None) -> np.ndarray:
    """Class scores per query by DINOv2's weighted kNN (eval/knn.py): the k most cosine-similar gallery rows vote for
    their class with weight exp(cos / T). ``leave_one_out``: the queries are the gallery, each row's own vote left
    out; ``exclude``: per query, a gallery row left out (-1: none). Returns [queries, num_classes]."""
    scores = np.zeros((len(queries), num_classes))
    for s, idx, sim in knn_neighbours(gallery, queries, k, leave_one_out, exclude):
        scores[s : s + len(idx)] = knn_votes(idx, sim, gallery_labels, num_classes, temperature)
    return scores


def knn_votes(idx: np.ndarray, sim: np.ndarray, gallery_labels: np.ndarray, num_classes: int,
              temperature: float = KNN_T) -> np.ndarray:
    """The class scores [queries, num_classes] that neighbours (their gallery indices and cosines, as
    ``knn_neighbours`` gives them) vote: weight exp(cos / T) each, DINOv2's eval/knn.py."""
    z = np.asarray(sim, np.float64) / temperature
    finite = np.isfinite(z)  # a left-out row (-inf) never votes
    z = np.where(finite, z, 0.0)
    top = np.max(np.where(finite, z, -np.inf), axis=1, keepdims=True)
    w = np.where(finite, np.exp(z - np.where(np.isfinite(top), top, 0.0)), 0.0)  # shifted: same votes, no overflow
    scores = np.zeros((len(idx), num_classes))
    rows = np.repeat(np.arange(len(idx)), idx.shape[1])
    np.add.at(scores, (rows, np.asarray(gallery_labels)[idx].ravel()), w.ravel())
    return scores


def knn_neighbours(gallery: np.ndarray, queries: np.ndarray, k: int = KNN_K, leave_one_out: bool = False,
                   exclude: np.ndarray | None = None) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Per block of queries: (first row, the k most cosine-similar gallery rows' indices, their cosines), most
    similar first (infer --gallery shows them; knn_votes weighs them). ``exclude``: per query, a gallery row left
    out (-1: none; a query that is a gallery image must not vote for itself)."""
    g, q = l2_normalize(gallery), l2_normalize(queries)
    k = max(1, min(k, g.shape[0] - int(leave_one_out or exclude is not None and bool((exclude >= 0).any()))))
    for s, sim in _similarity_blocks(q, g, leave_one_out):
        if exclude is not None:
            ex = np.asarray(exclude[s : s + len(sim)])
            rows = np.flatnonzero(ex >= 0)
            sim[rows, ex[rows]] = -np.inf
        idx = np.argpartition(-sim, kth=k - 1, axis=1)[:, :k]
        near = np.take_along_axis(sim, idx, axis=1)
        order = np.argsort(-near, axis=1, kind="stable")
        yield s, np.take_along_axis(idx, order, axis=1), np.take_along_axis(near, order, axis=1)


def knn_accuracy(x: np.ndarray, labels: np.ndarray, k: int = KNN_K, temperature: float = KNN_T) -> float:
    """Leave-one-out kNN top-1 of a labelled set's embeddings (DINOv2's weighted vote)."""
    y = np.asarray(labels)
    if len(y) < 2:
        return 0.0
    scores = knn_predict(x, y, x, int(y.max()) + 1, k, temperature, leave_one_out=True)
    return float((scores.argmax(1) == y).mean())


@dataclass(frozen=True)
class EmbeddingComparison:
    """A candidate's embeddings against the reference's, per image: cosine (mean, 1st percentile, minimum), the
    relative Frobenius error ||C − R|| / ||R||, the share of images whose nearest neighbour in the set is the
    reference's, and (with labels) both models' leave-one-out kNN top-1."""

    rows: int
    cosine_mean: float
    cosine_p1: float
    cosine_min: float
    rel_frobenius: float
    nn_agreement: float
    knn_top1: float | None = None
    knn_top1_reference: float | None = None
    nonfinite: int = 0
    per_image_cosine: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def finite(self) -> bool:
        return not self.nonfinite

    @property
    def knn_drop_points(self) -> float | None:
        if self.knn_top1 is None or self.knn_top1_reference is None:
            return None
        return round(100.0 * (self.knn_top1_reference - self.knn_top1), 4)

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "rows": self.rows,
            "cosine_mean": self.cosine_mean,
            "cosine_p1": self.cosine_p1,
            "cosine_min": self.cosine_min,
            "rel_frobenius": self.rel_frobenius,
            "nn_agreement": self.nn_agreement,
            "nonfinite": self.nonfinite,
        }
        if self.knn_top1 is not None:
            d.update(knn_top1=self.knn_top1, knn_top1_reference=self.knn_top1_reference,
                     knn_drop_points=self.knn_drop_points)
        return d


def compare_embeddings(reference: np.ndarray, candidate: np.ndarray, labels: np.ndarray | None = None,
                       knn_reference: float | None = None) -> EmbeddingComparison:
    """The one comparator for embedding models ([N, D] rows; [N, P, D] patch tokens are compared per token, their
    figures then over every token). A non-finite row has cosine 0 and never agrees. ``knn_reference``: the
    reference's kNN top-1 on these labels where the caller has it already (verify, for its second candidate on)."""
    ref = np.asarray(reference, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if ref.shape != cand.shape:
        raise ValueError(f"reference has shape {list(ref.shape)}, candidate {list(cand.shape)}")
    n = len(ref)
    if n == 0:
        return EmbeddingComparison(0, 1.0, 1.0, 1.0, 0.0, 1.0)
    r2, c2 = ref.reshape(-1, ref.shape[-1]), cand.reshape(-1, cand.shape[-1])
    ok = finite_rows(r2) & finite_rows(c2)
    r0, c0 = np.where(ok[:, None], r2, 0.0), np.where(ok[:, None], c2, 0.0)
    cos = np.where(ok, cosine_rows(r0, c0), 0.0)
    frob = float(np.linalg.norm(c0 - r0)) / max(float(np.linalg.norm(r0)), 1e-300) if ok.all() else float("inf")
    if ref.ndim == 2 and n > 1:
        nn_r, nn_c = nearest_neighbours(r0), nearest_neighbours(c0)
        nn = float(((nn_r == nn_c) & ok).mean())
    else:
        nn = float(ok.mean())
    knn = knn_ref = None
    if labels is not None and ref.ndim == 2 and len(labels) == n and n > 1:
        knn = knn_accuracy(c0, labels)
        knn_ref = knn_accuracy(r0, labels) if knn_reference is None else knn_reference
    return EmbeddingComparison(
        rows=n,
        cosine_mean=float(cos.mean()),
        cosine_p1=float(np.percentile(cos, 1)),
        cosine_min=float(cos.min()),
        rel_frobenius=frob,
        nn_agreement=nn,
        knn_top1=knn,
        knn_top1_reference=knn_ref,
        nonfinite=int((~ok).sum()),
        per_image_cosine=cos if ref.ndim == 2 else cos.reshape(ref.shape[:-1]),
    )
