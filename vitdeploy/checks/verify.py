"""Does a deployed artifact still answer like the reference? Logits and accuracy on real images.

The comparator only sees the Runner interface (Polygraphy's split: loaders, runners,
comparator), so checkpoints, ONNX models and engines are compared alike. The report
keeps every artifact's full logits, in image order, for reports built on top of it.

An embedding model (its task: core/task.py) is judged as ``checks/judge.py`` says: per-image cosine to the
reference (mean, 1st percentile, minimum), relative Frobenius error, nearest-neighbour agreement and, on a labelled
folder, kNN top-1 beside the reference's, against its precision's EmbeddingBudget; the run gives an
``EmbeddingVerifyReport``. Where the artifacts have patch tokens (export --tokens), one image's per-patch cosine map
is added: the image the candidates answer least like the reference.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, TypeVar

import numpy as np

from vitdeploy.checks import metrics
from vitdeploy.checks.judge import EmbeddingBudget, EmbeddingJudge
from vitdeploy.checks.metrics import EmbeddingComparison
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.task import Task

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


R = TypeVar("R", "ArtifactResult", "EmbeddingResult")


class _Results(Generic[R]):
    """What verify's two reports share: the reference first, then the candidates; passed when every one passed."""

    results: list[R]

    @property
    def reference(self) -> R:
        return self.results[0]

    @property
    def candidates(self) -> list[R]:
        return self.results[1:]

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.results)

    @property
    def failures(self) -> list[str]:
        return [f"{r.artifact}: {f}" for r in self.results for f in r.failures]


@dataclass
class VerifyReport(_Results["ArtifactResult"]):
    results: list[ArtifactResult]  # the reference first, then the candidates in argument order
    paths: list[str]  # the images measured, in order (unreadable ones are in ``skipped``)
    labels: np.ndarray | None  # class index (into class_labels) per image, or None for a flat folder
    class_labels: list[str]
    images: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

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


LOWEST_SHOWN = 10  # per candidate in --json: the images it answers least like the reference


@dataclass
class PatchCosine:
    """One image's per-patch cosine of a candidate's patch tokens to the reference's: [grid_h, grid_w]."""

    image: str
    cosine: np.ndarray
    view: np.ndarray | None = None  # the image as the model saw it (resized and cropped, uint8 HWC), for the report

    def to_dict(self) -> dict[str, Any]:
        c = self.cosine
        return {"image": self.image, "grid": list(c.shape), "mean": float(c.mean()),
                "p1": float(np.percentile(c, 1)), "min": float(c.min()),
                "map": np.round(c.astype(np.float64), 8).tolist()}


# Nearest-neighbour agreement asks whether each image's nearest other image is the reference's: it needs two images
# at least. On one it is undefined (shown as —, null in JSON, never judged), not the 100% a bare mean would give.
NN_MIN_IMAGES = 2


def nn_undefined_note(n: int) -> str:
    return (f"nearest-neighbour agreement needs {NN_MIN_IMAGES} images at least: undefined on {n} image(s), not judged "
            "(pass a folder with more images)")


@dataclass
class EmbeddingResult:
    """One embedding artifact against the reference (the reference: against itself, with its own kNN top-1)."""

    artifact: str
    backend: str
    precision: str
    embeddings: np.ndarray  # [N, D] float32, in the order of EmbeddingVerifyReport.paths
    comparison: EmbeddingComparison
    seconds: float
    budget: EmbeddingBudget | None = None  # None for the reference
    failures: list[str] = field(default_factory=list)
    patches: PatchCosine | None = None

    @property
    def is_reference(self) -> bool:
        return self.budget is None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def knn_top1(self) -> float | None:
        return self.comparison.knn_top1

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"artifact": self.artifact, "backend": self.backend, "precision": self.precision,
                             "reference": self.is_reference}
        d.update({k: v for k, v in self.comparison.to_dict().items() if k != "rows"})
        if self.comparison.rows < NN_MIN_IMAGES:  # one image has no neighbour: undefined, not 100%
            d["nn_agreement"] = None
        d.update(budget=self.budget.to_dict() if self.budget else None, passed=self.passed, failures=self.failures,
                 seconds=round(self.seconds, 3), patch_tokens=self.patches.to_dict() if self.patches else None)
        return d


