"""build-engine and the TensorRT runner driven through a MOCK of TensorRT and of libcudart.

TensorRT cannot run here, so these tests replace the ``tensorrt`` module with tests/trt_mock.py: a module generated
from NVIDIA's compiled bindings of that release (tests/trt_api.json: classes, signatures, enums, deprecations), whose
arguments are checked as pybind11 checks them and whose missing names raise AttributeError. Its parser records what
it is given and judges nothing; its "engine" runs the ONNX file with ONNX Runtime; libcudart is replaced with host
memory. They check our side only: which TensorRT calls are made per release, what is written (plan bytes as is,
sidecar, timing cache), the runner's buffers, padding, splitting and dtype handling, and what a user reads when CUDA
cannot start. They prove nothing about TensorRT itself.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import FakeHostCuda
from trt_mock import NULLPTR, fake_tensorrt, releases

from vitdeploy.core.errors import CudaUnavailable, UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest, set_onnx_manifest, sidecar_path
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.runners.tensorrt import cuda


def write_linear_onnx(path: Path, precision: str = "fp32", seed: int = 0) -> Path:
    """pixel_values [N,3,32,32] → Flatten → Gemm → logits [N,10], opset 17, with a vitdeploy manifest."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = numpy_helper.from_array(rng.normal(0, 0.02, (3 * 32 * 32, 10)).astype(np.float32), "W")
    b = numpy_helper.from_array(np.zeros(10, np.float32), "B")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["pixel_values"], ["flat"], axis=1, name="flatten"),
         helper.make_node("Gemm", ["flat", "W", "B"], ["logits"], name="head")],
        "linear",
        [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 32, 32])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 10])],
        [w, b],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    pp = Preprocess(input_size=(32, 32), resize_mode="squash", interpolation="bilinear")
    set_onnx_manifest(model, Manifest(model={"num_classes": 10, "image_size": [32, 32]},
                                      labels=[str(i) for i in range(10)], preprocess=pp.to_dict(),
                                      name="tiny-linear", precision=precision))
    onnx.save(model, str(path))
    return path


@pytest.fixture
def mocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    write_linear_onnx(tmp_path / "model.onnx")
    import fake_libcuda

    fake_cuda = FakeHostCuda()
    monkeypatch.setattr(cuda, "CudaRuntime", lambda *a, **k: fake_cuda)
    fake_libcuda.install(monkeypatch)  # the GPU probe asks the driver (libcuda): it lists one GPU
    state: dict[str, Any] = {"calls": [], "onnx": {}, "cuda": fake_cuda}

    def install(version: str, **switches: Any) -> list[tuple]:
        state["calls"].clear()
        monkeypatch.setitem(__import__("sys").modules, "tensorrt", fake_tensorrt(version, state["calls"], **switches))
        return state["calls"]

    state["install"] = install
    return state


def _plan(calls: list[tuple]) -> bytes:
    """The bytes the mock builder's deserializer was handed (what build-engine wrote, as TensorRT serialized it)."""
    return next(c[1] for c in calls if c[0] == "deserialize")


