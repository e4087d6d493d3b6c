"""Every ViT family downstream: a digits ViT of each (tests/families.py), trained a few epochs by train --init's code,
goes through `vitdeploy bundle CKPT -t jetpack6.1 -i DIR`, whose INT8 and FP16 models must pass check-target for trt10
and agree >= 98% with FP32 on the TensorRT oracle; then info names its family, and explain draws a map of the patches
only, saying how it was made."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import artifact_cache
import numpy as np
import pytest
from families import FAMILIES, knobs, small_export
from typer.testing import CliRunner

from vitdeploy.checks import conformance as cf
from vitdeploy.cli import app

# `make test` leaves these out (`make test-all` and CI run them): a bundle of each family, trained per family, judged on the oracle (535 test-s of 3500 under load)
pytestmark = pytest.mark.slow

MIN_AGREEMENT = 0.98  # the bar: INT8 and FP16 answer like FP32 on >= 98% of the images, on the oracle


def _ckpt(name: str, tmp_path: Path) -> Path:
    work = tmp_path / name
    work.mkdir()
    shutil.copy2(artifact_cache.family_ckpt_entry(name, knobs(name)) / "ckpt.pth", work / "ckpt.pth")
    return work / "ckpt.pth"


def _receipt(output: str) -> dict[str, dict[str, float]]:
    """The receipt table's rows: artifact → top-1 and agreement (fractions)."""
    rows: dict[str, dict[str, float]] = {}
    for line in output.splitlines():
        m = re.match(r"\W*(model[\w.]*\.onnx)\W+(\S+)\W+([\d.]+)%.*?(?:([\d.]+)%)?\s*│\s*[\d.]+ MB", line)
        if m:
            rows[m.group(1)] = {"top1": float(m.group(3)) / 100,
                                "agreement": float(m.group(4)) / 100 if m.group(4) else 1.0}
    return rows


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bundle_of_each_family_passes_trt10_and_agrees_with_fp32_on_the_oracle(name: str, digits_val10: Path,
                                                                                tmp_path: Path) -> None:
    ckpt = _ckpt(name, tmp_path)
    r = CliRunner().invoke(app, ["bundle", str(ckpt), "-t", "jetpack6.1", "-i", str(digits_val10),
                                 "-o", str(ckpt.parent / "b"), "--references", "4", "--opt-batch", "2",
                                 "--max-batch", "4"], terminal_width=240)
    assert r.exit_code == 0, r.output
    rows = _receipt(r.output)
    assert {"model.onnx", "model.int8.onnx", "model.fp16.onnx"} <= set(rows), r.output
    print(f"{name}: FP32 top-1 {rows['model.onnx']['top1']:.4f}; oracle agreement with FP32: "
          f"INT8 {rows['model.int8.onnx']['agreement']:.4f}, FP16 {rows['model.fp16.onnx']['agreement']:.4f}")
    for art in ("model.int8.onnx", "model.fp16.onnx"):
        assert rows[art]["agreement"] >= MIN_AGREEMENT, (name, art, rows[art])
        path = ckpt.parent / art
        found = cf.check_onnx(path, "trt10").findings + cf.check_int8_intent(path, "trt10").findings
        assert not found, [f.line() for f in found]
    for art in ("model.onnx", "model.int8.onnx", "model.fp16.onnx"):
        assert not cf.check_onnx(ckpt.parent / art, "trt10").findings
    _downstream(ckpt, ckpt.parent / "b", digits_val10, tmp_path)


