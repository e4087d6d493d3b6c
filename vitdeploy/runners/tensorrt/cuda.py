"""Small ctypes bindings to the CUDA driver (libcuda: is there a GPU?) and runtime (libcudart: what the TensorRT
runner and builder need).

No torch, no pycuda build, no cuda-python: a Jetson has libcudart from JetPack, a pip TensorRT pulls
``nvidia-cuda-runtime-cu12``, a workstation has the toolkit. Set ``VITDEPLOY_CUDART`` to the library's
path where none of those is found.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.errors import VitdeployError

# cudaMemcpyKind
H2D = 1
D2H = 2
# cudaDeviceAttr, and the driver's CUdevice_attribute (cuda.h), which numbers them the same
_ATTR_CC_MAJOR = 75
_ATTR_CC_MINOR = 76
_STREAM_NON_BLOCKING = 1
_PROPS_BYTES = 1 << 14  # larger than cudaDeviceProp of any CUDA release; the name is its first 256 bytes

_SONAMES = ("libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0")


class CudaError(VitdeployError):
    """A CUDA runtime call failed or no CUDA runtime/GPU is here."""


# ---------------------------------------------------------------- the driver (libcuda): is there a GPU?

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


def _driver_error(lib: Any, rc: int) -> str:
    """'CUDA_ERROR_NO_DEVICE (100)': the driver's own name for a CUresult where it gives one."""
    name = ctypes.c_char_p()
    try:
        ok = int(lib.cuGetErrorName(rc, ctypes.byref(name))) == 0 and name.value
    except AttributeError:
        ok = False
    return f"{name.value.decode(errors='replace')} ({rc})" if ok and name.value else f"error {rc}"


def gpu_probe() -> GpuProbe:
    """Ask the CUDA driver how many GPUs there are; never raises."""
    lib = load_libcuda()
    if lib is None:
        return GpuProbe(0, no_gpu(f"no CUDA driver: {_LIBCUDA_NAMES[0]} not found"))
    try:
        rc = int(lib.cuInit(0))
        if rc != 0:
            return GpuProbe(0, no_gpu(f"the CUDA driver did not start: cuInit {_driver_error(lib, rc)}"), lib=lib)
        ver = ctypes.c_int(0)
        driver = None
        if int(lib.cuDriverGetVersion(ctypes.byref(ver))) == 0 and ver.value > 0:
            driver = f"{ver.value // 1000}.{(ver.value % 1000) // 10}"
        count = ctypes.c_int(0)
        rc = int(lib.cuDeviceGetCount(ctypes.byref(count)))
    except AttributeError as e:  # a library named libcuda without the driver API
        return GpuProbe(0, no_gpu(f"libcuda has no {str(e).split()[-1]}"))
    if rc != 0:
        return GpuProbe(0, no_gpu(f"cuDeviceGetCount {_driver_error(lib, rc)}"), driver, lib)
    if count.value <= 0:
        return GpuProbe(0, no_gpu("the CUDA driver lists no device"), driver, lib)
    return GpuProbe(int(count.value), None, driver, lib)


def gpu_list(found: GpuProbe | None = None) -> list[dict[str, Any]]:
    """Every GPU the driver lists: index, name, compute capability and memory (doctor's and benchmark's listing)."""
    g = found or gpu_probe()
    if not g.available:
        return []
    lib, out = g.lib, []
    for i in range(g.count):
        dev = ctypes.c_int(0)
        if int(lib.cuDeviceGet(ctypes.byref(dev), i)) != 0:
            continue
        name = ctypes.create_string_buffer(256)
        lib.cuDeviceGetName(name, 256, dev)
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.cuDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, dev)
        lib.cuDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, dev)
        mem = ctypes.c_size_t(0)
        lib.cuDeviceTotalMem_v2(ctypes.byref(mem), dev)
        out.append({"index": i, "name": name.value.decode(errors="replace"),
                    "compute_capability": f"{major.value}.{minor.value}", "memory_gib": round(mem.value / 2**30, 1)})
    return out


# ---------------------------------------------------------------- the runtime (libcudart)


