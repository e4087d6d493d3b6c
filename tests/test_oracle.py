"""The TensorRT oracle: integer GEMMs pinned against arithmetic done by hand, float16 rounding, 8.x pinning,
and our real INT8 artifacts against OpenVINO's int8 execution (run in its own process)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.host import cpu_int8_dot_exact
from vitdeploy.runners.oracle.loader import lower
from vitdeploy.runners.oracle.runner import OracleSession

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"


def _run(model: onnx.ModelProto, feeds: dict[str, np.ndarray], target: str | None = None) -> np.ndarray:
    return OracleSession(lower(model, target)).run(feeds)[0]


def _qdq_matmul(w_q: np.ndarray, s_a: float, s_w: np.ndarray, dtype: type = np.float32) -> onnx.ModelProto:
    """x → QuantizeLinear → DequantizeLinear ─┐
    W (int8) → DequantizeLinear (axis 1) ───┴→ MatMul → y    (scales and float tensors of ``dtype``)"""
    et = TensorProto.FLOAT16 if dtype == np.float16 else TensorProto.FLOAT
    k, n = w_q.shape
    inits = [
        numpy_helper.from_array(np.array(s_a, dtype), "s_a"), numpy_helper.from_array(np.array(0, np.int8), "z_a"),
        numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(s_w.astype(dtype), "s_w"),
        numpy_helper.from_array(np.zeros(n, np.int8), "z_w"),
    ]
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "s_a", "z_a"], ["x_q"], name="q"),
        helper.make_node("DequantizeLinear", ["x_q", "s_a", "z_a"], ["x_dq"], name="dq"),
        helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w_dq"], name="w_dq", axis=1),
        helper.make_node("MatMul", ["x_dq", "w_dq"], ["y"], name="matmul"),
    ]
    g = helper.make_graph(nodes, "qdq_matmul", [helper.make_tensor_value_info("x", et, ["m", k])],
                          [helper.make_tensor_value_info("y", et, ["m", n])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 19 if dtype == np.float16 else 17)])


def _quantize_by_hand(x: np.ndarray, s: float) -> np.ndarray:
    return np.clip(np.rint(x.astype(np.float32) / np.float32(s)), -128, 127).astype(np.int64)


def test_int8_matmul_is_the_int32_sum_times_the_scale_product_not_the_float_dequantized_sum() -> None:
    rng = np.random.default_rng(0)
    k, n = 768, 16
    w_q = rng.integers(-127, 128, size=(k, n), dtype=np.int8)
    s_a, s_w = 0.0173, (rng.uniform(0.001, 0.01, n)).astype(np.float32)
    x = rng.normal(0, 1, size=(8, k)).astype(np.float32)
    model = _qdq_matmul(w_q, s_a, s_w)
    lowered = lower(model)
    assert lowered.fused == ["matmul"]
    assert [n.op_type for n in lowered.model.graph.node][:3] == ["QuantizeLinear", "MatMulInteger", "Cast"]

    got = _run(model, {"x": x})
    acc = _quantize_by_hand(x, s_a) @ w_q.astype(np.int64)  # exact integers
    expected = acc.astype(np.float32) * (np.float32(s_a) * s_w)
    assert got.dtype == np.float32
    np.testing.assert_array_equal(got, expected)
    # the float32 computation of the same Q/DQ graph (dequantize, then a float GEMM) differs in the last bits:
    dequantized = (_quantize_by_hand(x, s_a).astype(np.float32) * np.float32(s_a)) @ (w_q.astype(np.float32) * s_w)
    assert not np.array_equal(dequantized, expected)
    assert np.max(np.abs(dequantized - expected)) < 1e-4 * np.max(np.abs(expected))


def test_activation_quantization_rounds_half_to_even_and_saturates() -> None:
    x = np.array([[1.25, 1.75, -1.25, 100.0, -100.0, 0.75]], np.float32)  # / 0.5: 2.5 3.5 -2.5 200 -200 1.5
    got = _run(_qdq_matmul(np.eye(6, dtype=np.int8), 0.5, np.ones(6, np.float32)), {"x": x})
    np.testing.assert_array_equal(got, [[1.0, 2.0, -1.0, 63.5, -64.0, 1.0]])


def test_float16_scales_give_one_rounding_to_float16_after_the_exact_scale_product() -> None:
    rng = np.random.default_rng(1)
    w_q = rng.integers(-127, 128, size=(64, 8), dtype=np.int8)
    s_a, s_w = np.float16(0.02), rng.uniform(0.001, 0.01, 8).astype(np.float16)
    x = rng.normal(0, 1, size=(4, 64)).astype(np.float16)
    got = _run(_qdq_matmul(w_q, float(s_a), s_w, np.float16), {"x": x})
    assert got.dtype == np.float16
    q = np.clip(np.rint(x.astype(np.float32) / np.float32(s_a)), -128, 127).astype(np.int64)
    product = np.float32(s_a) * s_w.astype(np.float32)
    assert np.array_equal(product.astype(np.float64), np.float64(s_a) * s_w.astype(np.float64))  # exact in float32
    np.testing.assert_array_equal(got, ((q @ w_q.astype(np.int64)).astype(np.float32) * product).astype(np.float16))


def _conv_by_hand(xq: np.ndarray, wq: np.ndarray, stride: int) -> np.ndarray:
    """The int8 convolution as loops over output positions, exact in int64."""
    n, c, h, w = xq.shape
    o, _, kh, kw = wq.shape
    oh, ow = (h - kh) // stride + 1, (w - kw) // stride + 1
    out = np.zeros((n, o, oh, ow), np.int64)
    for i in range(oh):
        for j in range(ow):
            patch = xq[:, :, i * stride : i * stride + kh, j * stride : j * stride + kw].astype(np.int64)
            out[:, :, i, j] = np.einsum("nchw,ochw->no", patch, wq.astype(np.int64))
    return out


def test_int8_conv_is_an_integer_convolution_with_per_channel_scales_and_float32_bias() -> None:
    rng = np.random.default_rng(2)
    w_q = rng.integers(-127, 128, size=(3, 2, 2, 2), dtype=np.int8)
    s_w, bias = np.array([0.011, 0.007, 0.013], np.float32), np.array([0.5, -0.25, 0.1], np.float32)
    s_a = 0.031
    inits = [numpy_helper.from_array(np.array(s_a, np.float32), "s_a"), numpy_helper.from_array(np.array(0, np.int8), "z"),
             numpy_helper.from_array(w_q, "w_q"), numpy_helper.from_array(s_w, "s_w"),
             numpy_helper.from_array(np.zeros(3, np.int8), "z_w"), numpy_helper.from_array(bias, "b")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_a", "z"], ["x_q"]),
             helper.make_node("DequantizeLinear", ["x_q", "s_a", "z"], ["x_dq"]),
             helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w_dq"], axis=0),
             helper.make_node("Conv", ["x_dq", "w_dq", "b"], ["y"], name="conv", kernel_shape=[2, 2], strides=[2, 2])]
    g = helper.make_graph(nodes, "qdq_conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2, 6, 6])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 3, 3])], inits)
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    x = rng.normal(0, 2, size=(1, 2, 6, 6)).astype(np.float32)
    lowered = lower(model)
    assert lowered.fused == ["conv"] and "ConvInteger" in [n.op_type for n in lowered.model.graph.node]
    acc = _conv_by_hand(_quantize_by_hand(x, s_a).astype(np.int8), w_q, 2)
    expected = acc.astype(np.float32) * (np.float32(s_a) * s_w).reshape(1, 3, 1, 1) + bias.reshape(1, 3, 1, 1)
    np.testing.assert_array_equal(_run(model, {"x": x}), expected)


def _fp16_graph(node: onnx.NodeProto, k: int, inits: list[onnx.TensorProto] | None = None) -> onnx.ModelProto:
    g = helper.make_graph([node], "fp16", [helper.make_tensor_value_info("x", TensorProto.FLOAT16, [1, k])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT16, None)], inits or [])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_float16_matmul_accumulates_in_float32_and_rounds_once() -> None:
    a = np.array([[2048] + [1] * 8], np.float16)  # float16 spacing at 2048 is 2: 2048 + 1 rounds back to 2048
    b = np.ones((9, 1), np.float16)
    model = _fp16_graph(helper.make_node("MatMul", ["x", "b"], ["y"]), 9, [numpy_helper.from_array(b, "b")])
    got = _run(model, {"x": a})
    naive = np.float16(0)
    for v in a[0]:
        naive = np.float16(naive + v)  # what float16 accumulation would give
    assert got.dtype == np.float16 and got[0, 0] == np.float16(2056) and naive == np.float16(2048)


def test_trt8_pins_softmax_to_float32_and_strongly_typed_targets_keep_float16() -> None:
    x = np.array([[0.1, 0.2, 0.3, 0.45, -1.0]], np.float16)
    model = _fp16_graph(helper.make_node("Softmax", ["x"], ["y"], name="softmax", axis=-1), 5)
    e = np.exp(x.astype(np.float32) - x.astype(np.float32).max())
    exact = e / e.sum()
    pinned, typed = _run(model, {"x": x}, "trt8.5"), _run(model, {"x": x}, "trt10")
    assert pinned.dtype == np.float32 and typed.dtype == np.float16
    np.testing.assert_array_equal(pinned, exact)
    np.testing.assert_array_equal(typed, exact.astype(np.float16))
    assert not np.array_equal(pinned, typed.astype(np.float32))


def test_the_l2_normalisation_torch_exports_runs_as_onnxruntime_runs_it(tmp_path: Path) -> None:
    """F.normalize as torch exports it (ReduceL2 → Clip(min=eps) → Expand → Div: a zero-shot classifier's and an
    --normalize embedding's image side): the float32 oracle gives ONNX Runtime's answer, a zero row stays 0, and in
    float16 the norm is computed in float32 (TensorRT pins reductions on 8.x; the oracle widens them on every line)."""
    import onnxruntime as ort
    import torch
    import torch.nn.functional as F

    class Norm(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return F.normalize(x, dim=-1)

    torch.onnx.export(Norm(), (torch.ones(2, 5),), str(tmp_path / "n.onnx"), dynamo=False, opset_version=17,
                      input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "b"}, "y": {0: "b"}})
    model = onnx.load(str(tmp_path / "n.onnx"))
    assert {"ReduceL2", "Clip"} <= {n.op_type for n in model.graph.node}
    x = np.random.default_rng(0).normal(size=(4, 5)).astype(np.float32) * np.float32(30)
    x[2] = 0.0
    ref = ort.InferenceSession(str(tmp_path / "n.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    got = _run(model, {"x": x})
    np.testing.assert_allclose(got, ref, rtol=1e-6, atol=1e-7)
    assert not got[2].any() and np.allclose(np.linalg.norm(got[[0, 1, 3]], axis=1), 1.0, atol=1e-6)
    h = _fp16_graph(helper.make_node("ReduceL2", ["x"], ["y"], axes=[-1], keepdims=1), 4)
    big = np.array([[300.0, 300.0, 300.0, 300.0]], np.float16)  # the sum of squares (360000) overflows float16
    assert _run(h, {"x": big})[0, 0] == np.float16(600.0)


def test_a_graph_with_an_op_it_cannot_run_is_one_line() -> None:
    node = helper.make_node("Frobnicate", ["x"], ["y"], domain="custom")
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("custom", 1)])
    with pytest.raises(VitdeployError, match="cannot run op.*Frobnicate"):
        OracleSession(lower(model))


# --- our real artifacts against OpenVINO's int8 execution -----------------------------------------

_OV = ("import sys, numpy as np; from vitdeploy.runners import open_runner; r = open_runner(sys.argv[1], 'openvino'); "
       "x = np.load(sys.argv[2]); np.save(sys.argv[3], np.concatenate([r.run(x[i:i + 64]) for i in range(0, len(x), 64)]))")


def _openvino_logits(artifact: Path, x: np.ndarray, tmp: Path) -> np.ndarray:
    """OpenVINO in its own process: its thread pool and ONNX Runtime's slow each other in one process."""
    xp, out = tmp / "x.npy", tmp / f"{artifact.stem}.ov.npy"
    np.save(xp, x)
    subprocess.run([sys.executable, "-c", _OV, str(artifact), str(xp), str(out)], check=True, timeout=600)
    return np.load(out)


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory, digits_artifacts: Path, digits_folder: Path) -> dict[str, object]:
    """The digits ViT exported, calibrated without a target (the session's) and for trt10, and the validation images."""
    pytest.importorskip("openvino")
    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.stages.precision import calibrate

    d = tmp_path_factory.mktemp("oracle")
    for name in ("model.onnx", "model.int8.onnx"):
        shutil.copy(digits_artifacts / name, d / name)
    calibrate(d / "model.onnx", CALIB, d / "model.trt10.int8.onnx", num_images=256, target="trt10")
    ev = load_eval_set(digits_folder, read_onnx_manifest(d / "model.onnx"))
    return {"dir": d, "x": ev.x, "y": ev.y}


