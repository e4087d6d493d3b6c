"""One command from a checkpoint to a verified set of artifacts for a device: ``vitdeploy bundle CKPT --target …``.

``prepare`` runs export (parity on the images), INT8 with the accuracy guard and FP16, and verify, beside the
checkpoint, reusing every artifact whose lineage is current for the target; ``bundle`` then packs them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.lineage import STALE, source_link
from vitdeploy.core.naming import ONNX_NAMES


def guard_budget(manifest: Any, images: Path | None, labeled: Path | None, notes: list[str]) -> dict[str, Any]:
    """calibrate's budget keywords for the one-command path, decided by the task (core/task.py), not the family.

    A classifier: the top-1 budget (``max_drop``) on the labeled images, where there are some. An embedding model has
    no top-1: its budget is the mean per-image cosine to FP32 (checks/judge.embedding_budget("int8")), on the images
    given (labels not needed), passed as calibrate's ``min_cosine``."""
    from vitdeploy.checks.judge import CLASSIFIER_INT8_MAX_DROP, judge_for

    judge = judge_for(manifest)
    if judge is None:  # the classifier's budget: top-1 points lost against FP32 (the task's default, checks/judge.py)
        if labeled is None:
            notes.append("INT8 calibrated without an accuracy budget: --images has no labeled class sub-folders")
            return {}
        return {"eval_dir": labeled, "max_drop": CLASSIFIER_INT8_MAX_DROP}
    budget = judge.budget("int8")
    if images is None:  # calibrate's guard judges on an --eval folder, which here would be --images
        notes.append(f"INT8 calibrated without a cosine budget: pass --images for the guard to hold it to a mean "
                     f"cosine of {budget.min_cosine} to FP32 on them")
        return {}
    return {"eval_dir": images, "min_cosine": budget.min_cosine}


@dataclass
class Prepared:
    """What ``prepare`` made or reused beside the checkpoint, and the receipt's rows."""

    models: list[Path]
    made: list[str]  # files written this run (the rest were current and reused)
    rows: list[dict[str, Any]]  # artifact, target, top1, drop, agreement, size (bytes)
    notes: list[str] = field(default_factory=list)
    # the INT8's one verdict on its budget (checks/guard.Verdict), on the guard's image set; None: no INT8 asked for
    verdict: Any = None


def _current_for(path: Path, target: str | None, quantizer: str | None = None) -> bool:
    """``path`` exists, was made for ``target`` (an INT8: by ``quantizer``; none recorded is ours) and its lineage is
    current (the source beside it unchanged)."""
    if not path.exists():
        return False
    try:
        m = OnnxArtifact.open(path).manifest
    except VitdeployError:
        return False
    if quantizer is not None and (m.extra.get("quantization") or {}).get("quantizer", "vitdeploy") != quantizer:
        return False
    return m.target == target and source_link(path, m).status != STALE


def made_precisions(int8: bool, fp16: bool) -> list[str]:
    """The precisions the one command makes from a checkpoint: FP32, and INT8 and FP16 unless one alone is asked."""
    return ["fp32", *(["int8"] if int8 or not fp16 else []), *(["fp16"] if fp16 or not int8 else [])]


def check_inputs(ckpt: Path, images: str | Path | None, target: str | None, int8: bool, quantizer: str) -> str | None:
    """What ``prepare`` refuses, checked before its first artifact is touched; returns the target's name.

    The checkpoint exists, the target is known, --images is a folder, the quantizer makes an INT8 for the target
    (calibrate's own check), and, where an INT8 will be calibrated, its folder holds one batch of images at least
    (calibrate's own check, with the advice that helps here: more images in that folder)."""
    from vitdeploy.core.targets import resolve_target
    from vitdeploy.stages.precision import check_calibration_count, check_quantizer_target

    if not ckpt.is_file():
        raise VitdeployError(f"{ckpt}: no such checkpoint")
    facts = resolve_target(target)
    name = facts.name if facts is not None else None
    if images is not None and not Path(images).is_dir():
        raise UsageError(f"--images {images}: no such folder of images")
    if not int8:
        return name
    check_quantizer_target(quantizer, name)
    if quantizer == "nncf":
        from vitdeploy.graph.nncf_ptq import import_nncf

        import_nncf()  # one line saying how to install it, before model.onnx is touched
    folder = ckpt.parent
    if _current_for(folder / ONNX_NAMES["fp32"], name) and _current_for(folder / ONNX_NAMES["int8"], name, quantizer):
        return name  # reused: nothing is calibrated
    root = Path(images) if images is not None else Path("calibration")  # calibrate's one rule (None: calibration/)
    if root.is_dir():
        from vitdeploy.core.preprocess import list_images
        from vitdeploy.stages.precision import CALIB_IMAGES

        check_calibration_count(min(len(list_images(root)), CALIB_IMAGES), root)
    return name


