"""build-engine and the TensorRT runner: everything that needs no TensorRT, on real ONNX files.

Tests that need TensorRT and a CUDA GPU are marked ``tensorrt`` and skip, with the reason, where either
is missing (here and in CI). The one test that fakes TensorRT says so in its name.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import shlex
import sys
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from vitdeploy.cli import app
from vitdeploy.core.artifact import read_manifest
from vitdeploy.core.errors import EXIT_PARTIAL, EXIT_USAGE, UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest, set_onnx_manifest, sidecar_path
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.runners.tensorrt.builder import BuildSpec, sidecar_manifest
from vitdeploy.runners.tensorrt.commands import finish_commands, trtexec_command, vitdeploy_command
from vitdeploy.runners.tensorrt.versions import (
    Profile,
    compatibility_problem,
    engine_record,
    make_profile,
    network_plan,
    parse_version,
    plan_artifact,
    read_record,
    record_profile,
    require_compatible,
)

runner = CliRunner()
HAS_PRECISION = (importlib.util.find_spec("vitdeploy.stages.precision") is not None
                 and importlib.util.find_spec("vitdeploy.stages.export") is not None)


# ---------------------------------------------------------------- a real (small) ONNX model with a manifest


def small_manifest(precision: str = "fp32") -> Manifest:
    pp = Preprocess(input_size=(32, 32), resize_mode="squash", interpolation="bilinear")
    return Manifest(model={"num_classes": 10, "image_size": [32, 32]}, labels=[str(i) for i in range(10)],
                    preprocess=pp.to_dict(), name="tiny-linear", precision=precision)


def write_linear_onnx(path: Path, precision: str = "fp32", seed: int = 0) -> Path:
    """pixel_values [N,3,32,32] → Flatten → Gemm → logits [N,10], opset 17, with a vitdeploy manifest."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(0, 0.02, (3 * 32 * 32, 10)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(10, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["pixel_values"], ["flat"], axis=1),
         helper.make_node("Gemm", ["flat", "W", "B"], ["logits"])],
        "linear",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    set_onnx_manifest(model, small_manifest(precision))
    onnx.save(model, str(path))
    return path


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    write_linear_onnx(tmp_path / "model.onnx")
    return tmp_path


# ---------------------------------------------------------------- profile


def test_profile_defaults_and_shapes() -> None:
    p = make_profile()
    assert (p.min, p.opt, p.max) == (1, 8, 32)
    assert p.shapes([-1, 3, 224, 224]) == ((1, 3, 224, 224), (8, 3, 224, 224), (32, 3, 224, 224))


@pytest.mark.parametrize("mn,op,mx", [(4, 2, 8), (1, 16, 8), (2, 2, 1), (1, 1, 0), (0, 1, 4), (1, 8, -3)])
def test_profile_refused_when_not_min_le_opt_le_max(mn: int, op: int, mx: int) -> None:
    with pytest.raises(UsageError) as e:
        make_profile(mn, op, mx)
    assert e.value.exit_code == EXIT_USAGE


def test_dla_profile_is_fixed_at_opt() -> None:
    p = make_profile(1, 4, 32, dla_core=0)
    assert (p.min, p.opt, p.max) == (4, 4, 4) and p.fixed
    with pytest.raises(UsageError):
        make_profile(1, 4, 32, dla_core=-1)
    assert make_profile(1, 64, 32, dla_core=0) == Profile(64, 64, 64)  # min/max do not apply to DLA
    with pytest.raises(UsageError):
        make_profile(1, 0, 32, dla_core=0)


def test_dynamic_image_dims_refused() -> None:
    with pytest.raises(VitdeployError, match="fixed image size"):
        Profile(1, 2, 4).shapes([-1, 3, -1, -1])


# ---------------------------------------------------------------- which artifact --fp16 / --int8 choose