# Bound (oracle vs OpenVINO's int8 execution of the same file). Both run every quantized GEMM as an int8 GEMM with
# int32 accumulation; they differ in how the float32 scale product is formed and applied (a few float32 ulps) and
# in float32 summation order. Those ulps move an activation's x / scale across a rounding boundary now and then,
# which changes that int8 value by one step downstream. So: top-1 differs on at most one image, and every logit is
# within 1% of the logit range for the float32 artifact (one quantization step propagated; the exact-rounding
# part alone is ~1e-6 of it); the trt10 artifact's float parts are float16 on the oracle and float32 in OpenVINO,
# so its logits are held to 5% of the range (float16 rounding: 2^-11 per op over the depth of the network).
BOUNDS = {"model.int8.onnx": 0.01, "model.trt10.int8.onnx": 0.05}


@pytest.mark.parametrize("name", list(BOUNDS))
def test_the_oracle_agrees_with_openvino_int8_on_our_artifacts(artifacts: dict, name: str, tmp_path: Path) -> None:
    from vitdeploy.runners.oracle.runner import OracleRunner

    art = artifacts["dir"] / name  # type: ignore[operator]
    x, y = artifacts["x"], artifacts["y"]
    runner = OracleRunner(art)
    assert runner.describe()["int8_gemms"] > 0
    oracle = np.concatenate([runner.run(x[i : i + 64]) for i in range(0, len(x), 64)])  # type: ignore[index, arg-type]
    if cpu_int8_dot_exact():
        ov = _openvino_logits(art, x, tmp_path)  # type: ignore[arg-type]
    else:  # OpenVINO's first-layer int8 kernel saturates without VNNI (graph/quantize.py first_layer_overflow_fix)
        # ONNX Runtime with its graph optimisations off runs each DequantizeLinear and float GEMM as written: the Q/DQ
        # graph's own arithmetic, with none of ONNX Runtime's integer fusions (whose requantization rounds otherwise)
        import onnxruntime as ort

        print("no VNNI on this CPU: the independent runtime is ONNX Runtime without graph optimisations")
        so = ort.SessionOptions()
        so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        sess = ort.InferenceSession(str(art), so, providers=["CPUExecutionProvider"])
        name_in = sess.get_inputs()[0].name
        ov = np.concatenate([sess.run(None, {name_in: x[i : i + 64]})[0] for i in range(0, len(x), 64)])  # type: ignore[index, arg-type]
    flips = int(np.sum(oracle.argmax(1) != ov.argmax(1)))
    rel = float(np.max(np.abs(oracle - ov)) / np.max(np.abs(ov)))
    print(f"{name}: top-1 differs on {flips} of {len(x)} images; max |Δlogit| / range = {rel:.2e}")  # type: ignore[arg-type]
    # ONNX Runtime (the reference without VNNI) computes some float16 ops of the trt10 graph in float32, unlike
    # TensorRT and the oracle: two answers near a tie may flip there (measured: 2 of 360, max |Δ| 0.74% of range)
    assert flips <= (1 if cpu_int8_dot_exact() or name == "model.int8.onnx" else 2)
    assert rel <= BOUNDS[name]
    assert abs(np.mean(oracle.argmax(1) == y) - np.mean(ov.argmax(1) == y)) <= 1 / len(y)  # type: ignore[arg-type]


def test_runner_for_target_picks_the_oracle_for_tensorrt_targets_only(artifacts: dict) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.runners.oracle.runner import OracleRunner, runner_for_target

    art = artifacts["dir"] / "model.trt10.int8.onnx"  # type: ignore[operator]
    for target in ("trt8.5", "trt8.6", "trt10", "trt11"):
        assert isinstance(runner_for_target(art, target), OracleRunner)
    assert runner_for_target(artifacts["dir"] / "model.int8.onnx", "ort").backend in ("openvino", "onnxruntime")  # type: ignore[operator]
    assert open_runner(art, "oracle").describe()["target"] == "trt10"  # the manifest's target
    with pytest.raises(VitdeployError, match="unknown target"):
        runner_for_target(art, "trt7")
