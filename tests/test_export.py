"""ONNX export: dynamic batch, clean graph for TensorRT, manifest inside, atomic writes, parity against PyTorch."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from typer.testing import CliRunner

from vitdeploy.checks.parity import check_parity
from vitdeploy.cli import app
from vitdeploy.core.artifact import read_onnx_manifest
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.fileio import sha256_file
from vitdeploy.core.manifest import Manifest
from vitdeploy.model.checkpoint import save_checkpoint
from vitdeploy.model.importers import load_any
from vitdeploy.model.vit import VisionTransformer, get_preset
from vitdeploy.stages.export import (
    BATCH_DIM,
    INPUT_NAME,
    OUTPUT_NAME,
    export_onnx,
    max_supported_opset,
)


def graph_problems(model: onnx.ModelProto) -> list[str]:
    """What would keep TensorRT from a clean build: dead nodes, duplicates, unfolded constants (the exporter's checklist)."""
    g = model.graph
    problems: list[str] = []
    produced_by = {o: n for n in g.node for o in n.output}
    live: set[int] = set()
    stack = [o.name for o in g.output]
    while stack:
        name = stack.pop()
        n = produced_by.get(name)
        if n is None or id(n) in live:
            continue
        live.add(id(n))
        stack.extend(i for i in n.input if i)
    dead = [n for n in g.node if id(n) not in live]
    if dead:
        problems.append(f"{len(dead)} dead node(s), e.g. {dead[0].op_type} {dead[0].name}")
    seen: dict[tuple[Any, ...], str] = {}
    dups = 0
    for n in g.node:
        key = (n.op_type, n.domain, tuple(n.input), tuple(a.SerializeToString() for a in n.attribute))
        if key in seen:
            dups += 1
        seen.setdefault(key, n.name)
    if dups:
        problems.append(f"{dups} duplicated node(s) (same op, inputs and attributes)")
    consts = {i.name for i in g.initializer}
    leftovers = [n.op_type for n in g.node if n.op_type in ("Constant", "Identity", "ConstantOfShape")]
    foldable = [n.op_type for n in g.node if n.input and all((not i) or i in consts for i in n.input)]
    if leftovers or foldable:
        problems.append(f"unfolded constant node(s): {', '.join(sorted(set(leftovers + foldable)))}")
    return problems


cli = CliRunner()
slow = pytest.mark.skipif(
    not os.environ.get("VITDEPLOY_SLOW"), reason="vit-large/vit-huge export: set VITDEPLOY_SLOW=1 (or see scripts/bench_export.py)"
)


def make_ckpt(path: Path, preset: str, num_classes: int = 10, source: dict | None = None, seed: int = 0, **cfg_changes) -> Path:
    """A randomly initialised checkpoint of a preset (weights are irrelevant to the graph's shape)."""
    p = get_preset(preset)
    cfg = p.config.with_(num_classes=num_classes, **cfg_changes)
    pp = dict(p.preprocess)
    pp["input_size"] = list(cfg.image_size)
    torch.manual_seed(seed)
    model = VisionTransformer(cfg, weight_init="skip").eval()  # the layers' own random init: enough for a graph
    man = Manifest(model=cfg.to_dict(), labels=[f"class{i}" for i in range(num_classes)], preprocess=pp, name=preset,
                   source=source or {})
    return save_checkpoint(path, model, man)


def dims(vi: onnx.ValueInfoProto) -> list:
    return [d.dim_param or d.dim_value for d in vi.type.tensor_type.shape.dim]


@pytest.fixture(scope="module")
def digits_export(digits_ckpt: Path, tmp_path_factory: pytest.TempPathFactory):
    out = tmp_path_factory.mktemp("export") / "model.onnx"
    cwd = os.getcwd()
    os.chdir(out.parent)  # away from the repository's calibration/ folder: the digits set is the source
    try:
        return export_onnx(digits_ckpt, out)
    finally:
        os.chdir(cwd)


def test_digits_export_passes_parity_at_1_7_32(digits_export, digits_ckpt: Path) -> None:
    r = digits_export
    assert r.parity is not None and r.parity.passed
    assert [b.batch_size for b in r.parity] == [1, 7, 32]
    assert r.parity.source == "digits" and r.parity.num_images == 32 and not r.parity.warnings
    for b in r.parity:
        assert b.max_abs_diff <= 1e-4 * max(1.0, b.max_abs_logit)
        assert b.top1_mismatches == 0
    # the checkpoint was trained: logits are not all near zero, so the relative bound means something
    assert max(b.max_abs_logit for b in r.parity) > 1.0


def test_digits_export_io_manifest_and_checker(digits_export, digits_ckpt: Path) -> None:
    m = onnx.load(str(digits_export.path))
    assert [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] == [17]
    assert [i.name for i in m.graph.input] == [INPUT_NAME]
    assert [o.name for o in m.graph.output] == [OUTPUT_NAME]
    assert dims(m.graph.input[0]) == [BATCH_DIM, 3, 32, 32]
    assert dims(m.graph.output[0]) == [BATCH_DIM, 10]
    assert m.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    onnx.checker.check_model(m, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(m, strict_mode=True)
    assert dims(inferred.graph.output[0]) == [BATCH_DIM, 10]

    man = read_onnx_manifest(digits_export.path)
    src = load_any(digits_ckpt).manifest
    assert man.labels == src.labels and man.preprocess == src.preprocess and man.model == src.model
    assert man.precision == "fp32"
    assert man.source["sha256"] == sha256_file(digits_ckpt)
    assert man.versions["vitdeploy"] and man.versions["onnx"] == onnx.__version__
    assert man.extra["export"]["opset"] == 17


def test_digits_graph_is_clean_for_tensorrt(digits_export) -> None:
    m = onnx.load(str(digits_export.path))
    assert graph_problems(m) == []
    counts = digits_export.node_counts
    depth = 4
    assert counts["LayerNormalization"] == 2 * depth + 1  # one op each, never decomposed
    assert counts["Softmax"] == depth
    for op in ("Constant", "Identity", "ReduceMean", "Pow", "Sqrt", "Cast", "ConstantOfShape"):
        assert op not in counts, op
    # attention: Mul(Q, scalar) → MatMul(·, Kᵀ) → Softmax → MatMul(·, V); K unscaled
    g = m.graph
    producer = {o: n for n in g.node for o in n.output}
    consumers = {}
    for n in g.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    inits = {t.name: t for t in g.initializer}
    head_dim = 96 // 4
    for sm in (n for n in g.node if n.op_type == "Softmax"):
        qk = producer[sm.input[0]]
        assert qk.op_type == "MatMul"
        q, k = producer[qk.input[0]], producer[qk.input[1]]
        assert q.op_type == "Mul" and k.op_type != "Mul"
        scale = onnx.numpy_helper.to_array(inits[q.input[1]])
        assert scale.size == 1 and np.isclose(float(scale.reshape(())), head_dim**-0.5, rtol=1e-6)
        assert [c.op_type for c in consumers[sm.output[0]]] == ["MatMul"]


def test_exported_model_takes_any_batch(digits_export, digits_ckpt: Path) -> None:
    import onnxruntime as ort

    sess = ort.InferenceSession(str(digits_export.path), providers=["CPUExecutionProvider"])
    model = load_any(digits_ckpt).build()
    x = np.random.default_rng(1).standard_normal((5, 3, 32, 32)).astype(np.float32)
    got = sess.run(None, {INPUT_NAME: x})[0]
    with torch.inference_mode():
        ref = model(torch.from_numpy(x)).numpy()
    assert got.shape == (5, 10)
    np.testing.assert_allclose(got, ref, atol=1e-4)


def test_parity_check_catches_a_different_model(digits_export, digits_ckpt: Path) -> None:
    ck = load_any(digits_ckpt)
    model = ck.build()
    with torch.no_grad():
        model.head.bias.add_(torch.linspace(0.0, 0.05, 10))
    rep = check_parity(model, digits_export.path)
    assert not rep.passed
    assert [b.batch_size for b in rep.failures] == [1, 7, 32]
    assert "batch 1: max |Δlogit| 5.00e-02" in rep.failures[0].describe()
    # unchanged weights pass, also when handed over as a Checkpoint object
    assert check_parity(ck, digits_export.path, batch_sizes=(3,)).passed


def test_parity_image_sources(digits_export, digits_ckpt: Path, tmp_path: Path, photo_files, monkeypatch) -> None:
    rep = check_parity(digits_ckpt, digits_export.path, images=photo_files[0].parent, batch_sizes=(1, 7))
    assert rep.passed and rep.source == str(photo_files[0].parent)
    assert any("repeated" in w for w in rep.warnings) and rep.num_images == 5  # 5 photos for 8 inputs
    cal = tmp_path / "calibration"
    cal.mkdir()
    for p in photo_files[:2]:
        shutil.copy(p, cal / p.name)
    (cal / "broken.jpg").write_bytes(b"\xff\xd8not a jpeg")
    monkeypatch.chdir(tmp_path)
    rep = check_parity(digits_ckpt, digits_export.path, batch_sizes=(2,))
    assert rep.passed and rep.source == "calibration"
    assert [Path(p).name for p, _ in rep.skipped] == ["broken.jpg"]


def test_random_inputs_warn_when_no_images(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    ck = make_ckpt(tmp_path / "c.pth", "vit-digits", num_classes=4)
    res = cli.invoke(app, ["export", str(ck), "-o", str(tmp_path / "m.onnx")])
    assert res.exit_code == 0, res.output
    assert "warning: no images to check parity on" in res.stderr
    assert "parity passed at batch 1, 7, 32 on random" in res.stdout


def test_export_is_atomic_and_bad_checkpoints_are_one_line(digits_ckpt: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "model.onnx"
    res = cli.invoke(app, ["export", str(digits_ckpt), "-o", str(out), "--no-check", "--verbose"])
    assert res.exit_code == 0, res.output
    assert "LayerNormalization 9" in res.stdout and "parity check skipped" in res.stderr
    good = out.read_bytes()

    truncated = tmp_path / "trunc.pth"
    truncated.write_bytes(digits_ckpt.read_bytes()[:5000])
    plain = tmp_path / "plain.pth"
    torch.save({"linear.weight": torch.zeros(2, 3), "linear.bias": torch.zeros(2)}, plain)
    timm_like = tmp_path / "sd.pth"
    torch.save(load_any(digits_ckpt).state_dict, timm_like)
    cases = [
        (tmp_path / "missing.pth", "no such checkpoint"),
        (truncated, "truncated"),
        (plain, "plain state_dict"),
        (timm_like, "--arch"),
    ]
    for ck, words in cases:
        r = cli.invoke(app, ["export", str(ck), "-o", str(out)])
        assert r.exit_code == 1, r.output
        err = r.stderr.strip().splitlines()
        assert len(err) == 1 and err[0].startswith("error:") and words in err[0], err
    for opset in (16, max_supported_opset() + 1):  # the command line's entry point turns Typer's range check into one line
        from vitdeploy.__main__ import main

        capsys.readouterr()
        code = main(["export", str(digits_ckpt), "-o", str(out), "--opset", str(opset)])
        err = capsys.readouterr().err
        assert code == 2 and "--opset" in err and len(err.strip().splitlines()) == 1, err
    assert out.read_bytes() == good  # the earlier model is untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.onnx", "plain.pth", "sd.pth", "trunc.pth"]  # no temp files


def test_failed_export_leaves_earlier_model(digits_ckpt: Path, tmp_path: Path) -> None:
    out = tmp_path / "model.onnx"
    out.write_bytes(b"an earlier model")
    img = tmp_path / "imgs"
    img.mkdir()
    (img / "bad.png").write_bytes(b"")
    with pytest.raises(VitdeployError, match="none of its images can be read"):
        export_onnx(digits_ckpt, out, images=img)
    assert out.read_bytes() == b"an earlier model"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs", "model.onnx"]


def test_higher_opset_is_converted(digits_ckpt: Path, tmp_path: Path) -> None:
    r = export_onnx(digits_ckpt, tmp_path / "m21.onnx", opset=21, check=True)
    m = onnx.load(str(r.path))
    assert [o.version for o in m.opset_import if o.domain in ("", "ai.onnx")] == [21]
    assert r.parity is not None and r.parity.passed
    assert dims(m.graph.input[0])[0] == BATCH_DIM


@pytest.mark.parametrize("preset", ["vit-digits", "vit-tiny", "vit-small",
                                    pytest.param("vit-base", marks=pytest.mark.slow)])  # vit-base: 18 s, make test-all
def test_presets_export_at_224(preset: str, tmp_path: Path) -> None:
    import onnxruntime as ort

    ck = make_ckpt(tmp_path / "c.pth", preset, num_classes=10, image_size=(224, 224))
    r = export_onnx(ck, tmp_path / "m.onnx", check=False)
    assert r.external_data is None
    m = onnx.load(str(r.path), load_external_data=False)
    assert dims(m.graph.input[0]) == [BATCH_DIM, 3, 224, 224]
    assert dims(m.graph.output[0]) == [BATCH_DIM, 10]
    depth = get_preset(preset).config.depth
    assert r.node_counts["LayerNormalization"] == 2 * depth + 1 and r.node_counts["Softmax"] == depth
    assert graph_problems(m) == []
    if preset == "vit-tiny":  # a run at batch 2 against PyTorch, cheap enough here
        sess = ort.InferenceSession(str(r.path), providers=["CPUExecutionProvider"])
        x = np.random.default_rng(0).standard_normal((2, 3, 224, 224)).astype(np.float32)
        with torch.inference_mode():
            ref = load_any(ck).build()(torch.from_numpy(x)).numpy()
        np.testing.assert_allclose(sess.run(None, {INPUT_NAME: x})[0], ref, atol=1e-4)


@slow
@pytest.mark.slow
@pytest.mark.parametrize("preset", ["vit-large", "vit-huge"])
def test_large_presets_export(preset: str, tmp_path: Path) -> None:
    ck = make_ckpt(tmp_path / "c.pth", preset, num_classes=1000)
    r = export_onnx(ck, tmp_path / "m.onnx", check=False)
    m = onnx.load(str(r.path), load_external_data=False)
    assert dims(m.graph.input[0]) == [BATCH_DIM, 3, 224, 224]
    if preset == "vit-huge":  # 2.5 GB of weights: external data beside the .onnx
        assert r.external_data == tmp_path / "m.onnx.data" and r.external_data.stat().st_size > 2_000_000_000
    else:
        assert r.external_data is None
    onnx.checker.check_model(str(r.path), full_check=True)
    assert graph_problems(m) == []


def test_graph_problems_finds_dead_duplicate_and_foldable_nodes() -> None:
    """The checker the graph tests rely on reports each kind of litter (so its [] means something)."""
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])
    c = numpy_helper.from_array(np.ones(2, np.float32), "c")
    nodes = [
        helper.make_node("Add", ["x", "c"], ["a1"], name="a1"),
        helper.make_node("Add", ["x", "c"], ["a2"], name="a2"),  # duplicate of a1
        helper.make_node("Neg", ["c"], ["nc"], name="fold"),  # constant input only
        helper.make_node("Mul", ["a1", "a2"], ["m"], name="m"),
        helper.make_node("Add", ["m", "nc"], ["y"], name="out"),
        helper.make_node("Relu", ["x"], ["unused"], name="dead"),
    ]
    m = helper.make_model(helper.make_graph(nodes, "g", [x], [y], [c]))
    problems = " | ".join(graph_problems(m))
    assert "1 dead node(s), e.g. Relu" in problems
    assert "1 duplicated node(s)" in problems
    assert "unfolded constant node(s): Neg" in problems


def test_check_graph_rejects_broken_graphs(digits_export, tmp_path: Path) -> None:
    """The low-memory checker (weights left behind as stubs) still catches what onnx.checker catches."""
    from vitdeploy.graph.cleanup import check_graph

    good = onnx.load(str(digits_export.path))
    check_graph(good, tmp_path)
    cut = onnx.load(str(digits_export.path))
    w = next(t for t in cut.graph.initializer if len(t.dims) == 2 and t.dims[0] * t.dims[1] > 1000)
    w.raw_data = w.raw_data[:-4]
    with pytest.raises(VitdeployError, match=f"{w.name} holds"):
        check_graph(cut, tmp_path)
    dangling = onnx.load(str(digits_export.path))
    dangling.graph.node[3].input[0] = "no_such_tensor"
    with pytest.raises(VitdeployError, match="fails onnx.checker"):
        check_graph(dangling, tmp_path)
    assert list(tmp_path.iterdir()) == []  # its scratch files are gone


def test_headless_model_exports_as_an_embedding_model(tmp_path: Path) -> None:
    """A backbone (num_classes 0) is an embedding model (core/task.py): its output is `embedding` [batch, width], the
    pooled features its own forward gives, and the manifest says so. (It was refused before tasks existed.)"""
    import onnx
    import onnxruntime as ort
    import torch

    p = get_preset("vit-digits")
    cfg = p.config.with_(depth=1, num_classes=0)
    model = VisionTransformer(cfg).eval()
    ck = save_checkpoint(tmp_path / "enc.pth", model,
                         Manifest(model=cfg.to_dict(), labels=[], preprocess=dict(p.preprocess), name=p.name))
    out = tmp_path / "model.onnx"
    res = CliRunner().invoke(app, ["export", str(ck), "-o", str(out)])
    assert res.exit_code == 0, res.output
    m = onnx.load(str(out))
    assert [o.name for o in m.graph.output] == ["embedding"]
    assert [d.dim_param or d.dim_value for d in m.graph.output[0].type.tensor_type.shape.dim] == ["batch", cfg.embed_dim]
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.task import task_of

    task = task_of(read_onnx_manifest(out))
    assert task.is_embedding and task.dim == cfg.embed_dim and task.pool == "cls"
    x = np.random.default_rng(0).standard_normal((3, 3, *cfg.image_size)).astype(np.float32)
    got = ort.InferenceSession(str(out)).run(None, {"pixel_values": x})[0]
    with torch.no_grad():
        ref = model(torch.from_numpy(x)).numpy()
    assert np.max(np.abs(got - ref)) <= 1e-4 * np.max(np.abs(ref))
