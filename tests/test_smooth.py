"""SmoothQuant-style migration on the trained digits ViT: exact in FP32, and INT8 survives a 50× channel spread."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from helpers import paired_margin, with_spread

from vitdeploy.graph.smooth import factors, sites, smooth
from vitdeploy.stages.precision import site_channel_max as channel_max

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"
K = 50.0
CHANNELS = [3, 17, 42, 77]  # "a few channels" of the 96 (any few; fixed so the run is repeatable)


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, digits_onnx: Path) -> Path:
    d = tmp_path_factory.mktemp("smooth")
    shutil.copy(digits_onnx, d / "model.onnx")
    return d


def _batches(path: Path, n: int = 128) -> list[np.ndarray]:
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.images import iter_batches
    from vitdeploy.core.preprocess import list_images

    pp = OnnxArtifact.open(path).manifest.pp()
    return [b.array for b in iter_batches(list_images(CALIB)[:n], pp, 32)]


def _eval(path: Path, digits_folder: Path):  # type: ignore[no-untyped-def]
    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.artifact import OnnxArtifact

    return load_eval_set(digits_folder, OnnxArtifact.open(path).manifest)


def _logits(path: Path, x: np.ndarray) -> np.ndarray:
    from vitdeploy.checks.guard import logits

    return logits(onnx.load(str(path)), x)


def test_factors_follow_the_smoothquant_formula() -> None:
    s = factors(np.array([4.0, 1.0, 0.0]), np.array([1.0, 4.0, 2.0]), 0.5)
    np.testing.assert_allclose(s, [2.0, 0.5, np.sqrt(1e-5) / np.sqrt(2.0)], rtol=1e-6)
    np.testing.assert_allclose(factors(np.array([8.0]), np.array([3.0]), 1.0), [8.0])
    np.testing.assert_allclose(factors(np.array([8.0]), np.array([4.0]), 0.0), [0.25])
    with pytest.raises(ValueError):
        smooth(onnx.ModelProto(), {}, alpha=1.5)


def test_smoothing_is_exact_in_fp32_and_changes_initializers_only(work: Path, digits_folder: Path) -> None:
    src = work / "model.onnx"
    model = onnx.load(str(src))
    found = sites(model)
    assert found and all(len(s.matmuls) >= 1 for s in found)  # QKV and fc1 of every block
    res = smooth(model, channel_max(model, _batches(src)), alpha=0.5)
    assert set(res.factors) == {s.layernorm for s in found}
    assert any(not np.allclose(s, 1.0) for s in res.factors.values())  # it did move something
    # same nodes, same wiring: TensorRT's LayerNorm → Q/DQ → MatMul fusion sees the same graph
    assert [(n.op_type, list(n.input), list(n.output)) for n in res.model.graph.node] == \
           [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]
    onnx.save(res.model, str(work / "smoothed.onnx"))
    x = _eval(src, digits_folder).x
    ref, got = _logits(src, x), _logits(work / "smoothed.onnx", x)
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))


def test_int8_of_the_50x_spread_model_agrees_better_with_fp32_after_smoothing(work: Path, digits_folder: Path) -> None:
    from vitdeploy.stages.precision import calibrate

    src = work / "model.onnx"
    spread = with_spread(onnx.load(str(src)), K, CHANNELS)
    onnx.save(spread, str(work / "spread.onnx"))
    res = smooth(spread, channel_max(spread, _batches(src)), alpha=0.5)
    onnx.save(res.model, str(work / "spread.smoothed.onnx"))
    ev = _eval(src, digits_folder)
    ref = _logits(src, ev.x)
    assert np.max(np.abs(_logits(work / "spread.onnx", ev.x) - ref)) <= 1e-4 * np.max(np.abs(ref))  # equivalent
    figures = {}
    for name, src_name, how in (("spread", "spread", "off"), ("spread.smoothed", "spread.smoothed", "off"),
                                ("spread.auto", "spread", "auto")):
        q = calibrate(work / f"{src_name}.onnx", CALIB, work / f"{name}.int8.onnx", num_images=128, smooth=how)
        got = _logits(q.path, ev.x)
        figures[name] = (got.argmax(1) == ref.argmax(1), float(np.abs(got - ref).mean()))
        if how == "auto":  # calibrate's own choice: the spread is over numerics' limit, so it smooths at 0.5
            rec = q.manifest.extra["quantization"]["smoothing"]
            assert rec["applied"] and rec["max_spread"] > 16 and rec["alpha"] == 0.5
    (agree_spread, err_spread), (agree_smooth, err_smooth) = figures["spread"], figures["spread.smoothed"]
    agree_auto, err_auto = figures["spread.auto"]
    # Agreement is a count of images that moves with the CPU's INT8 kernels (ONNX Runtime's MLAS runs VNNI/AMX or
    # AVX2 GEMMs that round otherwise): smoothing must not make it significantly worse, within the paired margin
    # (helpers.paired_margin: 2·sqrt(images on which exactly one of the two agrees)). The logit error is the claim
    # that does not move with the CPU: smoothing halves it.
    m_smooth, m_auto = paired_margin(agree_smooth, agree_spread), paired_margin(agree_auto, agree_spread)
    print(f"INT8 vs FP32 on {len(ev.y)} images: 50x spread agreement {agree_spread.mean():.4f} mean|dlogit| "
          f"{err_spread:.4g}; smoothed (alpha 0.5) agreement {agree_smooth.mean():.4f} mean|dlogit| {err_smooth:.4g} "
          f"(margin {m_smooth:.1f} images); auto {agree_auto.mean():.4f} {err_auto:.4g} (margin {m_auto:.1f})")
    assert agree_smooth.sum() >= agree_spread.sum() - m_smooth and err_smooth < err_spread / 2
    assert agree_auto.sum() >= agree_spread.sum() - m_auto and err_auto < err_spread / 2


def test_numerics_flags_the_spread_for_int8_and_smoothing_clears_it(work: Path) -> None:
    from vitdeploy.checks.numerics import numerics

    src = work / "model.onnx"
    spread = with_spread(onnx.load(str(src)), K, CHANNELS)
    onnx.save(spread, str(work / "spread.numerics.onnx"))
    onnx.save(smooth(spread, channel_max(spread, _batches(src)), alpha=0.5).model, str(work / "smoothed.numerics.onnx"))
    before = numerics(work / "spread.numerics.onnx", CALIB, num_images=64)
    after = numerics(work / "smoothed.numerics.onnx", CALIB, num_images=64)
    flagged = {t.tensor for t in before.tensors if "int8_spread" in t.flags}
    outputs = {s.output for s in sites(spread)}
    assert flagged and flagged <= outputs  # exactly the LayerNorm outputs the spread was put in
    assert not any("int8_spread" in t.flags for t in after.tensors)
