"""The numerics report on the trained digits ViT and on an exactly equivalent copy whose residual stream is ×300."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper
from typer.testing import CliRunner

from vitdeploy.checks.numerics import FP16_MAX, fp16_unsafe_nodes, fp16_unsafe_tensors, numerics
from vitdeploy.cli import app
from vitdeploy.core.errors import UsageError

REPO = Path(__file__).resolve().parents[1]
CALIB = REPO / "calibration"
C = 300.0
runner = CliRunner()


def scaled_residual(model: onnx.ModelProto, c: float) -> onnx.ModelProto:
    """An exactly equivalent model whose residual stream is ×c.

    The stream is the patch embedding + class token + position embedding, plus each block's attention-output and
    MLP-output projections: scaling all of those (weights and biases) by c scales every residual Add by c, and
    LayerNorm(c·x; ε·c²) = LayerNorm(x; ε) undoes it wherever the stream is read.
    """
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}
    consumers: dict[str, list[onnx.NodeProto]] = {}
    for n in m.graph.node:
        for t in n.input:
            consumers.setdefault(t, []).append(n)
    todo: set[str] = {"cls_token", "pos_embed"}
    for n in m.graph.node:
        if n.op_type == "Conv":
            todo.update(n.input[1:3])
        elif n.op_type == "MatMul" and n.name.endswith(("/attn/proj/MatMul", "/mlp/fc2/MatMul")):
            todo.add(n.input[1])
            (bias_add,) = consumers[n.output[0]]
            todo.update(t for t in bias_add.input if t in inits)
        elif n.op_type == "LayerNormalization":
            for a in n.attribute:
                if a.name == "epsilon":
                    a.f = float(np.float32(a.f) * np.float32(c * c))
    blocks = sum(n.name.endswith("/attn/proj/MatMul") for n in m.graph.node)
    assert blocks > 0 and len(todo) == 2 + 2 + 4 * blocks  # cls, pos; conv w, b; per block: proj w, b, fc2 w, b
    for name in todo:
        t = inits[name]
        t.CopyFrom(numpy_helper.from_array((numpy_helper.to_array(t) * np.float32(c)).astype(np.float32), name))
    return m


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory, digits_onnx: Path) -> dict[str, Path]:
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.manifest import set_onnx_manifest
    from vitdeploy.graph.target import decompose_layernorm

    d = tmp_path_factory.mktemp("numerics")
    shutil.copy(digits_onnx, d / "model.onnx")
    base = onnx.load(str(d / "model.onnx"))
    big = scaled_residual(base, C)
    onnx.save(big, str(d / "x300.onnx"))
    spelled = onnx.ModelProto()
    spelled.CopyFrom(big)
    assert decompose_layernorm(spelled) > 0  # the trt8.5 form: ReduceMean, Sub, Mul(x, x), ...
    onnx.save(spelled, str(d / "x300.trt85.onnx"))
    bare = onnx.ModelProto()
    bare.CopyFrom(base)
    del bare.metadata_props[:]
    onnx.save(bare, str(d / "no_manifest.onnx"))
    wrong = onnx.ModelProto()
    wrong.CopyFrom(base)
    dims = wrong.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value, dims[3].dim_value = dims[2].dim_value * 2, dims[3].dim_value * 2
    set_onnx_manifest(wrong, OnnxArtifact.open(d / "model.onnx").manifest)
    onnx.save(wrong, str(d / "other_size.onnx"))
    return {p.stem: p for p in d.glob("*.onnx")}


def _logits(path: Path) -> np.ndarray:
    from vitdeploy.checks.guard import logits
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.images import iter_batches
    from vitdeploy.core.preprocess import list_images

    pp = OnnxArtifact.open(path).manifest.pp()
    x = np.concatenate([b.array for b in iter_batches(list_images(CALIB)[:64], pp, 64)])
    return logits(onnx.load(str(path)), x)


def test_the_scaled_model_is_exactly_equivalent_in_fp32(models: dict[str, Path]) -> None:
    ref, big = _logits(models["model"]), _logits(models["x300"])
    assert np.max(np.abs(big - ref)) <= 1e-4 * np.max(np.abs(ref))
    assert np.array_equal(big.argmax(1), ref.argmax(1))


def test_the_original_model_is_not_flagged(models: dict[str, Path]) -> None:
    r = numerics(models["model"], CALIB, num_images=64)
    assert r.images == 64 and r.flagged == [] and fp16_unsafe_tensors(r) == []
    roles = {t.role for t in r.tensors}
    assert roles == {"layernorm_input", "layernorm_square", "residual_add", "softmax_input", "quantized_input",
                     "activation"}
    for t in r.tensors:
        assert t.max_abs > 0 and t.fp16_headroom == pytest.approx(FP16_MAX / t.max_abs)
        if t.role == "quantized_input":
            assert t.spread is not None and t.spread >= 1 and t.range_used is not None and 0 < t.range_used <= 1


def test_the_x300_model_flags_the_layernorm_square_and_only_fp16_overflow(models: dict[str, Path]) -> None:
    base = numerics(models["model"], CALIB, num_images=64)
    big = numerics(models["x300"], CALIB, num_images=64)
    by = {(t.tensor, t.role): t for t in base.tensors}
    for t in big.tensors:  # the residual stream and everything read from it scale by C; what LayerNorm outputs does not
        b = by[(t.tensor, t.role)]
        want = {"residual_add": C, "layernorm_input": C, "layernorm_square": C * C}.get(t.role)
        if want is not None:
            assert t.max_abs == pytest.approx(b.max_abs * want, rel=1e-3)
    flagged = {t.role for t in big.flagged}
    assert "layernorm_square" in flagged and all("fp16_overflow" in t.flags for t in big.flagged)
    squares = [t for t in big.tensors if t.role == "layernorm_square"]
    assert any(t.max_abs > FP16_MAX for t in squares)  # a real overflow, not only inside the safety margin
    unsafe = fp16_unsafe_tensors(big)
    assert unsafe and set(fp16_unsafe_nodes(big)) <= {t.node for t in big.tensors}


def test_the_spelled_out_square_is_measured_where_it_is_computed(models: dict[str, Path]) -> None:
    """TensorRT 8.5's form has the square as a tensor (Mul(x, x)); its max equals what the report derives from the
    LayerNormalization op's input, max |x − mean|²."""
    op = numerics(models["x300"], CALIB, num_images=64)
    spelled = numerics(models["x300.trt85"], CALIB, num_images=64)
    derived = sorted(t.max_abs for t in op.tensors if t.role == "layernorm_square")
    measured = sorted(t.max_abs for t in spelled.tensors if t.role == "layernorm_square")
    assert len(derived) == len(measured) > 0
    np.testing.assert_allclose(measured, derived, rtol=1e-3)
    flagged = [t for t in spelled.flagged if t.role == "layernorm_square"]
    assert flagged and all(t.node.endswith("Mul_square") for t in flagged)
    assert set(fp16_unsafe_tensors(spelled)) >= {t.tensor for t in flagged}