@pytest.mark.parametrize(
    "src,fp16,int8,prec,artifact,make,engine",
    [
        ("model.onnx", False, False, "fp32", "model.onnx", None, "model.fp32.engine"),
        ("model.onnx", True, False, "fp16", "model.fp16.onnx", "fp16", "model.fp16.engine"),
        ("model.onnx", False, True, "int8", "model.int8.onnx", "int8", "model.int8.engine"),
        ("model.onnx", True, True, "int8", "model.int8.onnx", "int8", "model.int8.engine"),  # INT8, FP16 for the rest
        ("model.int8.onnx", False, False, "int8", "model.int8.onnx", None, "model.int8.engine"),
        ("model.int8.onnx", False, True, "int8", "model.int8.onnx", None, "model.int8.engine"),
        ("model.int8.onnx", True, True, "int8", "model.int8.onnx", None, "model.int8.engine"),
        ("model.fp16.onnx", False, False, "fp16", "model.fp16.onnx", None, "model.fp16.engine"),
        ("model.fp16.onnx", True, False, "fp16", "model.fp16.onnx", None, "model.fp16.engine"),
        ("out/vit.onnx", False, True, "int8", "out/vit.int8.onnx", "int8", "out/vit.int8.engine"),
    ],
)
def test_artifact_choice(src: str, fp16: bool, int8: bool, prec: str, artifact: str, make: str | None, engine: str) -> None:
    src_prec = "int8" if ".int8." in src else "fp16" if ".fp16." in src else "fp32"
    plan = plan_artifact(Path(src), src_prec, fp16=fp16, int8=int8)
    assert (plan.precision, plan.artifact, plan.make, plan.engine) == (prec, Path(artifact), make, Path(engine))


@pytest.mark.parametrize("src,src_prec,fp16,int8", [
    ("model.int8.onnx", "int8", True, False),
    ("model.fp16.onnx", "fp16", False, True),
    ("model.fp16.onnx", "fp16", True, True),
])
def test_artifact_conflicts_are_usage_errors(src: str, src_prec: str, fp16: bool, int8: bool) -> None:
    with pytest.raises(UsageError, match="starts from the FP32 model: pass model.onnx"):
        plan_artifact(Path(src), src_prec, fp16=fp16, int8=int8)


def test_artifact_out_and_dla_rules() -> None:
    assert plan_artifact(Path("model.onnx"), "fp32", int8=True, out=Path("x/vit.plan")).engine == Path("x/vit.plan")
    with pytest.raises(UsageError, match="not .onnx"):
        plan_artifact(Path("model.onnx"), "fp32", out=Path("model.int8.onnx"))
    with pytest.raises(UsageError, match="DLA runs FP16 and INT8 only"):
        plan_artifact(Path("model.onnx"), "fp32", dla_core=0)
    assert plan_artifact(Path("model.onnx"), "fp32", fp16=True, dla_core=0).precision == "fp16"


# ---------------------------------------------------------------- what each TensorRT version is asked for


def test_version_parsing() -> None:
    assert parse_version("10.3.0.30") == (10, 3, 0, 30)
    assert parse_version("8.5.2.2") == (8, 5, 2, 2)
    assert parse_version("11.1.0rc1") == (11, 1, 0)
    assert parse_version("10.13.0.35+cuda12") == (10, 13, 0, 35)
    with pytest.raises(ValueError):
        parse_version("tensorrt")


@pytest.mark.parametrize(
    "version,precision,dla,explicit,strongly,flags",
    [
        ("8.5.2.2", "fp32", False, True, False, ()),
        ("8.5.2.2", "fp16", False, True, False, ("FP16", "OBEY_PRECISION_CONSTRAINTS")),
        ("8.6.2", "int8", False, True, False, ("FP16", "INT8", "OBEY_PRECISION_CONSTRAINTS")),
        ("9.2.0", "int8", False, True, True, ()),
        ("10.3.0.30", "int8", False, False, True, ()),
        ("10.3.0.30", "fp16", False, False, True, ()),
        ("10.3.0.30", "int8", True, False, False, ("FP16", "INT8", "GPU_FALLBACK")),
        ("8.5.2.2", "fp16", True, True, False, ("FP16", "OBEY_PRECISION_CONSTRAINTS", "GPU_FALLBACK")),
        ("11.1.0", "int8", False, False, True, ()),
        ("11.4.1", "fp16", True, False, True, ("GPU_FALLBACK",)),  # 11 has no FP16/INT8 flags at all
    ],
)
def test_network_plan_per_version(version: str, precision: str, dla: bool, explicit: bool, strongly: bool,
                                  flags: tuple[str, ...]) -> None:
    p = network_plan(version, precision, dla=dla)
    assert (p.explicit_batch, p.strongly_typed, p.builder_flags) == (explicit, strongly, flags)