def check_identity(ckpt: Path, int8: bool, fp16: bool) -> None:
    """Refuse (exit 1, before any work) a model beside ``ckpt`` that this command would reuse or replace and that is
    not made from ``ckpt`` (core/lineage.descends_from): model.onnx exported from another checkpoint, or an INT8/FP16
    made from another model, or one whose recorded source is missing or unrecorded. Such a file is neither shipped
    nor overwritten; whatever its target. A stale one (made from an earlier ``ckpt``) is re-made as before."""
    from vitdeploy.core.lineage import require_descends

    folder = ckpt.parent
    fp32 = folder / ONNX_NAMES["fp32"]
    # model.onnx first: when it is another checkpoint's, so are (or stale against it) the INT8 and FP16 made from it,
    # and re-exporting explicitly is the one way out for all of them
    require_descends(fp32, ckpt, "bundle", remake=f"vitdeploy export {ckpt}")
    for prec, wanted in (("int8", int8), ("fp16", fp16)):
        if wanted:
            other = folder / ONNX_NAMES[prec]
            cmd = "calibrate" if prec == "int8" else "convert-fp16"
            require_descends(other, ckpt, "bundle", remake=f"vitdeploy {cmd} {fp32} -o {other}")


def check_before_work(ckpt: Path, images: str | Path | None, target: str | None, int8: bool, fp16: bool,
                      quantizer: str, opts: Any, out: Path) -> None:
    """Every option of the whole path from a checkpoint, before the first artifact is touched (exit 2, or 1 for
    too few calibration images): the bundle's (stages/bundle.check_options, ``opts`` its BundleOptions), the
    precision it is to use among those made, and what prepare and calibrate refuse (``check_inputs``)."""
    from vitdeploy.stages.bundle import check_options

    check_options(opts, out, [ckpt])
    made = made_precisions(int8, fp16)
    if opts.precision is not None and opts.precision not in made:
        raise UsageError(f"--precision {opts.precision}: this command makes {', '.join(made)} from {ckpt.name}; "
                         f"drop --int8/--fp16, or choose one of those")
    check_inputs(ckpt, images, target, int8 or not fp16, quantizer)
    check_identity(ckpt, int8 or not fp16, fp16 or not int8)


def prepare(ckpt: str | Path, images: str | Path | None, target: str | None = None, int8: bool = True,
            fp16: bool = True, say: Callable[[str], None] | None = None, quantizer: str = "vitdeploy") -> Prepared:
    """The whole path from a checkpoint, beside it: export (parity on ``images``), INT8 (the accuracy guard on
    ``images``' labeled sub-folders where it has them, else calibrated without a budget) and FP16, then verify on the
    labeled images. An artifact already made for ``target`` from the current source is reused; only a missing or
    stale one is made. ``quantizer``: calibrate's (nncf: NNCF's INT8, for a CPU target)."""
    from vitdeploy.model.imageset import ImageSet

    say = say or (lambda _m: None)
    ckpt = Path(ckpt)
    if ckpt.is_file():
        check_identity(ckpt, int8, fp16)  # nothing made from another checkpoint is reused or replaced
    target = check_inputs(ckpt, images, target, int8, quantizer)
    folder = ckpt.parent
    fp32, q8, h16 = folder / ONNX_NAMES["fp32"], folder / ONNX_NAMES["int8"], folder / ONNX_NAMES["fp16"]
    made: list[str] = []
    notes: list[str] = []
    if not _current_for(fp32, target):
        from vitdeploy.stages.export import export_onnx

        say("exporting (parity on the images)")
        export_onnx(ckpt, fp32, check=True, images=images, target=target)
        made.append(fp32.name)
    src = OnnxArtifact.open(fp32)
    from vitdeploy.core.task import task_of

    embedding = task_of(src.manifest).is_embedding  # no labels, no top-1: judged by cosine (the bundle's table)
    labeled = None
    if images is not None and not embedding:
        ls = ImageSet.labeled(images, list(src.manifest.labels))
        labeled = Path(ls.source) if ls.labels is not None else None
    models = [fp32]
    verdict = None
    if int8:
        budget_notes: list[str] = []  # said when it calibrates (a reused INT8 was calibrated earlier)
        budget = guard_budget(src.manifest, Path(images) if images is not None else None, labeled, budget_notes)
        if not _current_for(q8, target, quantizer):
            notes += budget_notes
            from vitdeploy.core.errors import BudgetMissed
            from vitdeploy.stages.precision import calibrate

            calib = images  # None: calibrate's one rule (calibration/, else the digits for a digits model)
            say("calibrating INT8" + (" with the accuracy guard" if budget else ""))
            try:
                calibrate(fp32, calib, q8, target=target, quantizer=quantizer, **budget)
                made.append(q8.name)
            except BudgetMissed as e:
                if not fp16:  # the INT8 alone was asked for (--int8): nothing to ship in its place
                    raise
                verdict = _missed_verdict(budget, str(e))
                notes.append(f"no INT8 shipped: the guard could not bring it within budget ({e}); FP16 is the default")
        if verdict is None:
            verdict = int8_verdict(fp32, q8, budget, target, say)
            models.append(q8)
    if fp16:
        if not _current_for(h16, target):
            from vitdeploy.stages.precision import convert_fp16

            say("converting to FP16")
            convert_fp16(fp32, h16, target=target)
            made.append(h16.name)
        models.append(h16)
    rows = _receipt_rows(models, labeled, target, say)
    if labeled is None and not embedding:
        notes.append("not verified on labels: --images has no labeled class sub-folders (top-1 and drop left blank)")
    return Prepared(models, made, rows, notes, verdict)


