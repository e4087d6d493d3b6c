"""A ``tensorrt`` module generated from NVIDIA's compiled bindings of one release (tests/trt_api.json).

tests/trt_api.json holds what scripts/trt_bindings.py read from the real pybind11 modules of 26 releases (8.6.1,
10.0.1 … 11.4.0.106, the wheels on PyPI, imported with stub libraries). From it, per release, this module makes:

* every class, with its constructor and method signatures (all overloads) and properties (read-only or writable,
  typed); arguments are checked against the real signatures, and a wrong type raises TypeError as pybind11 does
  (``int`` takes ints, numpy ints and enum members, never floats; a ``Dims`` parameter takes a Dims, a list or a
  tuple; a class parameter refuses None; ``str`` refuses a Path);
* every enum: members are NOT ints (``1 << member`` raises TypeError, ``member == 2`` is False, ``int(member)``
  and ``operator.index(member)`` work), as the real modules showed;
* ``Dims``: not a tuple (no ``json.dumps``, no ``+``), indexable, ``==`` a list or tuple;
* ``IHostMemory``: the buffer protocol (``memoryview``), nothing else (no ``len``);
* deprecations NVIDIA's docstrings state: using one is recorded in ``trt._mock.deprecated``;
* names a release lacks raise AttributeError; classes without a Python constructor raise TypeError.

Behaviour the dumps cannot show is the mock's own, and says so (it proves our side only, never TensorRT's):

* ``Builder``, ``Runtime``, ``OnnxParser`` raise ``TypeError: pybind11::init(): factory function returned
  nullptr`` when told to (``fail={"Runtime", ...}``): what the real bindings do when libnvinfer cannot start CUDA
  (seen with the stub libraries on every release);
* ``create_execution_context()`` returns None when told to (``no_context=True``: out of GPU memory);
* the parser RECORDS the file it is given and judges nothing (``parser_errors=[...]`` makes it fail with those);
  the network gets one layer per ONNX node, named after it;
* the "plan" is JSON (ONNX path, profile, DLA core, version); the "engine" runs the ONNX with ONNX Runtime,
  reading and writing the addresses the caller set; every output of the ONNX is an output of the engine, and
  execute_async_v3 fails (False) while one of them has no address, as TensorRT's enqueue does; a plan of another
  version does not deserialize (None);
* a timing cache this mock did not write for this version comes back None from ``create_timing_cache``.
"""

from __future__ import annotations

import ctypes
import functools
import json
import re
import types
from pathlib import Path
from typing import Any

import numpy as np

NULLPTR = "pybind11::init(): factory function returned nullptr"
API_FILE = Path(__file__).with_name("trt_api.json")
NP = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
      "BOOL": np.bool_, "UINT8": np.uint8, "BF16": None, "FP8": None}
ONNX_DT = {"tensor(float)": "FLOAT", "tensor(float16)": "HALF", "tensor(uint8)": "UINT8", "tensor(int8)": "INT8"}


def _vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", v))


@functools.lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    out: dict[str, Any] = json.loads(API_FILE.read_text())
    return out


def releases() -> list[str]:
    """The releases whose real API the mock can be: 8.6.1, 10.0.1 … 11.4.0.106."""
    return sorted(_data()["releases"], key=_vtuple)


def release_of(version: str) -> str:
    """The dumped release that stands for ``version``: itself, or the one it is a build of (10.3.0.30 → 10.3.0)."""
    if version in _data()["releases"]:
        return version
    v = _vtuple(version)
    for r in releases():
        if _vtuple(r)[:3] == v[:3] or (len(v) < 3 and _vtuple(r)[: len(v)] == v):
            return r
    if v[:2] == (8, 5):
        return "8.5"
    raise KeyError(f"no dump of TensorRT {version}: one of {', '.join(releases())} (or 8.5.x)")


@functools.cache
def api(version: str) -> dict[str, Any]:
    """One release's dump (classes, enums, module, enum_deprecated, runtime probes) from tests/trt_api.json.

    8.5 has no compiled bindings on PyPI: it is 8.6.1's API without what NVIDIA's 8.5 sources lack (the 8.5 row of
    vitdeploy/core/trt_facts.json, read from release/8.5's pybind11 sources and headers), with 8.5's enum values."""
    data = _data()
    rel_name = release_of(version)
    if rel_name == "8.5":
        return _api_85()
    rel = data["releases"][rel_name]
    out = {k: v for k, v in rel.items() if k not in ("classes", "enums")}
    for kind in ("classes", "enums"):
        out[kind] = {name: data["entries"][key] for name, key in rel[kind].items()}
    return out