def cudart_candidates() -> list[str]:
    """Where libcudart may be, most specific first."""
    out: list[str] = []
    env = os.environ.get("VITDEPLOY_CUDART")
    if env:
        out.append(env)
    if sys.platform == "win32":
        for home in filter(None, (os.environ.get("CUDA_PATH"),)):
            out += sorted(glob.glob(os.path.join(home, "bin", "cudart64_*.dll")), reverse=True)
        return out
    out += list(_SONAMES)
    roots = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"]
    for root in filter(None, roots):
        out += sorted(glob.glob(os.path.join(root, "lib64", "libcudart.so*")), reverse=True)
        out += sorted(glob.glob(os.path.join(root, "targets", "*", "lib", "libcudart.so*")), reverse=True)
    for p in sys.path:  # the pip wheel nvidia-cuda-runtime-cu1x (pulled by pip's tensorrt)
        out += sorted(glob.glob(os.path.join(p, "nvidia", "cuda_runtime", "lib", "libcudart.so*")), reverse=True)
        out += sorted(glob.glob(os.path.join(p, "nvidia", "cu1*", "lib", "libcudart.so*")), reverse=True)
    return list(dict.fromkeys(out))


def load_cudart() -> ctypes.CDLL:
    for cand in cudart_candidates():
        try:
            return ctypes.CDLL(cand)
        except OSError:
            continue
    raise CudaError(
        "no CUDA runtime library (libcudart) found: install the CUDA toolkit or JetPack, "
        "or set VITDEPLOY_CUDART to the path of libcudart.so"
    )