# create_network's bits: 1 << the member's value in the compiled bindings of that release (tests/trt_api.json;
# 8.5: include/NvInfer.h, read into the facts): 8.5 EXPLICIT_BATCH = 0; 10.x STRONGLY_TYPED = 1; 11.x STRONGLY_TYPED = 0.
@pytest.mark.parametrize("version,flags_bits,builder_flags", [
    ("8.5.2.2", 1 << 0, []),
    ("10.3.0.30", 1 << 1, []),
    ("11.1.0.106", 1 << 0, []),
])
def test_mock_tensorrt_build_writes_plan_sidecar_and_cache(mocked: Any, version: str, flags_bits: int,
                                                           builder_flags: list[str]) -> None:
    from vitdeploy.stages.engine import BuildOptions, build_engine

    calls = mocked["install"](version)
    res = build_engine("model.onnx", BuildOptions(min_batch=1, opt_batch=4, max_batch=16, workspace=0.25,
                                                  timing_cache=Path("t.cache")))
    assert ("network", flags_bits) in calls
    assert [c[1] for c in calls if c[0] == "flag"] == builder_flags
    assert ("pool", "WORKSPACE", 1 << 28) in calls
    assert ("profile", ("pixel_values", (1, 3, 32, 32), (4, 3, 32, 32), (16, 3, 32, 32))) in calls
    assert ("cache-in", b"") in calls
    plan = json.loads(Path("model.fp32.engine").read_bytes())  # written as the builder returned it, no header
    assert plan["version"] == version and plan["onnx"].endswith("model.onnx")
    assert Path("t.cache").read_bytes() == f"TIMING-CACHE {version}".encode()
    side = json.loads(sidecar_path("model.fp32.engine").read_text())
    rec = side["engine"]
    assert rec["tensorrt"] == version and rec["gpu"] == "Fake Orin" and rec["compute_capability"] == "8.7"
    assert rec["profile"]["max"] == [16, 3, 32, 32] and rec["options"]["workspace_gib"] == 0.25
    assert rec["source_onnx"] == "model.onnx" and len(rec["source_sha256"]) == 64 and rec["built_at"]
    assert side["precision"] == "fp32" and side["labels"] == [str(i) for i in range(10)]
    assert res.record == rec and not list(Path(".").glob(".*"))


def test_mock_tensorrt_foreign_timing_cache_is_rebuilt_and_said(mocked: Any) -> None:
    """A timing cache from another version comes back None from create_timing_cache: build without it, say so."""
    from vitdeploy.stages.engine import BuildOptions, build_engine

    Path("t.cache").write_bytes(b"TIMING-CACHE 8.6.1")
    calls = mocked["install"]("10.3.0.30")
    events: list[tuple[str, dict]] = []
    build_engine("model.onnx", BuildOptions(timing_cache=Path("t.cache")), lambda k, d: events.append((k, d)))
    assert ("cache-in", b"TIMING-CACHE 8.6.1") in calls and ("cache-in", b"") in calls
    assert any(k == "warning" and "another device or TensorRT version" in d["message"] for k, d in events)
    assert Path("t.cache").read_bytes() == b"TIMING-CACHE 10.3.0.30"


def test_mock_tensorrt_fp16_artifact_on_8x_sets_fp16_flag_and_dla(mocked: Any) -> None:
    from vitdeploy.stages.engine import BuildOptions, build_engine

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    calls = mocked["install"]("8.5.2.2")
    build_engine("model.fp16.onnx", BuildOptions(opt_batch=2, dla_core=1))
    assert [c[1] for c in calls if c[0] == "flag"][:3] == ["FP16", "OBEY_PRECISION_CONSTRAINTS", "GPU_FALLBACK"]
    assert ("build", "DLA", 1) in calls
    assert ("profile", ("pixel_values", (2, 3, 32, 32), (2, 3, 32, 32), (2, 3, 32, 32))) in calls


def test_mock_tensorrt_8x_pins_the_nodes_numerics_kept_float32(mocked: Any) -> None:
    """A node convert-fp16 kept float32 because its tensor overflows float16 (manifest numerics.kept_fp32_nodes) is
    pinned to FP32 on a weakly typed 8.x build, as LayerNorm and Softmax are; the same graph without that record pins
    nothing here (a Gemm is no float32 island by itself)."""
    import onnx

    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.manifest import set_onnx_manifest
    from vitdeploy.stages.engine import BuildOptions, build_engine

    pinned = {}
    for kept in ([], ["head"]):
        path = write_linear_onnx(Path(f"model{len(kept)}.fp16.onnx"), precision="fp16")
        m = onnx.load(str(path))
        man = OnnxArtifact.open(path).manifest
        man.extra["numerics"] = {"kept_fp32_nodes": kept}
        set_onnx_manifest(m, man)
        onnx.save(m, str(path))
        calls = mocked["install"]("8.5.2.2")
        build_engine(str(path), BuildOptions())
        pinned[len(kept)] = {c[1] for c in calls if c[0] == "precision" and c[2] == "FLOAT"}
        assert ("output_type", "head", 0, "FLOAT") in calls or not kept
    assert "head" not in pinned[0] and "head" in pinned[1]