def test_network_plan_version_compatible_and_too_old() -> None:
    assert "VERSION_COMPATIBLE" in network_plan("8.6.1", "fp16", version_compatible=True).builder_flags
    with pytest.raises(UsageError, match="8.6 or newer"):
        network_plan("8.5.2.2", "fp16", version_compatible=True)
    with pytest.raises(VitdeployError, match="too old"):
        network_plan("8.4.3", "fp16")


@pytest.mark.parametrize("version", ["10.8.0", "10.16.0", "11.0.0", "11.3.0"])
def test_no_dla_build_where_tensorrt_has_no_dla(version: str) -> None:
    with pytest.raises(UsageError, match="has no DLA"):
        network_plan(version, "fp16", dla=True)


# ---------------------------------------------------------------- the sidecar and the compatibility decision


def _record(trt: str = "10.3.0.30", cc: tuple[int, int] = (8, 7), vc: bool = False) -> dict:
    plan = network_plan(trt, "int8", version_compatible=vc)
    return engine_record(
        trt_version=trt, gpu_name="Orin", compute_capability=cc, profile=Profile(1, 8, 32), input_name="pixel_values",
        input_dims=[-1, 3, 32, 32], plan=plan, options={"workspace_gib": None}, build_seconds=41.234,
        source=Path("model.int8.onnx"), source_sha256="ab" * 32,
    )


def test_sidecar_round_trip_and_read_manifest(tmp_path: Path) -> None:
    m = small_manifest("int8")
    m.source = {"checkpoint": "ckpt.pth", "sha256": "cd" * 32}
    side = sidecar_manifest(m, _record(), Path("model.int8.onnx"))
    engine = tmp_path / "model.int8.engine"
    engine.write_bytes(b"plan bytes as TensorRT wrote them")
    sidecar_path(engine).write_text(side.to_json(indent=2))
    back = read_manifest(engine)
    assert back.precision == "int8" and back.labels == m.labels and back.preprocess == m.preprocess
    assert back.source["sha256"] == "ab" * 32 and back.source["parent"]["checkpoint"] == "ckpt.pth"
    rec = read_record(back, engine)
    assert rec["tensorrt"] == "10.3.0.30" and rec["compute_capability"] == "8.7"
    assert rec["profile"] == {"min": [1, 3, 32, 32], "opt": [8, 3, 32, 32], "max": [32, 3, 32, 32]}
    assert rec["strongly_typed"] is True and rec["builder_flags"] == []
    assert record_profile(rec) == Profile(1, 8, 32)
    assert json.loads(sidecar_path(engine).read_text())["engine"]["source_onnx"] == "model.int8.onnx"
    assert back.versions["tensorrt"] == "10.3.0.30"


def test_sidecar_without_build_record_is_refused(tmp_path: Path) -> None:
    with pytest.raises(VitdeployError, match="rebuild it with `vitdeploy build-engine`"):
        read_record(small_manifest(), tmp_path / "x.engine")


@pytest.mark.parametrize(
    "built,vc,here,cc_here,ok",
    [
        ("10.3.0.30", False, "10.3.0.30", (8, 7), True),
        ("10.3.0.30", False, "10.3.0", (8, 7), True),  # Jetson wheels report three components
        ("10.3.0.30", False, "10.3.0.26", (8, 7), False),
        ("10.3.0.30", False, "10.4.0.26", (8, 7), False),
        ("8.5.2.2", False, "10.3.0.30", (8, 7), False),
        ("10.3.0.30", False, "10.3.0.30", (8, 6), False),
        ("10.3.0.30", True, "10.8.0.43", (8, 7), True),
        ("10.3.0.30", True, "11.1.0", (8, 7), True),
        ("8.6.2", True, "10.3.0.30", (8, 7), True),
        ("10.3.0.30", True, "10.1.0", (8, 7), False),  # older runtime: never
        ("10.3.0.30", True, "12.0.0", (8, 7), False),
        ("10.3.0.30", True, "11.1.0", (9, 0), False),  # version compatibility is not hardware compatibility
    ],
)
def test_compatibility_decision(built: str, vc: bool, here: str, cc_here: tuple[int, int], ok: bool) -> None:
    problem = compatibility_problem(_record(built, (8, 7), vc), here, cc_here)
    assert (problem is None) == ok, problem


