"""Classify image files and folders with any artifact: the command users run every day.

Decoding runs in a small pool of reader threads ahead of the model (``images.iter_batches``),
so memory stays flat on a folder of any size and the model is not left waiting. A file that
cannot be decoded is named, skipped and counted; the rest of the run goes on.

An embedding model (its task: core/task.py) answers a vector per image instead of labels: ``embed`` keeps them in
image order with their file names (written as .npy with a .files.txt list of the files, .json, or .parquet where
pyarrow is installed), and with a gallery (a labelled ImageFolder) labels each image by its nearest gallery
neighbours, DINOv2's weighted kNN vote (checks/metrics: k=20, T=0.07).
"""

from __future__ import annotations

import csv
import importlib.util
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vitdeploy.checks import metrics
from vitdeploy.core.errors import NonFiniteOutput, UsageError, VitdeployError
from vitdeploy.core.fileio import atomic_path, printable_name, strict_json
from vitdeploy.core.images import iter_batches
from vitdeploy.core.manifest import ENGINE_SUFFIXES
from vitdeploy.core.naming import CHECKPOINT_SUFFIXES, precision_from_name
from vitdeploy.core.preprocess import gather_images  # noqa: F401 (gather_images: the CLI's)
from vitdeploy.core.text import csv_cell
from vitdeploy.runners import BACKENDS, artifact_kind, open_runner

if TYPE_CHECKING:
    import numpy as np

    from vitdeploy.core.task import Task

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


def other_checkpoint_note(path: Path, ckpt: Path | None) -> str | None:
    """Why the folder pick passes over ``path``: it is not made from ``ckpt``, the checkpoint the pick falls back to
    here (ckpt.pth, else the newest), so the answer would be another model's (core/lineage.descends_from: made from
    another checkpoint, or from one whose record is missing); None when it is, or when the folder has no checkpoint."""
    from vitdeploy.core.lineage import descends_from

    if ckpt is None or path.suffix in CHECKPOINT_SUFFIXES or path.suffix not in (".onnx", *ENGINE_SUFFIXES):
        return None
    d = descends_from(path, ckpt)
    if d.usable:
        return None
    return f"passed over {path.name}: not made from {ckpt.name} (made from {d.made_from_text()})"


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
    # the checkpoint the pick falls back to (whatever the backend): what every other candidate must be made from
    ckpt = next(iter(candidate_models(folder, "torch")), None)
    for p in cands:
        why = stale_note(p) or other_checkpoint_note(p, ckpt)
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
    gallery: str | Path | None = None,
) -> InferResult | EmbedResult:
    """Top-k predictions for every readable image under ``images``; for an embedding model, its vectors (``embed``,
    with kNN labels from ``gallery``).

    ``progress(done, skipped, total)`` is called after each batch. An open ``runner`` may be
    passed instead of ``model`` (as benchmark scripts do). Raises VitdeployError when no image
    could be read; the caller decides what skipped files mean (the CLI exits 3).
    """
    from vitdeploy.core.task import task_of

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
        if task_of(runner.manifest).is_embedding:
            return embed(paths, runner, batch_size, top_k, workers, progress, gallery, notes)
        if gallery is not None:
            raise UsageError(f"--gallery labels images by an embedding model's nearest neighbours; {runner.artifact} "
                             f"is a {task_of(runner.manifest).describe()} and labels them itself: drop --gallery "
                             "(or export its features with `vitdeploy export CKPT --embedding`)")
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
                        res.skipped.append((p, NONFINITE_SKIP.format("logits")))
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
        raise nothing_answered(len(paths), res.skipped)
    return res


NONFINITE_SKIP = "the model gave NaN or Inf {} for it"  # an image read, but not answered: never "could not be read"