@dataclass
class EmbeddingVerifyReport(_Results["EmbeddingResult"]):
    """verify's report for an embedding model: the reference first, then the candidates in argument order."""

    task: Task
    results: list[EmbeddingResult]
    paths: list[str]
    labels: np.ndarray | None  # class index (into class_labels: the folder's own classes) per image, or None
    class_labels: list[str]
    images: str
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    grid: tuple[int, int] | None = None  # the patch grid (rows, columns) of the patch-token maps

    def lowest(self, result: EmbeddingResult, n: int = LOWEST_SHOWN) -> list[dict[str, Any]]:
        """The ``n`` images a candidate answers least like the reference: path and cosine, lowest first."""
        cos = result.comparison.per_image_cosine
        return [{"path": self.paths[i], "cosine": float(cos[i])} for i in np.argsort(cos, kind="stable")[:n]]

    def to_dict(self) -> dict[str, Any]:
        results = [r.to_dict() for r in self.results]
        for r, d in zip(self.results[1:], results[1:], strict=True):
            d["lowest_cosine"] = self.lowest(r)
        return {
            "task": self.task.to_dict(),
            "results": results,
            "images": self.images,
            "num_images": len(self.paths),
            "labeled": self.labels is not None,
            "classes": len(self.class_labels),
            "knn": {"k": metrics.KNN_K, "temperature": metrics.KNN_T, "leave_one_out": True},
            "passed": self.passed,
            "skipped": [{"path": p, "reason": why} for p, why in self.skipped],
            "notes": self.notes,
        }


def judge_embeddings(judge: EmbeddingJudge, names: Sequence[str], outputs: Sequence[np.ndarray],
                     labels: np.ndarray | None, backends: Sequence[str], precisions: Sequence[str],
                     seconds: Sequence[float], min_cosine: float | None = None) -> list[EmbeddingResult]:
    """Every artifact's embeddings against the first's, each candidate held to its precision's budget."""
    ref = outputs[0]
    own = judge.compare(ref, ref, labels)  # the reference's own kNN top-1, measured once
    results = [EmbeddingResult(names[0], backends[0], precisions[0], ref, own, seconds[0])]
    for i in range(1, len(outputs)):
        cmp = judge.compare(ref, outputs[i], labels, knn_reference=own.knn_top1)
        budget = judge.budget(precisions[i], min_cosine)
        results.append(EmbeddingResult(names[i], backends[i], precisions[i], outputs[i], cmp, seconds[i], budget,
                                       budget.failures(cmp)))
    return results


def patch_cosine_maps(runners: Sequence[Any], path: str, grid: tuple[int, int]) -> tuple[list[PatchCosine | None], str]:
    """Each candidate's per-patch cosine to the reference's (the first runner's) patch tokens on one image ([grid]
    maps; None for the reference and where a candidate has no patch tokens of the reference's shape), and a note
    when the reference has none."""
    from vitdeploy.core.preprocess import preprocess_file, resized_uint8

    pp = runners[0].manifest.pp()
    x = preprocess_file(path, pp)[None]
    ref = runners[0].run_with_tokens(x)[1]
    if ref is None:
        return [None] * len(runners), f"{runners[0].artifact} has no patch tokens: no per-patch cosine map"
    view = resized_uint8(path, pp)
    maps: list[PatchCosine | None] = [None]
    for r in runners[1:]:
        tokens = r.run_with_tokens(x)[1]
        if tokens is None or tokens.shape != ref.shape or ref.shape[1] != grid[0] * grid[1]:
            maps.append(None)
            continue
        cos = metrics.compare_embeddings(ref[0], tokens[0]).per_image_cosine.reshape(grid)
        maps.append(PatchCosine(path, cos, view))
    return maps, ""


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