def test_mock_tensorrt_dla_core_beyond_the_device_is_refused_before_building(mocked: Any) -> None:
    from vitdeploy.stages.engine import BuildOptions, build_engine

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    calls = mocked["install"]("10.3.0.30")
    with pytest.raises(UsageError, match="--dla-core 2: this device has 2 DLA cores"):
        build_engine("model.fp16.onnx", BuildOptions(dla_core=2))
    assert not any(c[0] in ("parse", "build") for c in calls)
    mocked["install"]("8.5.2.2")
    with pytest.raises(UsageError, match="8.6 or newer"):
        build_engine("model.fp16.onnx", BuildOptions(version_compatible=True))
    calls = mocked["install"]("10.8.0.43")  # NVIDIA: 10.7 was the last 10.x with DLA
    with pytest.raises(UsageError, match="has no DLA"):
        build_engine("model.fp16.onnx", BuildOptions(dla_core=0))
    assert not any(c[0] in ("parse", "build") for c in calls)


@pytest.mark.parametrize("version,limit", [("8.6.1", 17), ("10.0.1", 20)])
def test_mock_tensorrt_refuses_an_opset_its_parser_cannot_read(mocked: Any, version: str, limit: int) -> None:
    import onnx

    from vitdeploy.stages.engine import BuildOptions, build_engine

    m = onnx.load("model.onnx")
    m.opset_import[0].version = limit + 1
    onnx.save(m, "model.onnx")
    calls = mocked["install"](version)
    with pytest.raises(VitdeployError, match=f"parser reads opsets up to {limit}") as e:
        build_engine("model.onnx", BuildOptions())
    assert "\n" not in str(e.value) and "vitdeploy export --target" in str(e.value)
    assert not any(c[0] in ("parse", "build") for c in calls) and not list(Path(".").glob("*.engine"))


def test_mock_tensorrt_parser_errors_are_one_line_and_nothing_is_written(mocked: Any) -> None:
    """The parser judges nothing; told to fail, its errors reach the user in one line and no engine is written."""
    from vitdeploy.stages.engine import BuildOptions, build_engine

    calls = mocked["install"]("10.3.0", parser_errors=["node head: Gemm: unsupported\nsecond line", "another"])
    with pytest.raises(VitdeployError, match="cannot parse it: node head: Gemm: unsupported") as e:
        build_engine("model.onnx", BuildOptions())
    assert "\n" not in str(e.value).replace("\\n", "") or str(e.value).count("\n") <= 1
    assert ("parse", "model.onnx") in calls and not any(c[0] == "build" for c in calls)
    assert not list(Path(".").glob("*.engine"))


def test_mock_tensorrt_missing_api_raises_attribute_error() -> None:
    """Names a release does not have are absent from the mock, as from the real module (facts from pyCore.cpp)."""
    t85, t86, t10, t11 = (fake_tensorrt(v) for v in ("8.5.2.2", "8.6.1", "10.3.0", "11.1.0.106"))
    with pytest.raises(AttributeError):
        t85.NetworkDefinitionCreationFlag.STRONGLY_TYPED  # noqa: B018 - added in 9.x
    with pytest.raises(AttributeError):
        t85.BuilderFlag.VERSION_COMPATIBLE  # noqa: B018 - added in 8.6
    with pytest.raises(AttributeError):
        t85.Runtime(t85.Logger(t85.Logger.WARNING)).engine_host_code_allowed = True
    with pytest.raises(AttributeError):
        t11.BuilderFlag.FP16  # noqa: B018 - gone in 11
    with pytest.raises(AttributeError):
        t11.NetworkDefinitionCreationFlag.EXPLICIT_BATCH  # noqa: B018 - gone in 11
    assert int(t86.BuilderFlag.VERSION_COMPATIBLE) >= 0
    assert int(t10.NetworkDefinitionCreationFlag.STRONGLY_TYPED) == 1
    assert int(t11.NetworkDefinitionCreationFlag.STRONGLY_TYPED) == 0
    rt = t10.Runtime(t10.Logger(t10.Logger.WARNING))
    with pytest.raises(AttributeError):
        rt.no_such_call()