def nothing_answered(total: int, skipped: list[tuple[Path, str]], what: str = "") -> VitdeployError:
    """The one line when no image got an answer, true to why: the images could not be read, or the model answered
    NaN or Inf for those that could (issue 40: a NaN model read as "none of the 15 image(s) could be read"), or
    both, counted apart. ``what``: the set's name ("--gallery DIR: "), or "" for the images given."""
    said = NONFINITE_SKIP.split("{")[0]  # "the model gave NaN or Inf "
    nonfinite = [(p, why) for p, why in skipped if why.startswith(said)]
    unread = [(p, why) for p, why in skipped if not why.startswith(said)]
    if not nonfinite:
        first = f" (e.g. {printable_name(unread[0][0])}: {unread[0][1]})" if unread else ""
        return VitdeployError(f"{what}none of the {total} image(s) could be read{first}")
    rest = (f"; the other {len(unread)} could not be read (e.g. {printable_name(unread[0][0])}: {unread[0][1]})"
            if unread else "")
    return NonFiniteOutput(f"{what}the model gave NaN or Inf values for all {len(nonfinite)} image(s) it read "
                           f"(e.g. {printable_name(nonfinite[0][0])}){rest}: the model is broken, not the images; "
                           "check it against its source with `vitdeploy verify`")


# --- embedding models ----------------------------------------------------------------------------

NEIGHBOURS_SHOWN = 5  # nearest gallery images kept per image (of the k that vote)


@dataclass(frozen=True, slots=True)
class Neighbour:
    path: str
    label: str
    cosine: float

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "label": self.label, "cosine": round(self.cosine, 6)}


@dataclass
class EmbedResult:
    """An embedding model's vectors for the readable images, in order, and with a gallery their kNN labels: each
    image's classes by the share of the neighbours' weighted vote (``Prediction``: labels and vote shares) and its
    nearest gallery images."""

    model: Path
    backend: str
    precision: str
    task: Task
    paths: list[Path]
    vectors: np.ndarray  # [images, dim] float32, in the order of ``paths``
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)
    gallery: str | None = None
    gallery_size: int = 0
    k: int = metrics.KNN_K
    predictions: list[Prediction] | None = None  # per image, with a gallery
    neighbours: list[list[Neighbour]] | None = None
    # unreadable gallery images, skipped: the labels came from fewer neighbours than asked, so the run is partly done
    gallery_skipped: list[tuple[Path, str]] = field(default_factory=list)

    @property
    def images_per_second(self) -> float:
        return len(self.paths) / self.seconds if self.seconds > 0 else 0.0

    def rows(self, vectors: bool = True) -> list[dict[str, Any]]:
        """One record per image: path, (with a gallery) label, score and label_i/score_i as a classifier's rows plus
        its nearest gallery images, and the embedding."""
        out = []
        for i, p in enumerate(self.paths):
            r: dict[str, Any] = {"path": printable_name(p)}
            if self.predictions is not None and self.neighbours is not None:
                r.update(self.predictions[i].row())
                r["neighbours"] = [n.to_dict() for n in self.neighbours[i]]
            if vectors:
                r["embedding"] = [float(v) for v in self.vectors[i]]
            out.append(r)
        return out

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"model": str(self.model), "backend": self.backend, "precision": self.precision,
                             "task": self.task.to_dict(), "dim": int(self.vectors.shape[1]),
                             "images_per_second": self.images_per_second}
        if self.gallery is not None:
            d["gallery"] = {"folder": self.gallery, "images": self.gallery_size, "k": self.k,
                            "temperature": metrics.KNN_T,
                            "skipped": [{"path": str(p), "why": why} for p, why in self.gallery_skipped]}
        d["embeddings"] = self.rows()
        d["skipped"] = [{"path": str(p), "why": why} for p, why in self.skipped]
        return d