def test_incompatible_engine_error_says_what_and_how_to_rebuild() -> None:
    with pytest.raises(VitdeployError) as e:
        require_compatible("model.int8.engine", _record("10.3.0.30", (8, 7)), "8.5.2.2", (7, 2))
    msg = str(e.value)
    assert "TensorRT 10.3.0.30 built it, this is TensorRT 8.5.2.2" in msg
    assert "compute capability 8.7 (Orin), this GPU is 7.2" in msg
    assert "rebuild it on this device with `vitdeploy build-engine model.int8.onnx`" in msg
    assert "\n" not in msg


# ---------------------------------------------------------------- the commands that finish the job


def test_trtexec_lines_per_version() -> None:
    spec = BuildSpec(Path("model.int8.onnx"), Path("model.int8.engine"), "pixel_values", [-1, 3, 224, 224],
                     Profile(1, 8, 32), "int8")
    new = trtexec_command(spec, trt_version="10.0")
    old = trtexec_command(spec, trt_version="8.5")
    for line in (new, old):
        assert "--onnx=model.int8.onnx" in line and "--saveEngine=model.int8.engine" in line
        assert "--minShapes=pixel_values:1x3x224x224" in line
        assert "--optShapes=pixel_values:8x3x224x224" in line
        assert "--maxShapes=pixel_values:32x3x224x224" in line
    assert "--stronglyTyped" in new and "--int8" not in new and "--fp16" not in new
    assert "--stronglyTyped" not in old and "--int8" in old and "--fp16" in old
    assert "--skipInference" in new and "--buildOnly" in old and "--skipInference" not in old  # 8.5: --buildOnly only


def test_trtexec_dla_workspace_cache_and_odd_names() -> None:
    line = trtexec_command(BuildSpec(Path("my models/m.fp16.onnx"), Path("m.fp16.engine"), "input:0", [-1, 3, 32, 32],
                                     make_profile(1, 4, 32, dla_core=1), "fp16", workspace=1.5,
                                     timing_cache=Path("t.cache"), dla_core=1), "10.3")
    argv = shlex.split(line)
    assert "--onnx=my models/m.fp16.onnx" in argv
    assert "--minShapes=input:0:4x3x32x32" in argv and "--maxShapes=input:0:4x3x32x32" in argv
    assert "--useDLACore=1" in argv and "--allowGPUFallback" in argv and "--fp16" in argv
    assert "--memPoolSize=workspace:1536" in argv and "--timingCacheFile=t.cache" in argv


def test_vitdeploy_line_builds_the_artifact_as_is() -> None:
    line = vitdeploy_command(BuildSpec(Path("model.int8.onnx"), Path("model.int8.engine"), "pixel_values",
                                       [-1, 3, 32, 32], Profile(2, 8, 16), "int8", workspace=2, version_compatible=True))
    assert shlex.split(line) == ["vitdeploy", "build-engine", "model.int8.onnx", "--min-batch", "2", "--opt-batch", "8",
                                 "--max-batch", "16", "--workspace", "2", "--version-compatible", "-o",
                                 "model.int8.engine"]
    cmds = finish_commands(BuildSpec(Path("model.fp16.onnx"), Path("model.fp16.engine"), "pixel_values",
                                     [-1, 3, 32, 32], Profile(1, 8, 32), "fp16"))
    assert len(cmds) == 3 and cmds[0].startswith("vitdeploy build-engine model.fp16.onnx")
    assert "TensorRT 10+" in cmds[1] and "TensorRT 8.5/8.6" in cmds[2]
    dla = finish_commands(BuildSpec(Path("model.fp16.onnx"), Path("model.fp16.engine"), "pixel_values",
                                    [-1, 3, 32, 32], make_profile(1, 8, 32, dla_core=0), "fp16", dla_core=0))
    # DLA lines only for versions with DLA (NVIDIA: 10.7 the last 10.x with it; 11.0-11.3 none; 11.4.1+ JetPack 7.2.2+)
    assert [c.split(":")[0] for c in dla[1:]] == ["# or, TensorRT 11.4.1+ (JetPack 7.2.2+)", "# or, TensorRT 10.0-10.7",
                                                  "# or, TensorRT 8.5/8.6"]
    assert "--fp16" not in dla[1] and "--stronglyTyped" in dla[1]  # 11 has no precision flags
    assert "--fp16" in dla[2] and "--fp16" in dla[3] and all("--useDLACore=0" in c for c in dla[1:])


@pytest.mark.parametrize("version,limit", [("8.5.2.2", 17), ("8.6.2", 17), ("9.3.0", 19), ("10.0.1", 20),
                                           ("10.3.0", 20), ("10.15.1", 24)])
