"""Comparing outputs: one comparator, one tolerance rule, one softmax and one top-k for every check.

Modelled on Polygraphy's comparator (``polygraphy/comparator``): ``compare`` turns a reference
and a candidate (rows of logits, or of anything else row-shaped) into one ``Comparison`` of
the figures every check reports; extra per-row compare functions plug in by name (as
``CompareFunc`` does there), and ``softmax``/``top_k`` are the one post-processing
(``PostprocessFunc.top_k``). Export's parity, verify, the engine's compare, the guard,
bundle's raw-pixel check and explain's map comparison all read their figures from here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A per-row figure: reference rows, candidate rows (float64, [N, ...]) → one value per row.
RowFunc = Callable[[np.ndarray, np.ndarray], np.ndarray]


def logit_limit(rtol: float, ref_max_abs_logit: float) -> float:
    """The largest |Δlogit| allowed: rtol × max(1, max |reference logit|), the rule export and verify share."""
    return rtol * max(1.0, ref_max_abs_logit)


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


def nonfinite_note(count: int, rows: int, who: str = "the candidate") -> str:
    """The one line every check says about NaN/Inf outputs."""
    return f"{who} gave NaN or Inf logits on {count} of {rows} images (a non-finite output is never a pass)"


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


def require_finite(logits: np.ndarray, what: str = "the model") -> None:
    """Raise NonFiniteOutput (one line, how many images) when any row of ``logits`` holds NaN or Inf."""
    from vitdeploy.core.errors import NonFiniteOutput

    ok = finite_rows(logits)
    if not ok.all():
        raise NonFiniteOutput(nonfinite_note(int((~ok).sum()), len(ok), what))