def _run_vectors(runner: Any, paths: Sequence[Path], batch_size: int, workers: int | None,
                 on_batch: Callable[[int, list[tuple[Path, str]]], None]) -> tuple[list[Path], np.ndarray,
                                                                                    list[tuple[Path, str]]]:
    """The runner's vectors for the readable ``paths`` (in order); a row with NaN or Inf is skipped with a reason."""
    import numpy as np

    from vitdeploy.core.task import task_of

    kept: list[Path] = []
    rows: list[np.ndarray] = []
    skipped: list[tuple[Path, str]] = []
    for batch in iter_batches(paths, runner.manifest.pp(), batch_size, workers=workers):
        skipped.extend(batch.skipped)
        if batch.paths:
            out = np.asarray(runner(batch.array), np.float32)
            ok = metrics.finite_rows(out)
            for p, good in zip(batch.paths, ok, strict=True):
                if not good:
                    skipped.append((p, NONFINITE_SKIP.format("values")))
            kept += [p for p, good in zip(batch.paths, ok, strict=True) if good]
            rows.append(out[ok])
        on_batch(len(batch.paths), batch.skipped)
    dim = task_of(runner.manifest).dim
    return kept, (np.concatenate(rows) if rows else np.zeros((0, dim), np.float32)), skipped


def read_gallery(gallery: str | Path) -> tuple[list[Path], list[int], list[str]]:
    """A labelled ImageFolder (one sub-folder per class, or its val/ split): files, class index per file, classes."""
    from vitdeploy.model.data import read_labeled_folder

    g = Path(gallery)
    if not g.is_dir():
        from vitdeploy.core.folders import not_a_folder

        raise UsageError(f"--gallery {g}: {not_a_folder(g)}; pass a folder with one sub-folder of images per class")
    try:
        folder = read_labeled_folder(g, None, require=True, of="its classes")
    except VitdeployError as e:
        raise UsageError(f"--gallery: {e}") from None
    assert folder.labels is not None
    return list(folder.files), list(folder.labels), folder.classes


def embed(
    paths: Sequence[Path],
    runner: Any,
    batch_size: int = DEFAULT_BATCH_SIZE,
    top_k: int = DEFAULT_TOP_K,
    workers: int | None = None,
    progress: Callable[[int, int, int], None] | None = None,
    gallery: str | Path | None = None,
    notes: list[str] | None = None,
) -> EmbedResult:
    """An embedding model's vector for every readable image in ``paths``; with ``gallery``, each image's kNN labels
    (the top_k classes by their share of the k=20 neighbours' exp(cos/T) votes) and its nearest gallery images. A
    query that is itself a gallery file never votes for itself."""
    import numpy as np

    from vitdeploy.core.task import task_of

    index_gallery = _open_index_gallery(gallery, runner)  # a .faiss index: checked before any image is read
    g_files, g_labels, classes = read_gallery(gallery) if gallery is not None and index_gallery is None else ([], [], [])
    check_batch_fits(runner.manifest, batch_size)
    total = len(paths) + len(g_files)
    state = {"done": 0, "skipped": 0}

    def on_batch(n: int, skipped: list[tuple[Path, str]]) -> None:
        state["done"] += n
        state["skipped"] += len(skipped)
        if progress:
            progress(state["done"], state["skipped"], total)

    t0 = time.perf_counter()
    kept, vectors, skipped = _run_vectors(runner, paths, batch_size, workers, on_batch)
    seconds = time.perf_counter() - t0
    res = EmbedResult(runner.artifact, runner.backend, runner.precision, task_of(runner.manifest), kept, vectors,
                      skipped, seconds, list(notes or []))
    if not kept:
        raise nothing_answered(len(paths), skipped)
    if gallery is None:
        return res
    if index_gallery is not None:
        return _label_with_index(res, index_gallery, top_k)
    g_kept, g_vectors, g_skipped = _run_vectors(runner, g_files, batch_size, workers, on_batch)
    res.gallery_skipped = list(g_skipped)
    for p, why in g_skipped:
        res.notes.append(f"gallery image {printable_name(p)} skipped: {why}")
    if not g_kept:
        raise nothing_answered(len(g_files), g_skipped, f"--gallery {gallery}: ")
    label_of = dict(zip(g_files, g_labels, strict=True))
    y = np.asarray([label_of[p] for p in g_kept], np.int64)
    index = {p.resolve(): i for i, p in enumerate(g_kept)}
    exclude = np.asarray([index.get(p.resolve(), -1) for p in kept], np.int64)
    if (exclude >= 0).any():
        res.notes.append(f"{int((exclude >= 0).sum())} image(s) are gallery images too: each is labelled by the "
                         "other gallery images (leave-one-out)")
    show = min(top_k, len(classes))
    if top_k > len(classes):
        res.notes.append(f"--top-k {top_k} is more than the gallery's {len(classes)} classes: showing {len(classes)}")
    res.gallery, res.gallery_size, res.predictions, res.neighbours = str(gallery), len(g_kept), [], []
    for s, idx, sim in metrics.knn_neighbours(g_vectors, vectors, metrics.KNN_K, exclude=exclude):
        res.k = idx.shape[1]
        scores = metrics.knn_votes(idx, sim, y, len(classes))
        share = scores / np.maximum(scores.sum(axis=1, keepdims=True), 1e-300)
        top, val = metrics.top_k(share, show)
        for j in range(len(idx)):
            res.predictions.append(Prediction(kept[s + j], [classes[c] for c in top[j]], [float(v) for v in val[j]]))
            res.neighbours.append([Neighbour(printable_name(g_kept[n]), classes[int(y[n])], float(c))
                                   for n, c in zip(idx[j, :NEIGHBOURS_SHOWN], sim[j, :NEIGHBOURS_SHOWN], strict=True)
                                   if np.isfinite(c)])
    return res


