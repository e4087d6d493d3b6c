"""build-engine and the TensorRT runner driven through a MOCK of TensorRT and of libcudart.

TensorRT cannot be installed here, so these tests replace the ``tensorrt`` module with a recording fake
(its "engine" runs the ONNX file with ONNX Runtime, reading and writing the addresses the runner set)
and libcudart with host memory. They check our side only: which TensorRT calls are made per version,
what is written (plan bytes as is, sidecar, timing cache), and the runner's buffers, padding, splitting
and dtype handling. They prove nothing about TensorRT itself; the ``tensorrt``-marked tests do that.
"""

from __future__ import annotations

import ctypes
import json
import types
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from test_engine import write_linear_onnx  # tests/ is on sys.path (rootdir conftest)

from vitdeploy import cuda
from vitdeploy.errors import UsageError, VitdeployError
from vitdeploy.manifest import sidecar_path


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


def fake_tensorrt(version: str, calls: list[tuple], onnx_path: dict[str, Path], input_dtype: Any = np.float32) -> Any:
    """A recording stand-in for the parts of the tensorrt module vitdeploy uses, shaped like ``version``."""
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version  # type: ignore[attr-defined]

    class Logger:
        WARNING = 2

        def __init__(self, severity: int) -> None:
            pass

    flags_ns = {"GPU_FALLBACK": "GPU_FALLBACK", "VERSION_COMPATIBLE": "VERSION_COMPATIBLE"}
    if major < 11:
        flags_ns.update(FP16="FP16", INT8="INT8")  # removed in 11: touching them there fails the test
    trt.BuilderFlag = types.SimpleNamespace(**flags_ns)  # type: ignore[attr-defined]
    ncf: dict[str, int] = {}
    if major < 11:
        ncf["EXPLICIT_BATCH"] = 0
    if major >= 9:
        ncf["STRONGLY_TYPED"] = 5
    trt.NetworkDefinitionCreationFlag = types.SimpleNamespace(**ncf)  # type: ignore[attr-defined]
    trt.MemoryPoolType = types.SimpleNamespace(WORKSPACE="WORKSPACE")  # type: ignore[attr-defined]
    trt.DeviceType = types.SimpleNamespace(DLA="DLA", GPU="GPU")  # type: ignore[attr-defined]
    trt.TensorIOMode = types.SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")  # type: ignore[attr-defined]
    trt.Dims = lambda shape: tuple(shape)  # type: ignore[attr-defined]
    trt.nptype = lambda t: t  # type: ignore[attr-defined]

    class Cache:
        def serialize(self) -> bytes:
            return b"TIMING-CACHE"

    class Config:
        def __init__(self) -> None:
            self.default_device_type = "GPU"
            self.DLA_core = -1

        def set_memory_pool_limit(self, pool: str, size: int) -> None:
            calls.append(("pool", pool, size))

        def set_flag(self, f: str) -> None:
            calls.append(("flag", f))

        def add_optimization_profile(self, p: Any) -> int:
            calls.append(("profile", p.shape))
            return 0

        def create_timing_cache(self, data: bytes) -> Cache:
            calls.append(("cache-in", bytes(data)))
            return Cache()

        def set_timing_cache(self, c: Cache, ignore: bool) -> bool:
            return True

        def get_timing_cache(self) -> Cache:
            return Cache()

    class OptProfile:
        shape: tuple = ()

        def set_shape(self, name: str, mn: tuple, op: tuple, mx: tuple) -> None:
            self.shape = (name, mn, op, mx)

    class Parser:
        num_errors = 0

        def __init__(self, network: Any, logger: Any) -> None:
            pass

        def parse_from_file(self, path: str) -> bool:
            calls.append(("parse", Path(path).name))
            onnx_path["model"] = Path(path)
            return True

    class Builder:
        num_DLA_cores = 2

        def __init__(self, logger: Any) -> None:
            pass

        def create_network(self, flags: int) -> object:
            calls.append(("network", flags))
            return object()

        def create_builder_config(self) -> Config:
            self.config = Config()
            return self.config

        def create_optimization_profile(self) -> OptProfile:
            return OptProfile()

        def build_serialized_network(self, network: Any, config: Config) -> bytes:
            calls.append(("build", config.default_device_type, config.DLA_core))
            return b"PLAN-AS-TENSORRT-WROTE-IT"

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.addr: dict[str, int] = {}
            self.shape: tuple = ()

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            calls.append(("set_input_shape", tuple(shape)))
            self.shape = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            return (self.shape[0], 10)

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self.addr[name] = ptr
            return True

        def execute_async_v3(self, stream: int) -> bool:
            import onnxruntime as ort

            calls.append(("execute", self.shape[0], stream))
            x = cuda.host_array(self.addr["pixel_values"], self.shape, input_dtype).astype(np.float32)
            sess = ort.InferenceSession(str(onnx_path["model"]), providers=["CPUExecutionProvider"])
            y = sess.run(None, {"pixel_values": x})[0]
            cuda.host_array(self.addr["logits"], y.shape, np.float32)[:] = y
            return True

    class Engine:
        num_io_tensors = 2

        def get_tensor_name(self, i: int) -> str:
            return ["pixel_values", "logits"][i]

        def get_tensor_mode(self, name: str) -> str:
            return "INPUT" if name == "pixel_values" else "OUTPUT"

        def get_tensor_dtype(self, name: str) -> Any:
            return input_dtype if name == "pixel_values" else np.float32

        def create_execution_context(self) -> Context:
            return Context(self)

    class Runtime:
        engine_host_code_allowed = False

        def __init__(self, logger: Any) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Engine:
            calls.append(("deserialize", bytes(data), self.engine_host_code_allowed))
            return Engine()

    trt.Logger, trt.Builder, trt.OnnxParser, trt.Runtime = Logger, Builder, Parser, Runtime  # type: ignore[attr-defined]
    return trt