def _api_85() -> dict[str, Any]:
    import copy

    from vitdeploy.core import trt_table

    out = copy.deepcopy(api("8.6.1"))
    facts = trt_table.python_names("8.5")
    for cname, members in facts["classes"].items():
        entry = out["classes"].get(cname)
        if entry is None:
            continue
        keep = set(members)
        for kind in ("methods", "props", "values"):
            if kind in entry:
                entry[kind] = {k: v for k, v in entry[kind].items() if k in keep or k.startswith("__")}
    for ename, members in facts["enums"].items():
        if ename in out["enums"]:
            out["enums"][ename] = {k: v for k, v in members.items() if v is not None}
    known = set(facts["module"])
    out["module"]["classes"] = [c for c in out["module"]["classes"] if c in known or c not in facts["classes"]]
    out["module_version"] = "8.5"
    return out


# ---------------------------------------------------------------- signatures and pybind11's argument check


@functools.cache
def parse_sig(sig: str) -> tuple[list[tuple[str, str, bool]], str]:
    """'(self, name: str, x: int = 0) -> bool' → ([(name, type, has_default), ...] without self, return type)."""
    m = re.match(r"^\w*\((.*)\)\s*(?:->\s*(.+))?$", sig.strip())
    if not m:
        return [], ""
    params, depth, cur = [], 0, ""
    for ch in m.group(1):  # split on top-level commas (types and defaults may hold brackets)
        if ch in "[(<":
            depth += 1
        elif ch in "])>":
            depth -= 1
        if ch == "," and depth == 0:
            params.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        params.append(cur.strip())
    out = []
    for p in params:
        if p == "self" or p.startswith("*"):
            continue
        name, _, rest = p.partition(":")
        typ, eq, _ = rest.partition("=")
        out.append((name.strip(), typ.strip(), bool(eq)))
    return out, (m.group(2) or "").strip()


_STRIP = re.compile(r"\b(?:typing_extensions|typing|collections\.abc|nvinfer1|nvonnxparser|v_1_0|v_2_0|detail)(?:\.|::)")


def _norm(t: str) -> str:
    return _STRIP.sub("", t).strip()


class _Mismatch(Exception):
    pass


class MockModule(types.ModuleType):
    """The generated module; ``_mock`` holds the switches and what was recorded."""

    _mock: Mock


class Mock:
    """Switches and records of one generated module."""

    def __init__(self, version: str, calls: list[tuple], fail: set[str], no_context: bool,
                 parser_errors: list[str], dla_cores: int) -> None:
        self.version, self.calls, self.fail = version, calls, set(fail)
        self.no_context, self.parser_errors, self.dla_cores = no_context, list(parser_errors), dla_cores
        self.used: dict[str, int] = {}  # every API name touched: "Class.member", "Enum.MEMBER", "module.name"
        self.deprecated: list[tuple[str, str]] = []  # (name, the release NVIDIA's docstring names, or "")

    def use(self, name: str, dep: str | None = None) -> None:
        self.used[name] = self.used.get(name, 0) + 1
        if dep is not None and (name, dep) not in self.deprecated:
            self.deprecated.append((name, dep))