def _downstream(ckpt: Path, bundle_dir: Path, images: Path, tmp_path: Path) -> None:
    """infer, the bundle's run.py and benchmark on the family's artifacts: infer gives the checkpoint's answers (torch)
    from the FP32 ONNX to 1e-4; run.py passes --check against the bundle's reference logits and answers each image as
    infer does on the same model; benchmark measures the INT8 model."""
    from helpers import load_run_py

    files = [sorted(d.iterdir())[0] for d in sorted(images.iterdir())[:4]]
    preds = {}
    for name, model in (("torch", ckpt), *((p, ckpt.parent / f"model{'' if p == 'fp32' else '.' + p}.onnx")
                                          for p in ("fp32", "fp16", "int8"))):
        out = tmp_path / f"infer-{name}.json"
        r = CliRunner().invoke(app, ["infer", *map(str, files), "-m", str(model), "-k", "3", "--json", str(out)])
        assert r.exit_code == 0, r.output
        preds[name] = {Path(p["path"]).name: p for p in json.loads(out.read_text())["predictions"]}
    for f in files:
        t, o = preds["torch"][f.name], preds["fp32"][f.name]
        assert t["label"] == o["label"] and abs(t["score"] - o["score"]) <= 1e-4, (t, o)
    run_py = load_run_py(bundle_dir / "run.py")
    assert run_py.main(["--check"]) == 0
    import contextlib
    import io

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert run_py.main([*map(str, files), "--json"]) == 0
    rows = [json.loads(line) for line in buf.getvalue().splitlines()]
    default = json.loads((bundle_dir / "manifest.json").read_text())["bundle"]["default_model"]  # its raw-pixel variant
    ref = preds[next((p for p in ("int8", "fp16") if f".{p}." in default), "fp32")]
    assert [Path(r["path"]).name for r in rows] == [f.name for f in files]
    assert all(r["label"] == ref[Path(r["path"]).name]["label"] for r in rows), (rows, ref)
    bench = tmp_path / "bench.json"
    r = CliRunner().invoke(app, ["benchmark", str(ckpt.parent / "model.int8.onnx"), "--batch-sizes", "1",
                                 "--iterations", "3", "--warmup", "1", "--json", str(bench)])
    assert r.exit_code == 0, r.output
    assert all(x["throughput"] > 0 for x in json.loads(bench.read_text())["results"])


@pytest.mark.parametrize("name", list(FAMILIES))
def test_info_names_the_family_and_explain_maps_only_the_patches(name: str, digits_folder: Path, tmp_path: Path) -> None:
    from vitdeploy.model.family import family, features, token_layout
    from vitdeploy.tools.explain import explain

    ckpt = _ckpt(name, tmp_path)
    r = CliRunner().invoke(app, ["info", str(ckpt), "--json", "-"])
    assert r.exit_code == 0, r.output
    (d,) = json.loads(r.stdout)
    from vitdeploy.model.importers import read_any_manifest

    cfg = read_any_manifest(ckpt).model
    assert d["family"] == family(cfg) and d["features"] == features(cfg) and d["family"] != "ViT"
    r = CliRunner().invoke(app, ["info", str(ckpt)], terminal_width=240)
    assert r.exit_code == 0 and f"family         {family(cfg)}" in r.output
    images = sorted((digits_folder / "val" / "3").iterdir())[:2]
    res = explain(images, ckpt, tmp_path / "maps")
    lay = token_layout(cfg)
    for ex in res.explanations:
        assert ex.heatmap.shape == (8, 8) and ex.heatmap.max() == 1.0
    if lay.registers:
        assert f"{lay.registers} register tokens left out of the map" in res.note
    if lay.distilled:
        assert "distillation token left out of the map" in res.note
    assert res.note.startswith("map from")
    assert np.isfinite(np.stack([e.heatmap for e in res.explanations])).all()


LINES = ("trt8.5", "trt8.6", "trt10", "trt11")




@pytest.mark.parametrize("name", list(FAMILIES))
def test_int8_covers_every_gemm_and_every_artifact_passes_each_tensorrt_line(name: str, tmp_path: Path) -> None:
    """Every MatMul/Gemm/Conv of the family's graph (SwiGLU's three, a distilled model's two heads, ...) is either a
    layer the INT8 placement quantizes or the classifier it keeps in float on purpose; and the FP32, FP16 and INT8
    artifacts made for trt8.5, trt8.6, trt10 and trt11 pass check-target for that line."""
    import onnx

    from vitdeploy.graph.quantize import ensure_node_names, find_layers, head_nodes
    from vitdeploy.graph.target import decompose_layernorm
    from vitdeploy.stages.precision import calibrate, convert_fp16

    src = small_export(name, tmp_path / "model.onnx")
    g = onnx.load(str(src))
    ensure_node_names(g)
    gemms = {n.name for n in g.graph.node if n.op_type in ("MatMul", "Gemm", "Conv")}
    layers, heads = {la.node for la in find_layers(g)}, head_nodes(g)
    assert gemms == layers | heads and not layers & heads
    assert len(heads) == (2 if knobs(name).get("distilled") else 1)
    calib = Path(__file__).resolve().parents[1] / "calibration"
    for line in LINES:
        q = calibrate(src, calib, tmp_path / f"{line}.int8.onnx", num_images=32, target=line, smooth="off")
        assert len(q.quantized) == sum(1 for la in find_layers(g) if la.kind != "attention")
        h16 = convert_fp16(src, tmp_path / f"{line}.fp16.onnx", target=line)
        fp32 = onnx.load(str(src))
        if line == "trt8.5":
            decompose_layernorm(fp32)  # what `export --target trt8.5` writes
        onnx.save(fp32, str(tmp_path / f"{line}.onnx"))
        found = [f.line() for a in (tmp_path / f"{line}.onnx", h16) for f in cf.check_onnx(a, line).findings]
        found += [f.line() for f in cf.check_onnx(q.path, line).findings + cf.check_int8_intent(q.path, line).findings]
        assert not found, found


