"""Stand-in CUDA drivers for tests (not a test module).

``build``/``use``: a real shared object, compiled here with the C compiler, exporting the driver calls vitdeploy's GPU
probe makes, with what they answer set by environment variables at call time. vitdeploy loads it through
``VITDEPLOY_LIBCUDA`` exactly as it loads libcuda.so.1 (ctypes.CDLL).

``install``: no compiler needed; ``cuda.load_libcuda`` returns a Python object answering the same calls. For tests
that fake the CUDA runtime (``cuda.CudaRuntime``) and need the driver to list a GPU too.

    FAKE_CUDA_INIT     cuInit's CUresult (default 0; 100 is CUDA_ERROR_NO_DEVICE in cuda.h)
    FAKE_CUDA_DEVICES  how many devices cuDeviceGetCount reports (default 1)
    FAKE_CUDA_NAME     the device name (default "Fake Orin"), FAKE_CUDA_CC its compute capability as "8.7"
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

SOURCE = r"""
#include <stdlib.h>
#include <string.h>
#include <stdio.h>
static int env_int(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }
int cuInit(unsigned int flags) { (void)flags; return env_int("FAKE_CUDA_INIT", 0); }
int cuDriverGetVersion(int *v) { *v = 12060; return 0; }
int cuDeviceGetCount(int *n) { *n = env_int("FAKE_CUDA_DEVICES", 1); return 0; }
int cuDeviceGet(int *dev, int ordinal) { *dev = ordinal; return ordinal < env_int("FAKE_CUDA_DEVICES", 1) ? 0 : 101; }
int cuDeviceGetName(char *name, int len, int dev) {
    const char *v = getenv("FAKE_CUDA_NAME"); (void)dev;
    snprintf(name, (size_t)len, "%s", v ? v : "Fake Orin"); return 0;
}
int cuDeviceGetAttribute(int *out, int attr, int dev) {
    const char *cc = getenv("FAKE_CUDA_CC"); int major = 8, minor = 7; (void)dev;
    if (cc) sscanf(cc, "%d.%d", &major, &minor);
    *out = attr == 75 ? major : attr == 76 ? minor : 0; return 0;
}
int cuDeviceTotalMem_v2(size_t *bytes, int dev) { (void)dev; *bytes = (size_t)8 << 30; return 0; }
int cuGetErrorName(int rc, const char **s) { *s = rc == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_UNKNOWN"; return 0; }
"""


def build(folder: Path) -> Path:
    """Compile the stand-in into ``folder``; skips the calling test where no C compiler is installed."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler to build the stand-in libcuda")
    src, lib = folder / "fake_libcuda.c", folder / "libcuda.so.1"
    src.write_text(SOURCE)
    subprocess.run([cc, "-shared", "-fPIC", "-O0", "-o", str(lib), str(src)], check=True, capture_output=True)
    return lib


def use(monkeypatch: pytest.MonkeyPatch, lib: Path, devices: int = 1, init: int = 0) -> None:
    """Point vitdeploy's probe at the stand-in (and at no other libcuda) for one test."""
    monkeypatch.setenv("VITDEPLOY_LIBCUDA", str(lib))
    monkeypatch.setenv("FAKE_CUDA_DEVICES", str(devices))
    monkeypatch.setenv("FAKE_CUDA_INIT", str(init))


class PyDriver:
    """The driver calls the probe makes, answered in Python: ``devices`` GPUs named ``name``, compute ``cc``."""

    def __init__(self, devices: int = 1, name: str = "Fake Orin", cc: tuple[int, int] = (8, 7)) -> None:
        self.devices, self.name, self.cc = devices, name, cc

    def cuInit(self, flags: int) -> int:  # noqa: N802 - the driver's names
        return 0

    def cuDriverGetVersion(self, ref: Any) -> int:  # noqa: N802
        ref._obj.value = 12060
        return 0

    def cuDeviceGetCount(self, ref: Any) -> int:  # noqa: N802
        ref._obj.value = self.devices
        return 0

    def cuDeviceGet(self, ref: Any, ordinal: int) -> int:  # noqa: N802
        ref._obj.value = ordinal
        return 0 if ordinal < self.devices else 101

    def cuDeviceGetName(self, buf: Any, length: int, dev: Any) -> int:  # noqa: N802
        buf.value = self.name.encode()[: length - 1]
        return 0

    def cuDeviceGetAttribute(self, ref: Any, attr: int, dev: Any) -> int:  # noqa: N802
        ref._obj.value = {75: self.cc[0], 76: self.cc[1]}.get(attr, 0)
        return 0

    def cuDeviceTotalMem_v2(self, ref: Any, dev: Any) -> int:  # noqa: N802
        ref._obj.value = 8 << 30
        return 0

    def cuGetErrorName(self, rc: int, ref: Any) -> int:  # noqa: N802
        ref._obj.value = b"CUDA_ERROR_UNKNOWN"
        return 0


def install(monkeypatch: pytest.MonkeyPatch, devices: int = 1, **kw: Any) -> PyDriver:
    """Make vitdeploy's GPU probe (runners/tensorrt/cuda.gpu_probe) talk to a PyDriver for one test."""
    from vitdeploy.runners.tensorrt import cuda

    drv = PyDriver(devices, **kw)
    monkeypatch.setattr(cuda, "load_libcuda", lambda: drv)
    return drv
