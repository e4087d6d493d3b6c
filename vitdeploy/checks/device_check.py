"""What the bundle's ``run.py --check`` holds a device's embeddings to beyond the cosine gates: each vector's norm.

Cosine ignores scale: a reference (or an engine's answer) multiplied by 1000 keeps every cosine at 1.0, yet a
gallery searched by inner product, a threshold on distances or a norm-based filter on the device would all break.
So each vector's L2 norm must stay within a share of the reference's: 1% for FP32 and FP16 (TF32 and float16
rounding move a norm by about 1e-3), 5% for INT8 (per-tensor activation scales move it by a few percent). The bundle
writes the gate per precision into manifest.json (``bundle.reference.check[precision].max_norm_rel_err``) beside the
cosine gates; run.py reads it there and keeps a copy of this table for bundles made before it (a test holds the two
equal). Patch tokens (an export with ``--tokens``) are held token by token to the same gates.
"""

from __future__ import annotations

from typing import Any

import numpy as np

# the largest |‖device‖ − ‖reference‖| / ‖reference‖ of any one vector, per precision
NORM_TOLERANCE = {"fp32": 0.01, "fp16": 0.01, "int8": 0.05}


def norm_tolerance(precision: str) -> float:
    return NORM_TOLERANCE.get(precision, NORM_TOLERANCE["int8"])


def norm_rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest per-row relative norm error of ``got`` against ``ref`` (rows: the last axis is the vector)."""
    w = ref.shape[-1]
    g = np.linalg.norm(np.asarray(got, np.float64).reshape(-1, w), axis=1)
    r = np.linalg.norm(np.asarray(ref, np.float64).reshape(-1, w), axis=1)
    if not r.size:
        return 0.0
    d = np.abs(g - r)
    with np.errstate(divide="ignore", invalid="ignore"):
        err = np.where(r > 0, d / np.where(r > 0, r, 1.0), np.where(d > 0, np.inf, 0.0))
    err = np.where(np.isfinite(g), err, np.inf)
    return float(err.max())


def norm_failure(precision: str, reference: np.ndarray, got: np.ndarray) -> str | None:
    """Why ``got`` would fail run.py --check's norm gate against ``reference``, or None."""
    tol = norm_tolerance(precision)
    err = norm_rel_err(got, reference)
    if err <= tol:
        return None
    return f"a vector's norm {err:.2%} away from the reference's, above run.py --check's {tol:.0%}"


def reference_tokens(runner: Any, x: np.ndarray, batch_size: int = 64) -> np.ndarray | None:
    """The patch tokens [N, patches, width] ``runner`` gives for ``x`` (the bundle's reference inputs, in batches),
    or None where its model has none: what run.py --check compares a device's ``patch_tokens`` output with."""
    parts = []
    for i in range(0, len(x), batch_size):
        tokens = runner.run_with_tokens(x[i : i + batch_size])[1]
        if tokens is None:
            return None
        parts.append(np.asarray(tokens, np.float32))
    return np.concatenate(parts) if parts else None
