"""The OpenVINO backend on real models and real digit images: logits against ONNX Runtime, `auto`, the cache,
the INT8 graph for the CPU target, and the bad inputs (one line, exit 1)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper
from typer.testing import CliRunner

from vitdeploy.cli import app
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.host import cpu_int8_dot_exact
from vitdeploy.runners import default_backend, open_runner

pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'vitdeploy[cpu]')")

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"
cli = CliRunner()


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, digits_artifacts: Path) -> Path:
    """The session's model.onnx and model.int8.onnx (calibrate's defaults on calibration/), plus the INT8 made for
    --target ort."""
    from vitdeploy.stages.precision import calibrate

    d = tmp_path_factory.mktemp("openvino")
    for name in ("model.onnx", "model.int8.onnx"):
        shutil.copy(digits_artifacts / name, d / name)
    calibrate(d / "model.onnx", CALIB, d / "model.ort.int8.onnx", target="ort")
    return d


@pytest.fixture(scope="module")
def val(work: Path, digits_folder: Path) -> tuple[np.ndarray, np.ndarray]:
    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.artifact import read_onnx_manifest

    ev = load_eval_set(digits_folder, read_onnx_manifest(work / "model.onnx"))
    return ev.x[:200], ev.y[:200]


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("VITDEPLOY_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "openvino"


def _both(path: Path, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with open_runner(path, backend="onnxruntime") as a, open_runner(path, backend="openvino") as b:
        assert (a.backend, b.backend) == ("onnxruntime", "openvino")
        return a(x), b(x)


def test_fp32_logits_match_onnxruntime(work: Path, val: tuple[np.ndarray, np.ndarray]) -> None:
    ort, ov = _both(work / "model.onnx", val[0])
    assert ov.shape == ort.shape == (len(val[0]), 10) and ov.dtype == np.float32
    assert np.abs(ov - ort).max() < 1e-3 * max(1.0, np.abs(ort).max())  # f32 float parts: no bfloat16 on AMX CPUs
    assert (ov.argmax(1) == ort.argmax(1)).all()


@pytest.mark.parametrize("name", ["model.int8.onnx", "model.ort.int8.onnx"])
def test_int8_logits_follow_onnxruntime(work: Path, val: tuple[np.ndarray, np.ndarray], name: str) -> None:
    """Both runtimes run the same Q/DQ graph; they may round a tensor differently at a step edge, no more. The CPU
    graph (model.ort.int8.onnx) holds on every CPU; the TensorRT one (8-bit weights in the patch embedding) only
    where the CPU adds int8 products without int16 saturation (VNNI)."""
    if name == "model.int8.onnx" and not cpu_int8_dot_exact():
        pytest.skip("no VNNI on this CPU: OpenVINO's first-layer int8 kernel saturates on the TensorRT graph's 8-bit "
                    "patch embedding (test_no_vnni_saturation_and_the_overflow_fix checks it)")
    ort, ov = _both(work / name, val[0])
    scale = np.abs(ort).max()
    assert np.abs(ov - ort).mean() < 0.02 * scale
    assert (ov.argmax(1) == ort.argmax(1)).mean() >= 0.98


def test_no_vnni_saturation_and_the_overflow_fix(work: Path, val: tuple[np.ndarray, np.ndarray],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU graph stores the patch embedding's weights in 7 bits (|q| <= 63) and every other layer in 8; `auto`
    keeps INT8 models off OpenVINO on a CPU without VNNI, but one made for -t openvino. On such a CPU
    (this one, where cpu_int8_dot_exact() is False) OpenVINO really does miscompute the 8-bit patch embedding."""
    from onnx import numpy_helper

    import vitdeploy.core.host as host

    m = onnx.load(str(work / "model.ort.int8.onnx"))
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    wq = {n.input[0]: np.abs(inits[n.input[0]]).max() for n in m.graph.node
          if n.op_type == "DequantizeLinear" and n.input[0] in inits and inits[n.input[0]].dtype == np.int8}
    conv = [k for k in wq if "Conv" in k]
    assert len(conv) == 1 and wq[conv[0]] == 63, wq
    assert all(v == 127 for k, v in wq.items() if k not in conv), wq
    from vitdeploy.core.artifact import OnnxArtifact

    ov_target = work / "model.openvino.int8.onnx"  # the same graph made for -t openvino
    if not ov_target.exists():
        src = OnnxArtifact.open(work / "model.ort.int8.onnx")
        OnnxArtifact.write(src.load_weights(), src.manifest.derive(target="openvino"), ov_target)
    monkeypatch.setattr(host, "cpu_int8_dot_exact", lambda cpuinfo="": False)
    # without VNNI every INT8 runs on ONNX Runtime (the TensorRT one saturates on OpenVINO; the CPU one runs faster
    # on ONNX Runtime there), but one made for -t openvino, which its guard judged on OpenVINO
    assert default_backend(work / "model.int8.onnx") == "onnxruntime"
    assert default_backend(work / "model.ort.int8.onnx") == "onnxruntime"
    assert default_backend(ov_target) == "openvino"
    assert default_backend(work / "model.onnx") == "openvino"
    monkeypatch.setattr(host, "cpu_int8_dot_exact", lambda cpuinfo="": True)
    assert {default_backend(work / n) for n in ("model.int8.onnx", "model.ort.int8.onnx", "model.onnx")} == {"openvino"}
    monkeypatch.undo()
    if not host.cpu_int8_dot_exact():
        ort, ov = _both(work / "model.int8.onnx", val[0])
        assert np.abs(ov - ort).mean() > 0.02 * np.abs(ort).max(), "OpenVINO no longer saturates here: revisit"