def _open_index_gallery(gallery: str | Path | None, runner: Any) -> Any:
    """A --gallery that names a FAISS index (``vitdeploy index``), opened and checked against the model; None for a
    folder (or no gallery)."""
    from vitdeploy.core.gallery import is_index_file

    if not is_index_file(gallery):
        return None
    from vitdeploy.tools.gallery_index import open_for_runner

    assert gallery is not None
    return open_for_runner(gallery, runner)


def _label_with_index(res: EmbedResult, g: Any, top_k: int) -> EmbedResult:
    """An EmbedResult's kNN labels and nearest gallery images from an index gallery (tools/gallery_index.py)."""
    from vitdeploy.tools.gallery_index import knn_rows

    k, rows, notes = knn_rows(g, res.paths, res.vectors, top_k, NEIGHBOURS_SHOWN)
    res.notes += notes
    res.gallery, res.gallery_size, res.k = str(g.path), g.size, k
    res.predictions = [Prediction(p, labels, scores) for p, (labels, scores, _) in zip(res.paths, rows, strict=True)]
    res.neighbours = [[Neighbour(*n) for n in near] for _, _, near in rows]
    return res


EMBEDDING_SUFFIXES = (".npy", ".json", ".parquet", ".csv")


def check_embedding_output(out: str | Path | None, task: Task, gallery: str | Path | None, model: str | Path) -> None:
    """Refuse, before any image is read, an -o the task cannot fill (one line, exit 2): a classifier's labels are
    .csv/.json; an embedding model's vectors .npy (with a .files.txt list of the files), .json or .parquet (pyarrow),
    and .csv only for its kNN labels (--gallery)."""
    if out is None:
        return
    suffix = Path(out).suffix.lower()
    if not task.is_embedding:
        if suffix in (".npy", ".parquet"):
            raise UsageError(f"-o {out} holds an embedding model's vectors; {model} is a {task.describe()}: write "
                             ".csv or .json (or export its features with `vitdeploy export CKPT --embedding`)")
        return
    if suffix == ".csv" and gallery is None:
        raise UsageError(f"-o {out}: {model} is an {task.describe()}; a .csv holds kNN labels (pass --gallery DIR), "
                         "its vectors go to .npy (with a .files.txt list of the files), .json or .parquet")
    if suffix == ".parquet" and importlib.util.find_spec("pyarrow") is None:
        npy = Path(out).with_suffix(".npy")
        raise UsageError(f"-o {out}: writing Parquet needs pyarrow (pip install pyarrow); or write -o {npy.name} (the "
                         f"vectors, with {sidecar_of(npy).name} naming the files) or .json")
    if suffix not in EMBEDDING_SUFFIXES:
        raise UsageError(f"-o {out}: write .npy, .json or .parquet (or .csv with --gallery)")


