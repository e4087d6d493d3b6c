"""Classify image files and folders with any artifact: the command users run every day.

Decoding runs in a small pool of reader threads ahead of the model (``images.iter_batches``),
so memory stays flat on a folder of any size and the model is not left waiting. A file that
cannot be decoded is named, skipped and counted; the rest of the run goes on.
"""

from __future__ import annotations

import csv
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.checks import metrics
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import atomic_path, printable_name, strict_json
from vitdeploy.core.images import iter_batches
from vitdeploy.core.manifest import ENGINE_SUFFIXES
from vitdeploy.core.naming import precision_from_name
from vitdeploy.core.preprocess import gather_images  # noqa: F401 (gather_images: the CLI's)
from vitdeploy.core.text import csv_cell
from vitdeploy.runners import BACKENDS, artifact_kind, open_runner

PRECISION_RANK = {"int8": 0, "fp16": 1, "fp32": 2}
DEFAULT_BATCH_SIZE = 8
DEFAULT_TOP_K = 5


@dataclass(slots=True)
class Prediction:
    path: Path
    labels: list[str]  # top-k, best first
    scores: list[float]  # softmax probabilities, same order

    @property
    def label(self) -> str:
        return self.labels[0]

    @property
    def score(self) -> float:
        return self.scores[0]

    def row(self) -> dict[str, Any]:
        """The flat record written to CSV and JSON: path, label, score, then label_i/score_i for the top k."""
        r: dict[str, Any] = {"path": printable_name(self.path), "label": self.label, "score": round(self.score, 6)}
        for i, (lab, sc) in enumerate(zip(self.labels, self.scores, strict=True), 1):
            r[f"label_{i}"] = lab
            r[f"score_{i}"] = round(sc, 6)
        return r


@dataclass
class InferResult:
    model: Path
    backend: str
    precision: str
    top_k: int
    predictions: list[Prediction] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return len(self.predictions) / self.seconds if self.seconds > 0 else 0.0


# --- which model --------------------------------------------------------------------------------


def tensorrt_missing() -> str | None:
    """Why TensorRT cannot be used here (a type-stubs-only ``tensorrt`` folder counts as missing), or None."""
    from vitdeploy.runners.tensorrt.versions import import_tensorrt

    trt = import_tensorrt()
    return trt if isinstance(trt, str) else None


def tensorrt_usable() -> bool:
    """TensorRT importable and a CUDA GPU the driver lists: the one probe (libcuda, so a Jetson without nvidia-smi
    counts), asked without importing torch."""
    from vitdeploy.runners.tensorrt.probe import tensorrt_usable as usable

    return usable()


def onnx_gpu_usable() -> bool:
    """ONNX Runtime with the CUDA provider (where FP16 graphs run fast)."""
    try:
        import onnxruntime as ort
    except ImportError:
        return False
    return "CUDAExecutionProvider" in ort.get_available_providers()


def candidate_models(folder: str | Path = ".", backend: str = "auto") -> list[Path]:
    """Artifacts in ``folder`` in the order ``infer`` tries them.

    Engines first (only where TensorRT and a GPU are here), then ONNX models: INT8, FP16, FP32 where
    ONNX Runtime has a GPU; on a CPU FP32 comes before FP16, because ONNX Runtime's CPU provider has
    few float16 kernels and runs an FP16 graph slower than the FP32 one (measured by `vitdeploy
    benchmark --preset`). Then the checkpoint ``ckpt.pth`` and other ``.pth`` files. Within one
    precision the newest file comes first, except that on a CPU an INT8 made for a CPU target comes before one
    made for TensorRT.
    """
    d = Path(folder)
    if not d.is_dir():
        return []

    def newest_first(paths: list[Path]) -> list[Path]:
        return sorted(paths, key=lambda p: -p.stat().st_mtime)

    def visible(pattern: str) -> list[Path]:
        return [p for p in d.glob(pattern) if p.is_file() and not p.name.startswith(".")]

    out: list[Path] = []
    if backend in ("auto", "tensorrt") and (backend == "tensorrt" or tensorrt_usable()):
        engines = [p for s in ENGINE_SUFFIXES for p in visible(f"*{s}")]
        out += sorted(newest_first(engines), key=lambda p: PRECISION_RANK[precision_from_name(p)])
    if backend in ("auto", "onnxruntime", "openvino"):
        gpu = onnx_gpu_usable()
        order = PRECISION_RANK if gpu else {"int8": 0, "fp32": 1, "fp16": 2}
        # on a CPU, among the INT8 models one made for the CPU (calibrate -t cpu / openvino) before one for TensorRT
        out += sorted(newest_first(visible("*.onnx")), key=lambda p: (
            order[precision_from_name(p)], not gpu and precision_from_name(p) == "int8" and not made_for_cpu(p)))
    if backend in ("auto", "torch"):
        ckpts = newest_first(visible("*.pth") + visible("*.pt"))
        out += sorted(ckpts, key=lambda p: p.name != "ckpt.pth")
    return out


