"""`vitdeploy bundle`: the Jetson folder, Triton repository, DeepStream config, run.py and build_engine.sh."""

from __future__ import annotations

import configparser
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from helpers import HostCuda, load_run_py, ort_run, write_plan
from PIL import Image
from tritonclient.grpc import model_config_pb2
from trt_mock import fake_tensorrt

from vitdeploy.core.artifact import read_onnx_manifest
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import set_onnx_manifest
from vitdeploy.core.preprocess import list_images, preprocess_file, resized_uint8
from vitdeploy.stages.bundle import BundleOptions, bundle

VENV_BIN = Path(sys.executable).parent


def make_int8(src: Path, out: Path, images: list[Path]) -> Path:
    """A Q/DQ INT8 artifact made with ONNX Runtime's own quantizer (per-channel weights, int8 activations)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    man = read_onnx_manifest(src)
    x = np.stack([preprocess_file(f, man.pp()) for f in images])

    class Reader(CalibrationDataReader):
        def __init__(self) -> None:
            self.it = iter([{"pixel_values": x[i : i + 16]} for i in range(0, len(x), 16)])

        def get_next(self):  # noqa: ANN201
            return next(self.it, None)

    quantize_static(str(src), str(out), Reader(), quant_format=QuantFormat.QDQ, activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8, per_channel=True)
    m = onnx.load(str(out))
    set_onnx_manifest(m, man.derive(precision="int8"))
    onnx.save(m, str(out))
    return out


def make_fp16(src: Path, out: Path) -> Path:
    """An FP16 artifact (float16 tensors, float16 input and output) made with ONNX Runtime's converter."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    m = convert_float_to_float16(onnx.load(str(src)), keep_io_types=False)
    set_onnx_manifest(m, read_onnx_manifest(src).derive(precision="fp16"))
    onnx.save(m, str(out))
    return out