def sidecar_of(path: str | Path) -> Path:
    """The file-name list beside a .npy of vectors: one file name per line, in the rows' order; emb.npy →
    emb.files.txt, the name the bundle's run.py and C++ example write too."""
    from vitdeploy.core.outputs import side_output_path

    return side_output_path("files list", path)


def write_embeddings(result: EmbedResult, path: str | Path) -> list[Path]:
    """Write the vectors with their file names, atomically: .npy + .files.txt (one name per line, the rows' order;
    escaped as core/file_list.py says, so each line means one name: ``read_file_list`` reads them back), .parquet (columns path, embedding[, label, score]), .json (the rows:
    path, embedding, with a gallery label/score/label_i/score_i and neighbours) or, with a gallery, .csv (the kNN
    labels, as a classifier's predictions). Returns the files written."""
    import numpy as np

    from vitdeploy.core.text import printable

    p = Path(path)
    suffix = p.suffix.lower()
    names = [printable(printable_name(q)) for q in result.paths]
    if suffix == ".npy":
        side = sidecar_of(p)
        with atomic_path(p) as tmp, atomic_path(side) as tmp_side:
            with open(tmp, "wb") as f:
                np.save(f, np.ascontiguousarray(result.vectors, np.float32))
            from vitdeploy.core.file_list import file_list_line

            tmp_side.write_text("".join(file_list_line(q) + "\n" for q in result.paths), encoding="utf-8")
        return [p, side]
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        cols: dict[str, Any] = {"path": names,
                                "embedding": pa.FixedSizeListArray.from_arrays(
                                    pa.array(result.vectors.reshape(-1), pa.float32()), result.vectors.shape[1])}
        if result.predictions is not None:
            cols["label"] = [pr.label for pr in result.predictions]
            cols["score"] = [pr.score for pr in result.predictions]
        with atomic_path(p) as tmp:
            pq.write_table(pa.table(cols), str(tmp))
        return [p]
    if suffix == ".csv":
        if result.predictions is None:
            raise UsageError(f"-o {p}: a .csv holds kNN labels: pass --gallery DIR (vectors: .npy, .json, .parquet)")
        write_predictions(InferResult(result.model, result.backend, result.precision,
                                      len(result.predictions[0].labels) if result.predictions else 1,
                                      result.predictions), p)
        return [p]
    if suffix != ".json":
        raise UsageError(f"-o {p}: write .npy, .json or .parquet (or .csv with --gallery)")
    with atomic_path(p) as tmp, tmp.open("w", encoding="utf-8") as f:
        f.write("[")
        for i, row in enumerate(result.rows()):
            f.write(("," if i else "") + "\n " + strict_json(row, indent=None))
        f.write("\n]\n")
    return [p]


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
    one = batch_bytes(manifest, 1)
    h, w = (int(v) for v in manifest.input_size)
    if one > free or batch_size == 1:  # no smaller batch helps: the input size is what does not fit
        raise VitdeployError(f"one image of this model ({h}x{w} input) needs about {one / 2**30:.1f} GiB and "
                             f"{free / 2**30:.1f} GiB is free here: free memory, run it on a larger machine, or import "
                             "it again at a smaller --image-size")
    fit = max(1, min(free // max(1, one), batch_size - 1))
    raise UsageError(f"--batch-size {batch_size}: one batch would need about {need / 2**30:.1f} GiB and "
                     f"{free / 2**30:.1f} GiB is free here; use --batch-size {fit} or less")


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
