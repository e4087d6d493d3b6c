#!/usr/bin/env python3
"""NVIDIA's REAL TensorRT Python bindings without TensorRT's libraries: install them, dump their API, make the mock's data.

PyPI carries NVIDIA's compiled pybind11 module alone: ``tensorrt-bindings==8.6.1`` and ``tensorrt-cu12-bindings``
10.0.1 ... 11.4.0.106 (cp311 wheels, ~1 MB each). ``tensorrt_bindings/tensorrt.so`` links libnvinfer.so.N,
libnvonnxparser.so.N, libnvinfer_plugin.so.N (and libnvparsers.so.8 on 8.6) for about a dozen entry points only
(createInferBuilder_INTERNAL, createInferRuntime_INTERNAL, createNvOnnxParser_INTERNAL, getPluginRegistry, ...:
``nm -D --undefined-only``). This tool compiles stub libraries that export exactly those symbols (returning 0/NULL;
getInferLibVersion and getNvOnnxParserVersion return the wheel's version), so the real module imports here. Every
libnvinfer factory then returns NULL, which is what TensorRT does when CUDA cannot start: ``trt.Builder``,
``trt.Runtime`` and ``trt.OnnxParser`` raise ``TypeError: pybind11::init(): factory function returned nullptr``.

Three jobs (started from /work/shared/trt-api/trt_bindings.py, which made the dumps in that folder):

* ``install``: wheel + stubs of each release into ``CACHE/<version>/`` (default ``.cache/trt-bindings`` in the
  repository, gitignored); a ``tensorrt`` shim makes ``import tensorrt`` give the real module. ``--print-env``
  prints the PYTHONPATH and LD_LIBRARY_PATH a subprocess needs (``env_for()`` from Python).
* ``dump``: ``<out>/<version>.json`` per release: every class (bases, constructor and method signatures with all
  overloads, properties read-only or writable with types, class values), every enum with its int values, the
  deprecations NVIDIA's own docstrings state, module functions, and what a few calls do with the stubs.
* ``compact``: the dumps of a folder into one file with each distinct class/enum stored once
  (tests/trt_api.json, the data tests/trt_mock.py is generated from).

Usage:
  trt_bindings.py install [--cache DIR] [--print-env] VERSION ...
  trt_bindings.py dump [--cache DIR] [--out DIR] [--all] [--no-probe] [VERSION ...]
  trt_bindings.py compact --from DIR [--out FILE]
  default versions: 8.6.1 10.0.1 10.3.0 10.8.0.43 10.13.3.9 10.16.1.11 11.0.0.114 11.4.0.106; --all: 26 releases
Needs: python3.11 (cp311 wheels; run with the interpreter that imports them), pip, gcc, nm, readelf.
"""

from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_CACHE = ROOT / ".cache" / "trt-bindings"
DEFAULT_OUT = ROOT / ".cache" / "trt-api"
DEFAULT_COMPACT = ROOT / "tests" / "trt_api.json"
DEFAULT_VERSIONS = ["8.6.1", "10.0.1", "10.3.0", "10.8.0.43", "10.13.3.9", "10.16.1.11", "11.0.0.114", "11.4.0.106"]
ALL_VERSIONS = ["8.6.1", "10.0.1", "10.1.0", "10.2.0", "10.3.0", "10.4.0", "10.5.0", "10.6.0", "10.7.0", "10.8.0.43",
                "10.9.0.34", "10.10.0.31", "10.11.0.33", "10.12.0.36", "10.13.0.35", "10.13.2.6", "10.13.3.9",
                "10.14.1.48.post1", "10.15.1.29", "10.16.0.72", "10.16.1.11", "11.0.0.114", "11.1.0.106",
                "11.2.1.2", "11.3.0.99", "11.4.0.106"]
SYSTEM_LIBS = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libdl.so.2", "libpthread.so.0",
               "librt.so.1", "ld-linux-x86-64.so.2")
# `import tensorrt` gives the real compiled module itself (NVIDIA's meta package re-exports tensorrt_bindings).
SHIM = "import sys\nimport tensorrt_bindings\nsys.modules[__name__] = tensorrt_bindings\n"


