"""The one answer to "is there a CUDA GPU / TensorRT here?", for build-engine, doctor, infer and benchmark.

The GPU question is asked of the CUDA driver library (``cuda.gpu_probe``: libcuda's ``cuInit`` +
``cuDeviceGetCount`` through ctypes), which every Jetson and every machine with an NVIDIA driver has;
``nvidia-smi`` may be missing on a Jetson. One function words every "no GPU" reason (``cuda.no_gpu``), so each
command says the same thing. No torch; tensorrt is imported only when ``probe``/``import_tensorrt`` ask for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from vitdeploy.runners.tensorrt.cuda import NO_GPU as NO_GPU
from vitdeploy.runners.tensorrt.cuda import GpuProbe as GpuProbe
from vitdeploy.runners.tensorrt.cuda import gpu_info, gpu_probe
from vitdeploy.runners.tensorrt.cuda import gpu_list as gpu_list


@dataclass
class TensorRTEnv:
    """TensorRT and the GPU as found here; ``missing`` names what is not (None: everything is)."""

    trt: Any = None
    version: str | None = None
    gpu: str | None = None
    compute_capability: tuple[int, int] | None = None
    cuda_runtime: str | None = None
    missing: str | None = field(default=None)


def import_tensorrt() -> Any:
    """The tensorrt module, or a one-line reason (str) why it cannot be used here."""
    try:
        import tensorrt as trt
    except ImportError:
        return "TensorRT is not installed (no Python module `tensorrt`)"
    except Exception as e:  # noqa: BLE001 - e.g. the wheel without libnvinfer: OSError
        return f"TensorRT cannot be loaded ({type(e).__name__}: {str(e).splitlines()[0][:120]})"
    # A folder named tensorrt with only type stubs (tensorrt-stubs) imports as an empty namespace package.
    if not hasattr(trt, "Builder") or not hasattr(trt, "__version__"):
        return "TensorRT is not installed (the `tensorrt` module here has no bindings: type stubs only)"
    return trt


def tensorrt_usable() -> bool:
    """True where an engine can run here: TensorRT imports and the CUDA driver lists a GPU (infer's auto-pick)."""
    return gpu_probe().available and not isinstance(import_tensorrt(), str)


def probe(device: int = 0) -> TensorRTEnv:
    """TensorRT, the GPU (from the driver) and, where both are, the device's name and compute capability and the
    CUDA runtime version (from libcudart, which the builder and runner use)."""
    trt = import_tensorrt()
    env = TensorRTEnv()
    missing: list[str] = []
    if isinstance(trt, str):
        missing.append(trt)
    else:
        env.trt, env.version = trt, str(trt.__version__)
    info = gpu_info(device)  # the driver's answer first (cuda.gpu_probe), then the runtime's
    if isinstance(info, str):
        missing.append(info)
    else:
        env.gpu, env.compute_capability, env.cuda_runtime = info
    env.missing = ", and ".join(missing) or None
    return env