def test_cli_writes_strict_json_and_refuses_bad_input_in_one_line(models: dict[str, Path], tmp_path: Path) -> None:
    res = runner.invoke(app, ["numerics", str(models["x300"]), "--images", str(CALIB), "--num-images", "32",
                              "--json", "-"])
    assert res.exit_code == 0, res.output
    d = json.loads(res.stdout)
    assert d["images"] == 32 and d["flagged"] and d["fp16_unsafe_tensors"]
    out = tmp_path / "n.json"
    res = runner.invoke(app, ["numerics", str(models["model"]), "-i", str(CALIB), "--num-images", "32", "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert json.loads(out.read_text())["flagged"] == [] and "FP16: ok" in res.stdout
    for model, images, words in (
        (models["no_manifest"], CALIB, "without a vitdeploy manifest"),
        (models["other_size"], CALIB, "takes"),
        (models["model"], tmp_path / "nowhere", "no such folder"),
    ):
        res = runner.invoke(app, ["numerics", str(model), "--images", str(images)])
        assert res.exit_code == 2, res.output
        assert words in res.output and "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    with pytest.raises(UsageError):
        numerics(models["model"], CALIB, num_images=0)


def test_an_exporters_pow_form_of_layernorm_is_watched_and_other_squares_are_not() -> None:
    """HF/onnxsim graphs spell LayerNorm as Pow(x − ReduceMean(x), 2) (onnxsim/onnxsim#1742); a square of
    anything else (a GELU approximation's x·x) is not a LayerNorm's."""
    from onnx import TensorProto, helper

    from vitdeploy.checks.numerics import probes

    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("ReduceMean", ["x"], ["mean"], axes=[-1]),
        helper.make_node("Sub", ["x", "mean"], ["centred"]),
        helper.make_node("Pow", ["centred", "two"], ["sq"]),
        helper.make_node("Mul", ["x", "x"], ["x2"]),
        helper.make_node("Add", ["sq", "x2"], ["y"]),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])], [two])
    found = {(p.tensor, p.role) for p in probes(helper.make_model(g))}
    assert ("sq", "layernorm_square") in found and ("x", "layernorm_input") in found
    assert {r for t, r in found if t == "x2"} == {"activation"}  # watched as any float tensor, not as a square


