"""One comparison run: every runner over the same images, logits in image order (Polygraphy's ``Comparator.run``).

verify, export's parity check, the calibrate guard, the bundle's check and the engine's artifact check all call
``run`` and add only their judgement (checks.metrics compares). The "same model?" rule over manifests is
``same_model``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.checks.metrics import compare as compare_logits
from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import IncompatibleArtifact, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.model.imageset import ImageSet
from vitdeploy.runners.base import Runner

Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class RunResult:
    """Each runner's logits ([N, classes] float32) over the readable images, in image order."""

    logits: list[np.ndarray]
    paths: list[str]
    labels: np.ndarray | None
    seconds: list[float]
    skipped: list[tuple[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.paths)


def same_model(reference: tuple[str, Manifest], candidate: tuple[str, Manifest]) -> str | None:
    """Why two manifests are not copies of one model (task, classes, class names, input size), or None."""
    from vitdeploy.core.task import task_of

    (rn, r), (cn, c) = reference, candidate
    rt, ct = task_of(r), task_of(c)
    if rt.is_embedding or ct.is_embedding:  # what the vector is: its width, pooling, projection and normalisation
        keys = ("kind", "dim", "pool", "projection", "normalize")
        if [getattr(rt, k) for k in keys] != [getattr(ct, k) for k in keys]:
            def what(t: Any) -> str:
                return f"{'an' if t.is_embedding else 'a'} {t.describe()}"

            return f"{cn} is {what(ct)}, {rn} {what(rt)}"
    if c.num_classes != r.num_classes:
        return f"{cn} has {c.num_classes} classes, {rn} has {r.num_classes}"
    if list(c.labels) != list(r.labels):
        diff = next(i for i, (a, b) in enumerate(zip(c.labels, r.labels, strict=True)) if a != b)
        return f"{cn} names class {diff} {c.labels[diff]!r}, {rn} names it {r.labels[diff]!r}"
    if c.input_size != r.input_size:
        return (f"{cn} takes {c.input_size[0]}x{c.input_size[1]} inputs, {rn} "
                f"{r.input_size[0]}x{r.input_size[1]}")
    return None


def require_same_model(reference: tuple[str, Manifest], candidate: tuple[str, Manifest], what: str = "") -> None:
    why = same_model(reference, candidate)
    if why:
        raise IncompatibleArtifact(f"{why}: {what or 'these are not artifacts of one model'}")


def run(runners: Sequence[Runner], images: ImageSet, batch_size: int = 32, progress: Progress | None = None) -> RunResult:
    """Run every runner over ``images``: one decode pass per distinct preprocessing (normally one for all)."""
    if not runners:
        raise ValueError("run needs at least one runner")
    groups: dict[str, list[int]] = {}
    for i, r in enumerate(runners):
        groups.setdefault(repr(r.manifest.pp()), []).append(i)
    outs: list[list[np.ndarray]] = [[] for _ in runners]
    secs = [0.0 for _ in runners]
    kept: list[str] | None = None
    labels: list[int] = []
    notes: list[str] = []
    skipped: list[tuple[str, str]] = []
    if progress:
        progress("start", {"total": len(images) * len(groups), "artifacts": len(runners)})
    for gi, members in enumerate(groups.values()):
        pp = runners[members[0]].manifest.pp()
        these: list[str] = []
        for b in images.batches(pp, batch_size):
            if gi == 0:
                skipped += [(str(p), why) for p, why in b.skipped]
                labels += b.labels or []
            these += [str(p) for p in b.paths]
            if len(b.paths):
                for i in members:
                    t = time.perf_counter()
                    outs[i].append(np.asarray(runners[i](b.array), np.float32))
                    secs[i] += time.perf_counter() - t
            if progress:
                progress("advance", {"n": len(b.paths) + len(b.skipped)})
        if kept is None:
            kept = these
        elif these != kept:
            raise VitdeployError(f"{images.source}: the readable images changed between passes; re-run on a stable folder")
        if len(groups) > 1:
            notes.append(f"{', '.join(str(runners[i].artifact) for i in members)}: own preprocessing ({pp.to_dict()})")
    kept = kept or []
    if not kept:
        first = f" (first: {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
        raise VitdeployError(f"{images.source}: no readable images to run on{first}")
    n_cls = runners[0].manifest.num_classes
    logits = [np.concatenate(o) if o else np.zeros((0, n_cls), np.float32) for o in outs]
    lab = np.asarray(labels, np.int64) if images.labels is not None else None
    return RunResult(logits, kept, lab, secs, skipped, notes)


def run_arrays(runners: Sequence[Runner], x: np.ndarray, batch_size: int = 64) -> list[np.ndarray]:
    """Every runner over inputs already decoded (the guard's probes, the parity batches), in order."""
    return [np.concatenate([np.asarray(r(x[i : i + batch_size]), np.float32) for i in range(0, len(x), batch_size)])
            for r in runners]


def agreement(reference: Runner, candidate: Runner, images: ImageSet, batch_size: int = 32) -> dict[str, Any]:
    """How closely ``candidate`` answers like ``reference`` on ``images`` (no labels needed): the engine's check. The
    reference's task decides the figures (checks/judge.py): top-1 agreement and |Δlogit| for a classifier, per-image
    cosine and nearest-neighbour agreement for an embedding model."""
    from vitdeploy.checks.judge import judge_for

    res = run([reference, candidate], images, batch_size)
    common = {"images": len(res), "against": reference.artifact.name, "source": images.source,
              "runner": candidate.backend}
    judge = judge_for(reference.manifest)
    if judge is not None:
        e = judge.compare(res.logits[0], res.logits[1])
        return {**common, "cosine_mean": e.cosine_mean, "cosine_p1": e.cosine_p1, "nn_agreement": e.nn_agreement}
    c = compare_logits(res.logits[0], res.logits[1])
    return {**common, "top1_agreement": c.agreement, "max_abs_logit_diff": c.max_abs_diff}


def artifact_agreement(reference: Path, ref_manifest: Manifest, candidate: OnnxArtifact, images: ImageSet,
                       target: str | None = None) -> dict[str, Any] | None:
    """A made precision artifact against its FP32 source (the engine step's check): the source on ONNX Runtime, the
    artifact on the runner that judges its target (the TensorRT oracle for a TensorRT target). None: nothing read."""
    from vitdeploy.core.targets import CPU_TARGETS
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    ref = OnnxRuntimeRunner(reference, manifest=ref_manifest)
    cand: Runner
    if target is not None and target not in CPU_TARGETS:
        from vitdeploy.runners.oracle.runner import OracleRunner

        cand = OracleRunner(candidate.path, target, manifest=candidate.manifest)
    else:
        cand = OnnxRuntimeRunner(candidate, manifest=candidate.manifest)
    try:
        return agreement(ref, cand, images)
    except VitdeployError:
        if not images.skipped:
            raise
        return None  # every image unreadable: the calibration said so already
    finally:
        ref.close()
        cand.close()
