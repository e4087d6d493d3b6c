"""run.py --check checks what it claims to (issue 40, E and mechanism 4), and patch tokens reach the device.

* Before judging, every model and reference file manifest.json's bundle.files lists must be the file the bundle was
  made with (SHA-256): a reference scaled x1000, cast to float16 or holding a NaN fails, naming the file. Files a user
  may edit (README, Triton and DeepStream configs) are named as edited, a warning.
* An embedding bundle is judged by cosine AND by each vector's norm (1% for FP32/FP16, 5% for INT8): a bundle whose
  reference and hash agree but whose scale is wrong fails, and so does an engine that answers at the wrong scale.
  A non-finite or float16 reference is named as a damaged file.
* An export with --tokens: the bundle saves reference/patch_tokens.<precision>.npy, --check holds the device's
  patch_tokens to it token by token, --out saves them; the TensorRT runner returns every output by name.

The model is a real two-output ONNX graph (Flatten, MatMul, Reshape: ``embedding`` [N, 8] and ``patch_tokens``
[N, 4, 8]) bundled by ``vitdeploy.stages.bundle`` (well under a second). TensorRT cases use tests/trt_mock.py
(generated from NVIDIA's compiled bindings; its "engine" runs the ONNX with ONNX Runtime) and host memory for CUDA:
they prove our side only.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from helpers import HostCuda, load_run_py, ort_run, write_plan
from onnx import TensorProto, helper, numpy_helper
from trt_mock import fake_tensorrt

from vitdeploy.core.manifest import Manifest, set_onnx_manifest
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.core.task import Task

DIM, PATCHES = 8, 4


def embedding_onnx(path: Path, scale: float = 1.0, token_scale: float = 1.0) -> Path:
    """pixel_values [N,3,16,16] → embedding [N,8] and patch_tokens [N,4,8] (two MatMuls of the flattened image), with
    a vitdeploy manifest of an embedding model exported with --tokens. ``scale``/``token_scale`` multiply the
    weights: the same model at another scale (cosine 1.0, norms off)."""
    rng = np.random.default_rng(0)
    w1 = rng.normal(0, 0.05, (3 * 16 * 16, DIM)).astype(np.float32) * np.float32(scale)
    w2 = rng.normal(0, 0.05, (3 * 16 * 16, PATCHES * DIM)).astype(np.float32) * np.float32(token_scale)
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["pixel_values"], ["flat"], axis=1, name="flatten"),
         helper.make_node("MatMul", ["flat", "W1"], ["embedding"], name="head"),
         helper.make_node("MatMul", ["flat", "W2"], ["tokens_flat"], name="tokens"),
         helper.make_node("Reshape", ["tokens_flat", "tokens_shape"], ["patch_tokens"], name="to_tokens")],
        "emb", [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", DIM]),
         helper.make_tensor_value_info("patch_tokens", TensorProto.FLOAT, ["batch", PATCHES, DIM])],
        [numpy_helper.from_array(w1, "W1"), numpy_helper.from_array(w2, "W2"),
         numpy_helper.from_array(np.array([-1, PATCHES, DIM], np.int64), "tokens_shape")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    pp = Preprocess(input_size=(16, 16), resize_mode="squash", interpolation="bilinear")
    set_onnx_manifest(model, Manifest(model={"num_classes": 0, "embed_dim": DIM, "image_size": [16, 16]}, labels=[],
                                      preprocess=pp.to_dict(), name="tinyemb", precision="fp32",
                                      extra={"task": Task("embedding", DIM, pool="cls", tokens=True).to_dict()}))
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vitdeploy.stages.bundle import BundleOptions, bundle

    d = tmp_path_factory.mktemp("embtok")
    bundle([embedding_onnx(d / "model.onnx")], d / "bundle", BundleOptions(references=6))
    return d / "bundle"


@pytest.fixture
def b(made: Path, tmp_path: Path) -> Path:
    out = tmp_path / "bundle"
    shutil.copytree(made, out)
    return out


def manifest(b: Path) -> dict:
    return json.loads((b / "manifest.json").read_text())


def run(b: Path, *argv: str, capsys: pytest.CaptureFixture) -> tuple[int, list[str], str]:
    """run.py's main from bundle ``b`` as a process would end: (exit code, stderr lines, stdout)."""
    mod = load_run_py(b / "run.py")
    try:
        code, msg = mod.main(list(argv)), None
    except SystemExit as e:
        code, msg = (e.code, None) if isinstance(e.code, int) or e.code is None else (1, str(e.code))
    out = capsys.readouterr()
    return int(code or 0), out.err.splitlines() + ([msg] if msg else []), out.out