def fake_tensorrt(version: str, calls: list[tuple] | None = None, *, fail: set[str] | frozenset[str] = frozenset(),
                  no_context: bool = False, parser_errors: list[str] | None = None,
                  dla_cores: int = 2) -> MockModule:
    """The tensorrt module of ``version`` (one of ``releases()``); ``calls`` records what was asked.

    ``fail``: constructors ("Builder", "Runtime", "OnnxParser") that raise the nullptr TypeError (CUDA cannot
    start); ``no_context``: create_execution_context() returns None; ``parser_errors``: the parser fails with them;
    ``dla_cores``: Builder.num_DLA_cores."""
    spec = api(version)
    calls = [] if calls is None else calls
    mock = Mock(version, calls, set(fail), no_context, parser_errors or [], dla_cores)
    trt = MockModule("tensorrt")
    trt._mock = mock
    trt.__version__ = version if release_of(version) != version else spec["module_version"]  # type: ignore[attr-defined]
    enums: dict[str, type] = {}
    classes: dict[str, type] = {}
    enum_dep = spec.get("enum_deprecated", {})

    # -- enums: pybind11 enums, not ints
    class EnumMeta(type):
        def __getattribute__(cls, name: str) -> Any:
            v = type.__getattribute__(cls, name)
            if isinstance(v, EnumBase) and not name.startswith("_"):
                q = type.__getattribute__(cls, "_qual")
                mock.use(f"{q}.{name}", type.__getattribute__(cls, "_dep").get(name))
            return v

    class EnumBase(metaclass=EnumMeta):
        _qual = ""
        _dep: dict[str, str] = {}
        __slots__ = ("_name", "_value")

        def __init__(self, value: Any) -> None:
            for m in type(self).__members__.values():  # type: ignore[attr-defined]
                if m._value == value:
                    object.__setattr__(self, "_name", m._name)
                    object.__setattr__(self, "_value", m._value)
                    return
            raise TypeError(f"{type(self).__name__}: no member with value {value!r}")

        @property
        def name(self) -> str:
            return self._name

        @property
        def value(self) -> int:
            return self._value

        def __int__(self) -> int:
            return self._value

        def __index__(self) -> int:
            return self._value

        def __hash__(self) -> int:
            return hash(self._value)

        def __eq__(self, other: object) -> bool:  # pybind11: only a member of the same enum compares equal
            return type(other) is type(self) and other._value == self._value  # type: ignore[attr-defined]

        def __ne__(self, other: object) -> bool:
            return not self.__eq__(other)

        def __repr__(self) -> str:
            return f"<{type(self).__name__}.{self._name}: {self._value}>"

        def __str__(self) -> str:
            return f"{type(self).__name__}.{self._name}"

        def __setattr__(self, name: str, value: Any) -> None:
            raise AttributeError(f"'{type(self).__name__}' object attribute '{name}' is read-only")

    def make_enum(qual: str, members: dict[str, int]) -> type:
        short = qual.split(".")[-1]
        ns: dict[str, Any] = {"_qual": qual, "_dep": enum_dep.get(qual, {}), "__slots__": ()}
        if short == "DataType" and str(spec.get("runtime", {}).get("float32.itemsize", "")).startswith("ok"):
            ns["itemsize"] = property(lambda self: np.dtype(NP[self._name]).itemsize if NP.get(self._name) else
                                      {"BF16": 2, "FP8": 1}.get(self._name, 0))
        e = EnumMeta(short, (EnumBase,), ns)
        e.__qualname__ = qual
        mem = {}
        for k, v in members.items():
            m = object.__new__(e)
            object.__setattr__(m, "_name", k)
            object.__setattr__(m, "_value", int(v))
            type.__setattr__(e, k, m)
            mem[k] = m
        type.__setattr__(e, "__members__", mem)
        return e

    for qual, members in spec["enums"].items():
        same = [e for q, e in enums.items() if "." in q and "." in qual and q.split(".")[-1] == qual.split(".")[-1]
                and spec["enums"][q] == members]
        enums[qual] = same[0] if same else make_enum(qual, members)  # Logger.Severity is ILogger.Severity

    def member_of(ref: str) -> Any:
        """'DataType.FLOAT' / 'Severity.WARNING' → the member (a nested enum by its short name)."""
        ename, _, m = ref.rpartition(".")
        for q, e in enums.items():
            if (q == ename or q.split(".")[-1] == ename) and m in e.__members__:  # type: ignore[attr-defined]
                return e.__members__[m]  # type: ignore[attr-defined]
        return ref

    # -- the argument check
    def check(t: str, x: Any) -> Any:
        """``x`` as pybind11 would pass it to a parameter of type ``t``; _Mismatch when it refuses it."""
        t = _norm(t)
        if t.startswith("Optional[") and t.endswith("]"):
            return None if x is None else check(t[9:-1], x)
        if t in ("int", "SupportsInt"):
            if isinstance(x, float) or not hasattr(type(x), "__index__"):
                raise _Mismatch
            return x
        if t in ("float", "SupportsFloat"):
            if not isinstance(x, (int, float, np.number)) or isinstance(x, EnumBase):
                raise _Mismatch
            return x
        if t == "bool":
            if x is None or isinstance(x, (bool, np.bool_, int, float, np.number)) and not isinstance(x, EnumBase):
                return x
            raise _Mismatch
        if t == "str":
            if not isinstance(x, (str, bytes)):
                raise _Mismatch
            return x
        if t in ("buffer", "Buffer"):
            try:
                memoryview(x)
            except TypeError:
                raise _Mismatch from None
            return x
        if t in ("tuple", "list"):
            if type(x).__name__ != t and not isinstance(x, tuple if t == "tuple" else list):
                raise _Mismatch
            return x
        lm = re.match(r"^(?:List|list|Sequence)\[(.+)\]$", t)
        if lm:
            if isinstance(x, (str, bytes)) or not hasattr(x, "__iter__"):
                raise _Mismatch
            return [check(lm.group(1), i) for i in x]
        if t in ("Dims", "Dims32", "Dims64") and "Dims" in classes:
            if isinstance(x, classes["Dims"]):
                return x
            if isinstance(x, (list, tuple)):
                return classes["Dims"](list(x))  # pybind11's implicit conversion (real on every release)
            raise _Mismatch
        for q, e in enums.items():
            if t in (q, q.split(".")[-1]):
                if not isinstance(x, e):
                    raise _Mismatch
                return x
        if t in classes:
            if not isinstance(x, classes[t]):
                raise _Mismatch
            return x
        return x  # object, capsule and types the dumps do not name precisely: taken as is

    def bind(qual: str, sigs: list[str], args: tuple, kwargs: dict[str, Any]) -> list[Any]:
        """The first overload the arguments fit (pybind11's order), converted; TypeError like pybind11 else."""
        for sig in sigs:
            params, _ = parse_sig(sig)
            if len(args) > len(params) or any(k not in {p[0] for p in params} for k in kwargs):
                continue
            try:
                out = []
                for i, (pname, ptype, has_default) in enumerate(params):
                    if i < len(args):
                        out.append(check(ptype, args[i]))
                    elif pname in kwargs:
                        out.append(check(ptype, kwargs[pname]))
                    elif has_default:
                        out.append(None)
                    else:
                        raise _Mismatch
                return out
            except _Mismatch:
                continue
        short = qual.split(".")[-1]
        listed = "\n".join(f"    {i}. {sig}" for i, sig in enumerate(sigs, 1))
        what = "constructor arguments" if short == "__init__" else "function arguments"
        raise TypeError(f"{short}(): incompatible {what}. The following argument types are supported:\n{listed}\n\n"
                        f"Invoked with: {', '.join(map(repr, args))}")

    # -- behaviour (the mock's own; the generated classes route their API names here)
    impls = _behaviour(trt, mock, enums, classes, member_of)

    def make_method(cname: str, mname: str, sigs: list[str], dep: str | None) -> Any:
        impl = getattr(impls.get(cname), mname, None)

        def method(self: Any, *args: Any, **kwargs: Any) -> Any:
            mock.use(f"{cname}.{mname}", dep)
            bound = bind(f"{cname}.{mname}", [s for s in sigs if not s.startswith("static ")] or sigs, args, kwargs)
            if impl is None:
                raise NotImplementedError(f"trt_mock: {cname}.{mname} exists in TensorRT {version}; the mock does "
                                          "not model what it does")
            return impl(self, *bound)

        method.__name__ = mname
        return method

    def make_prop(cname: str, pname: str, desc: str, dep: str | None) -> property:
        rw, _, typ = desc.partition(" ")
        impl = getattr(impls.get(cname), pname, None)

        def get(self: Any) -> Any:
            mock.use(f"{cname}.{pname}", dep)
            if isinstance(impl, property) and impl.fget is not None:
                return impl.fget(self)
            if pname in self._m_p:
                return self._m_p[pname]
            raise NotImplementedError(f"trt_mock: {cname}.{pname} exists in TensorRT {version}; the mock has no "
                                      "value for it until it is set")

        def put(self: Any, value: Any) -> None:
            mock.use(f"{cname}.{pname}", dep)
            if typ:
                try:
                    value = check(typ, value)
                except _Mismatch:
                    raise TypeError(f"(): incompatible function arguments. The following argument types are "
                                    f"supported:\n    1. (self: {cname}, arg0: {typ}) -> None\n\nInvoked with: "
                                    f"{self!r}, {value!r}") from None
            if isinstance(impl, property) and impl.fset is not None:
                impl.fset(self, value)
                return
            self._m_p[pname] = value

        return property(get, put if rw == "rw" else None)

    def make_class(cname: str, entry: dict[str, Any]) -> type:
        base_names = [b for b in entry.get("bases", []) if b in classes]
        bases: tuple[type, ...] = tuple(classes[b] for b in base_names) or (_Object,)
        if entry.get("buffer"):
            bases = (_HostMemory, *bases)
        inits: list[str] = entry.get("init", [])
        deps: dict[str, str] = entry.get("dep", {})
        impl_cls = impls.get(cname)

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
            self._m_p = {}
            if not inits:
                raise TypeError(f"tensorrt.{cname}: No constructor defined!")
            bound = bind(f"{cname}.__init__", inits, args, kwargs)
            mock.use(f"{cname}.__init__")
            if cname in mock.fail:
                raise TypeError(NULLPTR)  # after the argument check, as the real factories
            if impl_cls is not None and hasattr(impl_cls, "init"):
                impl_cls.init(self, *bound)

        ns: dict[str, Any] = {"__init__": __init__, "_m_cls": cname, "__module__": "tensorrt"}
        for mname, sigs in entry.get("methods", {}).items():
            if mname == "__eq__":
                ns["__hash__"] = None
            ns[mname] = make_method(cname, mname, sigs, deps.get(mname))
        for pname, desc in entry.get("props", {}).items():
            ns[pname] = make_prop(cname, pname, desc, deps.get(pname))
        for vname, v in entry.get("values", {}).items():
            ns[vname] = member_of(v) if isinstance(v, str) and "." in v else v
        for nname, kind in entry.get("nested", {}).items():
            if kind == "enum" and f"{cname}.{nname}" in enums:
                ns[nname] = enums[f"{cname}.{nname}"]
        if cname == "Dims":
            ns["__repr__"] = ns["__str__"] = impls["_dims_repr"]
        c = type(cname, bases, ns)
        c.__qualname__ = cname
        return c

    pending = dict(spec["classes"])
    while pending:  # bases before the classes that derive from them
        ready = [c for c, e in pending.items() if all(b in classes or b not in pending for b in e.get("bases", []))]
        for c in ready or list(pending):
            classes[c] = make_class(c, pending.pop(c))

    for name in spec["module"]["classes"]:
        setattr(trt, name, classes[name])
    for qual, e in enums.items():
        if "." not in qual:
            setattr(trt, qual, e)
    for name, value in spec["module"]["attrs"].items():
        if name == "__version__":
            continue
        setattr(trt, name, member_of(value) if isinstance(value, str) and "." in value else value)
    for fname, sigs in spec["module"]["functions"].items():
        setattr(trt, fname, _module_function(mock, fname, sigs, getattr(impls.get("module"), fname, None), bind,
                                             version))
    return trt