def test_opset_limit_of_every_version(version: str, limit: int) -> None:
    """The parser's limit per version, from the version table (onnx-tensorrt docs/operators.md per release)."""
    from vitdeploy.runners.tensorrt.versions import opset_problem

    assert opset_problem(limit, version) is None
    msg = opset_problem(limit + 1, version) or ""
    assert f"reads opsets up to {limit}" in msg and "vitdeploy export --target" in msg and "\n" not in msg


def test_opset_note_in_the_finishing_lines() -> None:
    cmds = finish_commands(BuildSpec(Path("m.int8.onnx"), Path("m.int8.engine"), "pixel_values", [-1, 3, 32, 32],
                                     Profile(1, 8, 32), "int8"), opset=19)
    assert cmds[-1].startswith("# note: m.int8.onnx is ONNX opset 19: TensorRT 8.5/8.6 reads opsets up to 17")
    assert len(finish_commands(BuildSpec(Path("m.onnx"), Path("m.engine"), "x", [-1, 3, 8, 8], Profile(1, 1, 1),
                                         "fp32"), opset=17)) == 3


# ---------------------------------------------------------------- no TensorRT here: exit 3, honest and exact


def _no_tensorrt_here() -> str | None:
    from vitdeploy.runners.tensorrt.probe import probe

    return probe().missing


def test_build_engine_without_tensorrt_exits_3_with_exact_commands(folder: Path) -> None:
    missing = _no_tensorrt_here()
    if missing is None:
        pytest.skip("TensorRT and a GPU are here: the exit-3 path does not apply")
    r = runner.invoke(app, ["build-engine"])
    assert r.exit_code == EXIT_PARTIAL, r.output
    assert "Traceback" not in r.output
    assert missing in r.output
    lines = [ln for ln in r.stdout.splitlines() if ln and not ln.startswith("#")]
    assert lines[0] == ("vitdeploy build-engine model.onnx --min-batch 1 --opt-batch 8 --max-batch 32 "
                        "-o model.fp32.engine")
    trtexec = [ln for ln in r.stdout.splitlines() if "trtexec" in ln]
    assert len(trtexec) == 2
    assert "--minShapes=pixel_values:1x3x32x32" in trtexec[0] and "--stronglyTyped" in trtexec[0]
    assert "--maxShapes=pixel_values:32x3x32x32" in trtexec[1] and "--stronglyTyped" not in trtexec[1]
    assert not (folder / "model.fp32.engine").exists() and not list(folder.glob(".*"))

    # the printed vitdeploy line parses and, run here, reaches the same point with the same commands
    r2 = runner.invoke(app, shlex.split(lines[0])[1:])
    assert r2.exit_code == EXIT_PARTIAL and r2.stdout == r.stdout


def test_build_engine_library_raises_engine_not_built(folder: Path) -> None:
    from vitdeploy.stages.engine import BuildOptions, EngineNotBuilt, build_engine

    if _no_tensorrt_here() is None:
        pytest.skip("TensorRT and a GPU are here")
    with pytest.raises(EngineNotBuilt) as e:
        build_engine("model.onnx", BuildOptions(min_batch=2, opt_batch=4, max_batch=4, workspace=0.5))
    err = e.value
    assert err.exit_code == EXIT_PARTIAL and err.artifact == Path("model.onnx") and not err.made_artifact
    assert "--memPoolSize=workspace:512" in err.commands[1]
    assert "\n" not in str(err)


@pytest.mark.parametrize("argv,match", [
    (["--min-batch", "4", "--opt-batch", "2"], "breaks min ≤ opt ≤ max"),
    (["--max-batch", "0"], "greater than or equal to 1"),  # Typer's range (one line through the entry point)
    (["--dla-core", "0"], "DLA runs FP16 and INT8 only"),
    (["-o", "model.int8.onnx"], "not .onnx"),
    (["--workspace", "0"], "more than 0"),
    (["model.int8.onnx"], None),  # wrong precision combinations need an INT8 artifact: below
])
def test_bad_options_exit_2_and_write_nothing(folder: Path, argv: list[str], match: str | None) -> None:
    if match is None:
        write_linear_onnx(folder / "model.int8.onnx", precision="int8")
        argv, match = ["model.int8.onnx", "--fp16"], "already INT8"
    before = sorted(p.name for p in folder.iterdir())
    r = runner.invoke(app, ["build-engine", *argv])
    assert r.exit_code == EXIT_USAGE, r.output
    assert match in r.output and "Traceback" not in r.output
    assert sorted(p.name for p in folder.iterdir()) == before