def test_cpu_int8_dot_exact_reads_the_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from vitdeploy.core.host import cpu_int8_dot_exact

    for var in ("ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"):  # a lowered oneDNN ISA overrides the flags (test_lowered_isa)
        monkeypatch.delenv(var, raising=False)

    f = tmp_path / "cpuinfo"
    f.write_text("processor\t: 0\nflags\t\t: fpu sse avx2 fma\n")
    assert not cpu_int8_dot_exact(str(f))
    f.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_vnni\n")
    assert cpu_int8_dot_exact(str(f))
    assert cpu_int8_dot_exact(str(tmp_path / "absent"))


def test_batches_of_any_size_and_the_cache(work: Path, own_cache: Path) -> None:
    x = np.random.default_rng(0).standard_normal((5, 3, *open_runner(work / "model.onnx", "onnxruntime").manifest.input_size), dtype=np.float32)
    with open_runner(work / "model.onnx", backend="openvino") as r:
        one = np.concatenate([r(x[i : i + 1]) for i in range(5)])
        np.testing.assert_allclose(r(x), one, atol=1e-4)
        assert r.describe()["config"]["INFERENCE_PRECISION_HINT"] == "f32"
        with pytest.raises(ValueError, match="expected a float32 batch"):
            r(x[:, :, :8])
    blobs = sorted(own_cache.glob("*.blob"))
    assert blobs, "the compiled model is cached for the next run"
    open_runner(work / "model.onnx", backend="openvino").close()
    assert sorted(own_cache.glob("*.blob")) == blobs  # the second run read the cache, wrote nothing new