def _module_function(mock: Mock, fname: str, sigs: list[str], impl: Any, bind: Any, version: str) -> Any:
    def fn(*args: Any, **kwargs: Any) -> Any:
        mock.use(f"module.{fname}")
        typed = [s[len(fname):] for s in sigs if ":" in s or s.endswith("()") or "->" in s]
        bound = bind(fname, typed, args, kwargs) if typed else list(args)
        if impl is None:
            raise NotImplementedError(f"trt_mock: tensorrt.{fname} exists in TensorRT {version}; not modelled")
        return impl(*bound)

    fn.__name__ = fname
    return fn


class _Object:
    """pybind11 objects refuse attributes their class does not define; mock state lives in ``_m_*``."""

    _m_cls = "object"

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("_m_") or isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"'tensorrt.{type(self)._m_cls}' object has no attribute '{name}'")


class _HostMemory(bytes):
    """IHostMemory: the buffer protocol (memoryview, bytes(x)) and nothing else the real class lacks."""

    def __new__(cls, data: bytes = b"") -> _HostMemory:
        return super().__new__(cls, data)

    def __init__(self, data: bytes = b"") -> None:  # the generated __init__ would refuse: no Python constructor
        object.__setattr__(self, "_m_p", {})

    def __len__(self) -> int:
        raise TypeError(f"object of type '{type(self).__name__}' has no len()")

    def __iter__(self) -> Any:
        raise TypeError(f"'{type(self).__name__}' object is not iterable")

    def __getitem__(self, i: Any) -> Any:
        raise TypeError(f"'{type(self).__name__}' object is not subscriptable")

    def __add__(self, other: Any) -> Any:
        return NotImplemented

    def __eq__(self, other: object) -> bool:
        return self is other

    __hash__ = object.__hash__

    def decode(self, *a: Any, **k: Any) -> Any:
        raise AttributeError(f"'{type(self).__name__}' object has no attribute 'decode'")