class Unreachable(RuntimeError):
    """pip could not download a wheel (no network, or PyPI unreachable)."""


def vtuple(v: str) -> tuple[int, ...]:
    return tuple(int(re.match(r"\d+", p).group()) for p in v.split(".") if re.match(r"\d+", p))


def package_of(version: str) -> str:
    return "tensorrt-bindings" if vtuple(version)[0] < 10 else "tensorrt-cu12-bindings"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# ---------------------------------------------------------------- wheel, stubs


def fetch_wheel(version: str, cache: Path) -> Path:
    wheels = cache / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    dist = package_of(version).replace("-", "_")
    pat = f"{dist}-{version}-cp311-*.whl"
    found = sorted(wheels.glob(pat))
    if not found:
        log(f"[{version}] pip download {package_of(version)}=={version}")
        try:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--only-binary=:all:", "--no-deps",
                                "--disable-pip-version-check", "--timeout", "20", "--retries", "1",
                                "--python-version", "3.11", "--platform", "manylinux_2_28_x86_64", "--platform",
                                "manylinux_2_17_x86_64", "-d", str(wheels), f"{package_of(version)}=={version}"],
                               capture_output=True, text=True, timeout=180)
        except subprocess.TimeoutExpired:
            raise Unreachable(f"pip download {package_of(version)}=={version} took over 180 s") from None
        if r.returncode:
            last = (r.stderr.strip().splitlines() or ["?"])[-1]
            raise Unreachable(f"pip download {package_of(version)}=={version} failed: {last[:200]}")
        found = sorted(wheels.glob(pat))
    if not found:
        raise SystemExit(f"{version}: no cp311 wheel of {package_of(version)} was downloaded")
    return found[0]


def extract(version: str, wheel: Path, cache: Path) -> Path:
    site = cache / version / "site"
    so = site / "tensorrt_bindings" / "tensorrt.so"
    if not so.exists():
        site.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    shim = site / "tensorrt" / "__init__.py"
    if not shim.exists():
        shim.parent.mkdir(exist_ok=True)
        shim.write_text(SHIM)
    return site


def _run(cmd: list[str]) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _system_symbols() -> set[str]:
    paths = {}
    for line in _run(["ldconfig", "-p"]).splitlines():
        m = re.match(r"\s*(\S+) \(libc6,x86-64\) => (\S+)", line)
        if m and m.group(1) in SYSTEM_LIBS:
            paths.setdefault(m.group(1), m.group(2))
    out: set[str] = set()
    for p in paths.values():
        for line in _run(["nm", "-D", "--defined-only", p]).splitlines():
            parts = line.split()
            if parts:
                out.add(parts[-1].split("@")[0])
    return out


def needed_nv_libs(so: Path) -> list[str]:
    out = _run(["readelf", "-d", str(so)])
    return [m for m in re.findall(r"Shared library: \[(\S+)\]", out) if m.startswith("libnv")]


def undefined_nv_symbols(so: Path) -> list[str]:
    system = _system_symbols()
    syms = []
    for line in _run(["nm", "-D", "--undefined-only", str(so)]).splitlines():
        parts = line.split()
        if len(parts) < 2 or parts[-2] != "U":
            continue  # weak references (w) need no definition
        name = parts[-1]
        if "@" in name or name.startswith(("Py", "_Py")) or name in system:
            continue
        syms.append(name)
    return sorted(set(syms))


def lib_for(symbol: str, libs: list[str]) -> str:
    def pick(prefix: str) -> str:
        return next((lib for lib in libs if lib.startswith(prefix + ".so")), libs[0])

    if "OnnxParser" in symbol:
        return pick("libnvonnxparser")
    if symbol == "initLibNvInferPlugins" or symbol.startswith("getCreators") or "PluginCreator" in symbol:
        return pick("libnvinfer_plugin")
    if "nvuffparser" in symbol or "nvcaffeparser" in symbol:
        return pick("libnvparsers")
    return pick("libnvinfer")


def lib_version_number(version: str) -> int:
    v = (vtuple(version) + (0, 0, 0))[:3]
    return v[0] * (1000 if v[0] < 10 else 10000) + v[1] * 100 + v[2]