def rehash(b: Path, rel: str) -> None:
    """manifest.json's bundle.files entry of ``rel`` set to the file as it is now: a bundle whose record agrees with
    its (wrong) file, as a tool that re-wrote both would leave it. The judgement, not the hash, must catch it then."""
    m = manifest(b)
    m["bundle"]["files"][rel] = hashlib.sha256((b / rel).read_bytes()).hexdigest()
    (b / "manifest.json").write_text(json.dumps(m))


REF = "reference/embeddings.fp32.npy"
TOKENS = "reference/patch_tokens.fp32.npy"


# --------------------------------------------------------------------------------------- the file check


@pytest.mark.parametrize("damage", ["x1000", "float16", "nan", "one value"])
@pytest.mark.parametrize("rel", [REF, TOKENS, "reference/inputs.npy"])
def test_check_refuses_a_reference_file_that_is_not_the_one_the_bundle_was_made_with(
        b: Path, rel: str, damage: str, capsys: pytest.CaptureFixture) -> None:
    a = np.load(b / rel)
    if damage == "x1000":
        a = a * 1000 if a.dtype != np.uint8 else a // 2
    elif damage == "float16":
        a = a.astype(np.float16)
    elif damage == "nan":
        a = a.astype(np.float32)
        a.flat[3] = np.nan
    else:
        a = a.copy()
        a.flat[5] = a.flat[5] + 1
    np.save(b / rel, a)
    code, err, out = run(b, "--check", capsys=capsys)
    assert code == 1 and out == "" and len(err) == 1, (err, out)
    assert err[0] == (f"error: {rel} is not the file this bundle was made with (its SHA-256 differs from manifest.json's "
                      "bundle.files): an edited or damaged copy; copy the bundle again")


def test_check_refuses_a_changed_model_that_is_no_artifact_of_the_bundle(b: Path, capsys: pytest.CaptureFixture) -> None:
    """triton/<name>/1/model.onnx is a copy of the raw-pixel model, listed in bundle.files only: checked all the same."""
    (tri,) = (b / "triton").iterdir()
    shutil.copyfile(b / "model.onnx", tri / "1" / "model.onnx")
    code, err, _ = run(b, "--check", capsys=capsys)
    assert code == 1 and err == [f"error: triton/{tri.name}/1/model.onnx is not the file this bundle was made with (its "
                                 "SHA-256 differs from manifest.json's bundle.files): an edited or damaged copy; copy "
                                 "the bundle again"]


def test_edited_readme_and_configs_are_named_as_a_warning(b: Path, capsys: pytest.CaptureFixture) -> None:
    (tri,) = (b / "triton").iterdir()
    with (b / "README.md").open("a") as f:
        f.write("my notes\n")
    cfg = tri / "config.pbtxt"
    cfg.write_text(cfg.read_text() + "# tuned here\n")
    (b / "deepstream" / "config_infer_primary.txt").unlink()
    code, err, out = run(b, "--check", "--json", capsys=capsys)
    edited = ["README.md", "deepstream/config_infer_primary.txt (removed)", f"triton/{tri.name}/config.pbtxt"]
    assert code == 0 and json.loads(out)["ok"] and json.loads(out)["edited"] == edited
    assert err == ["warning: edited since the bundle was made (their SHA-256 differs from manifest.json's bundle.files): "
                   + ", ".join(edited)]


def test_an_untouched_bundle_passes_without_a_warning(b: Path, capsys: pytest.CaptureFixture) -> None:
    code, err, out = run(b, "--check", "--json", capsys=capsys)
    res = json.loads(out)
    assert code == 0 and err == [] and res["ok"] and res["edited"] == []
    assert res["cosine_min"] >= 0.999999 and res["norm_rel_err_max"] <= 1e-6
    assert res["patch_tokens"]["ok"] and res["patch_tokens"]["tokens"] == 6 * PATCHES


# --------------------------------------------------------------------------------------- the judgement