def _behaviour(trt: MockModule, mock: Mock, enums: dict[str, type], classes: dict[str, type],
               member_of: Any) -> dict[str, Any]:
    """What the mock does for the API names our code uses, class by class (names only run if the release has
    them: the generated class routes its own names here and nothing else)."""
    calls, version = mock.calls, mock.version

    def new(cname: str, **state: Any) -> Any:
        obj = object.__new__(classes[cname])
        object.__setattr__(obj, "_m_p", {})
        for k, v in state.items():
            object.__setattr__(obj, f"_m_{k}", v)
        return obj

    def host_memory(data: bytes) -> Any:
        c = classes["IHostMemory"]
        hm = c.__new__(c, data)
        object.__setattr__(hm, "_m_p", {})
        return hm

    dt = enums["DataType"]

    class Logger:
        def init(self: Any, min_severity: Any = None) -> None:
            self._m_p["min_severity"] = min_severity if min_severity is not None else member_of("Severity.WARNING")

    class Dims:
        def init(self: Any, shape: Any = None) -> None:
            object.__setattr__(self, "_m_d", [int(s) for s in (shape or [])])

        def __len__(self: Any) -> int:
            return len(self._m_d)

        def __getitem__(self: Any, i: Any) -> Any:
            if isinstance(i, slice):
                return tuple(self._m_d[i])
            if not -len(self._m_d) <= int(i) < len(self._m_d):
                raise IndexError("Out of bounds")
            return self._m_d[int(i)]

        def __setitem__(self: Any, i: Any, v: Any) -> None:
            if isinstance(i, slice):
                self._m_d[i] = [int(s) for s in v]
            else:
                self._m_d[int(i)] = int(v)

        def __eq__(self: Any, other: Any) -> bool:
            return tuple(self._m_d) == tuple(other)

    def _dims_repr(self: Any) -> str:
        d = self._m_d
        return f"({d[0]},)" if len(d) == 1 else f"({', '.join(map(str, d))})"

    class Builder:
        def init(self: Any, logger: Any) -> None:
            self._m_p["num_DLA_cores"] = mock.dla_cores

        def create_network(self: Any, flags: Any = 0) -> Any:
            calls.append(("network", int(flags or 0)))
            return new("INetworkDefinition", flags=int(flags or 0), onnx=None, layers=[])

        def create_builder_config(self: Any) -> Any:
            cfg = new("IBuilderConfig", flags=[], profile=None, cache=None)
            return cfg

        def create_optimization_profile(self: Any) -> Any:
            return new("IOptimizationProfile", shape=())

        def build_serialized_network(self: Any, network: Any, config: Any) -> Any:
            dev = config._m_p.get("default_device_type")
            dla = getattr(dev, "name", "") == "DLA"
            core = config._m_p.get("DLA_core")
            calls.append(("build", "DLA" if dla else "GPU", core))
            if network._m_onnx is None:
                return None  # nothing parsed into the network
            plan = {"version": version, "onnx": str(network._m_onnx), "profile": config._m_profile,
                    "dla_core": int(core) if dla else None, "network_flags": network._m_flags,
                    "builder_flags": list(config._m_flags)}
            return host_memory(json.dumps(plan).encode())

    class INetworkDefinition:
        num_layers = property(lambda self: len(self._m_layers))

        def get_layer(self: Any, index: Any) -> Any:
            return self._m_layers[int(index)]

    layer_kind = {"LayerNormalization": "NORMALIZATION", "Softmax": "SOFTMAX", "MatMul": "MATRIX_MULTIPLY",
                  "Gemm": "MATRIX_MULTIPLY", "Add": "ELEMENTWISE", "Sub": "ELEMENTWISE", "Mul": "ELEMENTWISE",
                  "Div": "ELEMENTWISE", "Pow": "ELEMENTWISE", "Sqrt": "UNARY", "Erf": "UNARY", "Constant": "CONSTANT",
                  "Conv": "CONVOLUTION", "Cast": "CAST"}

    def layer_of(node: Any) -> Any:
        lt = enums["LayerType"]
        kind = layer_kind.get(node.op_type, "REDUCE" if node.op_type.startswith("Reduce") else "SHUFFLE")
        layer = new("ILayer", outputs=[o for o in node.output if o])
        members = lt.__members__  # type: ignore[attr-defined]
        layer._m_p.update(name=node.name or node.output[0], type=members.get(kind, members["SHUFFLE"]))
        return layer

    def set_precision(self: Any, value: Any) -> None:
        self._m_p["precision"] = value
        calls.append(("precision", self._m_p["name"], value.name))

    class ILayer:
        num_outputs = property(lambda self: len(self._m_outputs))
        precision = property(lambda self: self._m_p.get("precision", dt.__members__["FLOAT"]),  # type: ignore[attr-defined]
                             set_precision)

        def set_output_type(self: Any, index: Any, dtype: Any) -> None:
            calls.append(("output_type", self._m_p["name"], int(index), dtype.name))

    class OnnxParser:
        def init(self: Any, network: Any, logger: Any) -> None:
            object.__setattr__(self, "_m_network", network)
            object.__setattr__(self, "_m_errors", [])

        num_errors = property(lambda self: len(self._m_errors))

        def get_error(self: Any, index: Any) -> Any:
            return new("ParserError", text=self._m_errors[int(index)])

        def parse_from_file(self: Any, model: Any) -> bool:
            import onnx

            calls.append(("parse", Path(model).name))  # recorded, not judged
            if mock.parser_errors:
                object.__setattr__(self, "_m_errors", list(mock.parser_errors))
                return False
            net = self._m_network
            object.__setattr__(net, "_m_onnx", Path(model))
            object.__setattr__(net, "_m_layers", [layer_of(n) for n in onnx.load(model, load_external_data=False)
                                                  .graph.node])
            return True

    class ParserError:
        def desc(self: Any) -> str:
            return str(self._m_text)

    class IOptimizationProfile:
        def set_shape(self: Any, input: Any, min: Any, opt: Any, max: Any) -> None:  # noqa: A002 - real names
            object.__setattr__(self, "_m_shape", (input, tuple(min), tuple(opt), tuple(max)))

    cache_bytes = f"TIMING-CACHE {version}".encode()

    class IBuilderConfig:
        def set_memory_pool_limit(self: Any, pool: Any, pool_size: Any) -> None:
            calls.append(("pool", pool.name, int(pool_size)))

        def set_flag(self: Any, flag: Any) -> None:
            self._m_flags.append(flag.name)
            calls.append(("flag", flag.name))

        def add_optimization_profile(self: Any, profile: Any) -> int:
            object.__setattr__(self, "_m_profile", profile._m_shape)
            calls.append(("profile", profile._m_shape))
            return 0

        def create_timing_cache(self: Any, serialized_timing_cache: Any) -> Any:
            data = bytes(serialized_timing_cache)
            calls.append(("cache-in", data))
            if data and data != cache_bytes:
                return None  # the mock's stand-in for a cache of another device or version
            return new("ITimingCache")

        def set_timing_cache(self: Any, cache: Any, ignore_mismatch: Any) -> bool:
            object.__setattr__(self, "_m_cache", cache)
            return True

        def get_timing_cache(self: Any) -> Any:
            return self._m_cache

    class ITimingCache:
        def serialize(self: Any) -> Any:
            return host_memory(cache_bytes)

    class Runtime:
        def deserialize_cuda_engine(self: Any, serialized_engine: Any) -> Any:
            data = bytes(serialized_engine)
            host = self._m_p.get("engine_host_code_allowed")
            core = self._m_p.get("DLA_core")
            calls.append(("deserialize", data, host, core))
            try:
                plan = json.loads(data)
            except ValueError:
                return None
            if not isinstance(plan, dict) or plan.get("version") != version:
                return None  # a plan of another version (or not a plan)
            if plan.get("dla_core") is not None and plan["dla_core"] != core:
                return None  # a DLA plan on a runtime set to another core
            import onnxruntime as ort

            sess = ort.InferenceSession(plan["onnx"], providers=["CPUExecutionProvider"])
            return new("ICudaEngine", plan=plan, session=sess, inp=sess.get_inputs()[0], outs=sess.get_outputs())

    def dims(shape: Any) -> Any:
        return classes["Dims"](list(shape))

    def tensor(engine: Any, name: Any) -> Any:
        """The ONNX input or output an engine's I/O tensor name stands for (every output of the graph is one)."""
        return next(t for t in (engine._m_inp, *engine._m_outs) if t.name == name)

    class ICudaEngine:
        num_io_tensors = property(lambda self: 1 + len(self._m_outs))

        def get_tensor_name(self: Any, index: Any) -> str:
            return str([self._m_inp.name, *(o.name for o in self._m_outs)][int(index)])

        def get_tensor_mode(self: Any, name: Any) -> Any:
            mode = enums["TensorIOMode"].__members__  # type: ignore[attr-defined]
            return mode["INPUT"] if name == self._m_inp.name else mode["OUTPUT"]

        def get_tensor_dtype(self: Any, name: Any) -> Any:
            t = tensor(self, name).type
            return dt.__members__[ONNX_DT[t]]  # type: ignore[attr-defined]

        def get_tensor_profile_shape(self: Any, name: Any, profile_index: Any) -> list:
            _, mn, op, mx = self._m_plan["profile"]
            return [dims(mn), dims(op), dims(mx)]

        def create_execution_context(self: Any, *_: Any) -> Any:
            if mock.no_context:
                return None  # what TensorRT returns when it cannot allocate the context (out of GPU memory)
            return new("IExecutionContext", engine=self, shape=(), addr={})

    class IExecutionContext:
        def set_input_shape(self: Any, name: Any, shape: Any) -> bool:
            shape = tuple(int(s) for s in shape)
            calls.append(("set_input_shape", shape))
            e = self._m_engine
            _, mn, _, mx = e._m_plan["profile"]
            if name != e._m_inp.name or len(shape) != len(mn) or shape[1:] != tuple(mn[1:]) \
                    or not (mn[0] <= shape[0] <= mx[0]):
                return False  # outside the profile
            object.__setattr__(self, "_m_shape", shape)
            return True

        def get_tensor_shape(self: Any, name: Any) -> Any:
            e = self._m_engine
            if name == e._m_inp.name:
                return dims(self._m_shape)
            return dims((self._m_shape[0], *(int(d) for d in tensor(e, name).shape[1:])))

        def set_tensor_address(self: Any, name: Any, memory: Any) -> bool:
            self._m_addr[name] = int(memory)
            return True

        def execute_async_v3(self: Any, stream_handle: Any) -> bool:
            e = self._m_engine
            in_t = np.dtype(NP[ONNX_DT[e._m_inp.type]])
            n = int(np.prod(self._m_shape)) * in_t.itemsize
            x = np.frombuffer(ctypes.string_at(self._m_addr[e._m_inp.name], n), in_t).reshape(self._m_shape)
            missing = [o.name for o in e._m_outs if o.name not in self._m_addr]
            if missing:  # NvInferRuntime.h (10.16, IExecutionContext::setTensorAddress): "Before calling enqueueV3(), each
                # input must have a non-null address and each output must have a non-null address or an IOutputAllocator"
                calls.append(("execute-refused", tuple(missing)))
                return False
            for o, y in zip(e._m_outs, e._m_session.run(None, {e._m_inp.name: x}), strict=True):
                y = np.ascontiguousarray(y, NP[ONNX_DT[o.type]])
                ctypes.memmove(self._m_addr[o.name], y.ctypes.data, y.nbytes)
            calls.append(("execute", self._m_shape[0], int(stream_handle)))
            return True

    class module:  # noqa: N801 - the module-level functions
        @staticmethod
        def nptype(trt_type: Any) -> Any:
            if not isinstance(trt_type, dt) or NP.get(trt_type.name) is None:
                raise TypeError(f"Could not resolve TensorRT datatype to an equivalent numpy datatype. {trt_type}")
            return NP[trt_type.name]

    out = {"Logger": Logger, "Dims": Dims, "Builder": Builder, "INetworkDefinition": INetworkDefinition,
           "ILayer": ILayer, "OnnxParser": OnnxParser, "ParserError": ParserError,
           "IOptimizationProfile": IOptimizationProfile, "IBuilderConfig": IBuilderConfig,
           "ITimingCache": ITimingCache, "Runtime": Runtime, "ICudaEngine": ICudaEngine,
           "IExecutionContext": IExecutionContext, "module": module}
    # Dims' repr is what the real one prints; its dunders are API names of the dump (routed like the others)
    out["_dims_repr"] = _dims_repr
    return out