def make_stubs(version: str, so: Path, cache: Path) -> tuple[Path, dict[str, list[str]]]:
    stubs = cache / version / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    libs = needed_nv_libs(so)
    syms = undefined_nv_symbols(so)
    by_lib: dict[str, list[str]] = {lib: [] for lib in libs}
    for s in syms:
        by_lib[lib_for(s, libs)].append(s)
    onnx_v = lib_version_number(version) if vtuple(version)[0] >= 10 else (vtuple(version)[0] * 10000
                                                                          + vtuple(version)[1] * 100
                                                                          + (vtuple(version) + (0, 0))[2])
    for lib, names in by_lib.items():
        src = stubs / (lib.split(".so")[0] + ".c")
        body = ["/* generated by trt_bindings.py: every entry point returns 0/NULL */"]
        for s in names:
            if s == "getInferLibVersion":
                body.append(f"int {s}(void) {{ return {lib_version_number(version)}; }}")
            elif s == "getNvOnnxParserVersion":
                body.append(f"int {s}(void) {{ return {onnx_v}; }}")
            else:
                body.append(f"void *{s}(void) {{ return 0; }}")
        src.write_text("\n".join(body) + "\n")
        out = stubs / lib
        if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
            subprocess.run(["gcc", "-shared", "-fPIC", "-O0", f"-Wl,-soname,{lib}", "-o", str(out), str(src)],
                           check=True)
    return stubs, by_lib