def test_missing_model_and_checkpoint_given(folder: Path) -> None:
    r = runner.invoke(app, ["build-engine", "nope.onnx"])
    assert r.exit_code == 1 and "no such file" in r.output
    (folder / "ckpt.pth").write_bytes(b"x")
    r = runner.invoke(app, ["build-engine", "ckpt.pth"])
    assert r.exit_code == EXIT_USAGE and "vitdeploy export ckpt.pth" in r.output


def test_int8_without_calibration_folder_fails_before_any_work(folder: Path) -> None:
    r = runner.invoke(app, ["build-engine", "--int8"])
    assert r.exit_code == 1 and "calibration: no such folder" in r.output
    assert not (folder / "model.int8.onnx").exists()


@pytest.mark.skipif(not HAS_PRECISION, reason="vitdeploy.stages.precision (calibrate, convert_fp16) or vitdeploy.stages.export is missing")
@pytest.mark.parametrize("flags,artifact", [(["--fp16"], "model.fp16.onnx"), (["--int8", "--fp16"], "model.int8.onnx")])
def test_precision_artifact_written_then_exit_3(flags: list[str], artifact: str, tmp_path: Path,
                                               monkeypatch: pytest.MonkeyPatch, digits_ckpt: Path,
                                               digits_folder: Path) -> None:
    import shutil

    from vitdeploy.stages.export import export_onnx  # type: ignore[import-not-found]

    monkeypatch.chdir(tmp_path)
    export_onnx(digits_ckpt, tmp_path / "model.onnx")
    calib = tmp_path / "calibration"
    calib.mkdir()
    for p in sorted((digits_folder / "train").rglob("*.png"))[::20][:64]:
        shutil.copy(p, calib / f"{p.parent.name}_{p.name}")
    r = runner.invoke(app, ["build-engine", *flags])
    if _no_tensorrt_here() is None:
        assert r.exit_code == 0, r.output
        return
    assert r.exit_code == EXIT_PARTIAL, r.output
    m = read_manifest(tmp_path / artifact)
    assert m.precision == ("int8" if "--int8" in flags else "fp16")
    assert f"vitdeploy build-engine {artifact} " in r.stdout
    assert f"wrote {artifact}: top-1 agreement with model.onnx" in r.stdout  # checked against FP32 under ONNX Runtime
    assert "--int8" not in r.stdout.splitlines()[1]  # the artifact carries the precision; 10+ builds it typed


# ---------------------------------------------------------------- the runner's TensorRT-free parts


def test_import_tensorrt_sees_through_a_stub_only_namespace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorrt-stubs installs a folder `tensorrt/` with only .pyi: it imports as an empty namespace package."""
    from vitdeploy.runners.tensorrt.probe import import_tensorrt

    (tmp_path / "tensorrt").mkdir()
    (tmp_path / "tensorrt" / "__init__.pyi").write_text("class Builder: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    got = import_tensorrt()
    assert isinstance(got, str) and "type stubs only" in got


def test_open_runner_on_an_engine_without_tensorrt_is_one_clear_line(tmp_path: Path) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.runners.tensorrt.probe import import_tensorrt

    engine = tmp_path / "model.int8.engine"
    engine.write_bytes(b"\x00" * 64)
    with pytest.raises(VitdeployError, match="no sidecar"):
        open_runner(engine)
    sidecar_path(engine).write_text(small_manifest("int8").to_json())
    with pytest.raises(VitdeployError, match="does not say how it was built"):
        open_runner(engine)
    sidecar_path(engine).write_text(sidecar_manifest(small_manifest("int8"), _record(), Path("m.onnx")).to_json())
    if not isinstance(import_tensorrt(), str):
        pytest.skip("TensorRT is installed here")
    with pytest.raises(VitdeployError, match="TensorRT is not installed") as e:
        open_runner(engine)
    assert "\n" not in str(e.value)


def test_padded_batch() -> None:
    from vitdeploy.runners.tensorrt.runner import padded_batch

    assert padded_batch(3, 1, 32) == 3
    assert padded_batch(3, 8, 8) == 8  # DLA: fixed batch, padded
    with pytest.raises(ValueError):
        padded_batch(9, 8, 8)


def test_no_cudart_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver lists a GPU (a stand-in libcuda) but no CUDA runtime is found: gpu_info says which library is missing."""
    import fake_libcuda

    from vitdeploy.runners.tensorrt import cuda

    monkeypatch.setattr(cuda, "cudart_candidates", lambda: ["/nonexistent/libcudart.so.12"])
    with pytest.raises(cuda.CudaError, match="VITDEPLOY_CUDART"):
        cuda.CudaRuntime()
    fake_libcuda.install(monkeypatch, devices=1)
    assert cuda.gpu_info().startswith("no CUDA runtime library")