def test_a_stream_that_overflows_before_its_first_residual_add_is_kept_where_it_is_made_and_read() -> None:
    """A LayerScale model's stream is its embedding (patch projection + position embedding): when that overflows,
    the LayerNorm reading it is float32 already, but the float16 nodes making it write inf. Every float tensor the
    image reaches is watched at the node that makes it; a constant-only path and shape readers are not."""
    from onnx import TensorProto, helper

    from vitdeploy.checks.numerics import NumericsReport, TensorStat, probes

    w = numpy_helper.from_array(np.full((4, 4), 3e4, np.float32), "w")
    pos = numpy_helper.from_array(np.full((1, 4), 1e4, np.float32), "pos")
    one = numpy_helper.from_array(np.ones(4, np.float32), "one")
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["proj"], name="proj"),
        helper.make_node("Add", ["proj", "pos"], ["emb"], name="add_pos"),
        helper.make_node("LayerNormalization", ["emb", "one", "one"], ["y"], name="norm"),
        helper.make_node("Shape", ["emb"], ["shape"], name="shape"),
        helper.make_node("Mul", ["pos", "pos"], ["pos2"], name="const_only"),
        helper.make_node("Add", ["y", "pos2"], ["z"], name="out"),
    ]
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
                          [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4]),
                           helper.make_tensor_value_info("shape", TensorProto.INT64, [2])], [w, pos, one])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    found = {(p.tensor, p.role, p.node) for p in probes(m)}
    assert {("proj", "activation", "proj"), ("emb", "activation", "add_pos"), ("emb", "layernorm_input", "norm"),
            ("y", "activation", "norm"), ("z", "residual_add", "out")} <= found
    assert ("z", "activation", "out") not in found  # measured once where it is made
    assert not any(t in ("pos2", "shape") for t, _, _ in found)  # constants alone; not a float
    emb = TensorStat("emb", "activation", "add_pos", 1.3e5, flags=["fp16_overflow"])
    rep = NumericsReport("g", 1, [emb, TensorStat("emb", "layernorm_input", "norm", 1.3e5, flags=["fp16_overflow"])])
    assert fp16_unsafe_nodes(rep) == ["add_pos", "norm"]
    assert sorted(fp16_unsafe_nodes(rep, m)) == ["add_pos", "norm"]  # the Shape reads no values
    rep.tensors[0] = TensorStat("proj", "activation", "proj", 1e5, flags=["fp16_overflow"])
    assert sorted(fp16_unsafe_nodes(rep, m)) == ["add_pos", "norm", "proj"]  # add_pos reads proj


def test_convert_fp16_keeps_the_overflowing_tensors_float32_or_refuses_when_forbidden(models: dict[str, Path],
                                                                                        tmp_path: Path) -> None:
    """convert-fp16 measures the headroom on the images the one rule picks (here --images) and keeps exactly the
    flagged nodes in float32; with float32 islands forbidden it refuses in one line and writes nothing."""
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.stages.precision import convert_fp16

    out = convert_fp16(models["x300"], tmp_path / "x300.fp16.onnx", images=CALIB)
    rec = read_onnx_manifest(out).extra["numerics"]
    assert rec["overflow"] and rec["kept_fp32_nodes"] and rec["source"] == str(CALIB)
    fp16 = onnx.load(str(out))
    kept = set(rec["kept_fp32_nodes"])
    assert kept <= {n.name for n in fp16.graph.node}
    plain = convert_fp16(models["model"], tmp_path / "model.fp16.onnx", images=CALIB)
    assert read_onnx_manifest(plain).extra["numerics"]["kept_fp32_nodes"] == []
    with pytest.raises(VitdeployError, match="would overflow float16.*forbidden"):
        convert_fp16(models["x300"], tmp_path / "refused.fp16.onnx", images=CALIB, keep_unsafe=False)
    assert not (tmp_path / "refused.fp16.onnx").exists()