def stub_env(site: Path, stubs: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = str(stubs) + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    env["PYTHONPATH"] = str(site)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


# ---------------------------------------------------------------- the dump (runs inside the stubbed subprocess)

KEEP_DUNDER = ("__len__", "__getitem__", "__setitem__", "__iter__", "__eq__", "__bool__", "__buffer__")
_PREFIX = re.compile(r"\btensorrt(?:_bindings)?\.tensorrt\.")


def _clean(sig: str) -> str:
    sig = _PREFIX.sub("", sig)
    sig = re.sub(r"\(self: [\w.]+(, )?", lambda m: "(self" + (", " if m.group(1) else ""), sig)
    sig = re.sub(r"^\d+\.\s+", "", sig.strip())
    return sig


def _sigs(name: str, doc: str | None, strip_name: bool = False) -> list[str]:
    """pybind11's signature lines of ``name`` (one per overload), without the name when ``strip_name``."""
    if not doc:
        return []
    out = []
    for line in doc.splitlines():
        s = line.strip()
        if re.match(rf"^(\d+\.\s+)?{re.escape(name)}\(.*\)(\s*->\s*.+)?$", s) and "*args, **kwargs" not in s:
            s = _clean(s)
            out.append(s[len(name):] if strip_name and s.startswith(name + "(") else s)
    return out


def _prose(doc: str | None) -> str:
    """The docstring without its signature lines (pybind11 puts them first)."""
    if not doc:
        return ""
    return "\n".join(line for line in doc.splitlines() if not re.match(r"^\s*(\d+\.\s+)?\w+\(.*\)", line))[:600]


def _ret_type(doc: str | None) -> str | None:
    if not doc:
        return None
    for line in doc.splitlines():
        m = re.match(r"^\s*(?:\w+)?\(.*\)\s*->\s*(.+)$", line)
        if m:
            return _PREFIX.sub("", m.group(1).strip())
    return None


_DEP = re.compile(r"\[DEPRECATED\]|Deprecated in TensorRT|\bdeprecated\b and will be removed", re.I)
_DEP_SINCE = re.compile(r"Deprecated in TensorRT (\d+\.\d+(?:\.\d+)?)")


def _deprecated(doc: str | None) -> str | None:
    """None, or the release NVIDIA's docstring says it was deprecated in ("" when it names none).

    Only "[DEPRECATED]" / "Deprecated in TensorRT X" count, and not inside a parenthesis about another API
    (MemoryPoolType.WORKSPACE's doc mentions the deprecated IAlgorithmSelector that way)."""
    if not doc:
        return None
    doc = re.sub(r"\(\[DEPRECATED\][^)]*\)", "", doc)  # a parenthesis about another API
    m = _DEP.search(doc)
    if not m:
        return None
    since = _DEP_SINCE.search(doc[m.start():])
    return since.group(1) if since else ""


def _enum_members(obj: object) -> dict[str, int]:
    return {k: int(v) for k, v in obj.__members__.items()}  # type: ignore[attr-defined]


def _enum_deprecated(obj: object) -> dict[str, str]:
    """Members whose entry in the enum's docstring ("  NAME : doc") says deprecated: {member: since}."""
    doc = getattr(obj, "__doc__", "") or ""
    out: dict[str, str] = {}
    cur, buf = None, []
    members = set(obj.__members__)  # type: ignore[attr-defined]

    def flush() -> None:
        d = _deprecated("\n".join(buf)) if cur else None
        if cur and d is not None:
            out[cur] = d

    for line in doc.splitlines():
        m = re.match(r"^\s*(\w+)\s*:\s*(.*)$", line)
        if m and m.group(1) in members:
            flush()
            cur, buf = m.group(1), [m.group(2)]
        elif cur:
            buf.append(line)
    flush()
    return out


def _has_buffer(cls: type) -> bool:
    """Whether instances export the buffer protocol (memoryview(x) works): PyTypeObject.tp_as_buffer->bf_getbuffer."""
    import ctypes

    if sys.implementation.name != "cpython" or ctypes.sizeof(ctypes.c_void_p) != 8:
        return False
    tp_as_buffer = ctypes.c_void_p.from_address(id(cls) + 160).value  # offsetof(PyTypeObject, tp_as_buffer), 64-bit
    return bool(tp_as_buffer) and bool(ctypes.c_void_p.from_address(tp_as_buffer).value)


def _is_enum(obj: object) -> bool:
    return isinstance(obj, type) and isinstance(getattr(obj, "__members__", None), dict)


def dump_module() -> dict:
    import tensorrt_bindings as trt  # noqa: PLC0415 - the stubbed real module

    sys.modules.setdefault("tensorrt", trt)
    native = sys.modules.get("tensorrt_bindings.tensorrt")
    classes: dict = {}
    enums: dict = {}
    enum_dep: dict = {}
    functions: dict = {}
    attrs: dict = {}
    module_classes: list = []

    def own_module(t: type) -> bool:
        return (t.__module__ or "").startswith(("tensorrt", "tensorrt_bindings"))

    def do_enum(qual: str, obj: object) -> None:
        enums[qual] = _enum_members(obj)
        dep = _enum_deprecated(obj)
        if dep:
            enum_dep[qual] = dep

    def do_class(qual: str, cls: type) -> None:
        if qual in classes:
            return
        entry: dict = {"bases": [b.__name__ for b in cls.__mro__[1:] if own_module(b)]}
        if "__init__" in cls.__dict__:
            entry["init"] = _sigs("__init__", cls.__dict__["__init__"].__doc__, strip_name=True)
        if _deprecated(cls.__doc__ and cls.__doc__.split("\n\n")[0]) is not None:
            entry["deprecated"] = True
        methods, props, values, nested, dep = {}, {}, {}, {}, {}
        for klass in reversed([c for c in cls.__mro__ if own_module(c)]):
            for name, v in klass.__dict__.items():
                if (name.startswith("__") and name not in KEEP_DUNDER) or name.startswith("_pybind11"):
                    continue
                if isinstance(v, property):
                    t = _ret_type(getattr(v.fget, "__doc__", None))
                    props[name] = ("rw" if v.fset is not None else "ro") + (f" {t}" if t else "")
                    d = _deprecated(v.__doc__)
                    if d is not None:
                        dep[name] = d
                elif isinstance(v, staticmethod):
                    methods[name] = ["static " + s for s in _sigs(name, v.__func__.__doc__, strip_name=True)]
                elif isinstance(v, type):
                    if _is_enum(v):
                        do_enum(f"{qual}.{name}", v)
                        nested[name] = "enum"
                    else:
                        do_class(f"{qual}.{name}", v)
                        nested[name] = "class"
                elif inspect.isfunction(v):  # set in Python by __init__.py
                    methods[name] = [f"{inspect.signature(v)} (python)"]
                elif callable(v):
                    methods[name] = _sigs(name, v.__doc__, strip_name=True)
                    d = _deprecated(_prose(v.__doc__))
                    if d is not None:
                        dep[name] = d
                else:
                    values[name] = _value(v)
        for key, val in (("methods", methods), ("props", props), ("values", values), ("nested", nested)):
            if val:
                entry[key] = val
        if dep:
            entry["dep"] = dep
        if _has_buffer(cls):
            entry["buffer"] = True
        classes[qual] = entry

    for name in sorted(dir(trt)):
        if name.startswith("__") and name != "__version__":
            continue
        obj = getattr(trt, name)
        if isinstance(obj, type(sys)):
            continue  # ctypes, os, sys, warnings imported by __init__.py
        if isinstance(obj, type):
            if not own_module(obj):
                continue
            if _is_enum(obj):
                do_enum(name, obj)
            else:
                module_classes.append(name)
                do_class(name, obj)
                for mname, mv in obj.__dict__.items():
                    if isinstance(mv, type) and _is_enum(mv):
                        do_enum(f"{name}.{mname}", mv)
        elif inspect.isfunction(obj):
            functions[name] = [f"{name}{inspect.signature(obj)}"]
        elif callable(obj) and type(obj).__name__ == "builtin_function_or_method":
            functions[name] = _sigs(name, obj.__doc__)
        else:
            attrs[name] = _value(obj)
    return {"version": str(trt.__version__), "native_module": getattr(native, "__name__", None),
            "module": {"functions": functions, "attrs": attrs, "classes": module_classes},
            "classes": classes, "enums": enums, "enum_deprecated": enum_dep}


def _value(v: object) -> object:
    if isinstance(v, (bool, int, float, str)) and type(v) in (bool, int, float, str):
        return v
    if hasattr(type(v), "__members__"):
        return f"{type(v).__name__}.{getattr(v, 'name', v)}"
    return f"<{type(v).__name__}>"


# ---------------------------------------------------------------- runtime probes (each its own process)

PROBES: dict[str, str] = {
    "Logger()": "l = trt.Logger(); print(type(l).__name__, l.min_severity)",
    "Logger(Logger.WARNING)": "l = trt.Logger(trt.Logger.WARNING); print(l.min_severity)",
    "Builder(logger)": "b = trt.Builder(trt.Logger(trt.Logger.WARNING)); print(repr(b))",
    "Runtime(logger)": "r = trt.Runtime(trt.Logger(trt.Logger.WARNING)); print(repr(r))",
    "Refitter(None, logger)": "print(repr(trt.Refitter(None, trt.Logger())))",
    "OnnxParser(None, logger)": "print(repr(trt.OnnxParser(None, trt.Logger())))",
    "Dims([1,3,224,224])": "d = trt.Dims([1, 3, 224, 224]); print(repr(d), len(d), tuple(d), d[0])",
    "Dims((1,3,224,224))": "d = trt.Dims((1, 3, 224, 224)); print(repr(d), len(d), tuple(d))",
    "Dims(list) == tuple": "print(trt.Dims([1, 2]) == (1, 2))",
    "tuple -> Dims implicit (Dims[0:2] = (5, 6))": "d = trt.Dims([1, 2, 3]); d[0:2] = (5, 6); print(tuple(d))",
    "list -> Dims implicit (Dims[0:2] = [5, 6])": "d = trt.Dims([1, 2, 3]); d[0:2] = [5, 6]; print(tuple(d))",
    "Dims index past end": "d = trt.Dims([1, 2]); print(d[5])",
    "1 << NCF member (no int())": "print(1 << list(trt.NetworkDefinitionCreationFlag.__members__.values())[0])",
    "enum member == its int": "m = trt.TensorIOMode.INPUT; print(m == int(m), isinstance(m, int))",
    "json.dumps(Dims)": "import json; print(json.dumps(trt.Dims([1, 2])))",
    "Dims + tuple": "print(trt.Dims([1, 2]) + (3,))",
    "Logger('WARNING') (a str)": "print(trt.Logger('WARNING'))",
    "nptype(float32/float16/int8/uint8)":
        "print([trt.nptype(t).__name__ for t in (trt.float32, trt.float16, trt.int8, trt.uint8)])",
    "float32.itemsize": "print(trt.float32.itemsize)",
    "int(BuilderFlag.FP16)": "print(int(trt.BuilderFlag.FP16))",
    "1 << int(NCF.STRONGLY_TYPED)": "print(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))",
    "get_plugin_registry()": "print(repr(trt.get_plugin_registry()))",
    "init_libnvinfer_plugins(logger, '')": "print(trt.init_libnvinfer_plugins(trt.Logger(), ''))",
    "get_nv_onnx_parser_version()": "print(trt.get_nv_onnx_parser_version())",
}


def run_probes(site: Path, stubs: Path) -> dict[str, str]:
    out = {}
    env = stub_env(site, stubs)
    for label, code in PROBES.items():
        prog = ("import sys\nimport tensorrt_bindings as trt\ntry:\n    " + code.replace("; ", "\n    ")
                + "\nexcept Exception as e:\n    print(type(e).__name__ + ': ' + ' | '.join(str(e).splitlines()[:3]))"
                + "\n    sys.exit(3)\n")
        try:
            r = subprocess.run([sys.executable, "-c", prog], env=env, capture_output=True, text=True, timeout=60)
        except subprocess.TimeoutExpired:
            out[label] = "timeout"
            continue
        if r.returncode < 0:
            out[label] = f"killed by signal {-r.returncode}"
        elif r.returncode == 3:
            out[label] = "raises " + _PREFIX.sub("", r.stdout.strip())[:400]
        elif r.returncode:
            out[label] = f"exit {r.returncode}: " + _PREFIX.sub("", (r.stderr.strip().splitlines() or ["?"])[-1])[:300]
        else:
            out[label] = "ok: " + _PREFIX.sub("", r.stdout.strip())[:200]
    return out


# ---------------------------------------------------------------- install, dump, compact


def install(version: str, cache: Path = DEFAULT_CACHE) -> tuple[Path, Path, dict[str, list[str]]]:
    """Wheel, extracted module and stub libraries of ``version`` under ``cache``: (site, stubs, stubbed symbols).

    Cached: a second call downloads and compiles nothing. Raises Unreachable when pip cannot download the wheel."""
    done = cache / version / "stubs" / "stubbed.json"  # written last: the wheel, the module and the stubs are there
    if done.exists():
        return cache / version / "site", done.parent, json.loads(done.read_text())
    wheel = fetch_wheel(version, cache)
    site = extract(version, wheel, cache)
    stubs, by_lib = make_stubs(version, site / "tensorrt_bindings" / "tensorrt.so", cache)
    done.write_text(json.dumps(by_lib))
    return site, stubs, by_lib


def env_for(version: str, cache: Path = DEFAULT_CACHE) -> dict[str, str]:
    """The environment in which ``import tensorrt`` (a subprocess) gives NVIDIA's real module of ``version``."""
    site, stubs, _ = install(version, cache)
    return stub_env(site, stubs)


def dump(version: str, cache: Path = DEFAULT_CACHE, probe: bool = True) -> dict:
    """The API of the real module of ``version`` (the JSON ``dump`` writes)."""
    site, stubs, by_lib = install(version, cache)
    wheel = fetch_wheel(version, cache)
    r = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--_dump"], env=stub_env(site, stubs),
                       capture_output=True, text=True)
    if r.returncode:
        raise SystemExit(f"{version}: importing the stubbed module failed (rc {r.returncode}):\n{r.stderr[-2000:]}")
    data = json.loads(r.stdout)
    data = {"version": version, "package": f"{package_of(version)}=={version}", "wheel": wheel.name,
            "stubbed": by_lib, **{k: v for k, v in data.items() if k != "version"},
            "module_version": data["version"]}
    if probe:
        data["runtime"] = run_probes(site, stubs)
    return data