def test_auto_picks_openvino_for_onnx_on_a_cpu(work: Path, digits_ckpt: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert default_backend(work / "model.onnx") == "openvino"
    assert default_backend(work / "model.onnx", device="cuda") == "onnxruntime"
    assert default_backend(digits_ckpt) == "torch"
    # a TensorRT-bound INT8 model stays off OpenVINO on a CPU without VNNI (test_no_vnni_saturation_and_the_overflow_fix)
    assert open_runner(work / "model.int8.onnx").backend == ("openvino" if cpu_int8_dot_exact() else "onnxruntime")
    monkeypatch.setitem(sys.modules, "openvino", None)  # what Python does when openvino is not installed
    assert default_backend(work / "model.onnx") == "onnxruntime"


def test_openvino_not_installed_is_one_line(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    for args in (["infer", str(CALIB / "digit0_0000.png"), "--model", str(work / "model.onnx"), "--backend", "openvino"],
                 ["verify", str(work / "model.onnx"), str(work / "model.int8.onnx"), "--images", str(CALIB),
                  "--backend", "openvino"]):
        r = cli.invoke(app, args)
        assert r.exit_code == 1, r.output
        assert "OpenVINO is not installed" in r.output and "pip install 'vitdeploy[cpu]'" in r.output, r.output
        assert "Traceback" not in r.output


def test_an_engine_on_openvino_is_one_line(tmp_path: Path) -> None:
    engine = tmp_path / "model.fp32.engine"
    engine.write_bytes(b"not an onnx model")
    r = cli.invoke(app, ["infer", str(CALIB / "digit0_0000.png"), "--model", str(engine), "--backend", "openvino"])
    assert r.exit_code == 1 and "runs on tensorrt, not openvino" in r.output and "Traceback" not in r.output, r.output


def test_a_compile_failure_names_the_op(work: Path, tmp_path: Path) -> None:
    """The export with one op OpenVINO has no conversion for, in the middle of the graph."""
    m = onnx.load(str(work / "model.onnx"))
    out = m.graph.output[0].name
    for n in m.graph.node:
        for i, t in enumerate(n.output):
            if t == out:
                n.output[i] = "pre_frob"
    m.graph.node.append(helper.make_node("Frobnicate", ["pre_frob"], [out], domain="com.example", name="frob"))
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    bad = tmp_path / "bad.onnx"
    onnx.save(m, str(bad))
    with pytest.raises(VitdeployError, match=r"unsupported op com\.example\.Frobnicate"):
        open_runner(bad, backend="openvino")
    r = cli.invoke(app, ["infer", str(CALIB / "digit0_0000.png"), "--model", str(bad), "--backend", "openvino"])
    assert r.exit_code == 1 and "com.example.Frobnicate" in r.output and "Traceback" not in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def _attention_inputs(path: Path) -> list[list[str]]:
    """For each MatMul of two activations: the op types that feed it."""
    from vitdeploy.graph.quantize import _constants

    m = onnx.load(str(path))
    consts = _constants(m)
    producers = {o: n for n in m.graph.node for o in n.output}
    return [[producers[i].op_type if i in producers else "input" for i in n.input] for n in m.graph.node
            if n.op_type == "MatMul" and not any(i in consts or i.endswith("_weight_DequantizeLinear") for i in n.input)]


def test_int8_for_the_cpu_quantizes_attention_scores_not_softmax_v(work: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest

    blocks = sum(n.op_type == "Softmax" for n in onnx.load(str(work / "model.onnx")).graph.node)
    fed = _attention_inputs(work / "model.ort.int8.onnx")
    assert len(fed) == 2 * blocks
    assert sum(f == ["DequantizeLinear", "DequantizeLinear"] for f in fed) == blocks  # Q·Kᵀ
    assert sum("DequantizeLinear" not in f for f in fed) == blocks  # Softmax·V stays float
    man = read_onnx_manifest(work / "model.ort.int8.onnx")
    assert man.target == "cpu" and man.extra["quantization"]["attention_scores"] is True  # -t ort: cpu's old name
    assert man.extra["quantization"]["quantizer"] == "vitdeploy"  # the CPU INT8's default placement is ours
    assert read_onnx_manifest(work / "model.int8.onnx").target is None  # the default placement is unchanged
    assert all("DequantizeLinear" not in f for f in _attention_inputs(work / "model.int8.onnx"))


def test_calibrate_guard_evaluates_on_openvino(work: Path, digits_folder: Path, tmp_path: Path) -> None:
    from vitdeploy.stages.precision import calibrate

    res = calibrate(work / "model.onnx", CALIB, tmp_path / "g.int8.onnx", eval_dir=digits_folder, max_drop=1.0,
                    target="ort", backend="openvino")
    g = res.manifest.extra["guard"]
    assert g["backend"] == "openvino" and g["met"] and g["after"]["images"] > 300
    assert g["after"]["drop_points"] <= 1.0
    with pytest.raises(VitdeployError, match="onnxruntime, openvino or oracle"):
        calibrate(work / "model.onnx", CALIB, tmp_path / "h.int8.onnx", eval_dir=digits_folder, backend="tensorrt")


def test_verify_runs_candidates_on_openvino(work: Path, digits_folder: Path, tmp_path: Path) -> None:
    import json

    out = tmp_path / "v.json"
    r = cli.invoke(app, ["verify", str(work / "model.onnx"), str(work / "model.ort.int8.onnx"), "--images",
                         str(digits_folder), "--backend", "openvino", "--json", str(out)])
    assert r.exit_code in (0, 1), r.output
    assert "openvino" in r.output and "Traceback" not in r.output
    assert "openvino" in json.dumps(json.loads(out.read_text()))