@pytest.fixture
def mocked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    monkeypatch.chdir(tmp_path)
    write_linear_onnx(tmp_path / "model.onnx")
    fake_cuda = FakeHostCuda()
    monkeypatch.setattr(cuda, "CudaRuntime", lambda *a, **k: fake_cuda)
    state: dict[str, Any] = {"calls": [], "onnx": {}, "cuda": fake_cuda}

    def install(version: str, input_dtype: Any = np.float32) -> list[tuple]:
        state["calls"].clear()
        monkeypatch.setitem(__import__("sys").modules, "tensorrt",
                            fake_tensorrt(version, state["calls"], state["onnx"], input_dtype))
        return state["calls"]

    state["install"] = install
    return state


@pytest.mark.parametrize("version,flags_bits,builder_flags", [
    ("8.5.2.2", 1 << 0, []),
    ("10.3.0.30", 1 << 5, []),
    ("11.1.0", 1 << 5, []),
])
def test_mock_tensorrt_build_writes_plan_sidecar_and_cache(mocked: Any, version: str, flags_bits: int,
                                                           builder_flags: list[str]) -> None:
    from vitdeploy.engine import BuildOptions, build_engine

    calls = mocked["install"](version)
    res = build_engine("model.onnx", BuildOptions(min_batch=1, opt_batch=4, max_batch=16, workspace=0.25,
                                                  timing_cache=Path("t.cache")))
    assert ("network", flags_bits) in calls
    assert [c[1] for c in calls if c[0] == "flag"] == builder_flags
    assert ("pool", "WORKSPACE", 1 << 28) in calls
    assert ("profile", ("pixel_values", (1, 3, 32, 32), (4, 3, 32, 32), (16, 3, 32, 32))) in calls
    assert ("cache-in", b"") in calls
    assert Path("model.fp32.engine").read_bytes() == b"PLAN-AS-TENSORRT-WROTE-IT"  # no header glued on
    assert Path("t.cache").read_bytes() == b"TIMING-CACHE"
    side = json.loads(sidecar_path("model.fp32.engine").read_text())
    rec = side["engine"]
    assert rec["tensorrt"] == version and rec["gpu"] == "Fake Orin" and rec["compute_capability"] == "8.7"
    assert rec["profile"]["max"] == [16, 3, 32, 32] and rec["options"]["workspace_gib"] == 0.25
    assert rec["source_onnx"] == "model.onnx" and len(rec["source_sha256"]) == 64 and rec["built_at"]
    assert side["precision"] == "fp32" and side["labels"] == [str(i) for i in range(10)]
    assert res.record == rec and not list(Path(".").glob(".*"))


def test_mock_tensorrt_fp16_artifact_on_8x_sets_fp16_flag_and_dla(mocked: Any) -> None:
    from vitdeploy.engine import BuildOptions, build_engine

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    calls = mocked["install"]("8.5.2.2")
    build_engine("model.fp16.onnx", BuildOptions(opt_batch=2, dla_core=1))
    assert [c[1] for c in calls if c[0] == "flag"] == ["FP16", "GPU_FALLBACK"]
    assert ("build", "DLA", 1) in calls
    assert ("profile", ("pixel_values", (2, 3, 32, 32), (2, 3, 32, 32), (2, 3, 32, 32))) in calls


