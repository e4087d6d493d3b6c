"""Does an exported ONNX model answer like the PyTorch model it came from? (export's parity check)

Separate from the export (as Optimum separates ``export`` from ``validate_model_outputs``):
``check_parity`` measures and returns the figures, ``validate_parity`` raises ParityError
when they miss the tolerance. The figures come from the one comparator (checks.metrics).

The judgement is the task's (core/task.py): a classifier passes when max |Δlogit| ≤ rtol × max(1, max |logit|) and
every top-1 agrees; an embedding model when max |Δ| ≤ rtol × max |reference value| (no floor at 1, no argmax: the
argmax of an embedding means nothing), its per-image cosine reported beside it.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitdeploy.checks.metrics import compare, compare_embeddings, embedding_limit, finite_rows, nonfinite_note
from vitdeploy.core.errors import NonFiniteOutput, ParityError, VitdeployError
from vitdeploy.core.manifest import Manifest

if TYPE_CHECKING:
    import torch

PARITY_BATCHES = (1, 7, 32)
PARITY_RTOL = 1e-4


@dataclass
class BatchParity:
    """ONNX Runtime against PyTorch on one batch. ``max_abs_logit``: the reference's largest |value| (a logit, or an
    embedding's value); ``min_cosine``: for an embedding model, the lowest per-image cosine (None for a classifier)."""

    batch_size: int
    max_abs_diff: float
    max_abs_logit: float
    tolerance: float
    top1_mismatches: int
    nonfinite: int = 0  # images whose ONNX logits hold NaN or Inf (metrics.compare)
    embedding: bool = False  # judged as an embedding model: relative |Δ| only, no top-1
    min_cosine: float | None = None

    @property
    def passed(self) -> bool:
        if self.embedding:
            return self.max_abs_diff <= self.tolerance and not self.nonfinite
        return self.max_abs_diff <= self.tolerance and self.top1_mismatches == 0 and not self.nonfinite

    @property
    def excess(self) -> float:
        """max |Δ| over its limit: how far over the worst batch is (inf for a zero limit, an all-zero reference)."""
        return self.max_abs_diff / self.tolerance if self.tolerance > 0 else math.inf

    @property
    def max_rel_diff(self) -> float:
        """max |Δ| over the reference's largest |value|."""
        return self.max_abs_diff / max(self.max_abs_logit, 1e-30)

    def describe(self) -> str:
        if self.nonfinite:
            values = "embeddings" if self.embedding else "logits"
            return f"batch {self.batch_size}: {nonfinite_note(self.nonfinite, self.batch_size, 'the ONNX model', values)}"
        if self.embedding:
            s = f"batch {self.batch_size}: max |Δ| {self.max_abs_diff:.2e} (limit {self.tolerance:.2e}"
            s += f" = {PARITY_RTOL:g} × max |embedding| {self.max_abs_logit:.3g})"
            return s + (f", min cosine {self.min_cosine:.6f}" if self.min_cosine is not None else "")
        s = f"batch {self.batch_size}: max |Δlogit| {self.max_abs_diff:.2e} (limit {self.tolerance:.2e}"
        s += f" = {PARITY_RTOL:g} × max(1, {self.max_abs_logit:.3g}))"
        if self.top1_mismatches:
            s += f", {self.top1_mismatches} of {self.batch_size} top-1 differ"
        return s

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "batch_size": self.batch_size,
            "max_abs_diff": self.max_abs_diff,
            "max_abs_logit": self.max_abs_logit,
            "tolerance": self.tolerance,
            "top1_mismatches": self.top1_mismatches,
            "passed": self.passed,
        }
        if self.embedding:  # an embedding's figures: no top-1, the relative |Δ| and the per-image cosine
            del d["top1_mismatches"]
            d.update(task="embedding", max_rel_diff=self.max_rel_diff, min_cosine=self.min_cosine)
        return d


@dataclass
class ParityReport:
    """Per-batch parity results; iterates like the list of them."""

    batches: list[BatchParity]
    source: str  # where the inputs came from: a folder, "calibration", "digits" or "random"
    num_images: int
    warnings: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(b.passed for b in self.batches)

    @property
    def failures(self) -> list[BatchParity]:
        return [b for b in self.batches if not b.passed]

    def __iter__(self) -> Iterator[BatchParity]:
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def __getitem__(self, i: int) -> BatchParity:
        return self.batches[i]

    def summary(self) -> str:
        worst = max(self.batches, key=lambda b: b.excess)
        sizes = ", ".join(str(b.batch_size) for b in self.batches)
        verdict = "passed" if self.passed else "FAILED"
        return f"parity {verdict} at batch {sizes} on {self.source} ({self.num_images} images); worst {worst.describe()}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "source": self.source,
            "num_images": self.num_images,
            "batches": [b.to_dict() for b in self.batches],
            "warnings": self.warnings,
            "skipped": [list(s) for s in self.skipped],
        }