def one(version: str, cache: Path, out: Path, probe: bool) -> dict:
    data = dump(version, cache, probe)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{version}.json"
    path.write_text(json.dumps(data, sort_keys=True, separators=(",", ":")) + "\n")
    log(f"[{version}] {len(data['classes'])} classes, {len(data['enums'])} enums -> {path} "
        f"({path.stat().st_size // 1024} KiB)")
    return data


def _key(entry: object) -> str:
    return hashlib.sha1(json.dumps(entry, sort_keys=True).encode()).hexdigest()[:12]


def compact(dumps: list[dict]) -> dict:
    """Many releases' dumps as one file: each distinct class or enum entry stored once, named by its hash.

    ``releases[v]`` keeps the module, the runtime probes and, per class/enum name, the key of its entry."""
    entries: dict[str, object] = {}
    releases: dict[str, dict] = {}
    for d in sorted(dumps, key=lambda d: vtuple(d["version"])):
        rel: dict = {k: d[k] for k in ("package", "wheel", "module_version", "module", "enum_deprecated", "runtime")
                     if k in d}
        for kind in ("classes", "enums"):
            rel[kind] = {}
            for name, entry in d[kind].items():
                k = _key(entry)
                entries[k] = entry
                rel[kind][name] = k
        releases[d["version"]] = rel
    return {"generated_by": "scripts/trt_bindings.py compact, from dumps of NVIDIA's compiled bindings "
                            "(tensorrt-bindings / tensorrt-cu12-bindings wheels on PyPI)",
            "releases": releases, "entries": entries}