@pytest.mark.parametrize("rel", [REF, TOKENS])
def test_a_reference_of_the_wrong_scale_fails_even_where_its_hash_agrees(b: Path, rel: str,
                                                                         capsys: pytest.CaptureFixture) -> None:
    """x1000 keeps every cosine at 1.0: the norm gate fails it. x1.005 (0.5%) is within FP32's 1%; x1.02 is not."""
    good = np.load(b / rel)
    for k, ok in ((1000.0, False), (1.02, False), (1.005, True)):
        np.save(b / rel, (good * np.float32(k)).astype(np.float32))
        rehash(b, rel)
        code, err, out = run(b, "--check", "--json", capsys=capsys)
        res = json.loads(out)
        part = res if rel == REF else res["patch_tokens"]
        assert part["cosine_min"] >= 0.999999 and part["max_norm_rel_err"] == 0.01, (k, res)
        assert part["norm_rel_err_max"] == pytest.approx(1 - 1 / k, rel=1e-4), (k, res)
        assert (code, res["ok"], part["ok"]) == ((0, True, True) if ok else (1, False, False)), (k, res)
    np.save(b / rel, good * np.float32(1000))
    rehash(b, rel)
    code, _, out = run(b, "--check", capsys=capsys)
    assert code == 1 and out.startswith("FAILED: model.raw.onnx") and "norm within 99.90%" in out and "at most 1%" in out


@pytest.mark.parametrize("rel", [REF, TOKENS])
@pytest.mark.parametrize("damage", ["nan", "inf", "float16"])
def test_a_damaged_reference_is_named_not_read_as_a_broken_model(b: Path, rel: str, damage: str,
                                                                  capsys: pytest.CaptureFixture) -> None:
    a = np.load(b / rel)
    if damage == "float16":
        a = a.astype(np.float16)
    else:
        a.flat[2] = np.nan if damage == "nan" else np.inf
    np.save(b / rel, a)
    rehash(b, rel)
    code, err, out = run(b, "--check", capsys=capsys)
    assert code == 1 and out == "" and len(err) == 1, (err, out)
    if damage == "float16":
        assert err[0] == (f"error: {rel} holds float16 values, not the float32 the bundle wrote: a damaged or edited "
                          "reference; copy the bundle again")
    else:
        assert err[0] == (f"error: {rel}: 1 of its {a.size} values are not finite (NaN or infinity): a damaged reference "
                          "file; copy the bundle again")


def test_a_classifiers_damaged_reference_logits_are_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from helpers import tiny_bundle

    c = tiny_bundle(tmp_path)
    rel = "reference/logits.fp32.npy"
    a = np.load(c / rel)
    a[1, 2] = np.nan
    np.save(c / rel, a)
    code, err, _ = run(c, "--check", capsys=capsys)
    assert code == 1 and err == [f"error: {rel} is not the file this bundle was made with (its SHA-256 differs from "
                                 "manifest.json's bundle.files): an edited or damaged copy; copy the bundle again"]
    rehash(c, rel)
    code, err, out = run(c, "--check", capsys=capsys)
    assert code == 1 and out == "" and err == [f"error: {rel}: 1 of its {a.size} values are not finite (NaN or "
                                               "infinity): a damaged reference file; copy the bundle again"]


def test_norm_gates_are_the_manifests_and_run_py_keeps_vitdeploys_for_older_bundles(b: Path) -> None:
    from vitdeploy.checks.device_check import NORM_TOLERANCE

    assert NORM_TOLERANCE == {"fp32": 0.01, "fp16": 0.01, "int8": 0.05}  # the budget
    mod = load_run_py(b / "run.py")
    assert mod.NORM_TOLERANCE == NORM_TOLERANCE
    info = manifest(b)["bundle"]
    assert info["reference"]["check"]["fp32"]["max_norm_rel_err"] == NORM_TOLERANCE["fp32"]
    assert mod.norm_gate(info, "fp32") == 0.01
    del info["reference"]["check"]["fp32"]["max_norm_rel_err"]
    assert [mod.norm_gate(info, p) for p in ("fp32", "fp16", "int8")] == [0.01, 0.01, 0.05]
    # INT8's 5%: a vector 4% long passes, 6% long fails (cosine 1.0 both times)
    rng = np.random.default_rng(1)
    ref = rng.standard_normal((10, DIM)).astype(np.float32)
    for k, ok in ((1.04, True), (0.96, True), (1.06, False), (0.94, False)):
        got = ref.copy()
        got[7] *= k
        r = mod.judge_vectors(got, ref, 0.99, 0.97, mod.norm_gate(info, "int8"))
        assert r["cosine_min"] >= 0.999999 and r["ok"] is ok, (k, r)