def _fp16_linear(path: Path) -> Path:
    """The linear model with float16 input and output (ONNX Runtime's converter), for an FP16-input engine."""
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16

    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.manifest import set_onnx_manifest

    src = write_linear_onnx(path.with_name("src.onnx"))
    m = convert_float_to_float16(onnx.load(str(src)), keep_io_types=False)
    set_onnx_manifest(m, read_onnx_manifest(src).derive(precision="fp16"))
    onnx.save(m, str(path))
    return path


@pytest.mark.parametrize("fp16_input", [False, True])
def test_mock_tensorrt_runner_matches_onnxruntime_and_reuses_buffers(mocked: Any, fp16_input: bool) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    name = "model.fp16.onnx" if fp16_input else "model.onnx"
    if fp16_input:
        _fp16_linear(Path(name))
    mocked["install"]("10.3.0.30")
    res = build_engine(name, BuildOptions(min_batch=1, opt_batch=4, max_batch=8))
    calls = mocked["install"]("10.3.0.30")
    x = np.random.default_rng(0).normal(size=(19, 3, 32, 32)).astype(np.float32)
    import onnxruntime

    sess = onnxruntime.InferenceSession(name, providers=["CPUExecutionProvider"])
    want = sess.run(None, {"pixel_values": x.astype(np.float16 if fp16_input else np.float32)})[0].astype(np.float32)
    with open_runner(res.engine) as r:
        assert r.backend == "tensorrt" and r.max_batch == 8
        got = r(x)  # 8 + 8 + 3
        again = r(x[:8])
        assert len(mocked["cuda"].blocks) == 8  # two batch shapes (8 and 3), four buffers each, allocated once
    tol = 1e-5 if not fp16_input else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(again, want[:8], rtol=tol, atol=tol)
    assert [c[1] for c in calls if c[0] == "execute"] == [8, 8, 3, 8]
    assert calls[0][0] == "deserialize" and not calls[0][2]  # host code left as TensorRT defaults it
    assert mocked["cuda"].blocks == {}  # close() freed everything


def test_mock_tensorrt_runner_pads_a_fixed_dla_batch_and_sets_the_dla_core(mocked: Any) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    mocked["install"]("10.3.0.30")
    build_engine("model.fp16.onnx", BuildOptions(opt_batch=4, dla_core=1))
    calls = mocked["install"]("10.3.0.30")
    x = np.random.default_rng(1).normal(size=(6, 3, 32, 32)).astype(np.float32)
    with open_runner("model.fp16.onnx") as ort, open_runner("model.fp16.engine") as r:
        np.testing.assert_allclose(r(x), ort(x), rtol=1e-5, atol=1e-5)
    assert calls[0][0] == "deserialize" and calls[0][3] == 1  # DLA_core set before deserializing
    assert [c[1] for c in calls if c[0] == "execute"] == [4, 4]  # 4, then 2 padded to 4
    assert ("set_input_shape", (2, 3, 32, 32)) not in calls  # never asked for a shape outside the profile


