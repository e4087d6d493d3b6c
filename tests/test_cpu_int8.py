"""The CPU INT8 (`calibrate -t cpu` / `-t openvino`): NNCF's transformer scheme with our guard, manifest and lineage
on top, judged on the trained digits ViT against NNCF's own INT8 of the same model; and `benchmark --versus nncf`."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app

pytest.importorskip("nncf", reason="NNCF is not installed (pip install 'vitdeploy[cpu]')")
pytest.importorskip("openvino", reason="OpenVINO is not installed (pip install 'vitdeploy[cpu]')")

CALIB_IMAGES = 64


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory, digits_artifacts: Path) -> Path:
    d = tmp_path_factory.mktemp("cpu-int8")
    for name in ("model.onnx", "model.int8.onnx"):
        shutil.copy(digits_artifacts / name, d / name)
    return d


def _ov_logits(model: Path | str, x: np.ndarray) -> np.ndarray:
    """Logits on OpenVINO (FP32 float parts), 64 images a call: how the `openvino` target runs the model."""
    import openvino as ov

    core = ov.Core()
    req = core.compile_model(core.read_model(str(model)), "CPU", {"INFERENCE_PRECISION_HINT": "f32"}).create_infer_request()
    return np.concatenate([np.array(req.infer({0: x[i : i + 64]})[0]) for i in range(0, len(x), 64)])


def test_cpu_int8_of_the_digits_vit_is_as_accurate_as_nnclfs_own_and_the_guard_holds_on_openvino(
        work: Path, digits_folder: Path) -> None:
    from vitdeploy.checks.guard import figures, load_eval_set
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.stages.precision import calibrate
    from vitdeploy.tools.bench import nncf_anchor

    train, val = digits_folder / "train", digits_folder / "val"
    src = OnnxArtifact.open(work / "model.onnx")
    ev = load_eval_set(val, src.manifest)
    ref = _ov_logits(work / "model.onnx", ev.x)
    # NNCF's own INT8, as OpenVINO's user makes it in one call, on the same calibration images
    xml, _ = nncf_anchor(work / "model.onnx", work, train, num_images=CALIB_IMAGES, seed=0)
    theirs = figures(ref, _ov_logits(xml, ev.x), ev.y)

    res = calibrate(work / "model.onnx", train, work / "model.cpu.int8.onnx", num_images=CALIB_IMAGES,
                    target="openvino", eval_dir=val, max_drop=0.3, min_agreement=0.99)
    ours = figures(ref, _ov_logits(res.path, ev.x), ev.y)
    print(f"digits val ({len(ev.y)} images) on OpenVINO: NNCF's INT8 drop {theirs.drop_points} pt, agreement "
          f"{theirs.agreement:.4f}; ours (-t openvino, guarded) drop {ours.drop_points} pt, agreement "
          f"{ours.agreement:.4f}, {len(res.excluded)} layer(s) kept in float")
    assert ours.drop_points <= theirs.drop_points and ours.agreement >= theirs.agreement
    assert ours.drop_points <= 0.3 and ours.agreement >= 0.99  # the guard's budget, judged where it runs
    m = res.manifest
    q, g = m.extra["quantization"], m.extra["guard"]
    assert m.target == "openvino" and q["quantizer"] == "nncf" and q["model_type"] == "transformer"
    assert g["backend"] == "openvino" and g["met"]
    assert m.source["sha256"] == src.sha256  # lineage: the FP32 it was made from
    assert q["attention_scores"] or any(n for n in res.excluded if "attn" in n)  # NNCF quantizes Q·Kᵀ
    graph = onnx.load(str(res.path)).graph
    assert any(i.data_type == onnx.TensorProto.INT8 for i in graph.initializer)  # int8 weights on disk
    assert not any(n.op_type == "QuantizeLinear" and n.input[0] in {i.name for i in graph.initializer}
                   for n in graph.node)  # no float weight left behind a QuantizeLinear


def test_nncfs_graph_with_every_layer_back_in_float_is_the_fp32_model(work: Path, digits_folder: Path) -> None:
    """The guard's switch reverts a layer completely (Q/DQ bypassed, NNCF's corrected bias restored; SmoothQuant's
    scaling, exact in FP32, stays): with every layer in float the logits are FP32's."""
    from vitdeploy.checks.guard import load_eval_set, logits
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.graph.nncf_ptq import nncf_quantize
    from vitdeploy.graph.quantize import QuantizedGraphSwitch
    from vitdeploy.model.imageset import ImageSet

    art = OnnxArtifact.open(work / "model.onnx")
    fp32 = art.load_weights()
    calib = ImageSet.folder(digits_folder / "train", 32, 0)
    q = nncf_quantize(fp32, [b.array for b in calib.batches(art.manifest.pp(), 16)])
    switch = QuantizedGraphSwitch(q, fp32)
    assert {la.kind for la in switch.layers} >= {"conv", "linear", "attention"}
    x = load_eval_set(digits_folder / "val", art.manifest).x[:64]
    ref = logits(fp32, x)
    back = logits(switch.final([la.node for la in switch.layers]), x)
    assert np.max(np.abs(back - ref)) <= 1e-4 * np.max(np.abs(ref))
    assert np.max(np.abs(logits(switch.final([]), x) - ref)) > 1e-3 * np.max(np.abs(ref))  # and INT8 is not FP32


def test_benchmark_versus_nncf_prints_nncfs_row_and_the_ratio(work: Path, tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    import json

    monkeypatch.chdir(tmp_path)  # no calibration/ here: the anchor calibrates on the digits (the one image rule)
    out = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["benchmark", str(work / "model.onnx"), str(work / "model.int8.onnx"), "--versus",
                                 "nncf", "--backends", "openvino", "--batch-sizes", "2", "--iterations", "3",
                                 "--json", str(out)])
    assert r.exit_code == 0, r.output
    assert "int8-nncf" in r.output and "ours / NNCF" in r.output and "Statistics collection" not in r.output
    rep = json.loads(out.read_text())
    nncf_rows = [x for x in rep["results"] if x["precision"] == "int8-nncf"]
    assert len(nncf_rows) == 1 and nncf_rows[0]["backend"] == "openvino" and nncf_rows[0]["throughput"] > 0
    ours = next(x for x in rep["results"] if x["precision"] == "int8")
    ratio = next(q for q in rep["ratios"] if q.get("versus") == "nncf")
    assert ratio["ratio"] == pytest.approx(ours["throughput"] / nncf_rows[0]["throughput"])
    bad = CliRunner().invoke(app, ["benchmark", str(work / "model.int8.onnx"), "--versus", "nncf"])
    assert bad.exit_code == 2 and "FP32 ONNX" in bad.output and "Traceback" not in bad.output