# --------------------------------------------------------------------------------------- patch tokens


def test_bundle_saves_the_reference_patch_tokens_onnx_runtime_gives(made: Path) -> None:
    m = manifest(made)
    ref = m["bundle"]["reference"]
    assert ref["patch_tokens"] == {"fp32": TOKENS} and TOKENS in m["bundle"]["files"]
    images = np.load(made / ref["inputs"])
    want = ort_run(made / "model.raw.onnx", images)  # embedding (first output)
    import onnxruntime as ort

    s = ort.InferenceSession(str(made / "model.raw.onnx"), providers=["CPUExecutionProvider"])
    emb, tokens = s.run(["embedding", "patch_tokens"], {s.get_inputs()[0].name: images})
    np.testing.assert_allclose(np.load(made / REF), want, rtol=1e-6, atol=1e-6)
    saved = np.load(made / TOKENS)
    assert saved.dtype == np.float32 and saved.shape == (6, PATCHES, DIM)
    np.testing.assert_allclose(saved, tokens, rtol=1e-5, atol=1e-5)
    assert "patch_tokens" in (made / "README.md").read_text()


def test_out_saves_the_patch_tokens_beside_the_vectors(b: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "emb.npy"
    code, err, _ = run(b, str(b / "reference" / "images"), "--out", str(out), capsys=capsys)
    assert code == 0 and err[-1] == f"saved their patch tokens to {tmp_path / 'emb.patch_tokens.npy'}", err
    images = np.load(b / "reference" / "inputs.npy")
    import onnxruntime as ort

    s = ort.InferenceSession(str(b / "model.raw.onnx"), providers=["CPUExecutionProvider"])
    emb, tokens = s.run(["embedding", "patch_tokens"], {s.get_inputs()[0].name: images})
    np.testing.assert_allclose(np.load(out), emb, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(np.load(tmp_path / "emb.patch_tokens.npy"), tokens, rtol=1e-6, atol=1e-6)


def _engine(b: Path, onnx_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A mock engine (``model.raw.engine``, what build_engine.sh writes for the default model) that runs
    ``onnx_path``, and run.py loaded with the mock TensorRT and host-memory CUDA."""
    write_plan(b / "model.raw.engine", onnx_path, "10.3.0", 1, 4, 8)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("10.3.0"))
    mod = load_run_py(b / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    return mod


def _raw_variant(b: Path, src: Path, out: Path) -> Path:
    """The raw-pixel (uint8 NHWC in) form of ``src``, made as the bundle makes model.raw.onnx."""
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.stages.embed import write_variant

    art = OnnxArtifact.open(src)
    write_variant(art.model, art.manifest, src.name, art.sha256, out)
    return out


def test_check_on_tensorrt_judges_the_engines_patch_tokens(b: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture) -> None:
    mod = _engine(b, b / "model.raw.onnx", monkeypatch)
    assert mod.main(["--check", "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["backend"] == "tensorrt" and res["engine"] == "model.raw.engine" and res["ok"]
    assert res["patch_tokens"]["ok"] and res["patch_tokens"]["tokens"] == 6 * PATCHES
    assert res["patch_tokens"]["cosine_min"] >= 0.999999


@pytest.mark.parametrize("scale,token_scale,which", [(1000.0, 1.0, "embedding"), (1.0, 1.03, "patch_tokens"),
                                                     (1.0, -1.0, "patch_tokens")])
def test_an_engine_that_answers_at_another_scale_fails_the_check(b: Path, tmp_path: Path, scale: float,
                                                                 token_scale: float, which: str,
                                                                 monkeypatch: pytest.MonkeyPatch,
                                                                 capsys: pytest.CaptureFixture) -> None:
    """An engine built from another export of the model (weights x1000: every cosine 1.0; tokens 3% long; tokens
    turned around): the check fails on the output that differs, and says which."""
    other = _raw_variant(b, embedding_onnx(tmp_path / "other.onnx", scale, token_scale), tmp_path / "other.raw.onnx")
    mod = _engine(b, other, monkeypatch)
    assert mod.main(["--check", "--json"]) == 1
    res = json.loads(capsys.readouterr().out)
    assert not res["ok"] and res["backend"] == "tensorrt"
    emb_ok, tok_ok = which != "embedding", which != "patch_tokens"
    assert (res["cosine_min"] >= 0.999999, res["norm_rel_err_max"] <= 1e-5) == (True, emb_ok), res
    assert res["patch_tokens"]["ok"] is tok_ok, res


def test_a_tokens_reference_with_an_engine_without_tokens_is_one_line(b: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch,
                                                                      capsys: pytest.CaptureFixture) -> None:
    """An engine of the embedding alone (built from an export without --tokens) where the bundle has reference
    tokens: one line naming the missing output, not a pass on the embedding alone."""
    m = onnx.load(str(b / "model.raw.onnx"))
    keep = [o for o in m.graph.output if o.name != "patch_tokens"]
    del m.graph.output[:]
    m.graph.output.extend(keep)
    onnx.save(m, str(tmp_path / "no_tokens.onnx"))
    mod = _engine(b, tmp_path / "no_tokens.onnx", monkeypatch)
    with pytest.raises(SystemExit) as e:
        mod.main(["--check"])
    assert str(e.value.code) == (f"error: {TOKENS} holds reference patch tokens, but the model gives no patch_tokens "
                                 "output (outputs: embedding): rebuild the engine from this bundle's model with "
                                 "./build_engine.sh")


# --------------------------------------------------------------------------------------- the TensorRT runner


@pytest.fixture
def mocked_trt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The mock TensorRT of one release, host memory for libcudart, one fake GPU (as test_engine_mock_tensorrt)."""
    import fake_libcuda
    from helpers import FakeHostCuda

    from vitdeploy.runners.tensorrt import cuda

    monkeypatch.chdir(tmp_path)
    fake_cuda = FakeHostCuda()
    monkeypatch.setattr(cuda, "CudaRuntime", lambda *a, **k: fake_cuda)
    fake_libcuda.install(monkeypatch)
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("10.3.0.30", calls))
    return fake_cuda, calls


def test_tensorrt_runner_returns_every_output_by_name(mocked_trt: Any, tmp_path: Path) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    fake_cuda, calls = mocked_trt
    src = embedding_onnx(tmp_path / "model.onnx")
    res = build_engine(src, BuildOptions(min_batch=1, opt_batch=4, max_batch=8))
    x = np.random.default_rng(0).normal(size=(11, 3, 16, 16)).astype(np.float32)
    import onnxruntime as ort

    s = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"])
    emb, tokens = s.run(["embedding", "patch_tokens"], {"pixel_values": x})
    with open_runner(res.engine) as r:
        assert r.backend == "tensorrt" and r.output_names == ["embedding", "patch_tokens"]
        np.testing.assert_allclose(r(x), emb, rtol=1e-6, atol=1e-6)  # run(): the main output, as every runner
        outs = r.run_outputs(x)  # 8 + 3
        assert list(outs) == ["embedding", "patch_tokens"] and outs["patch_tokens"].shape == (11, PATCHES, DIM)
        np.testing.assert_allclose(outs["embedding"], emb, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(outs["patch_tokens"], tokens, rtol=1e-6, atol=1e-6)
        first, t = r.run_with_tokens(x[:5])  # what verify's per-patch cosine map asks
        np.testing.assert_allclose(first, emb[:5], rtol=1e-6, atol=1e-6)
        assert t is not None
        np.testing.assert_allclose(t, tokens[:5], rtol=1e-6, atol=1e-6)
    assert not [c for c in calls if c[0] == "execute-refused"]  # every output had an address on every call
    assert fake_cuda.blocks == {}  # close() freed every output's device and host memory
    with open_runner(src) as r:  # every runner answers the same call: ONNX Runtime here
        outs = r.run_outputs(x)
        assert list(outs) == ["embedding", "patch_tokens"]
        # its own session options (threads, graph optimisations) sum in another order: float32 rounding apart
        np.testing.assert_allclose(outs["patch_tokens"], tokens, rtol=1e-5, atol=1e-5)


def test_tensorrt_runner_reads_the_main_output_by_name_not_by_position(mocked_trt: Any, tmp_path: Path) -> None:
    """An engine whose plan lists patch_tokens first: run() still answers the embedding (the task's output)."""
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    src = embedding_onnx(tmp_path / "model.onnx")
    m = onnx.load(str(src))
    outs = list(m.graph.output)
    del m.graph.output[:]
    m.graph.output.extend(outs[::-1])
    onnx.save(m, str(src))
    res = build_engine(src, BuildOptions(min_batch=1, opt_batch=2, max_batch=4))
    x = np.random.default_rng(2).normal(size=(3, 3, 16, 16)).astype(np.float32)
    import onnxruntime as ort

    (emb,) = ort.InferenceSession(str(src), providers=["CPUExecutionProvider"]).run(["embedding"], {"pixel_values": x})
    with open_runner(res.engine) as r:
        assert r.output_names == ["embedding", "patch_tokens"]
        np.testing.assert_allclose(r(x), emb, rtol=1e-6, atol=1e-6)


# --------------------------------------------------------------------------------------- the C++ example


@pytest.mark.slow  # builds the example (about a minute on a loaded 2-core machine)
def test_cpp_example_saves_the_patch_tokens_run_py_saves(made: Path, tmp_path: Path) -> None:
    """bundle.cfg names the patch-token output; classify --out saves them beside the vectors, the very arrays
    run.py --out saves (the stub engine answers, per exact image, what ONNX Runtime gives for it)."""
    import subprocess

    from cpp_helpers import build_with_stub, stub_engine, write_table

    cfg = (made / "cpp" / "bundle.cfg").read_text().splitlines()
    assert "tokens=patch_tokens" in cfg and "output=embedding" in cfg
    binary = build_with_stub(made / "cpp", tmp_path / "classify")
    mod = load_run_py(made / "run.py")
    files = sorted((made / "reference" / "images").iterdir())
    x = np.stack([mod.load_resized(f, manifest(made)["preprocess"]) for f in files])
    outs = mod.OrtModel(made / "model.raw.onnx").outputs(x)
    rows = np.concatenate([outs["embedding"], outs["patch_tokens"].reshape(len(x), -1)], axis=1)
    eng, _ = stub_engine(tmp_path, 16, 16, DIM, lo=1, hi=4, table=write_table(tmp_path / "table.bin", x, rows))
    eng.write_text(eng.read_text() + f"patches={PATCHES}\ntoken_width={DIM}\n")
    out_c = tmp_path / "c.npy"
    r = subprocess.run([str(binary), str(eng), *map(str, files), "--out", str(out_c)], capture_output=True, text=True,
                       timeout=300, cwd=made)
    assert r.returncode == 0, r.stderr
    assert r.stderr.splitlines()[-1] == f"saved their patch tokens to {tmp_path / 'c.patch_tokens.npy'}"
    out_p = tmp_path / "p.npy"
    assert mod.main([*map(str, files), "--out", str(out_p), "--backend", "onnxruntime"]) == 0
    np.testing.assert_array_equal(np.load(out_c), np.load(out_p))
    tokens = np.load(tmp_path / "c.patch_tokens.npy")
    assert tokens.shape == (len(files), PATCHES, DIM) and tokens.dtype == np.float32
    np.testing.assert_array_equal(tokens, np.load(tmp_path / "p.patch_tokens.npy"))
    # an engine without the patch-token output, where bundle.cfg names one: one line, exit 1, nothing saved
    bare, _ = stub_engine(tmp_path / "bare", 16, 16, DIM)
    out_b = tmp_path / "b.npy"
    r = subprocess.run([str(binary), str(bare), str(files[0]), "--out", str(out_b)], capture_output=True, text=True,
                       timeout=60, cwd=made)
    assert r.returncode == 1 and r.stderr.strip().splitlines() == [
        f"error: {bare}: no output patch_tokens, though bundle.cfg names it: rebuild the engine"]
    assert not out_b.exists()


def test_verifys_per_patch_map_reads_the_engines_patch_tokens(mocked_trt: Any, tmp_path: Path) -> None:
    """verify's per-patch cosine map (run_with_tokens) on an engine: the engine's own patch tokens, not "none"."""
    from PIL import Image

    from vitdeploy.checks.verify import patch_cosine_maps
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    src = embedding_onnx(tmp_path / "model.onnx")
    res = build_engine(src, BuildOptions(min_batch=1, opt_batch=1, max_batch=2))
    img = tmp_path / "photo.png"
    Image.fromarray(np.random.default_rng(3).integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(img)
    with open_runner(src) as ort_runner, open_runner(res.engine) as trt_runner:
        maps, note = patch_cosine_maps([ort_runner, trt_runner], str(img), (2, 2))
    assert note == "" and maps[0] is None and maps[1] is not None
    assert maps[1].cosine.shape == (2, 2) and float(maps[1].cosine.min()) >= 0.999999