@pytest.fixture(scope="module")
def artifacts(digits_onnx: Path, digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The session's fp32 export with INT8 and FP16 made by ONNX Runtime's own tools: a bundle takes artifacts that
    vitdeploy did not make (tests/conftest.py's digits_bundle packs vitdeploy's own)."""
    d = tmp_path_factory.mktemp("artifacts")
    shutil.copy2(digits_onnx, d / "model.onnx")
    make_int8(d / "model.onnx", d / "model.int8.onnx", list_images(digits_folder / "train")[::15])
    make_fp16(d / "model.onnx", d / "model.fp16.onnx")
    return d


@pytest.fixture(scope="module")
def bundle_dir(artifacts: Path, digits_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("b") / "bundle"
    opts = BundleOptions(opt_batch=4, max_batch=16, check_images=[digits_folder / "val"], references=12)
    res = bundle([artifacts / "model.int8.onnx", artifacts / "model.onnx", artifacts / "model.fp16.onnx"], out, opts)
    assert res.out == out and res.precisions == ["fp32", "fp16", "int8"] and res.default_precision == "int8"
    assert res.embed_errors["fp32"] <= 1e-4 and res.embed_errors["int8"] <= 1e-4 and res.embed_errors["fp16"] <= 2e-3
    return out


def test_bundle_contents_and_manifest(bundle_dir: Path, artifacts: Path) -> None:
    for f in ("manifest.json", "labels.txt", "model.onnx", "model.raw.onnx", "model.int8.onnx", "model.int8.raw.onnx",
              "run.py", "build_engine.sh", "README.md", "reference/inputs.npy", "reference/logits.fp32.npy",
              "reference/logits.int8.npy", "deepstream/config_infer_primary.txt", "deepstream/model.ds.onnx"):
        assert (bundle_dir / f).is_file(), f
    assert (bundle_dir / "model.fp16.raw.onnx").is_file() and (bundle_dir / "reference/logits.fp16.npy").is_file()
    assert (bundle_dir / "build_engine.sh").stat().st_mode & stat.S_IXUSR
    m = json.loads((bundle_dir / "manifest.json").read_text())
    labels = read_onnx_manifest(artifacts / "model.onnx").labels
    assert m["labels"] == labels and m["precision"] == "int8"
    assert (bundle_dir / "labels.txt").read_text().splitlines() == labels
    assert m["raw_variant"] == "model.int8.raw.onnx" == m["bundle"]["default_model"]
    arts = m["bundle"]["artifacts"]
    assert arts["model.onnx"]["raw_variant"] == "model.raw.onnx"
    assert arts["model.int8.raw.onnx"]["input"]["dtype"] == "uint8"
    assert m["bundle"]["batch"] == {"min": 1, "opt": 4, "max": 16}
    assert len(m["bundle"]["reference"]["images"]) == 12
    for name, a in arts.items():
        from vitdeploy.core.fileio import sha256_file

        assert sha256_file(bundle_dir / name) == a["sha256"], name
    readme = (bundle_dir / "README.md").read_text()
    assert "JetPack 6.1 / 6.2" in readme and "run.py --check" in readme and "@@" not in readme
    assert not list(bundle_dir.parent.glob(".bundle.*"))  # no temporary folder left behind


def test_triton_config_parses_with_tritons_schema(bundle_dir: Path) -> None:
    tri = bundle_dir / "triton" / "vit-digits" if (bundle_dir / "triton" / "vit-digits").is_dir() else next((bundle_dir / "triton").iterdir())
    cfg = text_format.Parse((tri / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert cfg.name == tri.name and cfg.platform == "onnxruntime_onnx"
    assert cfg.max_batch_size == 16
    assert cfg.HasField("dynamic_batching") and list(cfg.dynamic_batching.preferred_batch_size) == [4, 16]
    (inp,) = cfg.input
    (out,) = cfg.output
    assert inp.name == "images" and inp.data_type == model_config_pb2.TYPE_UINT8 and list(inp.dims) == [32, 32, 3]
    assert out.name == "logits" and out.data_type == model_config_pb2.TYPE_FP32 and list(out.dims) == [10]
    assert out.label_filename == "labels.txt" and (tri / "labels.txt").read_text().splitlines() == [str(i) for i in range(10)]
    # the config describes the model that is really there
    import onnxruntime as ort

    s = ort.InferenceSession(str(tri / "1" / "model.onnx"), providers=["CPUExecutionProvider"])
    (si,), (so,) = s.get_inputs(), s.get_outputs()
    assert (si.name, si.type, si.shape[1:]) == ("images", "tensor(uint8)", [32, 32, 3])
    assert (so.name, so.shape[1:]) == ("logits", [10])


def test_deepstream_config_keys(bundle_dir: Path) -> None:
    ds = bundle_dir / "deepstream"
    cp = configparser.ConfigParser()
    cp.read_string((ds / "config_infer_primary.txt").read_text())
    p = cp["property"]
    assert p["network-type"] == "1" and p["network-mode"] == "1"  # classifier, INT8
    assert float(p["net-scale-factor"]) == 1.0 and p["offsets"] == "0;0;0"
    assert p["infer-dims"] == "3;32;32" and p["batch-size"] == "4" and p["model-color-format"] == "0"
    assert (ds / p["onnx-file"]).is_file() and p["model-engine-file"] == "model.ds.engine"
    assert (ds / p["labelfile-path"]).read_text().strip() == ";".join(str(i) for i in range(10))
    assert p["output-blob-names"] == "probs"
    # the model DeepStream runs takes float 0-255 NCHW (what nvinfer hands over with scale 1, offsets 0)
    images = np.load(bundle_dir / "reference" / "inputs.npy")
    probs = ort_run(ds / p["onnx-file"], images.transpose(0, 3, 1, 2).astype(np.float32))
    ref = np.load(bundle_dir / "reference" / "logits.int8.npy")
    e = np.exp(ref - ref.max(1, keepdims=True))
    np.testing.assert_allclose(probs, e / e.sum(1, keepdims=True), atol=1e-4)


def _blocking_site(tmp: Path) -> Path:
    """A folder that makes `import torch` and `import vitdeploy` fail, to prove run.py needs neither."""
    site = tmp / "block"
    (site / "vitdeploy").mkdir(parents=True, exist_ok=True)
    (site / "torch.py").write_text("raise ImportError('run.py must not import torch')\n")
    (site / "vitdeploy" / "__init__.py").write_text("raise ImportError('run.py must not import vitdeploy')\n")
    return site


def run_py(bundle: Path, *args: str, tmp: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(_blocking_site(tmp)), "OMP_NUM_THREADS": "2"}
    return subprocess.run([sys.executable, str(bundle / "run.py"), *args], capture_output=True, text=True, env=env,
                          cwd=tmp, timeout=300)


def vitdeploy_infer(model: Path, images: Path, tmp: Path) -> dict[str, str]:
    """vitdeploy infer on ONNX Runtime, the backend run.py is given below (auto would pick OpenVINO)."""
    out = tmp / f"infer-{model.stem}.json"
    r = subprocess.run([str(VENV_BIN / "vitdeploy"), "infer", str(images), "-m", str(model), "-o", str(out),
                        "--backend", "onnxruntime"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return {Path(row["path"]).resolve().as_posix(): row["label"] for row in json.loads(out.read_text())}


@pytest.mark.parametrize("model", ["model.int8.raw.onnx", "model.raw.onnx", "model.onnx"])
def test_run_py_labels_equal_vitdeploy_infer(bundle_dir: Path, digits_folder: Path, tmp_path: Path, model: str) -> None:
    # a copy of the bundle somewhere else: run.py reads only its own folder
    moved = tmp_path / "elsewhere"
    shutil.copytree(bundle_dir, moved)
    images = digits_folder / "val" / "3"
    r = run_py(moved, str(images), "--model", model, "--json", "--backend", "onnxruntime", tmp=tmp_path)
    assert r.returncode == 0, r.stderr
    got = {Path(j["path"]).resolve().as_posix(): j["label"] for j in map(json.loads, r.stdout.splitlines())}
    source = moved / (model.replace(".raw", ""))  # vitdeploy infer runs the normal export of the same precision
    want = vitdeploy_infer(source, images, tmp_path)
    assert len(got) == len(list_images(images)) >= 30
    assert got == want


def test_run_py_text_output_and_unreadable_file(bundle_dir: Path, digits_folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken.png"
    bad.write_bytes(b"not a png")
    good = list_images(digits_folder / "val" / "7")[:3]
    r = run_py(bundle_dir, *map(str, good), str(bad), "--top", "2", tmp=tmp_path)
    assert r.returncode == 3 and "skipped" in r.stderr and "broken.png" in r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 3 and all(len(line.split("\t")) == 5 for line in lines)


@pytest.mark.parametrize("model", [None, "model.onnx", "model.fp16.raw.onnx", "deepstream/model.ds.onnx"])
def test_run_py_check_passes_and_fails_when_logits_differ(bundle_dir: Path, tmp_path: Path, model: str | None) -> None:
    args = ["--check", "--json"] + (["--model", model] if model else [])
    r = run_py(bundle_dir, *args, tmp=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["ok"] and res["backend"] == "onnxruntime" and res["top1_agreement"] == 1.0
    assert res["max_rel_diff"] < (2e-3 if res["precision"] == "fp16" else 1e-4)
    # a bundle whose reference logits disagree with the model fails the check
    bad = tmp_path / "bad"
    shutil.copytree(bundle_dir, bad)
    prec = res["precision"]
    ref = np.load(bad / "reference" / f"logits.{prec}.npy")
    rel = f"reference/logits.{prec}.npy"
    np.save(bad / rel, ref[::-1].copy())
    r2 = run_py(bad, *args, tmp=tmp_path)  # first: not the file the bundle was made with (its SHA-256)
    assert r2.returncode == 1 and r2.stdout == "" and f"error: {rel} is not the file this bundle was made with" in r2.stderr
    m = json.loads((bad / "manifest.json").read_text())  # its record re-written to agree: the judgement fails it
    m["bundle"]["files"][rel] = hashlib.sha256((bad / rel).read_bytes()).hexdigest()
    (bad / "manifest.json").write_text(json.dumps(m))
    r2 = run_py(bad, *args, tmp=tmp_path)
    assert r2.returncode == 1 and not json.loads(r2.stdout)["ok"]


def test_run_py_resize_matches_vitdeploy(bundle_dir: Path, mixed_mode_folder: Path, photo_files: list[Path]) -> None:
    mod = load_run_py(bundle_dir / "run.py")
    from vitdeploy.core.preprocess import Preprocess

    for pp in (read_onnx_manifest(bundle_dir / "model.onnx").pp(), Preprocess(input_size=(64, 64)),
               Preprocess(input_size=(48, 64), interpolation="bilinear", crop_pct=0.9)):
        for f in list_images(mixed_mode_folder) + photo_files:
            np.testing.assert_array_equal(mod.load_resized(f, pp.to_dict()), resized_uint8(f, pp), err_msg=str(f))
        x = np.stack([resized_uint8(f, pp) for f in photo_files])
        spec_plain = {"preprocess_in_graph": False, "dtype": "float32"}
        np.testing.assert_allclose(mod.model_input(x, spec_plain, pp.to_dict()),
                                   np.stack([preprocess_file(f, pp) for f in photo_files]), atol=1e-6)


# --- build_engine.sh, with stand-ins for trtexec and vitdeploy (no TensorRT can exist here) ----------------


def fake_tool(bindir: Path, name: str, banner: str = "") -> Path:
    """A stand-in that logs its arguments and writes the engine file it is asked for."""
    bindir.mkdir(parents=True, exist_ok=True)
    log = bindir / f"{name}.args"
    script = bindir / name
    script.write_text(f"""#!/usr/bin/env bash
if [ "$1" = "--help" ]; then echo "&&&& RUNNING TensorRT.trtexec [TensorRT {banner}] # trtexec --help"; exit 0; fi
printf '%s\\n' "$@" > "{log}"
for a in "$@"; do case "$a" in --saveEngine=*) echo plan > "${{a#--saveEngine=}}" ;; esac; done
prev=""; for a in "$@"; do [ "$prev" = "--out" ] && echo plan > "$a"; prev="$a"; done
""")
    script.chmod(0o755)
    return log


def build(bundle: Path, bindir: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bindir}:/usr/bin:/bin", "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(["bash", str(bundle / "build_engine.sh"), *args], capture_output=True, text=True, env=env, timeout=60)


@pytest.mark.parametrize(("banner", "want", "absent"), [
    ("v8502", ["--int8", "--fp16", "--buildOnly"], ["--stronglyTyped", "--skipInference"]),  # 8.5: no --skipInference
    ("v8601", ["--int8", "--fp16", "--skipInference"], ["--stronglyTyped", "--buildOnly"]),
    ("v100300", ["--stronglyTyped", "--skipInference"], ["--int8", "--fp16", "--buildOnly"]),
    ("v110401", ["--skipInference"], ["--stronglyTyped", "--int8", "--fp16", "--buildOnly"]),
])
def test_build_engine_sh_trtexec_line_with_mock_trtexec(digits_bundle: Path, tmp_path: Path, banner: str, want: list[str], absent: list[str]) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(digits_bundle, b)
    log = fake_tool(tmp_path / "bin", "trtexec", banner)
    r = build(b, tmp_path / "bin")
    assert r.returncode == 0, r.stderr
    args = log.read_text().splitlines()
    line = {"v8502": "trt8.5", "v8601": "trt8.6", "v100300": "trt10", "v110401": "trt11"}[banner]
    made_for = json.loads((b / "manifest.json").read_text())["bundle"]["tensorrt"]["matrix"][line]["int8"]
    assert f"--onnx={made_for[:-len('.onnx')]}.raw.onnx" in args  # the file made and checked for that TensorRT
    assert {"--minShapes=images:1x32x32x3", "--optShapes=images:4x32x32x3", "--maxShapes=images:16x32x32x3"} <= set(args)
    assert all(w in args for w in want) and not any(a in args for a in absent)
    assert (b / f"{made_for[:-len('.onnx')]}.raw.engine").read_text() == "plan\n"
    assert "python3 run.py --check" in r.stdout
    assert not list(b.glob("*.tmp.*"))


def test_build_engine_sh_options_with_mock_trtexec(digits_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(digits_bundle, b)
    log = fake_tool(tmp_path / "bin", "trtexec", "v100300")
    r = build(b, tmp_path / "bin", "--precision", "fp32", "--normalized", "--batch", "2:4:8")
    assert r.returncode == 0, r.stderr
    args = log.read_text().splitlines()
    assert "--onnx=model.onnx" in args and "--minShapes=pixel_values:2x3x32x32" in args
    assert "--maxShapes=pixel_values:8x3x32x32" in args and (b / "model.engine").exists()
    assert not {"--stronglyTyped", "--fp16", "--int8", "--useDLACore=1"} & set(args)
    r = build(b, tmp_path / "bin", "--normalized", "--dla", "1")
    assert r.returncode == 0, r.stderr
    args = log.read_text().splitlines()
    int8_10 = json.loads((b / "manifest.json").read_text())["bundle"]["tensorrt"]["matrix"]["trt10"]["int8"]
    assert f"--onnx={int8_10}" in args and "--useDLACore=1" in args and "--allowGPUFallback" in args
    assert "--minShapes=pixel_values:4x3x32x32" in args and "--maxShapes=pixel_values:4x3x32x32" in args  # DLA: static
    assert "--int8" in args and "--fp16" in args and "--stronglyTyped" not in args  # DLA: weakly typed on 10
    assert (b / int8_10.replace(".onnx", ".engine")).exists()
    # DeepStream: the shipped INT8 model's form where that file conforms (8.6), the line's variant's form elsewhere
    r = build(b, tmp_path / "bin", "--deepstream", "--dry-run", "--trt", "8.6")
    assert r.returncode == 0 and "--onnx=deepstream/model.ds.onnx" in r.stdout and "images:4x3x32x32" in r.stdout
    r = build(b, tmp_path / "bin", "--deepstream", "--dry-run")
    ds = "model.ds.onnx" if int8_10 == "model.int8.onnx" else int8_10.replace(".onnx", ".ds.onnx")
    assert r.returncode == 0 and f"--onnx=deepstream/{ds}" in r.stdout and "--saveEngine=deepstream/model.ds.engine" in r.stdout
    assert not (b / "deepstream" / "model.ds.engine").exists()
    r = build(b, tmp_path / "bin", "--precision", "fp16")
    assert r.returncode == 0 and "--onnx=model.fp16.raw.onnx" in log.read_text().splitlines()
    assert "--stronglyTyped" in log.read_text().splitlines() and "--model model.fp16.raw.onnx" in r.stdout
    for bad in (["--precision", "bf16"], ["--batch", "8:4:2"], ["--bogus"], ["--triton", "--normalized"], ["--deepstream", "--precision", "fp32"],
                ["--precision", "fp32", "--dla", "0"]):
        r = build(b, tmp_path / "bin", *bad)
        assert r.returncode == 1 and "build_engine.sh:" in r.stderr, bad


def test_build_engine_sh_triton_plan_with_mock_trtexec(digits_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(digits_bundle, b)
    fake_tool(tmp_path / "bin", "trtexec", "v100300")
    r = build(b, tmp_path / "bin", "--triton")
    assert r.returncode == 0, r.stderr
    tri = next((b / "triton").iterdir())
    assert (tri / "1" / "model.plan").read_text() == "plan\n"
    cfg = text_format.Parse((tri / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert cfg.platform == "tensorrt_plan" and cfg.max_batch_size == 16


def test_build_engine_sh_prefers_vitdeploy_with_mock_vitdeploy(digits_bundle: Path, tmp_path: Path) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(digits_bundle, b)
    log = fake_tool(tmp_path / "bin", "vitdeploy")
    fake_tool(tmp_path / "bin", "trtexec", "v100300")
    r = build(b, tmp_path / "bin", "--dla", "0")
    assert r.returncode == 0, r.stderr
    args = log.read_text().splitlines()
    int8_10 = json.loads((b / "manifest.json").read_text())["bundle"]["tensorrt"]["matrix"]["trt10"]["int8"][:-len(".onnx")]
    assert args[:2] == ["build-engine", f"{int8_10}.raw.onnx"]  # trtexec's banner says 10.3: the file made for it
    assert args[args.index("--out") + 1] == f"{int8_10}.raw.engine"
    assert args[args.index("--dla-core") + 1] == "0" and args[args.index("--max-batch") + 1] == "4"
    # and the vitdeploy build-engine it calls takes those options
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    help_text = CliRunner().invoke(app, ["build-engine", "--help"], terminal_width=200).output
    for opt in ("--out", "--min-batch", "--opt-batch", "--max-batch", "--dla-core", "--timing-cache"):
        assert opt in help_text


def test_build_engine_sh_without_tools(bundle_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "bin").mkdir()
    r = build(bundle_dir, tmp_path / "bin")
    assert r.returncode == 1 and "neither vitdeploy nor trtexec" in r.stderr


# --- the bundle command ---------------------------------------------------------------------------------


def test_refuses_to_clobber_and_leaves_nothing_on_failure(bundle_dir: Path, artifacts: Path, tmp_path: Path) -> None:
    before = (bundle_dir / "manifest.json").read_text()
    with pytest.raises(UsageError, match="--force"):
        bundle([artifacts / "model.onnx"], bundle_dir)
    (tmp_path / "empty").mkdir()
    out = tmp_path / "b2"
    with pytest.raises(UsageError, match="no images"):
        bundle([artifacts / "model.onnx"], out, BundleOptions(check_images=[tmp_path / "empty"]))
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".b2")]
    assert (bundle_dir / "manifest.json").read_text() == before
    (tmp_path / "x.engine").write_text("x")
    with pytest.raises(UsageError, match="engines are tied"):
        bundle([tmp_path / "x.engine"], out)
    raw = bundle_dir / "model.raw.onnx"
    with pytest.raises(UsageError, match="raw-pixel variant"):
        bundle([raw], out)
    with pytest.raises(UsageError, match="two int8"):
        bundle([artifacts / "model.int8.onnx", bundle_dir / "model.int8.onnx"], out)
    with pytest.raises(UsageError, match="no fp16"):
        bundle([artifacts / "model.onnx"], out, BundleOptions(precision="fp16"))


def test_bundle_from_a_checkpoint_exports_it(digits_ckpt: Path, tmp_path: Path) -> None:
    res = bundle([digits_ckpt], tmp_path / "b", BundleOptions(references=2, max_batch=4, opt_batch=2))
    assert res.exported and res.precisions == ["fp32"]
    assert read_onnx_manifest(tmp_path / "b" / "model.onnx").labels == [str(i) for i in range(10)]
    assert not (tmp_path / "b" / ".work").exists()


def test_models_of_different_networks_are_refused(artifacts: Path, tmp_path: Path) -> None:
    other = tmp_path / "model.int8.onnx"
    m = onnx.load(str(artifacts / "model.int8.onnx"))
    man = read_onnx_manifest(artifacts / "model.int8.onnx")
    set_onnx_manifest(m, man.derive(labels=list("abcdefghij")))
    onnx.save(m, str(other))
    with pytest.raises(VitdeployError, match="differ in their labels"):
        bundle([artifacts / "model.onnx", other], tmp_path / "out")


def test_cli_bundle_from_folder_defaults_to_the_digits_references(artifacts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from vitdeploy.cli import app

    work = tmp_path / "work"
    work.mkdir()
    shutil.copyfile(artifacts / "model.onnx", work / "model.onnx")
    monkeypatch.chdir(work)
    r = CliRunner().invoke(app, ["bundle", "--max-batch", "8", "--opt-batch", "2", "--references", "4", "--name", "digits v1"])
    assert r.exit_code == 0, r.output
    assert "fp32" in r.output and "reference images: digits" in r.output  # the one image rule: a digits model
    m = json.loads((work / "bundle" / "manifest.json").read_text())
    assert m["bundle"]["default_model"] == "model.raw.onnx" and m["bundle"]["triton"]["name"] == "digits_v1"
    assert len(list((work / "bundle" / "reference" / "images").iterdir())) == 4
    r = CliRunner().invoke(app, ["bundle"])
    assert r.exit_code == 2 and "--force" in r.output
    r = CliRunner().invoke(app, ["bundle", "--force", "--precision", "int8"])
    assert r.exit_code == 2 and "no int8" in r.output
    r = CliRunner().invoke(app, ["bundle", "--force", "--references", "2"])
    assert r.exit_code == 0 and len(list((work / "bundle" / "reference" / "images").iterdir())) == 2
    img = Image.open(next((work / "bundle" / "reference" / "images").iterdir()))
    assert img.size == (8, 8)  # a digits scan as it is; run.py resizes it, as the reference inputs show
    assert np.load(work / "bundle" / "reference" / "inputs.npy").shape == (2, 32, 32, 3)


# --- run.py's TensorRT path, against a **mock** of TensorRT and of libcudart (neither can exist here) ----------


def test_run_py_tensorrt_path_with_mock_tensorrt(bundle_dir: Path, digits_folder: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(bundle_dir, b)
    write_plan(b / "model.int8.raw.engine", b / "model.int8.raw.onnx", "10.3.0", 1, 4, 5)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("10.3.0"))
    mod = load_run_py(b / "run.py")
    cuda = HostCuda()
    monkeypatch.setattr(mod, "CudaRT", lambda: cuda)
    assert mod.main(["--check", "--json", "--batch", "8"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["backend"] == "tensorrt" and res["ok"] and res["max_rel_diff"] == 0.0 and res["images"] == 12
    assert cuda.copies.count(cuda.H2D) == 3 and not cuda.buffers  # 12 images in batches of ≤ 5; every buffer freed
    images = digits_folder / "val" / "5"
    assert mod.main([str(images), "--json"]) == 0
    on_trt = [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()]
    assert mod.main([str(images), "--json", "--backend", "onnxruntime"]) == 0
    on_ort = [json.loads(line)["label"] for line in capsys.readouterr().out.splitlines()]
    assert on_trt == on_ort and len(on_trt) == len(list_images(images))
    with pytest.raises(SystemExit, match="no engine model.engine"):
        mod.main(["--check", "--backend", "tensorrt", "--model", "model.onnx"])


@pytest.mark.parametrize("version", ["8.5.2.2", "10.3.0"])
def test_run_py_pads_to_the_profile_minimum_and_sets_the_dla_core_with_mock_tensorrt(
        bundle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        version: str) -> None:
    """A DLA engine has one fixed batch (4 here) on core 1: one image is padded to 4, DLA_core set before loading."""
    b = tmp_path / "bundle"
    shutil.copytree(bundle_dir, b)
    write_plan(b / "model.int8.raw.engine", b / "model.int8.raw.onnx", version, 4, 4, 4, dla_core=1)
    (b / "model.int8.raw.engine.dla").write_text("1\n")  # what build_engine.sh --dla 1 writes
    calls: list[tuple] = []
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt(version, calls))
    mod = load_run_py(b / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    assert mod.main(["--check", "--json", "--batch", "1"]) == 0  # 12 images one at a time, each padded to 4
    assert json.loads(capsys.readouterr().out)["ok"]
    assert ("deserialize" == calls[0][0]) and calls[0][3] == 1
    assert {c[1][0] for c in calls if c[0] == "set_input_shape"} == {4}
    (b / "model.int8.raw.engine.dla").unlink()  # without it the runtime stays on core 0: the plan does not load
    calls.clear()
    with pytest.raises(SystemExit, match="cannot load this engine"):
        mod.main(["--check"])
    assert mod.main(["--check", "--dla-core", "1"]) == 0


def test_run_py_refused_shape_is_one_line_with_mock_tensorrt(bundle_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(bundle_dir, b)
    write_plan(b / "model.int8.raw.engine", b / "model.int8.raw.onnx", "10.3.0", 1, 4, 4)
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("10.3.0"))
    mod = load_run_py(b / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    model = mod.open_model(b / "model.int8.raw.engine", "tensorrt")
    model.max_batch = 8  # as if the profile were ignored: TensorRT refuses the shape, run.py says so
    with pytest.raises(RuntimeError, match=r"TensorRT refused input shape \(8, 32, 32, 3\)"):
        model(np.zeros((8, 32, 32, 3), np.uint8))


def test_run_py_foreign_engine_is_one_line_with_mock_tensorrt(bundle_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    b = tmp_path / "bundle"
    shutil.copytree(bundle_dir, b)
    write_plan(b / "model.int8.raw.engine", b / "model.int8.raw.onnx", "8.6.1", 1, 4, 4)  # built by another TensorRT
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt("10.3.0"))
    mod = load_run_py(b / "run.py")
    monkeypatch.setattr(mod, "CudaRT", HostCuda)
    with pytest.raises(SystemExit, match="rebuild it with ./build_engine.sh"):
        mod.main(["--check"])


def test_bundle_loads_each_onnx_once_and_hashes_each_file_once(
    artifacts: Path, digits_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp32 + fp16, counted with the real onnx.load and hashlib.sha256 wrapped (bytes hashed, paths loaded)."""
    import hashlib

    real_sha, real_load = hashlib.sha256, onnx.load
    hashed = [0]
    loads: dict[str, int] = {}

    class CountedSha:
        def __init__(self, data: bytes = b"") -> None:
            self._h = real_sha()
            self.update(data)

        def update(self, data: bytes) -> None:
            hashed[0] += len(data)
            self._h.update(data)

        def hexdigest(self) -> str:
            return self._h.hexdigest()

    def counted_load(f, *a, **k):  # type: ignore[no-untyped-def]
        loads[Path(f).name] = loads.get(Path(f).name, 0) + 1
        return real_load(f, *a, **k)

    import vitdeploy.core.loaded as loaded

    real_read = loaded.read_hashed

    def counted_read(f):  # type: ignore[no-untyped-def]  # OnnxArtifact reads a graph's bytes here, hashing them
        loads[Path(f).name] = loads.get(Path(f).name, 0) + 1
        return real_read(f)

    out = tmp_path / "bundle"
    opts = BundleOptions(opt_batch=4, max_batch=16, check_images=[digits_folder / "val"], references=4)
    monkeypatch.setattr(hashlib, "sha256", CountedSha)
    monkeypatch.setattr(onnx, "load", counted_load)
    monkeypatch.setattr(loaded, "read_hashed", counted_read)
    bundle([artifacts / "model.onnx", artifacts / "model.fp16.onnx"], out, opts)
    monkeypatch.undo()
    assert loads == {"model.onnx": 1, "model.fp16.onnx": 1}, loads
    arts = json.loads((out / "manifest.json").read_text())["bundle"]["artifacts"]
    shipped = ["deepstream/model.ds.onnx", "model.fp16.onnx", "model.fp16.raw.onnx", "model.onnx", "model.raw.onnx"]
    assert set(shipped) <= set(arts)
    # the rest are the TensorRT-line variants (written, never loaded) and their raw-pixel forms
    assert all(arts[n].get("variant_of") or arts[arts[n]["source"]].get("variant_of") for n in set(arts) - set(shipped))
    for name, a in arts.items():
        assert a["sha256"] == hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    # every hashed byte belongs to one of the bundle's files, each hashed once (a packed model as it was read; the
    # Triton model is a copy of a raw-pixel variant, known by its source's SHA-256); bundle.files lists them all
    man = json.loads((out / "manifest.json").read_text())["bundle"]
    files = man["files"]
    assert set(files) == {str(p.relative_to(out)) for p in out.rglob("*") if p.is_file()} - {"manifest.json"}
    for name, sha in files.items():
        assert sha == hashlib.sha256((out / name).read_bytes()).hexdigest(), name
    copies = {man["triton"]["model"]}
    assert hashed[0] == sum((out / name).stat().st_size for name in files if name not in copies)


def test_an_int8_no_tensorrt_builds_as_intended_is_refused_on_every_version(bundle_dir: Path, tmp_path: Path) -> None:
    """ONNX Runtime's quantizer writes non-zero zero points, which every TensorRT parser refuses (onnx-tensorrt's
    operators.md, check-target): the bundle's notes say so, and build_engine.sh refuses int8 in one line on every
    version while FP32 still builds."""
    notes = json.loads((bundle_dir / "manifest.json").read_text())["bundle"]["notes"]
    assert any("x_zero_point" in n for n in notes), notes
    (tmp_path / "bin").mkdir()
    for v in ("8.5", "8.6", "10.3", "11.4"):
        r = build(bundle_dir, tmp_path / "bin", "--dry-run", "--trt", v)
        assert r.returncode == 1 and "no int8 model in this bundle builds as intended" in r.stderr, r.stderr
        assert len(r.stderr.strip().splitlines()) == 1
        r = build(bundle_dir, tmp_path / "bin", "--dry-run", "--trt", v, "--precision", "fp32")
        assert r.returncode == 0 and "--onnx=model" in r.stdout