def _parity_inputs(
    manifest: Manifest, images: str | Path | None, count: int
) -> tuple[np.ndarray, int, str, list[str], list[tuple[str, str]]]:
    """``count`` preprocessed inputs from the image set the one rule picks (ImageSet.for_model; cycled when there
    are fewer), and how many distinct ones there are; random inputs, with a note, where it picks none."""
    from vitdeploy.model.imageset import ImageSet

    notes: list[str] = []
    chosen = ImageSet.for_model(manifest, images, limit=count * 2)
    if chosen is not None:
        _, arrays, _ = chosen.arrays(manifest.pp(), batch_size=count)
        arrays = arrays[:count]
        source, skipped = chosen.source.rstrip("/"), chosen.skipped
    else:
        source, skipped = "random", []
        notes.append(
            "no images to check parity on (no --images, no calibration/ images, not a digits model): "
            "random inputs prove the graph, not the accuracy; pass --images DIR"
        )
        h, w = manifest.input_size
        arrays = np.random.default_rng(0).standard_normal((count, 3, h, w), dtype=np.float32)
    n = len(arrays)
    if n < count:
        notes.append(f"only {n} readable image(s) in {source}: repeated to fill batches")
    x = np.stack([arrays[i % n] for i in range(count)]).astype(np.float32)
    return x, min(n, count), source, notes, skipped


def check_parity(
    checkpoint_or_model: Any,
    onnx_path: str | Path,
    images: str | Path | None = None,
    batch_sizes: Sequence[int] = PARITY_BATCHES,
    rtol: float = PARITY_RTOL,
    arch: str | None = None,
    labels: str | Path | None = None,
) -> ParityReport:
    """ONNX Runtime (CPU) against PyTorch on the same inputs, one ONNX Runtime run per batch size.

    ``checkpoint_or_model``: a checkpoint path (anything load_any reads), a Checkpoint,
    or an eval-mode VisionTransformer. A classifier's batch passes when max |Δlogit| ≤ rtol × max(1,
    max |logit|) and every top-1 agrees; an embedding model's (the ONNX manifest's task) when max |Δ| ≤ rtol ×
    max |reference value|, its minimum per-image cosine reported. The batches are the first 1, 7, 32 of the same
    32 inputs, so PyTorch runs once over 32 (on 2 cores the reference pass costs as much
    as the ONNX Runtime runs: 40 distinct images would add a fifth to the export).
    """
    import torch

    from vitdeploy.checks.compare import run_arrays
    from vitdeploy.core.task import task_of
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    model = _torch_model(checkpoint_or_model, arch, labels)
    runner = OnnxRuntimeRunner(onnx_path)
    embedding = task_of(runner.manifest).is_embedding
    count = int(max(batch_sizes))
    x, distinct, source, notes, skipped = _parity_inputs(runner.manifest, images, count)
    with torch.inference_mode():
        ref_all = model(torch.from_numpy(x)).float().numpy()
    bad = ~finite_rows(ref_all)
    if bad.any():  # the reference itself is broken: no ONNX model can be judged against it
        runner.close()
        where = f"{checkpoint_or_model}: " if isinstance(checkpoint_or_model, (str, Path)) else ""
        values = "embeddings" if embedding else "logits"
        raise NonFiniteOutput(f"{where}the checkpoint itself (PyTorch) gives NaN or Inf {values} on {int(bad.sum())} "
                              f"of {len(bad)} images, so no export can match it: its weights hold NaN or Inf (or "
                              "overflow float32); re-train or re-import it")
    results: list[BatchParity] = []
    for bs in batch_sizes:
        ref = ref_all[:bs]
        got = run_arrays([runner], x[:bs], batch_size=bs)[0]  # one ONNX Runtime call at this batch size
        if got.shape != ref.shape:
            raise VitdeployError(f"{onnx_path}: batch {bs} gives logits of shape {list(got.shape)}, PyTorch {list(ref.shape)}")
        c = compare(ref, got)
        e = compare_embeddings(ref, got) if embedding else None
        results.append(
            BatchParity(
                batch_size=int(bs),
                max_abs_diff=c.max_abs_diff,
                max_abs_logit=c.max_abs_reference,
                tolerance=embedding_limit(rtol, c.max_abs_reference) if embedding else c.limit(rtol),
                top1_mismatches=0 if embedding else c.mismatches,
                nonfinite=c.nonfinite,
                embedding=embedding,
                min_cosine=e.cosine_min if e is not None else None,
            )
        )
    runner.close()
    return ParityReport(results, source, distinct, notes, skipped)


def validate_parity(
    checkpoint_or_model: Any,
    onnx_path: str | Path,
    images: str | Path | None = None,
    batch_sizes: Sequence[int] = PARITY_BATCHES,
    rtol: float = PARITY_RTOL,
) -> ParityReport:
    """``check_parity``, raising ParityError (naming the worst batch) when a batch fails (Optimum's
    ``validate_model_outputs``: export writes, validation judges)."""
    report = check_parity(checkpoint_or_model, onnx_path, images=images, batch_sizes=batch_sizes, rtol=rtol)
    if not report.passed:
        worst = max(report.failures, key=lambda b: b.excess)
        raise ParityError(f"parity check failed against PyTorch on {report.source}: {worst.describe()}")
    return report


def _torch_model(obj: Any, arch: str | None = None, labels: str | Path | None = None) -> torch.nn.Module:
    from torch import nn

    from vitdeploy.model.checkpoint import Checkpoint
    from vitdeploy.model.importers import load_any

    if isinstance(obj, nn.Module):
        return obj.eval()
    ck = obj if isinstance(obj, Checkpoint) else load_any(obj, arch=arch, labels=labels)
    return ck.build()
