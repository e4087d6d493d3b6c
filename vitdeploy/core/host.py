"""Facts of the host this process runs on."""

from __future__ import annotations

import os


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, not the machine's count)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# CPU flags of an int8 dot product that adds u8*s8 products in int32 (no int16 saturation): AVX-512 VNNI, AVX-VNNI,
# AMX. Without them (AVX2 alone), OpenVINO's int8 kernels for an image-reading layer saturate (graph/quantize.py,
# first_layer_overflow_fix).
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")


def cpu_int8_dot_exact(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether this x86 CPU has an int8 dot product without int16 saturation (True where /proc/cpuinfo is absent:
    no x86 Linux, nothing known)."""
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return flags is None or any(f in flags for f in INT8_DOT_FLAGS)