def test_cudart_candidates_honour_the_override(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitdeploy.runners.tensorrt import cuda

    monkeypatch.setenv("VITDEPLOY_CUDART", "/opt/cuda/lib64/libcudart.so.12")
    cands = cuda.cudart_candidates()
    assert cands[0] == "/opt/cuda/lib64/libcudart.so.12" and "libcudart.so.12" in cands
    assert len(cands) == len(set(cands))


def test_host_array_is_a_view_of_the_memory() -> None:
    """The pinned-buffer view logic, on ordinary host memory."""
    from vitdeploy.runners.tensorrt.cuda import host_array

    buf = ctypes.create_string_buffer(2 * 3 * 4)
    a = host_array(ctypes.addressof(buf), (2, 3), np.float32)
    a[:] = np.arange(6, dtype=np.float32).reshape(2, 3)
    assert np.frombuffer(buf.raw, np.float32).tolist() == [0, 1, 2, 3, 4, 5]
    h = host_array(ctypes.addressof(buf), (2, 3), np.float16)
    h[0, 0] = 1.5
    assert np.frombuffer(buf.raw[:2], np.float16)[0] == 1.5


def test_engine_modules_do_not_import_torch() -> None:
    import subprocess

    code = ("import sys; import vitdeploy.stages.engine, vitdeploy.runners.tensorrt.runner, vitdeploy.runners.tensorrt.cuda, vitdeploy.runners.tensorrt.versions, "
            "vitdeploy.runners.tensorrt.builder, vitdeploy.runners.tensorrt.commands, vitdeploy.runners.tensorrt.probe, "
            "vitdeploy.cli.engine; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------- TensorRT and a GPU: only where both exist


def _require_tensorrt_gpu() -> None:
    missing = _no_tensorrt_here()
    if missing:
        pytest.skip(f"needs TensorRT and a CUDA GPU: {missing}")


@pytest.mark.tensorrt
def test_build_and_run_engine_matches_onnxruntime(folder: Path) -> None:
    _require_tensorrt_gpu()
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    res = build_engine("model.onnx", BuildOptions(min_batch=1, opt_batch=4, max_batch=8,
                                                  timing_cache=folder / "timing.cache"))
    assert res.engine == Path("model.fp32.engine") and res.sidecar.exists() and (folder / "timing.cache").exists()
    x = np.random.default_rng(0).normal(size=(19, 3, 32, 32)).astype(np.float32)
    with open_runner("model.onnx") as ort, open_runner(res.engine) as trt:
        assert trt.backend == "tensorrt" and trt.max_batch == 8
        want = ort(x)
        for n in (19, 3, 1, 8):  # split above max, several shapes, reuse of buffers
            np.testing.assert_allclose(trt(x[:n]), want[:n], rtol=1e-2, atol=1e-3)


@pytest.mark.gpu
def test_cuda_round_trip_through_device_memory() -> None:
    from vitdeploy.runners.tensorrt import cuda

    info = cuda.gpu_info()
    if isinstance(info, str):
        pytest.skip(f"needs a CUDA GPU: {info}")
    rt = cuda.CudaRuntime()
    s = rt.stream_create()
    n = 1 << 16
    h_in, h_out, d = rt.malloc_host(n * 4), rt.malloc_host(n * 4), rt.malloc(n * 4)
    a = cuda.host_array(h_in, (n,), np.float32)
    a[:] = np.arange(n, dtype=np.float32)
    rt.memcpy_async(d, h_in, n * 4, cuda.H2D, s)
    rt.memcpy_async(h_out, d, n * 4, cuda.D2H, s)
    rt.stream_synchronize(s)
    assert np.array_equal(cuda.host_array(h_out, (n,), np.float32), a)
    for p in (h_in, h_out):
        rt.free_host(p)
    rt.free(d)
    rt.stream_destroy(s)
    assert info[1] >= (5, 0)