def made_for_cpu(path: Path) -> bool:
    """Whether an ONNX artifact's manifest names a CPU target (cpu, ort, openvino); False when it has none."""
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.targets import CPU_TARGETS

    try:
        return read_onnx_manifest(path).target in CPU_TARGETS
    except Exception:  # no manifest, or not readable: infer says why when it opens it
        return False


def stale_note(path: str | Path) -> str | None:
    """Why an auto-pick passes over ``path``: made from an earlier version of the source beside it (core.lineage);
    None when current, or when it records no source or has no manifest to read."""
    from vitdeploy.core.artifact import read_manifest
    from vitdeploy.core.lineage import STALE, remake_command, source_link

    p = Path(path)
    if p.suffix not in (".onnx", *ENGINE_SUFFIXES):
        return None
    try:
        m = read_manifest(p)
    except (VitdeployError, OSError, ValueError):
        return None
    link = source_link(p, m)
    if link.status != STALE or link.source is None:
        return None
    return (f"passed over {p.name}: stale, made from an earlier {link.source.name} (re-make it with "
            f"`{remake_command(p, m)}`)")


def pick_model(folder: str | Path = ".", backend: str = "auto", threads: int | None = None) -> tuple[Any, list[str]]:
    """The first candidate that opens here, as an open Runner, and notes on what was passed over and why."""
    notes: list[str] = []
    cands = candidate_models(folder, backend)
    if not cands:
        what = {"auto": "engine, ONNX model or checkpoint", "torch": "checkpoint (.pth)",
                "onnxruntime": "ONNX model", "openvino": "ONNX model", "tensorrt": "engine"}[backend]
        raise VitdeployError(
            f"no {what} in {Path(folder).resolve()}: pass --model PATH, or create one with "
            "`vitdeploy train` / `vitdeploy export`"
        )
    for p in cands:
        why = stale_note(p)
        if why:  # lineage: a file made from an earlier version of the source beside it is never picked silently
            notes.append(why)
            continue
        try:
            runner = open_runner(p, backend=backend, threads=threads)
        except (VitdeployError, ImportError) as e:
            notes.append(f"passed over {p.name}: {e}")
            continue
        return runner, notes
    raise VitdeployError(f"none of the models in {Path(folder).resolve()} opens here ({'; '.join(notes)}); pass --model PATH")


def open_model(model: str | Path | None = None, backend: str = "auto", threads: int | None = None) -> tuple[Any, list[str]]:
    """An open Runner for ``model`` (or the pick from the current folder) and notes for the user."""
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    if backend == "tensorrt" or (model is not None and backend == "auto" and artifact_kind(model) == "engine"):
        why = tensorrt_missing()
        if why is not None:
            raise VitdeployError(
                f"{why}: install it with `pip install 'vitdeploy[gpu]'` on a machine with an NVIDIA GPU "
                "(on a Jetson: JetPack's TensorRT), or run an ONNX model (--model model.onnx --backend onnxruntime)"
            )
    if backend == "onnxruntime" and importlib.util.find_spec("onnxruntime") is None:
        raise VitdeployError("onnxruntime is not installed: pip install 'vitdeploy[cpu]' (or [gpu])")
    if backend == "openvino":
        from vitdeploy.runners.openvino.loader import import_openvino

        import_openvino()  # one line saying how to install it
    if backend == "torch" and importlib.util.find_spec("torch") is None:
        raise VitdeployError("PyTorch is not installed: pip install torch, or pass an ONNX model")
    if model is None:
        runner, notes = pick_model(".", backend, threads)
        return runner, [*notes, f"model: {runner.artifact} ({runner.backend}, {runner.precision}; newest usable here)"]
    p = Path(model)
    if not p.exists():
        raise VitdeployError(f"--model {p}: no such file; pass the path of a checkpoint, ONNX model or engine")
    if p.is_dir() and not (p / "config.json").is_file():  # a Hugging Face save_pretrained folder is a checkpoint
        raise VitdeployError(f"--model {p} is a folder: pass the checkpoint, ONNX model or engine inside it")
    try:
        runner = open_runner(p, backend=backend, threads=threads)
    except ImportError as e:
        raise VitdeployError(f"{p}: the {backend} backend cannot be loaded ({e}); install it or pick another backend") from None
    return runner, []


# --- the run ------------------------------------------------------------------------------------