def test_mock_tensorrt_dla_core_beyond_the_device_is_refused_before_building(mocked: Any) -> None:
    from vitdeploy.engine import BuildOptions, build_engine

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    calls = mocked["install"]("10.3.0.30")
    with pytest.raises(UsageError, match="--dla-core 2: this device has 2 DLA cores"):
        build_engine("model.fp16.onnx", BuildOptions(dla_core=2))
    assert not any(c[0] in ("parse", "build") for c in calls)
    mocked["install"]("8.5.2.2")
    with pytest.raises(UsageError, match="8.6 or newer"):
        build_engine("model.fp16.onnx", BuildOptions(version_compatible=True))


def test_mock_tensorrt_8x_refuses_an_opset_its_parser_cannot_read(mocked: Any) -> None:
    import onnx

    from vitdeploy.engine import BuildOptions, build_engine

    m = onnx.load("model.onnx")
    m.opset_import[0].version = 19
    onnx.save(m, "model.onnx")
    calls = mocked["install"]("8.6.2")
    with pytest.raises(VitdeployError, match="parser reads opsets up to 17"):
        build_engine("model.onnx", BuildOptions())
    assert not any(c[0] in ("parse", "build") for c in calls)


@pytest.mark.parametrize("input_dtype", [np.float32, np.float16])
def test_mock_tensorrt_runner_matches_onnxruntime_and_reuses_buffers(mocked: Any, input_dtype: Any) -> None:
    from vitdeploy.engine import BuildOptions, build_engine
    from vitdeploy.runners import open_runner

    mocked["install"]("10.3.0.30")
    build_engine("model.onnx", BuildOptions(min_batch=1, opt_batch=4, max_batch=8))
    calls = mocked["install"]("10.3.0.30", input_dtype)
    x = np.random.default_rng(0).normal(size=(19, 3, 32, 32)).astype(np.float32)
    with open_runner("model.onnx") as ort:
        want = ort(x)
    with open_runner("model.fp32.engine") as r:
        assert r.backend == "tensorrt" and r.max_batch == 8 and r.precision == "fp32"
        got = r(x)  # 8 + 8 + 3
        again = r(x[:8])
        assert len(mocked["cuda"].blocks) == 8  # two batch shapes (8 and 3), four buffers each, allocated once
    tol = 1e-5 if input_dtype == np.float32 else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
    np.testing.assert_allclose(again, want[:8], rtol=tol, atol=tol)
    assert [c[1] for c in calls if c[0] == "execute"] == [8, 8, 3, 8]
    assert calls[0] == ("deserialize", b"PLAN-AS-TENSORRT-WROTE-IT", False)
    assert mocked["cuda"].blocks == {}  # close() freed everything


def test_mock_tensorrt_runner_pads_a_fixed_dla_batch(mocked: Any) -> None:
    from vitdeploy.engine import BuildOptions, build_engine
    from vitdeploy.runners import open_runner

    write_linear_onnx(Path("model.fp16.onnx"), precision="fp16")
    mocked["install"]("10.3.0.30")
    build_engine("model.fp16.onnx", BuildOptions(opt_batch=4, dla_core=0))
    calls = mocked["install"]("10.3.0.30")
    x = np.random.default_rng(1).normal(size=(6, 3, 32, 32)).astype(np.float32)
    with open_runner("model.fp16.onnx") as ort, open_runner("model.fp16.engine") as r:
        np.testing.assert_allclose(r(x), ort(x), rtol=1e-5, atol=1e-5)
    assert [c[1] for c in calls if c[0] == "execute"] == [4, 4]  # 4, then 2 padded to 4


def test_mock_tensorrt_runner_refuses_another_device_before_deserializing(mocked: Any) -> None:
    from vitdeploy.engine import BuildOptions, build_engine
    from vitdeploy.runners import open_runner

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
    from vitdeploy.engine import BuildOptions, build_engine
    from vitdeploy.runners import open_runner

    calls = mocked["install"]("10.3.0.30")
    build_engine("model.onnx", BuildOptions(version_compatible=True))
    assert ("flag", "VERSION_COMPATIBLE") in calls
    calls = mocked["install"]("11.1.0")
    with open_runner("model.fp32.engine"):
        pass
    assert calls[0] == ("deserialize", b"PLAN-AS-TENSORRT-WROTE-IT", True)
