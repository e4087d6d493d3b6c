"""A mock of the ``tensorrt`` module built from the version table (vitdeploy/core/trt_facts.json), per version.

Names and enum values come from the facts scripts/extract_trt_facts.py read from NVIDIA/TensorRT's release
branches (pybind11 sources and include/*.h): a name the facts do not list for that version raises
AttributeError, as the real module does. Behaviour, where the real one fails:

* ``OnnxParser.parse_from_file`` fails (False, with errors) on an op the version's onnx-tensorrt operators.md does
  not support, or an opset above its limit (checks.conformance.check_onnx on that row);
* ``IExecutionContext.set_input_shape`` returns False for a shape outside the engine's profile;
* a strongly typed network built with FP16/INT8 builder flags fails (returns None), as TensorRT refuses precision
  flags on strongly typed networks (shared/TENSORRT.md);
* ``IBuilderConfig.create_timing_cache`` returns None for a cache from another version (issue 14, item 6);
* ``Runtime.deserialize_cuda_engine`` returns None for a plan of another version, and for a DLA plan when the
  runtime's DLA_core is not the core it was built for (the mock's model of what trtexec avoids by setting it).

The "plan" is JSON (the ONNX path, the profile, the DLA core, the version); the "engine" runs the ONNX with ONNX
Runtime, reading and writing the addresses the caller set. It proves our side only, never TensorRT's.
"""

from __future__ import annotations

import ctypes
import json
import types
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core import trt_table

NP = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
      "BOOL": np.bool_, "UINT8": np.uint8}
ONNX_DT = {"tensor(float)": "FLOAT", "tensor(float16)": "HALF", "tensor(uint8)": "UINT8", "tensor(int8)": "INT8"}


class Member(int):
    """An enum member: an int with a name, like pybind11's enum values."""

    def __new__(cls, value: int, name: str, enum: str) -> Member:
        m = super().__new__(cls, value)
        m.name, m.enum = name, enum  # type: ignore[attr-defined]
        return m

    def __repr__(self) -> str:
        return f"<{self.enum}.{self.name}: {int(self)}>"  # type: ignore[attr-defined]


def _enum(name: str, members: dict[str, Any]) -> Any:
    ns = type(name, (), {})
    for k, v in members.items():
        setattr(ns, k, Member(int(v) if isinstance(v, int) else -1, k, name))
    return ns


class Gated:
    """Attributes outside the version's bindings raise AttributeError; mock state lives in ``_m_*``."""

    _py = ""
    _allowed: frozenset[str] = frozenset()

    def __getattribute__(self, name: str) -> Any:
        if name.startswith("_") or name in type(self)._allowed:
            return object.__getattribute__(self, name)
        raise AttributeError(f"'tensorrt.{type(self)._py}' object has no attribute '{name}'")

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_m_") or name in type(self)._allowed:
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"'tensorrt.{type(self)._py}' object has no attribute '{name}'")


