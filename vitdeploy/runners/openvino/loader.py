"""Read and compile an ONNX model with OpenVINO, cached on disk; failures become one line naming the op.

Kept apart from the runner (as Polygraphy keeps loaders apart from runners): compiling is where OpenVINO
can refuse a graph, and where the compiled blob is cached so a second run starts fast.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.host import thread_count

INSTALL_HINT = "pip install 'vitdeploy[cpu]' (or pip install openvino)"


def import_openvino() -> Any:
    """The openvino module, or one line saying how to install it."""
    try:
        import openvino
    except ImportError:
        raise VitdeployError(f"OpenVINO is not installed: {INSTALL_HINT}") from None
    return openvino


def openvino_installed() -> bool:
    """Whether `import openvino` would succeed, without importing it."""
    import importlib.util
    import sys

    if "openvino" in sys.modules:
        return sys.modules["openvino"] is not None
    try:
        return importlib.util.find_spec("openvino") is not None
    except (ImportError, ValueError):
        return False


def cache_dir() -> Path | None:
    """Where compiled models are cached: $VITDEPLOY_CACHE or $XDG_CACHE_HOME (~/.cache) /vitdeploy/openvino.

    None (no caching) when that folder cannot be made; caching only saves start-up time.
    """
    root = os.environ.get("VITDEPLOY_CACHE")
    base = Path(root) if root else Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "vitdeploy"
    d = base / "openvino"
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return d if os.access(d, os.W_OK) else None


def precision_hint(float_type: str | None) -> str:
    """OpenVINO's INFERENCE_PRECISION_HINT for an artifact whose float parts are ``float_type``.

    The CPU plugin would run float parts in bfloat16 on CPUs with AVX512-BF16/AMX; the precision of our
    artifacts lives in the graph, so the float parts run as the graph says: f32, or f16 where the graph is fp16
    and the CPU has native fp16 arithmetic (else f32, which only adds accuracy).
    """
    return "f32" if float_type != "bf16" else "bf16"


def compile_config(threads: int | None, float_type: str | None) -> dict[str, Any]:
    """One stream using every core (the latency setting, as ONNX Runtime's sequential session)."""
    return {
        "PERFORMANCE_HINT": "LATENCY",
        "INFERENCE_NUM_THREADS": thread_count(threads),
        "INFERENCE_PRECISION_HINT": precision_hint(float_type),
    }


_OP_PATTERNS = (
    re.compile(r"No conversion rule found for operations?:\s*([^\n]+)"),
    re.compile(r"following ONNX operations?:\s*([^\n]+)"),
    re.compile(r"[Cc]onversion failed for ([^\s]+) node with name ([^\s,]+)"),
    re.compile(r"[Cc]annot create ([A-Za-z0-9_]+) layer ([^\s]+)"),
    re.compile(r"[Uu]nsupported operation:?\s*([^\n]+)"),
)


def failing_op(message: str) -> str | None:
    """The op OpenVINO names in its error text, e.g. 'custom.Frobnicate' (None when it names none)."""
    for pat in _OP_PATTERNS:
        m = pat.search(message)
        if m:
            return " ".join(g.strip().rstrip(".") for g in m.groups() if g)
    return None


def _one_line(path: Path, what: str, e: Exception) -> VitdeployError:
    msg = str(e)
    op = failing_op(msg)
    if op:
        return VitdeployError(f"{path}: OpenVINO cannot {what} it: unsupported op {op}; run it with --backend onnxruntime")
    lines = [ln.strip() for ln in msg.splitlines() if ln.strip() and not ln.strip().startswith("Exception from src/")]
    first = lines[-1] if lines else type(e).__name__
    return VitdeployError(f"{path}: OpenVINO cannot {what} it ({first[:160]}); run it with --backend onnxruntime")


def compile_onnx(path: str | Path, threads: int | None = None, float_type: str | None = None, cache: bool = True) -> Any:
    """An ov.CompiledModel for the CPU from an ONNX file (cached under ``cache_dir()``)."""
    ov = import_openvino()
    p = Path(path)
    core = ov.Core()
    d = cache_dir() if cache else None
    if d is not None:
        core.set_property({"CACHE_DIR": str(d)})
    try:
        model = core.read_model(str(p))
    except Exception as e:
        raise _one_line(p, "read", e) from None
    try:
        return core.compile_model(model, "CPU", compile_config(threads, float_type))
    except Exception as e:
        raise _one_line(p, "compile", e) from None


def compile_model_proto(model: Any, threads: int | None = None, float_type: str | None = None) -> Any:
    """An ov.CompiledModel for an onnx.ModelProto in memory (the calibrate guard's candidates; not cached)."""
    import tempfile

    ov = import_openvino()
    with tempfile.TemporaryDirectory(prefix="vitdeploy-ov-") as tmp:
        p = Path(tmp) / "model.onnx"
        p.write_bytes(model.SerializeToString())
        core = ov.Core()
        try:
            ovm = core.read_model(str(p))
            return core.compile_model(ovm, "CPU", compile_config(threads, float_type))
        except Exception as e:
            raise _one_line(Path("the INT8 candidate"), "compile", e) from None
