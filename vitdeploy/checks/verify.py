"""Does a deployed artifact still answer like the reference? Logits and accuracy on real images.

The comparator only sees the Runner interface (Polygraphy's split: loaders, runners,
comparator), so checkpoints, ONNX models and engines are compared alike. The report
keeps every artifact's full logits, in image order, for reports built on top of it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.checks import metrics
from vitdeploy.core.errors import UsageError, VitdeployError

Progress = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class Tolerance:
    """When a candidate still answers like the reference.

    ``rtol``: max |Δlogit| ≤ rtol × max(1, max |reference logit|) (None: not checked).
    ``agreement``: the least share of images whose top-1 equals the reference's.
    """

    rtol: float | None = 1e-4
    agreement: float = 1.0

    def describe(self) -> str:
        parts = [f"agreement ≥ {self.agreement:.1%}"]
        if self.rtol is not None:
            parts.insert(0, f"max |Δlogit| ≤ {self.rtol:g} × max(1, max |logit|)")
        return " and ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {"rtol": self.rtol, "agreement": self.agreement}

    @classmethod
    def parse(cls, text: str) -> Tolerance:
        """``"1e-3"`` (rtol, 100% agreement), ``"agreement=0.99"``, ``"rtol=1e-2,agreement=0.999"``, ``"rtol=none,..."``."""
        rtol: float | None = None
        agreement = 1.0
        try:
            for part in (text if "=" in text else f"rtol={text}").split(","):
                k, _, v = part.partition("=")
                k = k.strip().lower()
                if k in ("rtol", "logit", "diff"):
                    rtol = None if v.strip().lower() in ("none", "off", "") else float(v)
                elif k in ("agreement", "agree"):
                    agreement = float(v.rstrip("%")) / (100.0 if v.strip().endswith("%") else 1.0)
                else:
                    raise ValueError(k)
        except ValueError:
            raise UsageError(
                f"--tolerance {text!r}: write RTOL (e.g. 1e-3) or rtol=R,agreement=A (e.g. rtol=1e-2,agreement=0.999)"
            ) from None
        if not 0.0 <= agreement <= 1.0:
            raise UsageError(f"--tolerance {text!r}: agreement must be a fraction from 0 to 1 (or a percentage)")
        if rtol is not None and not rtol >= 0.0:  # also NaN
            raise UsageError(f"--tolerance {text!r}: the relative logit limit must be 0 or more (e.g. 1e-3), or rtol=none")
        return cls(rtol, agreement)


# Per precision of the candidate (runner.precision); --tolerance overrides.
DEFAULT_TOLERANCES: dict[str, Tolerance] = {
    "fp32": Tolerance(rtol=1e-4, agreement=1.0),
    "fp16": Tolerance(rtol=1e-2, agreement=0.999),
    "int8": Tolerance(rtol=None, agreement=0.99),
}


def default_tolerance(precision: str) -> Tolerance:
    return DEFAULT_TOLERANCES.get(precision, DEFAULT_TOLERANCES["fp32"])


@dataclass
class ArtifactResult:
    artifact: str
    backend: str
    precision: str
    logits: np.ndarray  # [N, C] float32, in the order of VerifyReport.paths
    top1: float | None
    top5: float | None
    agreement: float
    max_abs_diff: float
    mean_abs_diff: float
    max_abs_logit: float
    cosine: float
    min_cosine: float
    seconds: float
    tolerance: Tolerance | None = None  # None for the reference
    failures: list[str] = field(default_factory=list)

    @property
    def predictions(self) -> np.ndarray:
        return self.logits.argmax(-1)

    @property
    def is_reference(self) -> bool:
        return self.tolerance is None

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "backend": self.backend,
            "precision": self.precision,
            "reference": self.is_reference,
            "top1": self.top1,
            "top5": self.top5,
            "agreement": self.agreement,
            "max_abs_diff": self.max_abs_diff,
            "mean_abs_diff": self.mean_abs_diff,
            "max_abs_logit": self.max_abs_logit,
            "cosine": self.cosine,
            "min_cosine": self.min_cosine,
            "tolerance": self.tolerance.to_dict() if self.tolerance else None,
            "passed": self.passed,
            "failures": self.failures,
            "seconds": round(self.seconds, 3),
        }


@dataclass
class VerifyReport:
    results: list[ArtifactResult]  # the reference first, then the candidates in argument order
    paths: list[str]  # the images measured, in order (unreadable ones are in ``skipped``)
    labels: np.ndarray | None  # class index (into class_labels) per image, or None for a flat folder
    class_labels: list[str]
    images: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def reference(self) -> ArtifactResult:
        return self.results[0]

    @property
    def candidates(self) -> list[ArtifactResult]:
        return self.results[1:]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[str]:
        return [f"{r.artifact}: {f}" for r in self.results for f in r.failures]

    def to_dict(self) -> dict[str, Any]:
        return {
            "results": [r.to_dict() for r in self.results],
            "images": self.images,
            "num_images": len(self.paths),
            "labeled": self.labels is not None,
            "classes": len(self.class_labels),
            "passed": self.passed,
            "skipped": [{"path": p, "reason": why} for p, why in self.skipped],
            "notes": self.notes,
        }


def compare(
    name: str,
    logits: np.ndarray,
    ref: np.ndarray,
    labels: np.ndarray | None,
    tolerance: Tolerance | None,
    backend: str = "?",
    precision: str = "fp32",
    seconds: float = 0.0,
) -> ArtifactResult:
    """One artifact's logits against the reference's (the reference compared with itself gives the zeros)."""
    n, c = logits.shape
    cmp = metrics.compare(ref, logits)
    res = ArtifactResult(
        artifact=name,
        backend=backend,
        precision=precision,
        logits=logits,
        top1=metrics.top_k_accuracy(logits, labels, 1) if labels is not None and n else None,
        top5=metrics.top_k_accuracy(logits, labels, 5) if labels is not None and n and c >= 5 else None,
        agreement=cmp.agreement,
        max_abs_diff=cmp.max_abs_diff,
        mean_abs_diff=cmp.mean_abs_diff,
        max_abs_logit=cmp.max_abs_candidate,
        cosine=cmp.cosine,
        min_cosine=cmp.min_cosine,
        seconds=seconds,
        tolerance=tolerance,
    )
    if tolerance is not None and n:
        if (nonfinite := cmp.nonfinite_message()) is not None:  # the cause of every other failure: say only it
            res.failures.append(nonfinite)
            return res
        ref_max = cmp.max_abs_reference
        if tolerance.rtol is not None:
            limit = cmp.limit(tolerance.rtol)
            if res.max_abs_diff > limit:
                res.failures.append(
                    f"max |Δlogit| {res.max_abs_diff:.2e} > {limit:.2e} ({tolerance.rtol:g} × max(1, {ref_max:.3g}))"
                )
        if res.agreement < tolerance.agreement:
            differ = int(round((1 - res.agreement) * n))
            res.failures.append(
                f"top-1 agreement {res.agreement:.2%} < {tolerance.agreement:.1%} ({differ} of {n} images differ)"
            )
    return res


def verify(
    reference: str | Path,
    candidates: Sequence[str | Path],
    images: str | Path,
    tolerance: Tolerance | str | None = None,
    batch_size: int = 32,
    backend: str = "auto",
    progress: Progress | None = None,
    threads: int | None = None,
    device: str = "cpu",
) -> VerifyReport:
    """Run every artifact over the same images and compare each candidate with the reference.

    ``tolerance`` None: per the candidate's precision (DEFAULT_TOLERANCES). Returns the report
    whether or not it passes (``report.passed``); bad inputs raise VitdeployError.
    """
    from vitdeploy.checks.compare import require_same_model, run
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.lineage import STALE, remake_command, source_link
    from vitdeploy.core.targets import CPU_TARGETS
    from vitdeploy.model.imageset import ImageSet
    from vitdeploy.runners import BACKENDS_OF_KIND, Runner, artifact_kind, default_backend, open_runner

    if isinstance(tolerance, str):
        tolerance = Tolerance.parse(tolerance)
    if batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    artifacts = [Path(reference), *[Path(c) for c in candidates]]
    if len(artifacts) < 2:
        raise UsageError("verify needs a reference and at least one candidate")
    for a in artifacts:
        if not a.exists():
            raise VitdeployError(f"{a}: no such file or folder")
    if not Path(images).exists():
        raise VitdeployError(f"--images {images}: no such folder")

    runners: list[Runner] = []
    notes: list[str] = []
    try:
        # each artifact is loaded once (a checkpoint's manifest costs a full torch.load), and
        # checked against the reference as soon as it is open
        for i, a in enumerate(artifacts):
            # the candidates that can run on --backend run on it; the reference and the others on their own ('auto')
            use = backend if i > 0 and backend in BACKENDS_OF_KIND[artifact_kind(a)] else "auto"
            if i > 0 and backend != "auto" and use == "auto":
                notes.append(f"{a}: a {artifact_kind(a)} runs on {default_backend(a, device)}, not {backend}")
            if use == "auto" and artifact_kind(a) == "onnx":  # bound for TensorRT: judged on what TensorRT computes
                made_for = read_onnx_manifest(a).target
                if made_for is not None and made_for not in CPU_TARGETS:
                    use = "oracle"
                    notes.append(f"{a}: made for {made_for}: run on the TensorRT oracle (int8 GEMMs with int32 "
                                 "accumulation, float parts in the graph's types), not on a CPU runtime")
            runners.append(open_runner(a, backend=use, threads=threads, device=device))
            if i > 0:
                require_same_model((str(artifacts[0]), runners[0].manifest), (str(a), runners[i].manifest),
                                   "verify compares artifacts of one model")
                link = source_link(a, runners[i].manifest)  # lineage: never judged silently when it is stale
                if link.status == STALE:
                    notes.append(f"{a} is stale: made from an earlier {link.source.name if link.source else 'source'}; "
                                 f"re-make it with `{remake_command(a, runners[i].manifest)}`")
        ref_manifest = runners[0].manifest
        image_set = ImageSet.labeled(images, list(ref_manifest.labels))
        notes += image_set.notes
        res = run(runners, image_set, batch_size, progress)
    finally:
        for r in runners:
            r.close()
    notes += res.notes
    results = []
    for i, (a, r) in enumerate(zip(artifacts, runners, strict=True)):
        tol = None if i == 0 else (tolerance or default_tolerance(r.precision))
        results.append(compare(str(a), res.logits[i], res.logits[0], res.labels, tol, r.backend, r.precision, res.seconds[i]))
    return VerifyReport(results, res.paths, res.labels, list(ref_manifest.labels), str(images), res.skipped, notes)