def test_mock_tensorrt_set_input_shape_outside_the_profile_is_refused(mocked: Any) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    mocked["install"]("10.3.0.30")
    build_engine("model.onnx", BuildOptions(min_batch=2, opt_batch=4, max_batch=8))
    mocked["install"]("10.3.0.30")
    with open_runner("model.fp32.engine") as r:
        r.profile = type(r.profile)(1, 4, 8)  # as if the runner ignored the profile's minimum
        with pytest.raises(VitdeployError, match="TensorRT refused input shape"):
            r(np.zeros((1, 3, 32, 32), np.float32))


def test_mock_tensorrt_runner_refuses_another_device_before_deserializing(mocked: Any) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    mocked["install"]("10.3.0.30")
    build_engine("model.onnx", BuildOptions())
    calls = mocked["install"]("10.8.0.43")
    with pytest.raises(VitdeployError, match="TensorRT 10.3.0.30 built it, this is TensorRT 10.8.0.43"):
        open_runner("model.fp32.engine")
    mocked["install"]("10.3.0.30")
    mocked["cuda"].cc = (9, 0)
    with pytest.raises(VitdeployError, match="this GPU is 9.0.*rebuild it on this device"):
        open_runner("model.fp32.engine")
    assert not any(c[0] == "deserialize" for c in calls)


def test_mock_tensorrt_version_compatible_engine_allows_host_code(mocked: Any) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    calls = mocked["install"]("10.3.0.30")
    build_engine("model.onnx", BuildOptions(version_compatible=True))
    assert ("flag", "VERSION_COMPATIBLE") in calls
    plan = json.loads(Path("model.fp32.engine").read_bytes())
    plan["version"] = "11.1.0.106"  # the mock loads only its own version's plans; a real VC plan loads on 11
    Path("model.fp32.engine").write_bytes(json.dumps(plan).encode())
    calls = mocked["install"]("11.1.0.106")
    with open_runner("model.fp32.engine"):
        pass
    assert calls[0][0] == "deserialize" and calls[0][2] is True


def test_mock_tensorrt_artifact_for_another_target_is_refused(mocked: Any) -> None:
    import onnx

    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.manifest import set_onnx_manifest
    from vitdeploy.stages.engine import BuildOptions, build_engine

    m = onnx.load("model.onnx")
    man = read_onnx_manifest("model.onnx")
    man.target = "trt8.5"
    set_onnx_manifest(m, man)
    onnx.save(m, "model.onnx")
    calls = mocked["install"]("10.3.0.30")
    with pytest.raises(VitdeployError) as e:
        build_engine("model.onnx", BuildOptions())
    msg = str(e.value)
    assert "made for trt8.5" in msg and "trt10" in msg and "--target trt10" in msg and "\n" not in msg
    assert not any(c[0] in ("parse", "build") for c in calls) and not list(Path(".").glob("*.engine"))
    mocked["install"]("8.5.2.2")
    build_engine("model.onnx", BuildOptions())  # on its own target it builds


# ---------------------------------------------------------------- what the mock is: the real API's shape


@pytest.mark.parametrize("version", ["8.6.1", "10.3.0", "11.4.0.106"])
def test_mock_enum_members_are_not_ints_and_shifting_one_raises(version: str) -> None:
    """``1 << member`` raises TypeError and ``member == int(member)`` is False, as the real bindings showed."""
    trt = fake_tensorrt(version)
    ncf = trt.NetworkDefinitionCreationFlag
    member = ncf.STRONGLY_TYPED if hasattr(ncf, "STRONGLY_TYPED") else ncf.EXPLICIT_BATCH
    with pytest.raises(TypeError, match="unsupported operand"):
        1 << member  # noqa: B018
    assert member != int(member) and not isinstance(member, int) and 1 << int(member) >= 1
    d = trt.Dims([1, 3, 32, 32])
    with pytest.raises(TypeError):
        json.dumps(d)
    with pytest.raises(TypeError):
        d + (3,)  # noqa: B018
    assert d == (1, 3, 32, 32) and tuple(d) == (1, 3, 32, 32) and len(d) == 4


