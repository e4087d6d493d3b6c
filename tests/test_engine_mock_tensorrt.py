"""build-engine and the TensorRT runner driven through a MOCK of TensorRT and of libcudart.

TensorRT cannot be installed here, so these tests replace the ``tensorrt`` module with tests/trt_mock.py: its
names and enum values per version come from the version table (NVIDIA's sources), a name a version lacks raises
AttributeError, its parser fails on ops the version does not parse, ``set_input_shape`` refuses shapes outside the
profile (its "engine" runs the ONNX file with ONNX Runtime), and libcudart is replaced with host memory. They check our side only: which TensorRT calls are made per version,
what is written (plan bytes as is, sidecar, timing cache), and the runner's buffers, padding, splitting
and dtype handling. They prove nothing about TensorRT itself; the ``tensorrt``-marked tests do that.
"""

from __future__ import annotations

import ctypes
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_engine import write_linear_onnx  # tests/ is on sys.path (rootdir conftest)
from trt_mock import fake_tensorrt

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import sidecar_path
from vitdeploy.runners.tensorrt import cuda


class FakeHostCuda:
    """libcudart stand-in: "device" memory is host memory; copies are memmove; streams do nothing."""

    def __init__(self, cc: tuple[int, int] = (8, 7)) -> None:
        self.cc = cc
        self.blocks: dict[int, Any] = {}
        self.copies = 0

    def _alloc(self, n: int) -> int:
        buf = ctypes.create_string_buffer(max(int(n), 1))
        self.blocks[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    malloc = malloc_host = _alloc

    def free(self, p: int) -> None:
        self.blocks.pop(p)

    free_host = free

    def memcpy_async(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.copies += 1
        ctypes.memmove(dst, src, n)

    def device_count(self) -> int:
        return 1

    def set_device(self, d: int) -> None:
        pass

    def compute_capability(self, d: int = 0) -> tuple[int, int]:
        return self.cc

    def device_name(self, d: int = 0) -> str:
        return "Fake Orin"

    def runtime_version(self) -> str:
        return "12.6"

    def stream_create(self) -> int:
        return 1234

    def stream_synchronize(self, s: int) -> None:
        pass

    def stream_destroy(self, s: int) -> None:
        pass


@pytest.fixture
def mocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    write_linear_onnx(tmp_path / "model.onnx")
    fake_cuda = FakeHostCuda()
    monkeypatch.setattr(cuda, "CudaRuntime", lambda *a, **k: fake_cuda)
    state: dict[str, Any] = {"calls": [], "onnx": {}, "cuda": fake_cuda}

    def install(version: str, input_dtype: Any = np.float32) -> list[tuple]:
        state["calls"].clear()
        monkeypatch.setitem(__import__("sys").modules, "tensorrt", fake_tensorrt(version, state["calls"]))
        return state["calls"]

    state["install"] = install
    return state


def _plan(calls: list[tuple]) -> bytes:
    """The bytes the mock builder's deserializer was handed (what build-engine wrote, as TensorRT serialized it)."""
    return next(c[1] for c in calls if c[0] == "deserialize")


# create_network's bits: 1 << the member's value in include/NvInfer.h of that release (read into the facts):
# 8.5 EXPLICIT_BATCH = 0; 10.x STRONGLY_TYPED = 1; 11.x STRONGLY_TYPED = 0.
@pytest.mark.parametrize("version,flags_bits,builder_flags", [
    ("8.5.2.2", 1 << 0, []),
    ("10.3.0.30", 1 << 1, []),
    ("11.1.0", 1 << 0, []),
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


@pytest.mark.parametrize("version,limit", [("8.6.2", 17), ("9.3.0", 19), ("10.0.1", 20)])
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


def test_mock_tensorrt_parser_fails_on_an_op_the_version_does_not_parse(mocked: Any) -> None:
    """8.5's parser has no LayerNormalization importer (onnx-tensorrt 8.5-GA operators.md: N); 8.6's has."""
    import onnx
    from onnx import TensorProto, helper

    from vitdeploy.stages.engine import BuildOptions, build_engine

    m = onnx.load("model.onnx")
    g = m.graph
    g.initializer.extend([onnx.numpy_helper.from_array(np.ones(10, np.float32), "ln_s"),
                          onnx.numpy_helper.from_array(np.zeros(10, np.float32), "ln_b")])
    g.node[-1].output[0] = "pre"
    g.node.append(helper.make_node("LayerNormalization", ["pre", "ln_s", "ln_b"], ["logits"], axis=-1))
    del g.value_info[:]
    onnx.save(m, "model.onnx")
    assert g.output[0].type.tensor_type.elem_type == TensorProto.FLOAT
    calls = mocked["install"]("8.5.2.2")
    with pytest.raises(VitdeployError, match="cannot parse it: LayerNormalization is not supported"):
        build_engine("model.onnx", BuildOptions())
    assert not any(c[0] == "build" for c in calls)
    mocked["install"]("8.6.1")
    build_engine("model.onnx", BuildOptions())


def test_mock_tensorrt_missing_api_raises_attribute_error() -> None:
    """Names a release does not have are absent from the mock, as from the real module (facts from pyCore.cpp)."""
    t85, t86, t10, t11 = (fake_tensorrt(v) for v in ("8.5.2.2", "8.6.1", "10.3.0", "11.1.0"))
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
    assert int(fake_tensorrt("9.3.0").NetworkDefinitionCreationFlag.STRONGLY_TYPED) == 2
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
    assert calls[0][0] == "deserialize" and calls[0][2] is False
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
    plan["version"] = "11.1.0"  # the mock loads only its own version's plans; a real VC plan loads on 11
    Path("model.fp32.engine").write_bytes(json.dumps(plan).encode())
    calls = mocked["install"]("11.1.0")
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
