"""The one answer to "is there a CUDA GPU / TensorRT here?", for build-engine, doctor, infer and benchmark.

The GPU question is asked of the CUDA driver library (libcuda: ``cuInit`` + ``cuDeviceGetCount`` through ctypes),
which every Jetson and every machine with an NVIDIA driver has; ``nvidia-smi`` may be missing on a Jetson, and
the CUDA runtime (libcudart) may be missing where the driver is. One function words every "no GPU" reason, so
each command says the same thing. No torch, no tensorrt import until ``probe`` is asked about TensorRT.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import dataclass, field
from typing import Any

# Where the driver library is: its soname on Linux (Jetson included), nvcuda.dll on Windows; a path in
# VITDEPLOY_LIBCUDA first (a driver outside the loader's path, or a stand-in library in tests).
_LIBCUDA_NAMES = ("nvcuda.dll",) if sys.platform == "win32" else ("libcuda.so.1", "libcuda.so")
LIBCUDA_ENV = "VITDEPLOY_LIBCUDA"

# The words every command prints when there is no usable GPU (the reason follows in parentheses).
NO_GPU = "no CUDA GPU"


def load_libcuda() -> Any | None:
    """The CUDA driver library, or None where none loads."""
    names = [os.environ[LIBCUDA_ENV]] if os.environ.get(LIBCUDA_ENV) else []
    for name in [*names, *_LIBCUDA_NAMES]:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


@dataclass(frozen=True)
class GpuProbe:
    """What the CUDA driver says: how many GPUs, and why none where there are none (``why`` is None then)."""

    count: int
    why: str | None = None
    driver_cuda_version: str | None = None
    lib: Any = field(default=None, repr=False, compare=False)

    @property
    def available(self) -> bool:
        return self.count > 0


def no_gpu(detail: str) -> str:
    """The one wording of "no GPU here": ``no CUDA GPU (<detail>)``."""
    return f"{NO_GPU} ({detail})"


def gpu_probe() -> GpuProbe:
    """Ask the CUDA driver how many GPUs there are; never raises."""
    lib = load_libcuda()
    if lib is None:
        return GpuProbe(0, no_gpu("no CUDA driver: libcuda.so.1 not found"))
    try:
        rc = int(lib.cuInit(0))
        if rc != 0:
            return GpuProbe(0, no_gpu(f"the CUDA driver did not start: cuInit error {rc}"), lib=lib)
        ver = ctypes.c_int(0)
        driver = None
        if int(lib.cuDriverGetVersion(ctypes.byref(ver))) == 0 and ver.value > 0:
            driver = f"{ver.value // 1000}.{(ver.value % 1000) // 10}"
        count = ctypes.c_int(0)
        rc = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    except AttributeError as e:  # a library named libcuda without the driver API
        return GpuProbe(0, no_gpu(f"libcuda has no {str(e).split()[-1]}"))
    if rc != 0:
        return GpuProbe(0, no_gpu(f"cuDeviceGetCount error {rc}"), driver, lib)
    if count.value <= 0:
        return GpuProbe(0, no_gpu("the CUDA driver lists no device"), driver, lib)
    return GpuProbe(int(count.value), None, driver, lib)


# ---------------------------------------------------------------- TensorRT as well


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
    from vitdeploy.runners.tensorrt.cuda import gpu_info

    trt = import_tensorrt()
    env = TensorRTEnv()
    missing: list[str] = []
    if isinstance(trt, str):
        missing.append(trt)
    else:
        env.trt, env.version = trt, str(trt.__version__)
    info = gpu_info(device)
    if isinstance(info, str):
        missing.append(info)
    else:
        env.gpu, env.compute_capability, env.cuda_runtime = info
    env.missing = ", and ".join(missing) or None
    return env