def expand(data: dict, version: str) -> dict:
    """One release's dump back from the compact file (the inverse of ``compact`` for that release)."""
    rel = data["releases"][version]
    out = {k: v for k, v in rel.items() if k not in ("classes", "enums")}
    for kind in ("classes", "enums"):
        out[kind] = {name: data["entries"][k] for name, k in rel[kind].items()}
    out["version"] = version
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == ["--_dump"]:
        print(json.dumps(dump_module()))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    ins = sub.add_parser("install", help="wheel + stubs into the cache; import tensorrt works with --print-env's env")
    ins.add_argument("versions", nargs="+")
    ins.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    ins.add_argument("--print-env", action="store_true", help="print PYTHONPATH and LD_LIBRARY_PATH (shell syntax)")
    dmp = sub.add_parser("dump", help="write <out>/<version>.json per release")
    dmp.add_argument("versions", nargs="*")
    dmp.add_argument("--cache", type=Path, default=DEFAULT_CACHE)
    dmp.add_argument("--out", type=Path, default=DEFAULT_OUT)
    dmp.add_argument("--all", action="store_true", help="every release on PyPI")
    dmp.add_argument("--no-probe", action="store_true", help="skip the runtime probes")
    cmp_ = sub.add_parser("compact", help="the dumps of a folder as one deduplicated file")
    cmp_.add_argument("--from", dest="src", type=Path, required=True, help="folder of <version>.json dumps")
    cmp_.add_argument("--out", type=Path, default=DEFAULT_COMPACT)
    a = ap.parse_args(argv)
    if a.cmd == "compact":
        dumps = [json.loads(f.read_text()) for f in sorted(a.src.glob("*.json"))]
        a.out.write_text(json.dumps(compact(dumps), sort_keys=True, separators=(",", ":")) + "\n")
        log(f"{len(dumps)} releases -> {a.out} ({a.out.stat().st_size // 1024} KiB)")
        return 0
    if sys.version_info[:2] != (3, 11):
        raise SystemExit("run with Python 3.11: the wheels are cp311")
    try:
        if a.cmd == "install":
            for v in a.versions:
                env = env_for(v, a.cache)
                if a.print_env:
                    print(f"# {v}\nPYTHONPATH={env['PYTHONPATH']} LD_LIBRARY_PATH={env['LD_LIBRARY_PATH']}")
            return 0
        for v in a.versions or (ALL_VERSIONS if a.all else DEFAULT_VERSIONS):  # sequential downloads and compiles
            one(v, a.cache, a.out, not a.no_probe)
    except Unreachable as e:
        raise SystemExit(f"error: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main())