def infer(
    images: Sequence[str | Path],
    model: str | Path | None = None,
    backend: str = "auto",
    batch_size: int = DEFAULT_BATCH_SIZE,
    top_k: int = DEFAULT_TOP_K,
    threads: int | None = None,
    workers: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    runner: Any | None = None,
) -> InferResult:
    """Top-k predictions for every readable image under ``images``.

    ``progress(done, skipped, total)`` is called after each batch. An open ``runner`` may be
    passed instead of ``model`` (as benchmark scripts do). Raises VitdeployError when no image
    could be read; the caller decides what skipped files mean (the CLI exits 3).
    """
    if batch_size < 1:
        raise UsageError(f"--batch-size {batch_size}: must be at least 1")
    if top_k < 1:
        raise UsageError(f"--top-k {top_k}: must be at least 1")
    paths = gather_images(images)
    notes: list[str] = []
    own = runner is None
    if runner is None:
        runner, notes = open_model(model, backend, threads)
    try:
        labels = list(runner.manifest.labels)
        if top_k > len(labels):
            notes.append(f"--top-k {top_k} is more than the {len(labels)} classes: showing {len(labels)}")
            top_k = len(labels)
        check_batch_fits(runner.manifest, batch_size)
        res = InferResult(runner.artifact, runner.backend, runner.precision, top_k, notes=notes)
        pp = runner.manifest.pp()
        t0 = time.perf_counter()
        done = 0
        for batch in iter_batches(paths, pp, batch_size, workers=workers):
            res.skipped.extend(batch.skipped)
            if batch.paths:
                logits = runner(batch.array)
                idx, prob = metrics.top_k(metrics.softmax(logits), top_k)
                for p, ix, pr, ok in zip(batch.paths, idx, prob, metrics.finite_rows(logits), strict=True):
                    if not ok:  # a NaN row's argmax is class 0: named as not classified, never a prediction
                        res.skipped.append((p, "the model gave NaN or Inf logits for it"))
                        continue
                    res.predictions.append(Prediction(p, [labels[i] for i in ix], [float(v) for v in pr]))
                done += len(batch.paths)
            if progress:
                progress(done, len(res.skipped), len(paths))
        res.seconds = time.perf_counter() - t0
    finally:
        if own:
            runner.close()
    if not res.predictions:
        first = f" (e.g. {printable_name(res.skipped[0][0])}: {res.skipped[0][1]})" if res.skipped else ""
        raise VitdeployError(f"none of the {len(paths)} image(s) could be read{first}")
    return res


def batch_bytes(manifest: Any, batch_size: int) -> int:
    """Working memory of one infer batch: the model's (benchmark's activation estimate, twice over for the runtime's
    buffers, as benchmark counts it) and the decoded float32 images in flight (``iter_batches`` keeps up to three
    batches: the one running and two decoded ahead)."""
    from vitdeploy.tools.bench import activation_bytes

    h, w = (int(v) for v in manifest.input_size)
    return batch_size * (2 * activation_bytes(manifest.model, (h, w)) + 3 * 4 * 3 * h * w)


def check_batch_fits(manifest: Any, batch_size: int) -> None:
    """Refuse, in one line before the first image is decoded, a --batch-size whose working memory is more than this
    machine has free (issue 31: ``infer -b 100000`` held 6.3 GB on 32x32 images), naming the batch that fits."""
    from vitdeploy.tools.bench import available_memory

    free = available_memory()
    need = batch_bytes(manifest, batch_size)
    if free is None or need <= free:
        return
    fit = max(1, free // max(1, batch_bytes(manifest, 1)))
    raise UsageError(f"--batch-size {batch_size}: one batch would need about {need / 2**30:.1f} GiB and "
                     f"{free / 2**30:.1f} GiB is free here; use --batch-size {min(fit, batch_size - 1)} or less")


# --- output -------------------------------------------------------------------------------------


def result_columns(top_k: int) -> list[str]:
    cols = ["path", "label", "score"]
    for i in range(1, top_k + 1):
        cols += [f"label_{i}", f"score_{i}"]
    return cols


def write_predictions(result: InferResult, path: str | Path) -> Path:
    """Write the rows as .csv (header row) or .json (a list of objects with the same keys), atomically.

    Rows are streamed into the temporary file, so 100,000 predictions need no second copy in memory.
    """
    p = Path(path)
    suffix = p.suffix.lower()
    if suffix not in (".csv", ".json"):
        raise VitdeployError(f"-o {p}: write .csv or .json")
    with atomic_path(p) as tmp, tmp.open("w", encoding="utf-8", newline="") as f:
        if suffix == ".json":
            f.write("[")
            for i, pr in enumerate(result.predictions):
                f.write(("," if i else "") + "\n " + strict_json(pr.row(), indent=None))
            f.write("\n]\n")
        else:
            w = csv.DictWriter(f, fieldnames=result_columns(result.top_k), lineterminator="\n")
            w.writeheader()
            for pr in result.predictions:  # text cells escaped, formula starts (= + - @) neutralised
                w.writerow({k: csv_cell(v) for k, v in pr.row().items()})
    return p