class CudaRuntime:
    """The few runtime calls the TensorRT runner makes; every error becomes a one-line CudaError."""

    def __init__(self, lib: ctypes.CDLL | None = None) -> None:
        self.lib = lib or load_cudart()
        L = self.lib
        vp, sz, i = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
        L.cudaGetErrorString.restype = ctypes.c_char_p
        L.cudaGetErrorString.argtypes = [i]
        for name, args in {
            "cudaGetDeviceCount": [ctypes.POINTER(i)],
            "cudaSetDevice": [i],
            "cudaDeviceGetAttribute": [ctypes.POINTER(i), i, i],
            "cudaRuntimeGetVersion": [ctypes.POINTER(i)],
            "cudaMalloc": [ctypes.POINTER(vp), sz],
            "cudaFree": [vp],
            "cudaMallocHost": [ctypes.POINTER(vp), sz],
            "cudaFreeHost": [vp],
            "cudaMemcpyAsync": [vp, vp, sz, i, vp],
            "cudaStreamCreateWithFlags": [ctypes.POINTER(vp), ctypes.c_uint],
            "cudaStreamSynchronize": [vp],
            "cudaStreamDestroy": [vp],
        }.items():
            fn = getattr(L, name)
            fn.restype = i
            fn.argtypes = args

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            msg = self.lib.cudaGetErrorString(rc)
            text = msg.decode(errors="replace") if msg else f"error {rc}"
            raise CudaError(f"CUDA {what} failed: {text} (code {rc})")

    # -------------------------------------------------------------- device

    def device_count(self) -> int:
        n = ctypes.c_int(0)
        rc = self.lib.cudaGetDeviceCount(ctypes.byref(n))
        if rc != 0:  # no driver, no device: report as zero GPUs, with the reason kept for the message
            self.last_error = self.lib.cudaGetErrorString(rc).decode(errors="replace")
            return 0
        return n.value

    def set_device(self, device: int) -> None:
        self.check(self.lib.cudaSetDevice(device), f"cudaSetDevice({device})")

    def compute_capability(self, device: int = 0) -> tuple[int, int]:
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        self.check(self.lib.cudaDeviceGetAttribute(ctypes.byref(major), _ATTR_CC_MAJOR, device), "cudaDeviceGetAttribute")
        self.check(self.lib.cudaDeviceGetAttribute(ctypes.byref(minor), _ATTR_CC_MINOR, device), "cudaDeviceGetAttribute")
        return (major.value, minor.value)

    def device_name(self, device: int = 0) -> str:
        buf = ctypes.create_string_buffer(_PROPS_BYTES)
        for sym in ("cudaGetDeviceProperties_v2", "cudaGetDeviceProperties"):  # CUDA 12+ exports _v2
            fn = getattr(self.lib, sym, None)
            if fn is None:
                continue
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_void_p, ctypes.c_int]
            self.check(fn(buf, device), sym)
            return buf.raw[:256].split(b"\0", 1)[0].decode(errors="replace")
        return "unknown GPU"

    def runtime_version(self) -> str:
        v = ctypes.c_int(0)
        self.check(self.lib.cudaRuntimeGetVersion(ctypes.byref(v)), "cudaRuntimeGetVersion")
        return f"{v.value // 1000}.{(v.value % 1000) // 10}"

    # -------------------------------------------------------------- memory and streams

    def malloc(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), max(int(nbytes), 1)), f"cudaMalloc({nbytes})")
        return int(p.value or 0)

    def free(self, ptr: int) -> None:
        if ptr:
            self.check(self.lib.cudaFree(ctypes.c_void_p(ptr)), "cudaFree")

    def malloc_host(self, nbytes: int) -> int:
        """Page-locked host memory: asynchronous copies need it to overlap and to be truly async."""
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMallocHost(ctypes.byref(p), max(int(nbytes), 1)), f"cudaMallocHost({nbytes})")
        return int(p.value or 0)

    def free_host(self, ptr: int) -> None:
        if ptr:
            self.check(self.lib.cudaFreeHost(ctypes.c_void_p(ptr)), "cudaFreeHost")

    def memcpy_async(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        rc = self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), int(nbytes), kind, ctypes.c_void_p(stream))
        self.check(rc, "cudaMemcpyAsync")

    def stream_create(self) -> int:
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreateWithFlags(ctypes.byref(s), _STREAM_NON_BLOCKING), "cudaStreamCreateWithFlags")
        return int(s.value or 0)

    def stream_synchronize(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")

    def stream_destroy(self, stream: int) -> None:
        if stream:
            self.check(self.lib.cudaStreamDestroy(ctypes.c_void_p(stream)), "cudaStreamDestroy")


def host_array(ptr: int, shape: tuple[int, ...], dtype: np.dtype | type) -> np.ndarray:
    """A numpy view of ``prod(shape)`` elements of host memory at ``ptr`` (no copy)."""
    dt = np.dtype(dtype)
    count = int(np.prod(shape)) if shape else 1
    raw = (ctypes.c_char * (count * dt.itemsize)).from_address(ptr)
    return np.frombuffer(memoryview(raw), dtype=dt, count=count).reshape(shape)


def gpu_info(device: int = 0) -> tuple[str, tuple[int, int], str] | str:
    """(name, compute capability, CUDA runtime version) of a GPU, or why there is none, in words.

    The driver answers whether there is a GPU (``gpu_probe``, the reason every command prints); the runtime the
    builder and runner use answers the rest, and says why it cannot reach a GPU the driver lists (e.g. a CUDA
    runtime newer than the driver)."""
    found = gpu_probe()
    if found.why is not None:
        return found.why
    if device >= found.count:
        return no_gpu(f"no CUDA device {device}: the driver lists {found.count}")
    try:
        rt = CudaRuntime()
    except CudaError as e:
        return str(e).split(":")[0]
    n = rt.device_count()
    if n == 0:
        why = getattr(rt, "last_error", "")
        return f"the CUDA runtime sees no GPU though the driver lists {found.count}" + (f" ({why})" if why else "")
    if device >= n:
        return f"the CUDA runtime sees no device {device} (it sees {n})"
    return (rt.device_name(device), rt.compute_capability(device), rt.runtime_version())


def _self_check() -> None:  # pragma: no cover - run by hand on a GPU machine: python -m vitdeploy.runners.tensorrt.cuda
    info = gpu_info()
    print(info)
    rt = CudaRuntime()
    s = rt.stream_create()
    n = 1 << 20
    h_in, h_out, d = rt.malloc_host(n * 4), rt.malloc_host(n * 4), rt.malloc(n * 4)
    a = host_array(h_in, (n,), np.float32)
    a[:] = np.arange(n, dtype=np.float32)
    rt.memcpy_async(d, h_in, n * 4, H2D, s)
    rt.memcpy_async(h_out, d, n * 4, D2H, s)
    rt.stream_synchronize(s)
    ok = np.array_equal(host_array(h_out, (n,), np.float32), a)
    for p in (h_in, h_out):
        rt.free_host(p)
    rt.free(d)
    rt.stream_destroy(s)
    print("round trip through device memory:", "ok" if ok else "MISMATCH", Path(rt.lib._name).name)


if __name__ == "__main__":  # pragma: no cover
    _self_check()