def made_from_reference(reference: Path, ref_manifest: Any, candidate: Path, manifest: Any) -> str | None:
    """Whether ``candidate`` is of the reference's model (core/lineage): a SHA-256 in common along their recorded
    chains (model.int8.onnx and model.fp16.onnx share model.onnx's, model.onnx records ckpt.pth's). Judging A's
    model.onnx against B.pth measures two models, not a conversion.

    Two converted files (ONNX models, engines) of different models: refused (exit 1, before any image is run). With a
    checkpoint on either side: a note naming what the candidate was made from, and the comparison runs, since a
    checkpoint may hold the same weights under another record (a backbone saved from a classifier, a fine-tune
    compared with its original on purpose). A chain with a stale link is left to the stale note; a folder (a Hugging
    Face model) is not hashed as its import did, so it is not judged here."""
    from vitdeploy.core.lineage import ancestors, descends_from, not_made_from
    from vitdeploy.core.naming import CHECKPOINT_SUFFIXES

    if reference.is_dir() or candidate.is_dir():
        return None
    ref, ref_stale = ancestors(reference, ref_manifest)
    cand, cand_stale = ancestors(candidate, manifest)
    if ref_stale or cand_stale or not ref or not cand or ref & cand:
        return None
    if reference.suffix in CHECKPOINT_SUFFIXES and candidate.suffix in CHECKPOINT_SUFFIXES:
        return None  # two checkpoints: no conversion between them is recorded, nor claimed
    d = descends_from(candidate, reference, manifest)
    if reference.suffix in CHECKPOINT_SUFFIXES or candidate.suffix in CHECKPOINT_SUFFIXES:
        return (f"{candidate} was not made from {reference} (made from {d.made_from_text()}): its figures compare "
                "two checkpoints' models, not a conversion, unless they hold the same weights")
    raise not_made_from(d, "verify", ways=(
        f"verify compares one model's artifacts: pass the reference {candidate.name} was made from "
        f"(`vitdeploy info {candidate}` names it), or make it again from {reference.name}"))


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
    min_cosine: float | None = None,
) -> VerifyReport | EmbeddingVerifyReport:
    """Run every artifact over the same images and compare each candidate with the reference.

    ``tolerance`` None: per the candidate's precision (DEFAULT_TOLERANCES). An embedding model is judged by its
    task's judge (checks/judge.py) against its precision's EmbeddingBudget, ``min_cosine`` replacing the mean-cosine
    gate; ``tolerance`` (a classifier's |Δlogit| and top-1 agreement) is refused there, and ``min_cosine`` on a
    classifier. Returns the report whether or not it passes (``report.passed``); bad inputs raise VitdeployError.
    """
    from vitdeploy.checks.compare import require_same_model, run
    from vitdeploy.checks.judge import judge_for, refuse_classifier_budget
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.lineage import STALE, remake_command, source_link
    from vitdeploy.core.targets import CPU_TARGETS
    from vitdeploy.core.task import task_of
    from vitdeploy.model.imageset import ImageSet
    from vitdeploy.runners import BACKENDS_OF_KIND, Runner, artifact_kind, default_backend, open_runner

    if isinstance(tolerance, str):
        tolerance = Tolerance.parse(tolerance)
    if batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    from vitdeploy.core.limits import check_range

    check_range("--min-cosine", min_cosine, "fraction")  # the range --help shows: [0.0<=x<=1.0]
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
    judge: EmbeddingJudge | None = None
    maps: list[PatchCosine | None] = []
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
            if i == 0:  # the task decides the judge, and which budget options mean anything
                judge = judge_for(runners[0].manifest)
                if judge is not None and tolerance is not None:
                    refuse_classifier_budget(runners[0].manifest, "--tolerance")
                if judge is None and min_cosine is not None:
                    raise UsageError(f"--min-cosine judges embedding models; {a} is a {task_of(runners[0].manifest).describe()}: "
                                     "use --tolerance (|Δlogit| and top-1 agreement) instead")
            if i > 0:
                _require_same_task(str(artifacts[0]), runners[0].manifest, str(a), runners[i].manifest)
                require_same_model((str(artifacts[0]), runners[0].manifest), (str(a), runners[i].manifest),
                                   "verify compares artifacts of one model")
                why = made_from_reference(artifacts[0], runners[0].manifest, a, runners[i].manifest)
                if why:
                    notes.append(why)
                link = source_link(a, runners[i].manifest)  # lineage: never judged silently when it is stale
                if link.status == STALE:
                    notes.append(f"{a} is stale: made from an earlier {link.source.name if link.source else 'source'}; "
                                 f"re-make it with `{remake_command(a, runners[i].manifest)}`")
        ref_manifest = runners[0].manifest
        # an embedding model has no classes: a labelled folder is labelled by its own class folders (for kNN)
        image_set = ImageSet.labeled(images, None if judge is not None else list(ref_manifest.labels))
        notes += image_set.notes
        res = run(runners, image_set, batch_size, progress)
        if judge is not None:
            results = judge_embeddings(judge, [str(a) for a in artifacts], res.logits, res.labels,
                                       [r.backend for r in runners], [r.precision for r in runners], res.seconds,
                                       min_cosine)
            grid = _grid(ref_manifest)
            if grid is not None and any(task_of(r.manifest).tokens for r in runners):
                # the image the candidates answer least like the reference: where a per-patch map says the most
                worst = res.paths[int(np.argmin(np.min([e.comparison.per_image_cosine for e in results[1:]], axis=0)))]
                maps, why = patch_cosine_maps(runners, worst, grid)
                if why:
                    notes.append(why)
    finally:
        for r in runners:
            r.close()
    notes += res.notes
    if judge is not None:
        if len(res.paths) < NN_MIN_IMAGES:
            notes.append(nn_undefined_note(len(res.paths)))
        for e, m in zip(results, maps or [None] * len(results), strict=True):
            e.patches = m
        return EmbeddingVerifyReport(judge.task, results, res.paths, res.labels, list(image_set.classes or []),
                                     str(images), res.skipped, notes, grid if any(maps) else None)
    results_c = []
    for i, (a, r) in enumerate(zip(artifacts, runners, strict=True)):
        tol = None if i == 0 else (tolerance or default_tolerance(r.precision))
        results_c.append(compare(str(a), res.logits[i], res.logits[0], res.labels, tol, r.backend, r.precision,
                                 res.seconds[i]))
    return VerifyReport(results_c, res.paths, res.labels, list(ref_manifest.labels), str(images), res.skipped, notes)