def _missed_verdict(budget: dict[str, Any], why: str) -> Any:
    """The verdict on an INT8 the guard could not bring within budget (calibrate wrote nothing): outside."""
    from vitdeploy.checks.guard import OUTSIDE, Verdict

    return Verdict(OUTSIDE, eval=str(budget.get("eval_dir", "")), failures=(why.split("; nothing written")[0],),
                   by="the guard, every quantized layer tried in float")


def int8_verdict(fp32: Path, q8: Path, budget: dict[str, Any], target: str | None,
                 say: Callable[[str], None]) -> Any:
    """The one verdict on the INT8 for this command's budget (checks/guard.Verdict), on the guard's image set (all of
    --images, or its labeled folder for a classifier): the guard's own record where it measured on those images (an
    INT8 made now, or reused from a calibrate on the same folder), judged by the task against this budget; else, for
    an INT8 reused from elsewhere, measured here as the guard measures. No eval set (``budget`` {}): the record's own
    verdict, unjudged where it has none."""
    from vitdeploy.checks.guard import measured_verdict, recorded_verdict

    m = OnnxArtifact.open(q8).manifest
    if not budget:
        return recorded_verdict(m)
    eval_dir = Path(budget["eval_dir"])
    kw = {k: v for k, v in budget.items() if k != "eval_dir"}
    rec = m.extra.get("guard")
    if isinstance(rec, dict) and rec.get("eval") and Path(str(rec["eval"])).resolve() == eval_dir.resolve():
        return recorded_verdict(m, kw)
    say("judging the reused INT8 against FP32 on the images (the guard's measurement)")
    return measured_verdict(fp32, q8, eval_dir, target, kw)


def _receipt_rows(models: list[Path], labeled: Path | None, target: str | None,
                  say: Callable[[str], None]) -> list[dict[str, Any]]:
    """artifact | target | top-1 | drop | agreement | size, measured by verify on the labeled images."""
    rows: list[dict[str, Any]] = [{"artifact": p.name, "target": target or "any (no target)", "top1": None, "drop": None,
             "agreement": None, "size": p.stat().st_size} for p in models]
    if labeled is None or len(models) < 2:
        return rows
    from vitdeploy.checks.verify import EmbeddingVerifyReport, verify

    say("verifying on the labeled images")
    rep = verify(models[0], models[1:], labeled)
    if isinstance(rep, EmbeddingVerifyReport):  # no top-1: an embedding model's figures (checks/judge.py)
        for row, e in zip(rows, rep.results, strict=True):
            row.update(backend=e.backend, knn_top1=e.knn_top1,
                       cosine_mean=None if e.is_reference else e.comparison.cosine_mean)
        return rows
    ref = rep.results[0]
    for row, r in zip(rows, rep.results, strict=True):
        row["top1"] = r.top1
        row["agreement"] = None if r.is_reference else r.agreement
        row["drop"] = None if r.is_reference or r.top1 is None or ref.top1 is None else (ref.top1 - r.top1) * 100
        row["backend"] = r.backend
    return rows
