"""ONNX Runtime sessions: the one place vitdeploy builds them (Polygraphy's loader/runner split).

A session comes from a path, an ``onnx.ModelProto`` in memory (the calibrate guard's candidates) or an
``OnnxArtifact``; every session uses the settings measured fastest here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.host import thread_count

CPU = ["CPUExecutionProvider"]


def import_onnxruntime() -> Any:
    """onnxruntime, its own logger set to fatal only: a model it cannot load raises, and the exception is said in our
    one line; its log lines (red ANSI text on stderr, issue 37, P11) would say it a second time, unasked."""
    try:
        import onnxruntime as ort
    except ImportError:
        raise VitdeployError("onnxruntime is not installed: pip install 'vitdeploy[cpu]' (or [gpu])") from None
    ort.set_default_logger_severity(4)
    return ort


def session_options(threads: int | None = None) -> Any:
    """The settings measured fastest here: all graph optimizations, one intra-op thread per core, sequential."""
    ort = import_onnxruntime()
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = thread_count(threads)
    so.inter_op_num_threads = 1
    so.log_severity_level = 4  # fatal only: errors are raised, and said in one line by the caller
    return so


def session(src: str | Path | OnnxArtifact | Any, threads: int | None = None, providers: list[str] | None = None) -> Any:
    """An InferenceSession for a path, an OnnxArtifact (read from its file) or a ModelProto (serialised once).

    ``providers``: the wanted ones in order; those this onnxruntime lacks are dropped (the CPU is always there).
    A model ONNX Runtime cannot load is one line naming it.
    """
    ort = import_onnxruntime()
    avail = ort.get_available_providers()
    use = [p for p in (providers or CPU) if p in avail] or CPU
    if isinstance(src, OnnxArtifact):
        what: Any = str(src.path)
        name = str(src.path)
    elif isinstance(src, (str, Path)):
        what = name = str(src)
    else:
        what, name = src.SerializeToString(), "the model in memory"
    try:
        return ort.InferenceSession(what, session_options(threads), providers=use)
    except Exception as e:
        raise VitdeployError(f"{name}: ONNX Runtime cannot load it ({ort_reason(e)})") from None


def ort_reason(e: BaseException) -> str:
    """ONNX Runtime's reason in a few words: its first line without the status prefix ("[ONNXRuntimeError] : 1 :
    FAIL : ") or the C++ source location and signature ("/onnxruntime_src/...cc:132 ns::Op<T>::Op(...) [with T =
    float] "), ended at a word, never cut inside one."""
    import re

    text = (str(e).splitlines() or [""])[0].strip()
    text = re.sub(r"^\[ONNXRuntimeError\] : \d+ : \w+ : ", "", text)
    text = re.sub(r"/\S+:\d+ .*?\)( \[with [^\]]*\])? ", "", text).strip()
    if len(text) > 200:
        text = text[:200].rsplit(" ", 1)[0] + " …"
    return text or type(e).__name__
