"""TensorRT that cannot start CUDA, said in one line (issue 23 item 8).

NVIDIA's Python bindings construct ``Builder``, ``Runtime`` and ``OnnxParser`` through factory functions of
libnvinfer / libnvonnxparser (``createInferBuilder``, ``createInferRuntime``, ``createNvOnnxParser``). When the
library cannot initialise CUDA (a driver older than TensorRT's CUDA, no GPU visible, a broken Jetson driver) the
factory returns NULL and pybind11 raises ``TypeError: pybind11::init(): factory function returned nullptr``. That
message was observed on every compiled release 8.6.1 … 11.4.0.106 (scripts/trt_bindings.py, with stub libraries
whose factories return NULL; tests/trt_api.json keeps the observation per release). It names neither CUDA nor the
driver, so every place that constructs one of them goes through ``trt_call``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from vitdeploy.core.errors import CudaUnavailable

T = TypeVar("T")

NULLPTR = "factory function returned nullptr"
ADVICE = ("check the NVIDIA driver (`nvidia-smi`; on a Jetson, the JetPack install): it must be new enough for "
          "this TensorRT's CUDA; `vitdeploy doctor` shows what is found")


def is_cuda_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the bindings' nullptr TypeError (a TensorRT factory failed: CUDA did not start)."""
    return isinstance(exc, TypeError) and NULLPTR in str(exc)


def cuda_failure(what: str, version: str | None = None) -> CudaUnavailable:
    """The one-line error for a TensorRT object ``what`` (e.g. "trt.Runtime") that CUDA could not back."""
    v = f" {version}" if version else ""
    return CudaUnavailable(f"TensorRT{v} could not start CUDA ({what} failed: {NULLPTR}); {ADVICE}")


def trt_call(fn: Callable[..., T], *args: Any, what: str | None = None) -> T:
    """``fn(*args)``, with the nullptr TypeError turned into CudaUnavailable (other errors pass unchanged)."""
    try:
        return fn(*args)
    except TypeError as e:
        if not is_cuda_failure(e):
            raise
        name = what or f"trt.{getattr(fn, '__name__', 'object')}"
        version = getattr(__import__("sys").modules.get("tensorrt"), "__version__", None)
        raise cuda_failure(name, str(version) if version else None) from None


def no_context(path: object) -> CudaUnavailable:
    """``create_execution_context()`` returned None: TensorRT could not allocate the context on the GPU."""
    return CudaUnavailable(f"{path}: TensorRT could not create an execution context (out of GPU memory, or CUDA "
                           f"failed): free GPU memory or use a smaller --batch; {ADVICE}")
