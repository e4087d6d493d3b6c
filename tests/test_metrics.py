"""The one comparator, softmax and top-k (vitdeploy.checks.metrics)."""

from __future__ import annotations

import numpy as np
import pytest

from vitdeploy.checks.metrics import compare, logit_limit, pearson_rows, softmax, top_k, top_k_accuracy


def test_softmax_top_k_stable_on_ties_and_large_logits() -> None:
    logits = np.array([[1.0, 3.0, 2.0], [1000.0, 0.0, 1000.0]], np.float32)
    idx, prob = top_k(softmax(logits), 2)
    assert idx.tolist() == [[1, 2], [0, 2]]  # the tie keeps the lower class first
    np.testing.assert_allclose(prob[1], [0.5, 0.5])
    assert np.all(np.isfinite(prob))
    one_idx, one_val = top_k(np.array([0.1, 0.7, 0.2]), 5)
    assert one_idx.tolist() == [1, 2, 0] and one_val.tolist() == [0.7, 0.2, 0.1]


def test_compare_figures() -> None:
    ref = np.array([[4.0, 1.0, 0.0], [0.0, 2.0, 1.0], [1.0, 0.0, -8.0]], np.float32)
    cand = ref.copy()
    cand[1] = [0.0, 1.0, 1.5]  # argmax moves 1 → 2, |Δ| up to 1
    c = compare(ref, cand)
    assert c.rows == 3 and c.mismatches == 1
    assert c.agreement == pytest.approx(2 / 3)
    assert c.max_abs_diff == pytest.approx(1.0)
    assert c.mean_abs_diff == pytest.approx(1.5 / 9)
    assert c.max_abs_reference == 8.0
    assert c.max_rel_diff == pytest.approx(1 / 8)
    assert c.limit(1e-2) == logit_limit(1e-2, 8.0) == pytest.approx(0.08)
    assert not c.within(1e-2) and c.within(0.2)
    assert c.min_cosine < c.cosine < 1.0
    same = compare(ref, ref)
    assert same.max_abs_diff == 0.0 and same.agreement == 1.0 and same.cosine == pytest.approx(1.0)
    empty = compare(np.zeros((0, 3)), np.zeros((0, 3)))
    assert empty.rows == 0 and empty.agreement == 1.0
    with pytest.raises(ValueError, match="shape"):
        compare(ref, ref[:2])


def test_compare_plugs_in_row_functions_and_postprocessing() -> None:
    rng = np.random.default_rng(0)
    a = rng.random((4, 5, 5))
    b = a.copy()
    b[2] = 1.0 - a[2]  # anti-correlated map
    c = compare(a, b, extra={"correlation": pearson_rows})
    corr = c.extra["correlation"]
    assert corr.shape == (4,) and corr[0] == pytest.approx(1.0) and corr[2] == pytest.approx(-1.0)
    probs = compare(np.array([[0.0, 0.0]]), np.array([[10.0, 10.0]]), postprocess=softmax)
    assert probs.max_abs_diff == pytest.approx(0.0)


def test_top_k_accuracy() -> None:
    logits = np.array([[0.1, 0.5, 0.4], [0.9, 0.05, 0.05], [0.2, 0.3, 0.5]])
    labels = np.array([2, 0, 0])
    assert top_k_accuracy(logits, labels, 1) == pytest.approx(1 / 3)
    assert top_k_accuracy(logits, labels, 2) == pytest.approx(2 / 3)
    assert top_k_accuracy(logits, labels, 3) == 1.0
