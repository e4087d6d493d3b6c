"""make test's workers (pytest-xdist, one per core) each keep to their share of the cores: the pools they compute
with are as wide as that share, so two workers do not slow each other down (``conftest._share_the_cores``)."""

from __future__ import annotations

import os

import pytest


def test_a_worker_computes_with_a_pool_as_wide_as_its_share_of_the_cores() -> None:
    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        pytest.skip("runs under make test's workers (pytest -n 2 or more)")
    threadpoolctl = pytest.importorskip("threadpoolctl")
    import numpy as np

    np.ones((64, 64)) @ np.ones((64, 64))  # the BLAS is loaded and its pool started
    share = len(os.sched_getaffinity(0))
    pools = {p["internal_api"]: p["num_threads"] for p in threadpoolctl.threadpool_info()}
    assert pools, "no thread pool found"
    assert all(n <= share for n in pools.values()), f"pools {pools} are wider than this worker's {share} core(s)"