def fake_tensorrt(version: str, calls: list[tuple] | None = None, dla_cores: int = 2) -> types.ModuleType:
    """The tensorrt module of ``version`` as far as the facts go; ``calls`` records what was asked."""
    from vitdeploy.checks.conformance import check_onnx_rows

    calls = [] if calls is None else calls
    row = trt_table.row_of(version)
    py = trt_table.python_names(row)
    classes, enums, module = py["classes"], py["enums"], set(py["module"])

    def gated(pyname: str, impl: type) -> type:
        return type(pyname, (impl,), {"_py": pyname, "_allowed": frozenset(classes.get(pyname, []))})

    trt = types.ModuleType("tensorrt")
    trt.__version__ = version  # type: ignore[attr-defined]
    en = {k: _enum(k.split(".")[-1], v) for k, v in enums.items()}
    for k, e in en.items():
        if "." not in k and k in module:
            setattr(trt, k, e)
    severity = en.get("ILogger.Severity")
    DT = en["DataType"]
    MODE = en["TensorIOMode"]

    class _Logger(Gated):
        def __init__(self, min_severity: Any = None) -> None:
            self._m_sev = min_severity

    Logger = gated("Logger", _Logger)
    if severity is not None:
        for k in classes.get("Logger", []):
            if hasattr(severity, k):
                setattr(Logger, k, getattr(severity, k))

    class _Cache(Gated):
        def __init__(self, data: bytes) -> None:
            self._m_data = data

        def serialize(self) -> bytes:
            return f"TIMING-CACHE {version}".encode()

    Cache = gated("ITimingCache", _Cache)

    class _Profile(Gated):
        def __init__(self) -> None:
            self._m_shape: tuple = ()

        def set_shape(self, name: str, mn: Any, op: Any, mx: Any) -> None:
            self._m_shape = (name, tuple(mn), tuple(op), tuple(mx))

    Profile = gated("IOptimizationProfile", _Profile)

    class _Config(Gated):
        def __init__(self) -> None:
            self._m_flags: list[str] = []
            self._m_profile: Any = None
            self._m_cache: Any = None
            object.__setattr__(self, "default_device_type", getattr(en["DeviceType"], "GPU", None))
            object.__setattr__(self, "DLA_core", -1)

        def set_memory_pool_limit(self, pool: Member, size: int) -> None:
            calls.append(("pool", pool.name, size))  # type: ignore[attr-defined]

        def set_flag(self, f: Member) -> None:
            assert isinstance(f, Member) and f.enum == "BuilderFlag"  # type: ignore[attr-defined]
            self._m_flags.append(f.name)  # type: ignore[attr-defined]
            calls.append(("flag", f.name))  # type: ignore[attr-defined]

        def add_optimization_profile(self, p: Any) -> int:
            self._m_profile = p._m_shape
            calls.append(("profile", p._m_shape))
            return 0

        def create_timing_cache(self, data: bytes) -> Any:
            data = bytes(data)
            calls.append(("cache-in", data))
            if data and data != f"TIMING-CACHE {version}".encode():
                return None  # a cache from another version or device
            return Cache(data)

        def set_timing_cache(self, c: Any, ignore_mismatch: bool) -> bool:
            self._m_cache = c
            return True

        def get_timing_cache(self) -> Any:
            return self._m_cache

    Config = gated("IBuilderConfig", _Config)

    LT = en["LayerType"]
    layer_kind = {"LayerNormalization": "NORMALIZATION", "Softmax": "SOFTMAX", "MatMul": "MATRIX_MULTIPLY",
                  "Gemm": "MATRIX_MULTIPLY", "Add": "ELEMENTWISE", "Sub": "ELEMENTWISE", "Mul": "ELEMENTWISE",
                  "Div": "ELEMENTWISE", "Pow": "ELEMENTWISE", "Sqrt": "UNARY", "Erf": "UNARY", "Constant": "CONSTANT",
                  "Conv": "CONVOLUTION", "Cast": "CAST"}

    class _Layer(Gated):
        """One layer per ONNX node, named after it (as onnx-tensorrt names layers)."""

        def __init__(self, node: Any) -> None:
            kind = layer_kind.get(node.op_type, "REDUCE" if node.op_type.startswith("Reduce") else "SHUFFLE")
            object.__setattr__(self, "name", node.name or node.output[0])
            object.__setattr__(self, "type", getattr(LT, kind, LT.SHUFFLE))
            self._m_outputs = [o for o in node.output if o]
            self._m_types: dict[int, Any] = {}
            if "precision" in classes["ILayer"]:
                object.__setattr__(self, "precision", DT.FLOAT)

        @property
        def num_outputs(self) -> int:
            return len(self._m_outputs)

        def set_output_type(self, index: int, dtype: Member) -> None:
            self._m_types[index] = dtype
            calls.append(("output_type", object.__getattribute__(self, "name"), index, dtype.name))  # type: ignore[attr-defined]

        def __setattr__(self, name: str, value: Any) -> None:
            super().__setattr__(name, value)
            if name == "precision":
                calls.append(("precision", object.__getattribute__(self, "name"), value.name))

    Layer = gated("ILayer", _Layer)

    class _Network(Gated):
        def __init__(self, flags: int) -> None:
            self._m_flags = flags
            self._m_onnx: Path | None = None
            self._m_layers: list[Any] = []

        @property
        def num_layers(self) -> int:
            return len(self._m_layers)

        def get_layer(self, index: int) -> Any:
            return self._m_layers[index]

    Network = gated("INetworkDefinition", _Network)

    class _ParserError(Gated):
        def __init__(self, text: str) -> None:
            self._m_text = text

        def desc(self) -> str:
            return self._m_text

    ParserError = gated("ParserError", _ParserError)

    class _Parser(Gated):
        def __init__(self, network: Any, logger: Any) -> None:
            self._m_network = network
            self._m_errors: list[str] = []

        @property
        def num_errors(self) -> int:
            return len(self._m_errors)

        def get_error(self, i: int) -> Any:
            return ParserError(self._m_errors[i])

        def parse_from_file(self, path: str) -> bool:
            calls.append(("parse", Path(path).name))
            rep = check_onnx_rows(path, (row,))
            self._m_errors = [f.problem for f in rep.findings if f.check in ("op", "opset")]
            if self._m_errors:
                return False
            import onnx

            self._m_network._m_onnx = Path(path)
            self._m_network._m_layers = [Layer(n) for n in onnx.load(path, load_external_data=False).graph.node]
            return True

    Parser = gated("OnnxParser", _Parser)

    class _Builder(Gated):
        def __init__(self, logger: Any) -> None:
            object.__setattr__(self, "num_DLA_cores", dla_cores)

        def create_network(self, flags: int = 0) -> Any:
            calls.append(("network", flags))
            return Network(flags)

        def create_builder_config(self) -> Any:
            return Config()

        def create_optimization_profile(self) -> Any:
            return Profile()

        def build_serialized_network(self, network: Any, config: Any) -> bytes | None:
            dev = object.__getattribute__(config, "default_device_type")
            core = object.__getattribute__(config, "DLA_core")
            dla = getattr(dev, "name", "") == "DLA"
            calls.append(("build", "DLA" if dla else "GPU", core))
            ncf = en["NetworkDefinitionCreationFlag"]
            strongly = hasattr(ncf, "STRONGLY_TYPED") and network._m_flags & (1 << int(ncf.STRONGLY_TYPED))
            if strongly and row != "11.x" and {"FP16", "INT8"} & set(config._m_flags):
                return None  # precision flags on a strongly typed network: TensorRT refuses the build
            if network._m_onnx is None:
                return None
            plan = {"version": version, "onnx": str(network._m_onnx), "profile": config._m_profile,
                    "dla_core": int(core) if dla else None}
            return json.dumps(plan).encode()

    Builder = gated("Builder", _Builder)

    class _Context(Gated):
        def __init__(self, engine: Any) -> None:
            self._m_e = engine
            self._m_shape: tuple = ()
            self._m_addr: dict[str, int] = {}

        def set_input_shape(self, name: str, shape: Any) -> bool:
            shape = tuple(int(s) for s in shape)
            calls.append(("set_input_shape", shape))
            _, mn, _, mx = self._m_e._m_plan["profile"]
            if name != self._m_e._m_in.name or len(shape) != len(mn) or shape[1:] != tuple(mn[1:]) \
                    or not (mn[0] <= shape[0] <= mx[0]):
                return False  # outside the profile: TensorRT refuses it
            self._m_shape = shape
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            if name == self._m_e._m_in.name:
                return self._m_shape
            return (self._m_shape[0], int(self._m_e._m_out.shape[1]))

        def set_tensor_address(self, name: str, ptr: int) -> bool:
            self._m_addr[name] = int(ptr)
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            e = self._m_e
            dt = np.dtype(NP[ONNX_DT[e._m_in.type]])
            n = int(np.prod(self._m_shape)) * dt.itemsize
            x = np.frombuffer(ctypes.string_at(self._m_addr[e._m_in.name], n), dt).reshape(self._m_shape)
            y = np.ascontiguousarray(e._m_session.run(None, {e._m_in.name: x})[0], NP[ONNX_DT[e._m_out.type]])
            ctypes.memmove(self._m_addr[e._m_out.name], y.ctypes.data, y.nbytes)
            calls.append(("execute", self._m_shape[0], stream_handle))
            return True

    Context = gated("IExecutionContext", _Context)

    class _Engine(Gated):
        def __init__(self, plan: dict) -> None:
            import onnxruntime as ort

            self._m_plan = plan
            self._m_session = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
            self._m_in = self._m_session.get_inputs()[0]
            self._m_out = self._m_session.get_outputs()[0]

        @property
        def num_io_tensors(self) -> int:
            return 2

        def get_tensor_name(self, i: int) -> str:
            return [self._m_in.name, self._m_out.name][i]

        def get_tensor_mode(self, name: str) -> Member:
            return MODE.INPUT if name == self._m_in.name else MODE.OUTPUT

        def get_tensor_dtype(self, name: str) -> Member:
            t = self._m_in.type if name == self._m_in.name else self._m_out.type
            return getattr(DT, ONNX_DT[t])

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> tuple:
            _, mn, op, mx = self._m_plan["profile"]
            return (tuple(mn), tuple(op), tuple(mx))

        def create_execution_context(self) -> Any:
            return Context(self)

    Engine = gated("ICudaEngine", _Engine)

    class _Runtime(Gated):
        def __init__(self, logger: Any) -> None:
            object.__setattr__(self, "DLA_core", 0)
            if "engine_host_code_allowed" in classes["Runtime"]:
                object.__setattr__(self, "engine_host_code_allowed", False)

        def deserialize_cuda_engine(self, data: Any) -> Any:
            try:
                plan = json.loads(bytes(data))
            except ValueError:
                plan = None
            host = object.__getattribute__(self, "__dict__").get("engine_host_code_allowed")
            calls.append(("deserialize", bytes(data), host, object.__getattribute__(self, "DLA_core")))
            if not isinstance(plan, dict) or plan.get("version") != version:
                return None  # a plan of another version (or not a plan)
            if plan.get("dla_core") is not None and plan["dla_core"] != object.__getattribute__(self, "DLA_core"):
                return None  # a DLA plan on a runtime set to another core
            return Engine(plan)

    Runtime = gated("Runtime", _Runtime)

    def nptype(t: Member) -> Any:
        return NP[t.name]  # type: ignore[attr-defined]

    def dims(shape: Any) -> tuple:
        return tuple(int(s) for s in shape)

    impl = {"Logger": Logger, "Builder": Builder, "OnnxParser": Parser, "Runtime": Runtime, "nptype": nptype,
            "Dims": dims, "float32": DT.FLOAT, "float16": DT.HALF, "int8": DT.INT8}
    for k, v in impl.items():
        if k in module:
            setattr(trt, k, v)
    return trt
