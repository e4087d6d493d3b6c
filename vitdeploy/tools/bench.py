"""Latency and throughput of artifacts on backends, side by side, as ratios between rows.

Every row (artifact × backend) is opened once, in its own process (bench_worker.py: ONNX Runtime's
and OpenVINO's thread pools slow each other when they share one), and the rows are measured in
interleaved rounds for each batch size, so a slow minute on a shared machine costs every row alike
and the ratios between rows hold even when the absolute numbers move. Each row reports the peak
resident memory of its process.

Threads: torch gets ``torch.set_num_threads(cores)``; ONNX Runtime sessions get all graph
optimizations, ``intra_op_num_threads = cores``, one inter-op thread, sequential execution
(``runners.onnxruntime.session_options``); OpenVINO compiles for the CPU with one stream,
``INFERENCE_NUM_THREADS = cores`` and the graph's own float precision (``runners.openvino.loader``).
"""

from __future__ import annotations

import json
import math
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.artifact import read_manifest
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.host import available_cores
from vitdeploy.runners import BACKENDS, BACKENDS_OF_KIND, artifact_kind

DEFAULT_BATCH_SIZES = (1, 8, 32)
DEFAULT_SECONDS = 5.0
MAX_SECONDS = 3600.0  # per row and batch size: an hour measures any model; inf or 1e300 would never end
ROUNDS = 5


@dataclass
class BenchRow:
    artifact: str
    backend: str
    precision: str
    batch: int
    iterations: int
    throughput: float  # images per second
    p50_ms: float
    p90_ms: float
    p99_ms: float
    mean_ms: float
    device: str = "cpu"
    peak_rss_mb: float | None = None  # peak resident memory of the row's own process

    @property
    def name(self) -> str:
        return f"{self.backend} {self.precision}" + (" eager" if self.backend == "torch" else "")


@dataclass
class BenchReport:
    results: list[BenchRow]
    ratios: list[dict[str, Any]]
    machine: dict[str, Any]
    versions: dict[str, str]
    settings: dict[str, Any]
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [asdict(r) for r in self.results],
            "ratios": self.ratios,
            "machine": self.machine,
            "versions": self.versions,
            "settings": self.settings,
            "notes": self.notes,
        }


