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


# oneDNN's ISA ceilings (ONEDNN_MAX_CPU_ISA, or its older name DNNL_MAX_CPU_ISA) below any int8 dot product: set to
# one of these, OpenVINO's CPU plugin (oneDNN inside) runs the AVX2 int8 kernels even on a VNNI CPU, and saturates as
# there (docs/cpu-backends.md, "Lowered ISA"). Every other value (AVX2_VNNI, AVX512_CORE_VNNI, ..., DEFAULT) keeps one.
ONEDNN_ISAS_WITHOUT_INT8_DOT = ("SSE41", "AVX", "AVX2", "AVX512_CORE")


def onednn_isa_without_int8_dot() -> bool:
    """Whether this process lowered oneDNN's ISA below VNNI by its environment (ONNX Runtime's MLAS has no such
    switch: it reads CPUID alone)."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    return isa.strip().upper() in ONEDNN_ISAS_WITHOUT_INT8_DOT


def cpu_int8_dot_exact(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether OpenVINO has an int8 dot product without int16 saturation on this x86 CPU: the CPU's flags say so
    (True where /proc/cpuinfo is absent: no x86 Linux, nothing known) and oneDNN's ISA was not lowered below it."""
    if onednn_isa_without_int8_dot():
        return False
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return flags is None or any(f in flags for f in INT8_DOT_FLAGS)


def thread_count(requested: int | None) -> int:
    """Threads for a runtime's pool: ``requested`` (default: one per core), at most the cores this process may run
    on. More only slows down: ONNX Runtime's spinning pool took 1 s per call of a 32x32 model with 64 threads on
    2 cores, and 100000 crashed verify (issue 31); the CLI refuses such values, library callers are capped here."""
    cores = available_cores()
    return max(1, min(int(requested), cores)) if requested else cores


def die_with_parent(parent_pid: int, worker_id: int = 0) -> None:
    """A DataLoader ``worker_init_fn`` (with ``functools.partial(die_with_parent, os.getpid())``): the worker gets
    SIGKILL when the process that started it dies (Linux ``PR_SET_PDEATHSIG``), so a killed training run leaves no
    orphan holding memory (issue 31: 5 orphans with 1 GB after a run was killed). torch's own watchdog only looks
    between batches, not while a worker is stuck decoding a file. Elsewhere a no-op."""
    del worker_id
    import signal
    import sys

    if not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before the prctl: nobody is left to read this worker's results
        os._exit(1)
