#!/usr/bin/env python3
"""Extract what each TensorRT line can do from NVIDIA's own sources; writes vitdeploy/core/trt_facts.json.

Run by hand where the sources are (git directories, no work tree needed)::

    python scripts/extract_trt_facts.py --tensorrt /path/NVIDIA+TensorRT/repo \
        --onnx-tensorrt /path/onnx+onnx-tensorrt/repo [--operators-md 10.15=/path/operators.md] [-o FILE]

Per release branch ``release/X.Y`` of NVIDIA/TensorRT it reads
  python/src/**/*.cpp            the pybind11 names (classes, their members, enums and their members),
  python/packaging/**/__init__.py module-level Python names (nptype),
  include/*.h                    the numeric values of the enums,
  samples/common/sampleOptions.cpp  the options trtexec parses (its own option structs only),
and the onnx-tensorrt commit that branch's ``parsers/onnx`` submodule points at: docs/operators.md (max opset,
per-operator support, types, restrictions) and the importer sources (whether a LayerNormalization importer exists).
Where that commit is not in the onnx-tensorrt mirror, ``--operators-md VERSION=FILE`` may supply a copy of that
release's operators.md read elsewhere (the JSON says so); otherwise the parser facts of that release are
"unconfirmed". Facts that no repository file states (which releases have DLA) are entered below with their
source named, never guessed. Release rows merge their releases conservatively (a name exists only if it exists
in every release read; an op is supported only if every list read supports it).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

TRT_REPO = "NVIDIA/TensorRT"
OTRT_REPO = "onnx/onnx-tensorrt"

# The rows of the version table: which release branches each one covers.
ROWS: dict[str, list[str]] = {
    "8.5": ["8.5"],
    "8.6": ["8.6"],
    "9.x": ["9.0", "9.1", "9.2", "9.3"],
    "10.0-10.7": ["10.0", "10.1", "10.2", "10.3", "10.4", "10.5", "10.6", "10.7"],
    "10.8+": ["10.8", "10.9", "10.10", "10.11", "10.12", "10.13", "10.14", "10.15", "10.16"],
    "11.x": ["11.0", "11.1"],
}

# What no file in these repositories states: DLA availability per release line is a platform fact of NVIDIA's
# release notes (JetPack), entered here by hand with its source named.
DLA_SOURCE = ("NVIDIA TensorRT release notes / JetPack support (quoted in shared/TENSORRT.md): 10.7 was the last "
              "10.x with DLA; 11.0-11.3 have none; 11.4.1+ on JetPack 7.2.2+ only; not read from a repository file")
DLA: dict[str, Any] = {
    "8.5": True,  # JetPack 5.1.x (Xavier, Orin)
    "8.6": True,  # JetPack 6.0 (Orin)
    "9.x": "unconfirmed",  # no JetPack shipped 9.x
    "10.0-10.7": True,  # JetPack 6.1/6.2 ship 10.3
    "10.8+": False,
    "11.x": False,  # 11.0-11.3; 11.4.1+ on JetPack 7.2.2+ only (outside the branches read here)
}

# Python classes and enums whose members the table keeps (what vitdeploy's builder, runners and mock touch).
KEEP_CLASSES = {"Builder", "IBuilderConfig", "INetworkDefinition", "OnnxParser", "ParserError", "Runtime", "ICudaEngine",
                "IExecutionContext", "IOptimizationProfile", "ITimingCache", "ILayer", "ITensor", "ILogger", "Logger",
                "Dims", "IHostMemory", "IEngineInspector"}
KEEP_ENUMS = {"BuilderFlag", "NetworkDefinitionCreationFlag", "DeviceType", "MemoryPoolType", "TensorIOMode",
              "DataType", "ILogger.Severity", "LayerType", "ProfilingVerbosity", "LayerInformationFormat"}
# trtexec's option structs (sampleOptions.cpp): the safety/inference-task tools parse their own options elsewhere.
TRTEXEC_STRUCTS = {"BaseModelOptions", "UffInput", "ModelOptions", "BuildOptions", "SystemOptions", "InferenceOptions",
                   "ReportingOptions", "AllOptions", "TuningOptions"}
OPERATORS_OF_INTEREST = None  # all operators are kept


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          errors="replace").stdout


def git_ok(repo: Path, *args: str) -> bool:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True).returncode == 0


def show(repo: Path, ref: str, path: str) -> str | None:
    try:
        return git(repo, "show", f"{ref}:{path}")
    except subprocess.CalledProcessError:
        return None


def ls(repo: Path, ref: str, under: str) -> list[str]:
    args = ["ls-tree", "-r", "--name-only", ref] + ([under] if under else [])
    return [p for p in git(repo, *args).splitlines() if p]


# ---------------------------------------------------------------- C++ text helpers


def strip_comments(src: str) -> str:
    src = re.sub(r"/\*.*?\*/", " ", src, flags=re.S)
    src = re.sub(r"//[^\n]*", " ", src)
    # Code under `#if ENABLE_INETWORK_SERIALIZE` is not compiled into NVIDIA's bindings: INetworkDefinition.serialize
    # exists in no compiled release (tests/trt_api.json, the dumps of the real modules 8.6.1 … 11.4.0.106).
    return re.sub(r"#if\s+ENABLE_INETWORK_SERIALIZE\b.*?#endif", " ", src, flags=re.S)


def statements(src: str) -> list[str]:
    """Split C++ into statements at ';' and block braces outside parentheses, skipping string literals.

    A brace right after a name (``binding{m, "ILogger"}``) is an initializer and kept inside its statement.
    """
    out, stack, start, i, n = [], [], 0, 0, len(src)
    while i < n:
        c = src[i]
        if c == '"' or c == "'":
            j = i + 1
            while j < n and src[j] != c:
                j += 2 if src[j] == "\\" else 1
            i = j + 1
            continue
        if c in "([":
            stack.append(c)
        elif c == "{":
            before = src[max(0, i - 80):i]
            block = re.search(r"(\b(namespace|struct|class|union)\s+\w+|\b(const|override|noexcept|else|do|try|final|mutable))\s*$",
                              before)
            if stack or (re.search(r"\w\s*$", before) and not block):
                stack.append(c)
            else:
                out.append(src[start:i])
                start = i + 1
        elif c in ")]}":
            if stack:
                stack.pop()
            elif c == "}":
                out.append(src[start:i])
                start = i + 1
        elif c == ";" and not stack:
            out.append(src[start:i])
            start = i + 1
        i += 1
    out.append(src[start:])
    return [s.strip() for s in out if s.strip()]


MEMBER = re.compile(r"\.(def|def_property|def_property_readonly|def_readwrite|def_readonly|def_static|value)\s*\(\s*\"(\w+)\"")
DECL = re.compile(r"py::(class_|enum_)\s*<\s*([\w:]+)([^>]*(?:<[^>]*>[^>]*)*)>\s*(\w+)?\s*[({]\s*(\w+)\s*,\s*\"(\w+)\"")
VALUE_MAP = re.compile(r"\.value\s*\(\s*\"(\w+)\"\s*,\s*([\w:]+)")


def pybind_names(sources: list[str]) -> dict[str, Any]:
    """Classes (with inherited members), enums (python member -> C++ enumerator) and module functions."""
    classes: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    enums: dict[str, dict[str, str]] = {}
    enum_cpp: dict[str, str] = {}
    cpp_to_py: dict[str, str] = {}
    var_to_py: dict[str, str] = {}
    module_funcs: set[str] = set()
    for src in sources:
        for st in statements(strip_comments(src)):
            m = DECL.search(st)
            if m and st.lstrip().startswith(("py::", "auto")) or (m and st.find("py::") < 40 and m.start() < 80):
                assert m is not None
                kind, cpp, rest, var, parent, pyname = m.groups()
                if parent != "m":  # a nested enum/class: Parent.Name
                    pyname = f"{var_to_py.get(parent, parent)}.{pyname}"
                cpp_to_py[cpp.split("::")[-1]] = pyname
                cpp_to_py[cpp] = pyname
                if var:
                    var_to_py[var] = pyname
                vm = re.match(r"\s*(?:auto\s+)?(\w+)\s*=\s*py::", st)
                if vm:
                    var_to_py[vm.group(1)] = pyname
                body = st[m.end():]
                if kind == "enum_":
                    values = {name: cpp_name.split("::")[-1] for name, cpp_name in VALUE_MAP.findall(body)}
                    enums.setdefault(pyname, {}).update(values)
                    enum_cpp[pyname] = cpp
                    if ".export_values()" in body and "." in pyname:  # members also on the parent class
                        classes.setdefault(pyname.rsplit(".", 1)[0], set()).update(values)
                else:
                    classes.setdefault(pyname, set()).update(n for _, n in MEMBER.findall(body))
                    bases[pyname] = [b.strip().split("::")[-1] for b in rest.split(",") if b.strip()]
                continue
            module_funcs.update(re.findall(r"\bm\.attr\(\s*\"(\w+)\"\s*\)", st))  # m.attr("float32") = ...
            vm = re.match(r"\s*(\w+)\s*\.\s*(def|value|def_property|def_property_readonly|def_readwrite|def_static)\b", st)
            if vm and vm.group(1) == "m":
                module_funcs.update(n for _, n in MEMBER.findall("." + st.split(".", 1)[1]))
            elif vm and vm.group(1) in var_to_py:
                py = var_to_py[vm.group(1)]
                if py in enums:
                    enums[py].update({a: b.split("::")[-1] for a, b in VALUE_MAP.findall(st)})
                else:
                    classes.setdefault(py, set()).update(n for _, n in MEMBER.findall(st))
    # inherited members (Logger inherits ILogger's Severity values and methods)
    resolved: dict[str, set[str]] = {}

    def members(c: str, seen: frozenset[str] = frozenset()) -> set[str]:
        if c in resolved:
            return resolved[c]
        out = set(classes.get(c, set()))
        for b in bases.get(c, []):
            pb = cpp_to_py.get(b)
            if pb and pb != c and pb not in seen:
                out |= members(pb, seen | {c})
        resolved[c] = out
        return out

    all_classes = {c: sorted(members(c)) for c in classes}
    return {"classes": all_classes, "enums": enums, "enum_cpp": enum_cpp, "module": sorted(module_funcs)}


def header_enums(headers: list[str]) -> dict[str, dict[str, int | None]]:
    """enum class NAME : T { kA = 0, kB, ... } -> {NAME: {kA: 0, kB: 1}} (None where the value is an expression)."""
    out: dict[str, dict[str, int | None]] = {}
    for text in headers:
        text = strip_comments(text)
        for m in re.finditer(r"enum\s+class\s+(\w+)\s*(?::\s*[\w:]+)?\s*\{(.*?)\}", text, flags=re.S):
            name, body = m.group(1), m.group(2)
            vals: dict[str, int | None] = {}
            nxt: int | None = 0
            for item in body.split(","):
                item = re.sub(r"\bTRT_\w+\b(\([^)]*\))?", " ", item).strip()
                if not item:
                    continue
                im = re.match(r"(\w+)\s*(?:=\s*(.+))?$", item, flags=re.S)
                if not im:
                    continue
                key, expr = im.group(1), (im.group(2) or "").strip()
                if expr:
                    try:
                        v: int | None = int(expr, 0)
                    except ValueError:
                        v = vals.get(expr)
                else:
                    v = nxt
                vals[key] = v
                nxt = v + 1 if v is not None else None
            out.setdefault(name, vals)
    return out


def trtexec_flags(src: str) -> list[str]:
    """The --options parsed inside trtexec's option structs' parse() functions."""
    flags: set[str] = set()
    parts = re.split(r"\n(?=void\s+\w+::parse\s*\(\s*Arguments)", src)
    for part in parts:
        m = re.match(r"void\s+(\w+)::parse", part)
        if not m or m.group(1) not in TRTEXEC_STRUCTS:
            continue
        body = part.split("\n}\n", 1)[0]
        flags.update(re.findall(r"\"(--[A-Za-z][\w-]*)\"", strip_comments(body)))
    return sorted(flags)


# ---------------------------------------------------------------- onnx-tensorrt


def parse_operators_md(text: str) -> dict[str, Any]:
    m = re.search(r"supports operators (?:up to Opset (\d+)|in the inclusive range of opset (\d+) to opset (\d+))",
                  text, flags=re.I)
    max_opset = int(m.group(1) or m.group(3)) if m else None
    ops: dict[str, Any] = {}
    for line in text.splitlines():
        if not line.startswith("|") or line.startswith("|--") or "Operator" in line.split("|")[1]:
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 2 or not re.match(r"^[A-Z]\w*$", cells[0]):
            continue
        supported = cells[1].upper().startswith("Y")
        types = [t.strip() for t in cells[2].split(",") if t.strip()] if len(cells) > 2 and supported else []
        restr = cells[3].strip() if len(cells) > 3 else ""
        ops[cells[0]] = {"supported": supported, "types": types, "restrictions": restr}
    return {"max_opset": max_opset, "ops": ops}


def importer_facts(repo: Path, commit: str) -> dict[str, bool | None]:
    """From the importer sources: a LayerNormalization importer; Q/DQ scales read as float16 (half) values."""
    files = [p for p in ls(repo, commit, "") if re.search(r"(builtin_op_importers|onnxOpImporters)\.cpp$", p)]
    if not files:
        return {"layernorm_importer": None, "fp16_dq_scales": None}
    text = "".join(show(repo, commit, p) or "" for p in files)
    return {
        "layernorm_importer": bool(re.search(r"DEFINE_BUILTIN_OP_IMPORTER\s*\(\s*LayerNormalization\s*\)", text)),
        "fp16_dq_scales": bool(re.search(r"static_cast<half_float::half const\s*\*>\s*\(\s*scale\.values", text)),
    }


# ---------------------------------------------------------------- one release


def release_facts(trt: Path, otrt: Path | None, ver: str, extra_ops: dict[str, Path]) -> dict[str, Any] | None:
    ref = f"release/{ver}"
    if not git_ok(trt, "rev-parse", "--verify", "-q", ref):
        return None
    commit = git(trt, "rev-parse", ref).strip()
    src = lambda p: f"{TRT_REPO}@{ref} ({commit[:10]}) {p}"  # noqa: E731
    cpp = [p for p in ls(trt, ref, "python/src") if p.endswith(".cpp")]
    names = pybind_names([show(trt, ref, p) or "" for p in cpp])
    inits = [p for p in ls(trt, ref, "python/packaging") if p.endswith("tensorrt/__init__.py")]
    module_py: set[Any] = set()
    for p in inits:
        module_py.update(re.findall(r"^def (\w+)\(|^(__version__)\s*=", show(trt, ref, p) or "", flags=re.M))
    headers = [show(trt, ref, p) or "" for p in ls(trt, ref, "include") if p.endswith(".h")]
    hvals = header_enums(headers)
    enums: dict[str, dict[str, int | None]] = {}
    for pyname, members in names["enums"].items():
        if pyname not in KEEP_ENUMS:
            continue
        cpp_name = names["enum_cpp"][pyname].split("::")[-1]
        hv = hvals.get(cpp_name, {})
        enums[pyname] = {py: hv.get(k) for py, k in sorted(members.items())}
    classes = {c: m for c, m in names["classes"].items() if c in KEEP_CLASSES}
    opts = show(trt, ref, "samples/common/sampleOptions.cpp") or ""
    facts: dict[str, Any] = {
        "branch": ref, "commit": commit,
        "python": {"classes": classes, "enums": enums,
                   # `from .tensorrt import *` in the package's __init__.py skips _names (m.add_object("_plugin_registry")
                   # stays on the native module): the dumps of the compiled releases have none on `tensorrt`
                   "module": sorted(n for n in set(names["module"]) | {a or b for a, b in module_py}
                                    | set(classes) | {e for e in names["enums"] if "." not in e}
                                    if not n.startswith("_") or n.startswith("__")),
                   "source": src("python/src/**/*.cpp (pybind11), include/*.h (enum values), "
                                 "python/packaging/**/tensorrt/__init__.py")},
        "trtexec": {"flags": trtexec_flags(opts), "source": src("samples/common/sampleOptions.cpp")},
    }
    # the ONNX parser: the submodule commit this branch pins
    sub = git(trt, "ls-tree", ref, "parsers/onnx").split()
    pin = sub[2] if len(sub) >= 3 else None
    parser: dict[str, Any] = {"commit": pin, "read": False}
    if otrt is not None and pin and git_ok(otrt, "cat-file", "-e", f"{pin}^{{commit}}"):
        md = show(otrt, pin, "docs/operators.md")
        if md:
            parser.update(parse_operators_md(md))
            parser["read"] = True
            parser["source"] = f"{OTRT_REPO}@{pin[:10]} (pinned by {ref} parsers/onnx) docs/operators.md"
        parser.update(importer_facts(otrt, pin))
        parser["importer_source"] = f"{OTRT_REPO}@{pin[:10]} builtin_op_importers.cpp / onnxOpImporters.cpp"
    elif ver in extra_ops:
        parser.update(parse_operators_md(extra_ops[ver].read_text()))
        parser["read"] = True
        parser["source"] = (f"{OTRT_REPO} docs/operators.md for TensorRT {ver} (a copy read from a stored index; "
                            f"the pinned commit {pin[:10] if pin else '?'} is not in the mirror)")
        parser["layernorm_importer"] = None
        parser["fp16_dq_scales"] = None
    else:
        parser["source"] = (f"unconfirmed: {ref} pins {OTRT_REPO}@{pin[:10] if pin else '?'}, "
                            "which was not in the mirror read")
    facts["parser"] = parser
    return facts


# ---------------------------------------------------------------- rows


def fact(value: Any, source: str) -> dict[str, Any]:
    return {"value": value, "source": source}


def merge_ops(lists: list[dict[str, Any]]) -> dict[str, Any]:
    """An op is supported only if every list read supports it; its types are the intersection."""
    names = set().union(*(set(x) for x in lists)) if lists else set()
    out = {}
    for op in sorted(names):
        entries = [x.get(op) for x in lists]
        ok = all(e is not None and e["supported"] for e in entries)
        types = sorted(set.intersection(*(set(e["types"]) for e in entries if e))) if ok else []
        restr = sorted({e["restrictions"] for e in entries if e and e["restrictions"]})
        out[op] = {"supported": ok, "types": types, "restrictions": restr}
    return out


def row_facts(row: str, rels: dict[str, dict[str, Any]]) -> dict[str, Any]:
    read = [v for v in ROWS[row] if v in rels]
    missing = [v for v in ROWS[row] if v not in rels]
    parsed = [v for v in read if rels[v]["parser"]["read"]]
    unparsed = [v for v in ROWS[row] if v not in parsed]
    note = (f"read at {', '.join(parsed)}" if parsed else "no parser source read") + (
        f"; not read at {', '.join(unparsed)} (unconfirmed there)" if unparsed else "")
    psrc = "; ".join(rels[v]["parser"].get("source", "") for v in parsed) or "unconfirmed"
    opsets = [rels[v]["parser"].get("max_opset") for v in parsed]
    max_opset = min(o for o in opsets if o) if any(opsets) else "unconfirmed"
    ops = merge_ops([rels[v]["parser"]["ops"] for v in parsed]) if parsed else {}
    ln_imp = [rels[v]["parser"].get("layernorm_importer") for v in parsed]
    ln_doc = ops.get("LayerNormalization", {}).get("supported") if ops else None
    if not parsed:
        layernorm: Any = "unconfirmed"
    elif all(x is True for x in ln_imp if x is not None) and ln_doc:
        layernorm = True
    elif ln_doc is False or any(x is False for x in ln_imp):
        layernorm = False
    else:
        layernorm = "unconfirmed"
    imp_read = [v for v in parsed if rels[v]["parser"].get("fp16_dq_scales") is not None]
    fp16_scales: Any = all(rels[v]["parser"]["fp16_dq_scales"] for v in imp_read) if imp_read else "unconfirmed"
    dq_types = ops.get("DequantizeLinear", {}).get("types") if ops else None
    py = [rels[v]["python"] for v in read]
    classes: dict[str, list[str]] = {}
    for c in sorted(set().union(*(set(p["classes"]) for p in py)) if py else []):
        sets = [set(p["classes"].get(c, [])) if c in p["classes"] else None for p in py]
        classes[c] = sorted(set.intersection(*[s for s in sets if s is not None])) if all(s is not None for s in sets) else []
        if not all(s is not None for s in sets):
            classes.pop(c)
    enums: dict[str, dict[str, Any]] = {}
    for e in sorted(set().union(*(set(p["enums"]) for p in py)) if py else []):
        if not all(e in p["enums"] for p in py):
            continue
        common = set.intersection(*(set(p["enums"][e]) for p in py))
        vals = {}
        for mname in sorted(common):
            vs = {p["enums"][e][mname] for p in py}
            vals[mname] = vs.pop() if len(vs) == 1 else "varies: " + ", ".join(
                f"{v}={rels[v]['python']['enums'][e][mname]}" for v in read)
        enums[e] = vals
    module = sorted(set.intersection(*(set(p["module"]) for p in py))) if py else []
    flags = sorted(set.intersection(*(set(rels[v]["trtexec"]["flags"]) for v in read))) if read else []
    pysrc = "; ".join(rels[v]["python"]["source"] for v in read)
    tsrc = "; ".join(rels[v]["trtexec"]["source"] for v in read)
    bf = enums.get("BuilderFlag", {})
    ncf = enums.get("NetworkDefinitionCreationFlag", {})
    build_only = "--skipInference" if "--skipInference" in flags else ("--buildOnly" if "--buildOnly" in flags else "unconfirmed")
    strongly = "STRONGLY_TYPED" in ncf
    # 11: STRONGLY_TYPED is deprecated and ignored, every network is strongly typed (include/NvInfer.h 11.x)
    return {
        "releases": ROWS[row], "releases_read": read, "releases_missing": missing,
        "max_opset": fact(max_opset, psrc + f" ({note})"),
        "layernorm_importer": fact(layernorm, psrc + "; importers: " + "; ".join(
            str(rels[v]["parser"].get("importer_source", "importer not read")) for v in parsed) + f" ({note})"),
        "dq_types": fact(dq_types if dq_types is not None else "unconfirmed", psrc),
        "fp16_dq_scales": fact(fp16_scales, "; ".join(
            str(rels[v]["parser"].get("importer_source")) for v in imp_read) + " (scale.values read as half_float::half)"
            + (f"; importer not read at {', '.join(v for v in ROWS[row] if v not in imp_read)}" if len(imp_read) < len(ROWS[row]) else "")
            if imp_read else "unconfirmed: no importer source read for this row"),
        "strongly_typed": fact(strongly, pysrc + " (NetworkDefinitionCreationFlag.STRONGLY_TYPED)"),
        "explicit_batch_flag": fact("EXPLICIT_BATCH" in ncf, pysrc + " (NetworkDefinitionCreationFlag.EXPLICIT_BATCH)"),
        "fp16_flag": fact("FP16" in bf, pysrc + " (BuilderFlag.FP16)"),
        "int8_flag": fact("INT8" in bf, pysrc + " (BuilderFlag.INT8)"),
        "obey_precision_constraints": fact("OBEY_PRECISION_CONSTRAINTS" in bf, pysrc + " (BuilderFlag)"),
        "version_compatible": fact("VERSION_COMPATIBLE" in bf, pysrc + " (BuilderFlag)"),
        "dla": fact(DLA[row], DLA_SOURCE),
        "trtexec_build_only": fact(build_only, tsrc),
        "trtexec_flags": fact(flags, tsrc),
        "python": fact({"classes": classes, "enums": enums, "module": module}, pysrc),
        "onnx_ops": fact(ops if parsed else "unconfirmed", psrc + f" ({note})"),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tensorrt", type=Path, required=True, help="git dir of NVIDIA/TensorRT (release/* branches)")
    ap.add_argument("--onnx-tensorrt", type=Path, help="git dir of onnx/onnx-tensorrt")
    ap.add_argument("--operators-md", action="append", default=[], metavar="VERSION=FILE",
                    help="operators.md of a release whose pinned onnx-tensorrt commit is not in the mirror")
    ap.add_argument("-o", "--out", type=Path, default=Path(__file__).resolve().parent.parent / "vitdeploy/core/trt_facts.json")
    a = ap.parse_args(argv)
    extra = {}
    for item in a.operators_md:
        v, _, p = item.partition("=")
        extra[v] = Path(p)
    rels: dict[str, dict[str, Any]] = {}
    for vers in ROWS.values():
        for v in vers:
            f = release_facts(a.tensorrt, a.onnx_tensorrt, v, extra)
            if f is not None:
                rels[v] = f
                print(f"release/{v}: {len(f['trtexec']['flags'])} trtexec flags, parser "
                      f"{'read' if f['parser']['read'] else 'not read'}", file=sys.stderr)
    out = {
        "generated_by": "scripts/extract_trt_facts.py",
        "sources": {"tensorrt": TRT_REPO, "onnx_tensorrt": OTRT_REPO},
        "releases": {v: {"branch": f["branch"], "commit": f["commit"], "parser_commit": f["parser"]["commit"],
                         "parser_read": f["parser"]["read"], "max_opset": f["parser"].get("max_opset"),
                         "parser_source": f["parser"].get("source")} for v, f in rels.items()},
        "rows": {row: row_facts(row, rels) for row in ROWS},
    }
    tmp = a.out.with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=0, sort_keys=True, separators=(",", ":")) + "\n")
    tmp.replace(a.out)
    print(f"wrote {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