# --- the machine --------------------------------------------------------------------------------


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_flags() -> list[str]:
    """The SIMD features that decide int8 and fp16 speed on a CPU."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = set()
    for line in text.splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    return [f for f in ("avx2", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "avx512_fp16", "amx_int8") if f in flags]


def gpu_names() -> list[str]:
    """GPUs the CUDA driver lists (the one GPU probe, libcuda: a Jetson without nvidia-smi too; no torch import)."""
    from vitdeploy.runners.tensorrt.cuda import gpu_list

    return [g["name"] for g in gpu_list()]


def machine_info(threads: int | None = None) -> dict[str, Any]:
    return {
        "cpu": cpu_model(),
        "cpu_flags": cpu_flags(),
        "cores": available_cores(),
        "threads": threads or available_cores(),
        "gpu": gpu_names() or None,
        "os": platform.platform(),
    }


def library_versions() -> dict[str, str]:
    from vitdeploy.core.manifest import tool_versions

    return tool_versions("numpy", "torch", "onnx", "onnxruntime", "onnxruntime-gpu", "openvino", "tensorrt", "pillow")


# --- measuring ----------------------------------------------------------------------------------


def rows_for(models: Sequence[str | Path], backends: Sequence[str] | None = None) -> list[tuple[Path, str]]:
    """(artifact, backend) pairs to measure: each artifact on each requested backend that can run it."""
    for b in backends or ():
        if b not in BACKENDS or b == "auto":
            raise UsageError(f"--backends: unknown backend {b!r}; choose from torch, onnxruntime, openvino, tensorrt")
    from vitdeploy.runners.openvino.loader import openvino_installed

    out = []
    for m in models:
        p = Path(m)
        if not p.exists():
            raise VitdeployError(f"{p}: no such file; pass a checkpoint, ONNX model or engine (or use --preset NAME)")
        for b in BACKENDS_OF_KIND[artifact_kind(p)]:
            # without --backends, OpenVINO rows appear where OpenVINO is installed
            if (not backends and (b != "openvino" or openvino_installed())) or (backends and b in backends):
                out.append((p, b))
    if not out:
        raise VitdeployError(f"no artifact runs on --backends {','.join(backends or [])}: a checkpoint runs on torch, "
                             "an .onnx on onnxruntime or openvino, an engine on tensorrt")
    return out


def _percentiles(times: list[float]) -> tuple[float, float, float, float]:
    a = np.asarray(times) * 1000.0
    p50, p90, p99 = np.percentile(a, [50, 90, 99])
    return float(p50), float(p90), float(p99), float(a.mean())


def measure(
    runners: Sequence[Any],
    batch: int,
    warmup: int = 3,
    iterations: int | None = None,
    seconds: float | None = None,
    rounds: int = ROUNDS,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[list[float]]:
    """Per-call latencies (s) of each runner at one batch size, measured in interleaved rounds.

    With ``iterations`` each runner makes that many timed calls; with ``seconds`` each spends about
    that long (at least 3 calls). The calls are split into ``rounds`` blocks and the blocks of
    all runners alternate, so drift in the machine's load is shared by every row.
    """
    if iterations is None and seconds is None:
        seconds = DEFAULT_SECONDS
    rng = np.random.default_rng(seed)
    inputs = []
    for r in runners:
        h, w = r.manifest.input_size
        inputs.append(rng.standard_normal((batch, 3, h, w), dtype=np.float32))
    for r, x in zip(runners, inputs, strict=True):
        for _ in range(warmup):
            r(x)
    times: list[list[float]] = [[] for _ in runners]
    rounds = max(1, min(rounds, iterations or rounds))
    for k in range(rounds):
        for i, (r, x) in enumerate(zip(runners, inputs, strict=True)):
            if progress:
                progress(f"batch {batch}: round {k + 1}/{rounds}, {r.backend} {r.precision}")
            if iterations is not None:
                n_here = math.ceil(iterations * (k + 1) / rounds) - len(times[i])
                for _ in range(n_here):
                    t = time.perf_counter()
                    r(x)
                    times[i].append(time.perf_counter() - t)
            else:
                assert seconds is not None
                budget = seconds / rounds
                spent = 0.0
                min_calls = 3 if k == rounds - 1 and len(times[i]) < 3 else 1
                n = 0
                while spent < budget or n < min_calls:
                    t = time.perf_counter()
                    r(x)
                    dt = time.perf_counter() - t
                    times[i].append(dt)
                    spent += dt
                    n += 1
    return times


class Worker:
    """One row in its own process (``python -m vitdeploy.tools.bench_worker``): open once, time on command."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.hello = self._read()
        self.peak_rss_mb = float(self.hello.get("peak_rss_mb") or 0.0)

    @classmethod
    def for_row(cls, path: Path, backend: str, threads: int, device: str) -> Worker:
        return cls([sys.executable, "-m", "vitdeploy.tools.bench_worker", str(path), backend, str(threads), device])

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            return {"error": f"the worker ended (exit {self.proc.wait()})"}
        return dict(json.loads(line))

    @property
    def error(self) -> str | None:
        e = self.hello.get("error")
        return str(e) if e else None

    def time(self, **cmd: Any) -> list[float]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        ans = self._read()
        if "error" in ans:
            raise VitdeployError(f"benchmark worker failed: {ans['error']}")
        self.peak_rss_mb = max(self.peak_rss_mb, float(ans.get("peak_rss_mb") or 0.0))
        return [float(t) for t in ans["times"]]

    def close(self, now: bool = False) -> None:
        """End the worker: closing its pipe ends an idle one; ``now`` (Ctrl-C, an error) terminates a busy one
        at once instead of waiting for its round to finish."""
        try:
            if self.proc.stdin:
                self.proc.stdin.close()
        except OSError:  # a worker that died first: its pipe is broken
            pass
        if now:
            self.proc.terminate()
        try:
            self.proc.wait(timeout=2 if now else 30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def measure_workers(
    workers: Sequence[Worker],
    batch: int,
    warmup: int = 3,
    iterations: int | None = None,
    seconds: float | None = None,
    rounds: int = ROUNDS,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> list[list[float]]:
    """As ``measure``, with each row in its own process: the rows' rounds alternate, one process busy at a time."""
    if iterations is None and seconds is None:
        seconds = DEFAULT_SECONDS
    rounds = max(1, min(rounds, iterations or rounds))
    times: list[list[float]] = [[] for _ in workers]
    for k in range(rounds):
        for i, w in enumerate(workers):
            if progress:
                progress(f"batch {batch}: round {k + 1}/{rounds}, {w.hello.get('backend')} {w.hello.get('precision')}")
            cmd: dict[str, Any] = {"batch": batch, "seed": seed, "warmup": warmup if k == 0 else 0}
            if iterations is not None:
                cmd["calls"] = math.ceil(iterations * (k + 1) / rounds) - len(times[i])
            else:
                assert seconds is not None
                cmd["seconds"] = seconds / rounds
                cmd["min_calls"] = 3 - len(times[i]) if k == rounds - 1 and len(times[i]) < 3 else 1
            times[i] += w.time(**cmd)
    return times


def too_short(workers: Sequence[Worker], times: Sequence[Sequence[float]], seconds: float, batch: int) -> None:
    """Refuse to print a figure when ``seconds`` did not cover the calls that make one.

    Every round makes at least one call (three in all), so a budget shorter than those calls is overrun: what was
    timed is the forced calls, not the time asked for. Overrun more than twice, no figure is given."""
    for w, ts in zip(workers, times, strict=True):
        if sum(ts) > 2 * seconds:
            need = sum(ts)
            raise UsageError(
                f"--seconds {seconds:g}: {w.hello.get('backend')} {w.hello.get('precision')} at batch {batch} took "
                f"{need:.3g} s for the fewest calls a figure needs ({len(ts)}: one a round), over twice the time "
                f"given, so no figure is printed; give --seconds {max(1.0, 2 * need):.3g} or more, or --iterations N")


def ratios_between(rows: list[BenchRow]) -> list[dict[str, Any]]:
    """Throughput ratios at each batch size: every row against the first, and each precision against fp32 of its backend."""
    out = []
    for b in sorted({r.batch for r in rows}):
        at = [r for r in rows if r.batch == b]
        base = at[0]
        for r in at[1:]:
            out.append({"batch": b, "row": r.name, "vs": base.name, "ratio": r.throughput / base.throughput,
                        "row_artifact": r.artifact, "vs_artifact": base.artifact})
        for r in at:
            if r.precision == "fp32":
                continue
            ref = next((q for q in at if q.backend == r.backend and q.precision == "fp32"), None)
            if ref is not None and ref is not base:
                out.append({"batch": b, "row": r.name, "vs": ref.name, "ratio": r.throughput / ref.throughput,
                            "row_artifact": r.artifact, "vs_artifact": ref.artifact})
    return out


def check_settings(batch_sizes: Sequence[int], warmup: int, iterations: int | None, seconds: float | None,
                   threads: int | None, device: str) -> None:
    """Refuse impossible settings in one line (exit 2) before any artifact is opened."""
    if not batch_sizes or any(b < 1 for b in batch_sizes):
        raise UsageError("--batch-sizes: give positive integers, e.g. 1,8,32")
    if warmup < 0:
        raise UsageError(f"--warmup {warmup}: give 0 or more untimed calls")
    if iterations is not None and iterations < 1:
        raise UsageError("--iterations must be at least 1")
    if seconds is not None and not (math.isfinite(seconds) and 0 < seconds <= MAX_SECONDS):
        raise UsageError(f"--seconds {seconds:g}: give a positive number of at most {MAX_SECONDS:g} "
                         "(seconds per row and batch size)")
    if threads is not None and threads < 1:
        raise UsageError(f"--threads {threads}: give 1 or more (default: one per core)")
    if device not in ("cpu", "cuda"):
        raise UsageError(f"--device {device!r}: choose cpu or cuda")
    if device == "cuda":
        from vitdeploy.runners.tensorrt.cuda import gpu_info

        info = gpu_info(0)
        if isinstance(info, str):
            raise UsageError(f"--device cuda: {info}; measure on the CPU (--device cpu)")


def activation_bytes(model: dict[str, Any], input_size: Sequence[int]) -> int:
    """A ViT forward's peak working memory per image, float32, in bytes (an estimate, on the safe side).

    The live tensors at the widest point of a block: attention scores and their softmax (heads x N x N each), the
    MLP's hidden layer and its activation (N x mlp each), Q, K, V and the residual (N x dim each); plus the input.
    """
    h, w = (int(v) for v in input_size)
    p = int(model.get("patch_size") or 16)
    d = int(model.get("embed_dim") or 768)
    heads = int(model.get("num_heads") or 12)
    mlp = int(model.get("mlp_dim") or d * float(model.get("mlp_ratio") or 4.0))
    n = (h // p) * (w // p) + 1
    return 4 * (2 * heads * n * n + 2 * n * mlp + 4 * n * d + 3 * h * w)


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can have without swapping (Linux MemAvailable); None elsewhere."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def check_memory(paths: Sequence[Path], batch: int) -> None:
    """Refuse, in one line and before any row is opened, a batch whose working memory cannot fit here.

    Each row's process needs the batch, twice over for the framework's own buffers (a factor measured loosely:
    ONNX Runtime and torch keep a few of the estimated tensors alive at once)."""
    free = available_memory()
    if free is None:
        return
    for path in paths:
        if artifact_kind(path) == "checkpoint":
            from vitdeploy.model.importers import read_any_manifest

            manifest = read_any_manifest(path)
        else:
            manifest = read_manifest(path)
        need = 2 * batch * activation_bytes(manifest.model, manifest.input_size)
        if need > free:
            fit = max(1, free // (2 * activation_bytes(manifest.model, manifest.input_size)))
            raise UsageError(f"--batch-sizes {batch}: {path.name} would need about {need / 2**30:.1f} GiB, and "
                             f"{free / 2**30:.1f} GiB is free here; use a batch of at most {fit}")


# --- the anchor: NNCF's INT8 of the same model (--versus nncf) -----------------------------------

VERSUS = ("nncf",)
NNCF_PRECISION = "int8-nncf"  # the anchor row's precision label (backend openvino)
ANCHOR_IMAGES = 64


def check_versus(versus: str | None, backends: Sequence[str] | None = None) -> None:
    """``--versus``: nncf, where NNCF and OpenVINO are installed (one line saying how to install them otherwise).
    NNCF's INT8 is an OpenVINO model, so its row runs on OpenVINO: a --backends list without openvino is refused
    before any work rather than overridden (issue 37, P11: it ran an OpenVINO row under --backends onnxruntime)."""
    if versus is None:
        return
    if versus not in VERSUS:
        raise UsageError(f"--versus {versus!r}: choose {', '.join(VERSUS)}")
    if backends and "openvino" not in backends:
        raise UsageError(f"--versus nncf measures NNCF's INT8 on OpenVINO, which --backends {','.join(backends)} leaves "
                         "out: add openvino to --backends, or drop --versus")
    from vitdeploy.graph.nncf_ptq import import_nncf
    from vitdeploy.runners.openvino.loader import import_openvino

    import_nncf()
    import_openvino()


def fp32_onnx_of(models: Sequence[str | Path]) -> Path:
    """The FP32 ONNX among the models: what NNCF's anchor is made from."""
    for m in models:
        p = Path(m)
        if artifact_kind(p) == "onnx" and read_manifest(p).precision == "fp32":
            return p
    raise UsageError("--versus nncf: NNCF's INT8 is made from the FP32 ONNX; pass it among the models (e.g. model.onnx)")


def nncf_anchor(fp32: str | Path, folder: str | Path, images: str | Path | None = None,
                num_images: int = ANCHOR_IMAGES, seed: int = 0) -> tuple[Path, str]:
    """NNCF's INT8 of the FP32 ONNX as OpenVINO's user makes it in one call (``nncf.quantize`` on the OpenVINO model,
    ``model_type=TRANSFORMER``, every other default), saved as IR in ``folder``; and where its calibration images came
    from: the one image rule (``images``, calibration/ here, the digits for a digits model), else random images
    (the anchor is for speed, which does not depend on the images)."""
    from vitdeploy.graph.nncf_ptq import import_nncf, quiet
    from vitdeploy.model.imageset import ImageSet
    from vitdeploy.runners.openvino.loader import import_openvino

    nncf, ov = import_nncf(), import_openvino()
    manifest = read_manifest(fp32)
    chosen = ImageSet.for_model(manifest, images, num_images, seed)
    if chosen is None:
        h, w = manifest.input_size
        chosen = ImageSet.folder(_random_images(Path(folder) / "anchor-calibration", num_images, (h, w), seed))
        chosen.source = f"{num_images} random images"
    data = [b.array[i : i + 1] for b in chosen.batches(manifest.pp(), 8) for i in range(len(b.paths))]
    with quiet():
        q = nncf.quantize(ov.Core().read_model(str(fp32)), nncf.Dataset(data), model_type=nncf.ModelType.TRANSFORMER,
                          subset_size=len(data))
    xml = Path(folder) / "nncf.int8.xml"
    xml.parent.mkdir(parents=True, exist_ok=True)
    ov.save_model(q, str(xml))
    return xml, str(chosen.source)


def versus_ratios(rows: list[BenchRow]) -> list[dict[str, Any]]:
    """Each of our INT8 rows against NNCF's INT8 at the same batch size (ours / NNCF's images per second)."""
    out = []
    for b in sorted({r.batch for r in rows}):
        anchor = next((r for r in rows if r.batch == b and r.precision == NNCF_PRECISION), None)
        if anchor is None:
            continue
        for r in rows:
            if r.batch == b and r.precision == "int8":
                out.append({"batch": b, "row": r.name, "vs": anchor.name, "ratio": r.throughput / anchor.throughput,
                            "row_artifact": r.artifact, "vs_artifact": anchor.artifact, "versus": "nncf"})
    return out


def benchmark(
    models: Sequence[str | Path],
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    backends: Sequence[str] | None = None,
    warmup: int = 3,
    iterations: int | None = None,
    seconds: float | None = None,
    threads: int | None = None,
    device: str = "cpu",
    progress: Callable[[str], None] | None = None,
    versus: str | None = None,
) -> BenchReport:
    """Measure every (artifact, backend) row at every batch size, each row in its own process, rounds interleaved.

    ``versus="nncf"``: one row more, OpenVINO on NNCF's INT8 of the FP32 ONNX among ``models`` (nncf_anchor), made
    and measured in this run, and each INT8 row's ratio to it."""

    if not models:
        raise UsageError("nothing to measure: pass MODEL paths or --preset NAME")
    check_settings(batch_sizes, warmup, iterations, seconds, threads, device)
    check_versus(versus, backends)
    threads = threads or available_cores()
    notes: list[str] = []
    workers: list[Worker] = []
    pairs = rows_for(models, backends)
    check_memory([p for p, _ in pairs], max(batch_sizes))
    anchor_dir = tempfile.TemporaryDirectory(prefix="vitdeploy-nncf-") if versus else None
    anchor: list[str] | None = None
    interrupted = True  # until the rows are measured: a Ctrl-C or an error terminates busy workers at once
    try:
        if anchor_dir is not None:
            fp32 = fp32_onnx_of(models)
            if progress:
                progress(f"NNCF's INT8 of {fp32.name}")
            xml, source = nncf_anchor(fp32, anchor_dir.name)
            ah, aw = read_manifest(fp32).input_size
            anchor = [sys.executable, "-m", "vitdeploy.tools.bench_worker", str(xml), "openvino", str(threads),
                      "default", NNCF_PRECISION, str(ah), str(aw)]
            notes.append(f"openvino {NNCF_PRECISION}: NNCF's INT8 of {fp32.name} (nncf.quantize on the OpenVINO model, "
                         f"ModelType.TRANSFORMER, calibrated on {source}), OpenVINO's default precision hint")
        for path, backend in pairs:
            if progress:
                progress(f"opening {path.name} on {backend}")
            w = Worker.for_row(path, backend, threads, device)
            if w.error is None:
                workers.append(w)
                continue
            w.close()
            if len(pairs) == 1 and not w.hello.get("import_error"):
                raise VitdeployError(w.error)
            notes.append(f"{path} on {backend}: skipped ({w.error})")
        if not workers:
            raise VitdeployError("no row could be opened here: " + "; ".join(notes))
        if anchor is not None:  # the last row: the table's "x first" and the ratios keep our first row as base
            w = Worker(anchor)
            if w.error is not None:
                w.close()
                raise VitdeployError(f"--versus nncf: {w.error}")
            workers.append(w)
        rows: list[BenchRow] = []
        for b in batch_sizes:
            times = measure_workers(workers, b, warmup, iterations, seconds, progress=progress)
            if iterations is None:
                too_short(workers, times, seconds or DEFAULT_SECONDS, b)
            for w, ts in zip(workers, times, strict=True):
                p50, p90, p99, mean = _percentiles(ts)
                back = str(w.hello["backend"])
                rows.append(BenchRow(str(w.hello["artifact"]), back, str(w.hello["precision"]), b, len(ts), b * len(ts) / sum(ts),
                                     p50, p90, p99, mean, "cuda" if back == "tensorrt" else device, round(w.peak_rss_mb, 1)))
        interrupted = False
    finally:
        for w in workers:
            w.close(now=interrupted)
        if anchor_dir is not None:
            anchor_dir.cleanup()
    settings = {
        "warmup": warmup, "iterations": iterations, "seconds": None if iterations else (seconds or DEFAULT_SECONDS),
        "rounds": ROUNDS, "batch_sizes": list(batch_sizes), "device": device,
        "torch": f"eager, inference_mode, torch.set_num_threads({threads})",
        "onnxruntime": f"ORT_ENABLE_ALL graph optimizations, intra_op_num_threads={threads}, inter_op_num_threads=1, sequential",
        "openvino": f"CPU, PERFORMANCE_HINT=LATENCY, INFERENCE_NUM_THREADS={threads}, INFERENCE_PRECISION_HINT as the graph's floats",
        "isolation": "each row in its own process, rounds interleaved",
    }
    if versus:
        settings["versus"] = versus
    ratios = ratios_between(rows) + versus_ratios(rows)
    return BenchReport(rows, ratios, machine_info(threads), library_versions(), settings, notes)


# --- a preset without a checkpoint ---------------------------------------------------------------


def _random_checkpoint(preset: str, folder: Path, seed: int) -> Path:
    import torch

    from vitdeploy.core.manifest import Manifest, tool_versions
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.vit import build_model, get_preset

    pr = get_preset(preset)  # an unknown name: UnknownPreset, a usage error
    torch.manual_seed(seed)
    model = build_model(pr.config).eval()
    manifest = Manifest(
        model=pr.config.to_dict(),
        labels=[f"class_{i}" for i in range(pr.config.num_classes)],
        preprocess=dict(pr.preprocess),
        name=pr.name,
        source={"preset": pr.name, "weights": f"random (seed {seed})"},
        versions=tool_versions("torch"),
    )
    return save_checkpoint(folder / "ckpt.pth", model, manifest)


def _random_images(folder: Path, n: int, size: tuple[int, int], seed: int) -> Path:
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    h, w = size
    for i in range(n):
        Image.fromarray(rng.integers(0, 256, (h + 32, w + 32, 3), dtype=np.uint8)).save(folder / f"random_{i:03d}.png")
    return folder


def _pipeline() -> tuple[Any, Any, Any]:
    """export_onnx, calibrate and convert_fp16: the project's own export and precision steps."""
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.stages.precision import calibrate, convert_fp16

    return export_onnx, calibrate, convert_fp16


def preset_artifacts(
    preset: str,
    folder: str | Path,
    calib_images: int = 16,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    cpu_int8: bool = False,
) -> tuple[list[Path], list[str]]:
    """A random-weight checkpoint of the preset, its FP32 ONNX, FP16 ONNX and INT8 ONNX (random-calibrated).

    Returns the artifacts that could be made, and notes on those that could not. An unknown preset is refused
    (UnknownPreset, a usage error) before anything imports torch.
    """
    from vitdeploy.model.presets import get_preset

    pr = get_preset(preset)
    export_onnx, calibrate, convert_fp16 = _pipeline()
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    say = progress or (lambda s: None)
    say(f"building a random-weight {preset}")
    ckpt = _random_checkpoint(preset, d, seed)
    say("exporting ONNX")
    onnx_path = Path(export_onnx(ckpt, out=d / "model.onnx", check=False).path)
    out = [ckpt, onnx_path]
    say("converting to FP16")
    try:
        out.append(Path(convert_fp16(onnx_path, out=d / "model.fp16.onnx")))
    except VitdeployError as e:
        notes.append(f"FP16 ONNX not made: {e}")
    say("quantizing to INT8 (random calibration images)")
    h, w = pr.preprocess["input_size"]  # the checkpoint's, without reading it back
    size = (int(h), int(w))
    calib = _random_images(d / "calibration", calib_images, size, seed)
    try:
        res = calibrate(onnx_path, images=calib, out=d / "model.int8.onnx", num_images=calib_images,
                        batch_size=min(8, calib_images), seed=seed)
        out.append(Path(res.path))
    except VitdeployError as e:
        notes.append(f"INT8 ONNX not made: {e}")
    if cpu_int8:  # the CPU INT8 (calibrate -t cpu): what --versus nncf compares with NNCF's
        say("quantizing to the CPU INT8 (-t cpu)")
        try:
            res = calibrate(onnx_path, images=calib, out=d / "model.cpu.int8.onnx", num_images=calib_images,
                            batch_size=min(8, calib_images), seed=seed, target="cpu")
            out.append(Path(res.path))
        except VitdeployError as e:
            notes.append(f"CPU INT8 ONNX not made: {e}")
    return out, notes


def benchmark_preset(
    preset: str,
    batch_sizes: Sequence[int] = DEFAULT_BATCH_SIZES,
    backends: Sequence[str] | None = None,
    warmup: int = 3,
    iterations: int | None = None,
    seconds: float | None = None,
    threads: int | None = None,
    device: str = "cpu",
    keep: str | Path | None = None,
    progress: Callable[[str], None] | None = None,
    versus: str | None = None,
) -> BenchReport:
    """Torch eager and ONNX Runtime FP32, FP16 and INT8 of a random-weight preset, without a checkpoint (and with
    ``versus="nncf"`` the CPU INT8 and NNCF's INT8 beside them)."""
    check_versus(versus, backends)
    with tempfile.TemporaryDirectory(prefix="vitdeploy-bench-") as tmp:
        folder = Path(keep) if keep else Path(tmp)
        models, notes = preset_artifacts(preset, folder, progress=progress, cpu_int8=versus == "nncf")
        rep = benchmark(models, batch_sizes, backends, warmup, iterations, seconds, threads, device, progress, versus)
    rep.notes = notes + rep.notes
    rep.settings["preset"] = preset
    return rep