def test_the_map_heads_query_projection_is_a_constant_in_the_export(tmp_path: Path) -> None:
    """The learned query's q projection (weight and a non-zero bias) folds to one constant: no MatMul or Add of the
    graph reads only initializers, and the ONNX logits still equal the torch model's."""
    import onnxruntime as ort
    import torch

    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.vit import VisionTransformer, get_preset
    from vitdeploy.stages.export import _clean, _torch_export

    p = get_preset("vit-digits")
    torch.manual_seed(0)
    net = VisionTransformer(p.config.with_(embed_dim=32, depth=1, num_heads=2, **knobs("siglip"))).eval()
    with torch.no_grad():
        for name, t in net.named_parameters():
            if name.endswith("bias"):
                t.normal_(0, 0.5)
    man = Manifest(model=net.cfg.to_dict(), labels=[str(i) for i in range(10)], preprocess=dict(p.preprocess),
                   name="digits-siglip")
    m = _clean(_torch_export(net, tmp_path, 32, 32, 17), man, 17)
    inits = {t.name for t in m.graph.initializer}
    assert not [n.name for n in m.graph.node if n.op_type in ("MatMul", "Add") and set(n.input) <= inits]
    assert any(n.op_type == "Expand" and n.input[0] in inits for n in m.graph.node)  # the folded query, batched
    out = tmp_path / "m.onnx"
    OnnxArtifact.write(m, man.derive(precision="fp32"), out)
    x = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        ref = net(x).numpy()
    got = ort.InferenceSession(str(out), providers=["CPUExecutionProvider"]).run(None, {"pixel_values": x.numpy()})[0]
    np.testing.assert_allclose(got, ref, rtol=0, atol=1e-5 * float(np.abs(ref).max()))


def test_the_map_reads_what_each_head_reads_and_leaves_the_prefix_tokens_out() -> None:
    """Hand-made attention over [cls, dist, reg, p0, p1]: each readout's patch relevance, by hand."""
    from vitdeploy.model.family import TokenLayout
    from vitdeploy.tools.explain import last_layer, readout_note

    a = np.zeros((1, 1, 5, 5))
    a[0, 0, 0] = [0, 0, 0.5, 0.5, 0]  # the class token looks at the register and p0
    a[0, 0, 1] = [0, 0, 0, 0, 1.0]  # the distillation token at p1
    a[0, 0, 2] = [1.0, 0, 0, 0, 0]
    a[0, 0, 3] = [0, 0, 0, 0, 1.0]  # p0 → p1
    a[0, 0, 4] = [0, 0, 0, 1.0, 0]  # p1 → p0
    lay = TokenLayout(class_token=True, distilled=True, registers=1, patches=2)
    # a distilled model's heads read the class and distillation tokens: their mean, over the patch columns only
    np.testing.assert_allclose(last_layer([a], pool="token", layout=lay), [[0.25, 0.5]])
    np.testing.assert_allclose(last_layer([a], pool="avg", layout=lay), [[0.5, 0.5]])
    np.testing.assert_allclose(last_layer([a], pool="token_avg", layout=lay), [[0.375, 0.5]])
    note = readout_note("token", lay)
    assert "distillation token and 1 register tokens left out of the map" in note
    # an attention-pooling head: its query's weights over the tokens, after the blocks' rollout
    pool_attn = np.array([[[[0.0, 0.0, 0.0, 0.2, 0.8]]]])
    np.testing.assert_allclose(last_layer([a, pool_attn], pool="map", layout=lay), [[0.2, 0.8]])
    assert "attention-pooling head" in readout_note("map", lay)
    gap = TokenLayout(class_token=False, distilled=False, registers=0, patches=4)
    assert "patch tokens' mean" in readout_note("avg", gap) and "no class token" in readout_note("token", gap)
