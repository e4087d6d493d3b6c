"""One benchmark row in its own process: open a runner, then time calls on command, reporting peak memory.

ONNX Runtime's and OpenVINO's thread pools slow each other when they share a process (measured: issue 17),
so `vitdeploy benchmark` runs each row here and alternates the rows' rounds. The protocol is JSON lines:
the parent writes {"batch", "warmup", "calls" | "seconds", "seed"}; the worker answers {"times": [...s],
"peak_rss_mb"} (or {"error"}). Its first line says it is ready (or why it could not open the artifact).
Run as ``python -m vitdeploy.tools.bench_worker ARTIFACT BACKEND THREADS DEVICE`` (an OpenVINO IR:
``IR.xml openvino THREADS HINT LABEL H W``).
"""

from __future__ import annotations

import json
import os
import select
import signal
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np


def peak_rss_mb() -> float:
    """The peak resident memory of this process (MiB): the row's model, runtime and buffers.

    Linux: VmHWM, which starts afresh at exec (getrusage's ru_maxrss keeps the parent's peak across fork+exec).
    """
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / (1024.0 * 1024.0) if sys.platform == "darwin" else kb / 1024.0


PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def die_with_parent() -> None:
    """Be killed when the parent dies (SIGTERM, SIGKILL, a crash): a busy worker otherwise spins on for ever.

    Linux's PR_SET_PDEATHSIG through libc's prctl; elsewhere ``parent_gone`` (polled between calls) is the guard.
    Ctrl-C is the parent's to handle: it terminates the workers at once."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    parent = os.getppid()
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def parent_gone(inp: TextIO) -> bool:
    """Whether the parent closed its end of the command pipe (it died, or gave up): polled between timed calls.

    The parent sends nothing while a command runs, so a readable or hung-up pipe then means end of file."""
    try:
        fd = inp.fileno()
    except (OSError, ValueError, AttributeError):
        return False
    try:
        ready, _, _ = select.select([fd], [], [], 0)
    except (OSError, ValueError):
        return True
    return bool(ready)


def serve(call: Callable[[np.ndarray], Any], input_size: tuple[int, int], out: TextIO, inp: TextIO) -> None:
    """Answer timing commands on ``inp`` until it closes (or closes mid-command: then stop at once)."""
    for line in inp:
        if not line.strip():
            continue
        cmd = json.loads(line)
        b = int(cmd["batch"])
        h, w = input_size
        x = np.random.default_rng(int(cmd.get("seed", 0))).standard_normal((b, 3, h, w), dtype=np.float32)
        for _ in range(int(cmd.get("warmup", 0))):
            if parent_gone(inp):
                return
            call(x)
        times: list[float] = []
        calls, seconds = cmd.get("calls"), cmd.get("seconds")
        spent = 0.0
        while (calls is not None and len(times) < int(calls)) or (calls is None and (spent < float(seconds) or len(times) < int(cmd.get("min_calls", 1)))):
            t = time.perf_counter()
            call(x)
            dt = time.perf_counter() - t
            times.append(dt)
            spent += dt
            if parent_gone(inp):
                return
        out.write(json.dumps({"times": times, "peak_rss_mb": peak_rss_mb()}) + "\n")
        out.flush()


def protocol_streams() -> TextIO:
    """The parent's channel (the real stdout); libraries that print to fd 1 now print to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def serve_openvino_ir(xml: str, threads: int, hint: str, label: str, input_size: tuple[int, int], out: TextIO) -> int:
    """A row for an OpenVINO IR (NNCF's INT8 as NNCF's own OpenVINO path writes it: the `--versus nncf` anchor),
    compiled as OpenVINO's user would: one stream, ``threads`` threads, ``hint`` the INFERENCE_PRECISION_HINT
    ("default": OpenVINO's own choice, bfloat16 float parts on a CPU with AMX/AVX512-BF16)."""
    try:
        import openvino as ov

        core = ov.Core()
        cfg: dict[str, Any] = {"PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads}
        if hint != "default":
            cfg["INFERENCE_PRECISION_HINT"] = hint
        req = core.compile_model(core.read_model(xml), "CPU", cfg).create_infer_request()
    except Exception as e:  # not installed, or an IR it cannot read: the row is skipped with the reason
        out.write(json.dumps({"error": f"{xml}: {e}".splitlines()[0], "import_error": isinstance(e, ImportError)}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ready": True, "backend": "openvino", "precision": label, "artifact": xml,
                          "peak_rss_mb": peak_rss_mb()}) + "\n")
    out.flush()
    serve(lambda x: req.infer({0: x}), input_size, out, sys.stdin)
    return 0


def main(argv: list[str]) -> int:
    artifact, backend, threads, device = argv[0], argv[1], int(argv[2]), argv[3]
    die_with_parent()
    out = protocol_streams()
    if artifact.endswith(".xml"):  # ARTIFACT.xml openvino THREADS HINT LABEL H W
        return serve_openvino_ir(artifact, threads, device, argv[4], (int(argv[5]), int(argv[6])), out)
    try:
        from vitdeploy.core.errors import VitdeployError
        from vitdeploy.runners import open_runner

        runner = open_runner(artifact, backend=backend, threads=threads, device=device)
        if runner.backend == "torch":
            import torch

            torch.set_num_threads(threads)
    except (VitdeployError, ImportError) as e:
        out.write(json.dumps({"error": str(e), "import_error": isinstance(e, ImportError)}) + "\n")
        out.flush()
        return 1
    h, w = runner.manifest.input_size
    out.write(json.dumps({"ready": True, "backend": runner.backend, "precision": runner.precision,
                          "artifact": str(runner.artifact), "peak_rss_mb": peak_rss_mb()}) + "\n")
    out.flush()
    with runner:
        serve(runner, (h, w), out, sys.stdin)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