def test_mock_checks_argument_types_like_pybind11() -> None:
    trt = fake_tensorrt("10.3.0")
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        trt.Logger("WARNING")
    with pytest.raises(TypeError, match="incompatible constructor arguments"):
        trt.OnnxParser(None, trt.Logger())
    with pytest.raises(TypeError, match="No constructor defined"):
        trt.ICudaEngine()
    builder = trt.Builder(trt.Logger())
    with pytest.raises(TypeError, match="incompatible function arguments"):
        builder.create_network(1.5)
    net = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(net, trt.Logger())
    with pytest.raises(TypeError, match="incompatible function arguments"):
        parser.parse_from_file(Path("model.onnx"))  # a str, not a Path
    config = builder.create_builder_config()
    with pytest.raises(TypeError):
        config.set_flag(3)  # a BuilderFlag member, not its int
    with pytest.raises(AttributeError):
        builder.no_such_call()  # noqa: B018


@pytest.mark.parametrize("version", releases())
def test_mock_constructors_fail_like_tensorrt_without_cuda(version: str) -> None:
    """The real bindings of every release said this with factories that return NULL (tests/trt_api.json)."""
    from trt_mock import api

    probes = api(version)["runtime"]
    assert probes["Runtime(logger)"] == probes["Builder(logger)"] == f"raises TypeError: {NULLPTR}"
    trt = fake_tensorrt(version, fail={"Runtime", "Builder", "OnnxParser"})
    for make in (lambda: trt.Runtime(trt.Logger()), lambda: trt.Builder(trt.Logger())):
        with pytest.raises(TypeError, match=NULLPTR.replace("(", r"\(").replace(")", r"\)")):
            make()


# ---------------------------------------------------------------- CUDA that cannot start: one line


def test_mock_tensorrt_runner_says_cuda_and_the_driver_when_the_runtime_cannot_start(mocked: Any) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.engine import BuildOptions, build_engine

    mocked["install"]("10.3.0")
    build_engine("model.onnx", BuildOptions())
    mocked["install"]("10.3.0", fail={"Runtime"})
    with pytest.raises(CudaUnavailable) as e:
        open_runner("model.fp32.engine")
    msg = str(e.value)
    assert "CUDA" in msg and "driver" in msg and "\n" not in msg and e.value.exit_code == 1
    mocked["install"]("10.3.0", no_context=True)
    with pytest.raises(CudaUnavailable, match="execution context") as e:
        open_runner("model.fp32.engine")
    assert "driver" in str(e.value) and "\n" not in str(e.value)


def test_doctor_says_cuda_and_the_driver_when_tensorrt_cannot_start_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from vitdeploy.tools.doctor import probe_tensorrt

    monkeypatch.setitem(__import__("sys").modules, "tensorrt", fake_tensorrt("10.3.0", fail={"Runtime"}))
    out = probe_tensorrt()
    assert out["available"] is False and "CUDA" in out["why"] and "driver" in out["why"]
    monkeypatch.setitem(__import__("sys").modules, "tensorrt", fake_tensorrt("10.3.0"))
    assert probe_tensorrt()["available"] is True


@pytest.mark.parametrize("failing", ["Builder", "OnnxParser"])
def test_mock_tensorrt_build_says_cuda_and_the_driver_when_tensorrt_cannot_start_it(mocked: Any, failing: str) -> None:
    from vitdeploy.stages.engine import BuildOptions, build_engine

    mocked["install"]("10.3.0", fail={failing})
    with pytest.raises(CudaUnavailable) as e:
        build_engine("model.onnx", BuildOptions())
    msg = str(e.value)
    assert f"trt.{failing}" in msg and "CUDA" in msg and "driver" in msg and "\n" not in msg
    assert not list(Path(".").glob("*.engine"))


# NVIDIA's own engine-inspector output (tests/data/inspector/README.md names each source): what a real engine reports.
INSPECTOR = Path(__file__).parent / "data" / "inspector"


