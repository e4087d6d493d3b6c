"""The calibration cache is an input like any other (issue 37, P10): read back only when every tensor has a finite,
positive range for the method asked, else calibrated again and said in one line.

On main a cache with its key kept and its ranges set to NaN made an INT8 model whose outputs were all NaN (exit 0);
zero or negative ranges gave constant logits; a missing method key gave KeyError. A real cache is made by
``calibrate`` on the cached digits export, edited each way, and calibrate run again: the INT8 model it writes must
be the one the untouched cache gives (the same images give the same ranges), with finite outputs.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ort_run

CALIB_IMAGES = 32  # one batch (calibrate needs one at least): seconds to collect


@pytest.fixture(scope="module")
def calibrated(digits_onnx: Path, digits_val10: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """model.onnx, its INT8 and calibration cache made once, and the INT8 outputs on a fixed batch."""
    from vitdeploy.stages.precision import calibrate

    d = tmp_path_factory.mktemp("calib_trust")
    src = Path(shutil.copy(digits_onnx, d / "model.onnx"))
    res = calibrate(src, digits_val10, num_images=CALIB_IMAGES, smooth="off")
    x = np.random.default_rng(0).normal(0, 1, (8, 3, *res.manifest.input_size)).astype(np.float32)
    return {"dir": d, "src": src, "cache": res.cache, "text": res.cache.read_text(), "x": x,
            "want": ort_run(res.path, x), "images": digits_val10}


def _each_range(value: float) -> Callable[[dict[str, Any]], None]:
    def edit(d: dict[str, Any]) -> None:
        for r in d["ranges"].values():
            for m in r:
                r[m] = value
    return edit


def _drop_method(d: dict[str, Any]) -> None:
    for r in d["ranges"].values():
        r.pop("entropy", None)


def _drop_tensor(d: dict[str, Any]) -> None:
    d["ranges"].pop(next(iter(d["ranges"])))


@pytest.mark.parametrize(("edit", "says"), [
    (_each_range(float("nan")), "not a finite positive number"),
    (_each_range(0.0), "range 0.0, not a finite positive number"),
    (_each_range(-3.0), "range -3.0, not a finite positive number"),
    (_drop_method, "has no 'entropy' range"),
    (_drop_tensor, "no range for tensor"),
], ids=["nan", "zero", "negative", "no-method-key", "no-tensor"])
def test_a_damaged_cache_is_recomputed_and_said(calibrated: dict[str, Any], edit: Callable[[dict[str, Any]], None],
                                                says: str) -> None:
    from vitdeploy.core.defaults import DEFAULT_METHOD
    from vitdeploy.stages.precision import calibrate

    assert DEFAULT_METHOD == "entropy"  # the key _drop_method removes
    cache: Path = calibrated["cache"]
    d = json.loads(calibrated["text"])
    edit(d)
    cache.write_text(json.dumps(d))  # NaN written as JSON's NaN, as an editor or a bad writer would
    res = calibrate(calibrated["src"], calibrated["images"], num_images=CALIB_IMAGES, smooth="off")
    assert not res.cache_reused
    said = [w for w in res.warnings if cache.name in w]
    assert len(said) == 1 and says in said[0] and said[0].endswith("calibrated again"), res.warnings
    got = ort_run(res.path, calibrated["x"])
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, calibrated["want"])  # same images, same ranges: the same INT8 model
    again = json.loads(cache.read_text())  # the cache was rewritten whole: the next run reuses it, silently
    assert again["ranges"] == json.loads(calibrated["text"])["ranges"]


def test_an_untouched_cache_is_reused_without_a_word(calibrated: dict[str, Any]) -> None:
    from vitdeploy.stages.precision import calibrate

    calibrated["cache"].write_text(calibrated["text"])
    res = calibrate(calibrated["src"], calibrated["images"], num_images=CALIB_IMAGES, smooth="off")
    assert res.cache_reused and not [w for w in res.warnings if calibrated["cache"].name in w]
    np.testing.assert_array_equal(ort_run(res.path, calibrated["x"]), calibrated["want"])