def _grid(manifest: Any) -> tuple[int, int] | None:
    """The patch grid (rows, columns) a manifest's model cuts its input into, or None where it does not say."""
    cfg = manifest.model
    if not cfg or "patch_size" not in cfg:
        return None
    h, w = cfg.get("image_size", manifest.input_size)
    p = int(cfg["patch_size"])
    return (int(h) // p, int(w) // p)


def _require_same_task(ref_name: str, ref: Any, cand_name: str, cand: Any) -> None:
    """A classifier's embedding export is verified against its own FP32 form, not the classifier: one line saying so."""
    from vitdeploy.core.errors import IncompatibleArtifact
    from vitdeploy.core.task import task_of

    rt, ct = task_of(ref), task_of(cand)
    if ct.is_embedding and not rt.is_embedding:
        raise IncompatibleArtifact(
            f"{cand_name} is an {ct.describe()} and {ref_name} a {rt.describe()}: verify an embedding model's copies "
            f"against its FP32 ONNX model or 0-class checkpoint (e.g. `vitdeploy verify {cand_name} "
            f"{Path(cand_name).with_suffix('.fp16.onnx')} -i DIR`)")
    if rt.is_embedding and not ct.is_embedding:
        raise IncompatibleArtifact(f"{cand_name} is a {ct.describe()} and {ref_name} an {rt.describe()}: "
                                   "verify compares artifacts of one model")