@pytest.mark.parametrize("published,written", [("trex-resnet18-A100-fp16.graph.json", True),
                                               ("trex-resnet18-A100-fp32.graph.json", False)])
def test_mock_tensorrt_build_records_the_precision_receipt_and_rejects_a_missed_precision(
        mocked: Any, monkeypatch: pytest.MonkeyPatch, published: str, written: bool) -> None:
    """The builder asks for detailed layer information and reads the engine back through the inspector. An FP16 build
    whose layers run FP16 (NVIDIA's published FP16 ResNet-18 engine) is written with its receipt in the sidecar; one
    whose GEMMs all run FP32 (the published FP32 engine) is refused, exit 1, the plan kept as .rejected."""
    from vitdeploy.core.errors import VitdeployError
    from vitdeploy.runners.tensorrt import builder
    from vitdeploy.stages.engine import BuildOptions, build_engine

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    calls = mocked["install"]("10.3.0.30")
    monkeypatch.setattr(builder, "engine_information", lambda engine: (INSPECTOR / published).read_text())
    if written:
        build_engine("model.fp16.onnx", BuildOptions())
        receipt = json.loads(sidecar_path("model.fp16.engine").read_text())["engine"]["receipt"]
        assert receipt["status"] == "ok" and receipt["gemm_share"] == {"FP16": 1.0}
        assert Path("model.fp16.engine").exists() and not Path("model.fp16.engine.rejected").exists()
    else:
        with pytest.raises(VitdeployError, match=r"not written: FP16 was requested but 0\.0% of the GEMM FLOPs"):
            build_engine("model.fp16.onnx", BuildOptions())
        assert not Path("model.fp16.engine").exists() and Path("model.fp16.engine.rejected").exists()
        side = json.loads(sidecar_path("model.fp16.engine.rejected").read_text())
        assert side["engine"]["receipt"]["gemm_share"] == {"FP32": 1.0}
    assert any(c[0] == "deserialize" for c in calls)  # the plan was read back to be inspected


def test_mock_tensorrt_build_without_an_inspector_says_the_receipt_is_unknown(mocked: Any) -> None:
    """The mock has no engine inspector (NVIDIA's bindings list it; the mock does not model it): the receipt is
    "unknown" with the reason, the engine is written, and nothing is guessed."""
    from vitdeploy.stages.engine import BuildOptions, build_engine

    mocked["install"]("10.3.0.30")
    build_engine("model.onnx", BuildOptions())
    receipt = json.loads(sidecar_path("model.fp32.engine").read_text())["engine"]["receipt"]
    assert receipt["status"] == "unknown" and "inspector" in receipt["reason"]


def test_mock_tensorrt_build_of_an_onnx_re_written_meanwhile_writes_no_engine(mocked: Any,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 31 item 3: the sidecar's source SHA-256 is of the bytes TensorRT parsed; a model.onnx re-exported while
    the engine builds is one line and no engine that names other bytes."""
    import onnx

    import vitdeploy.runners.tensorrt.builder as builder
    from vitdeploy.stages.engine import BuildOptions, build_engine

    mocked["install"]("10.3.0.30")
    real = builder.engine_receipt

    def re_exported_meanwhile(*a: Any, **kw: Any) -> Any:  # after the parse and the build
        m = onnx.load("model.onnx")
        m.doc_string = "a re-export"
        onnx.save(m, "model.onnx.new")
        Path("model.onnx.new").replace("model.onnx")
        return real(*a, **kw)

    monkeypatch.setattr(builder, "engine_receipt", re_exported_meanwhile)
    with pytest.raises(VitdeployError) as e:
        build_engine("model.onnx", BuildOptions(min_batch=1, opt_batch=1, max_batch=2))
    assert "model.onnx changed while build-engine ran" in str(e.value) and "\n" not in str(e.value)
    assert not list(Path(".").glob("*.engine*"))
