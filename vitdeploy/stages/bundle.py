"""A self-contained folder that carries a model to a Jetson, a Triton server or a DeepStream pipeline.

Engines are tied to the TensorRT version and GPU that built them, so what
travels is the ONNX (FP32, FP16, INT8 Q/DQ) with its raw-pixel variants, the
labels, a torch-free ``run.py``, ``build_engine.sh`` (vitdeploy where it is
installed, else trtexec from JetPack), a Triton model repository, a DeepStream
nvinfer config and reference outputs that ``run.py --check`` compares the
device's engine against.

What those outputs are, and how they are judged, is the model's task (core/task.py), asked once here: a
classifier's reference logits are held to a relative tolerance (and labels travel with them); an embedding model's
reference embeddings are held to a per-image cosine (checks/judge.py's budget for the precision, written into the
manifest for run.py), its Triton and DeepStream configs declare tensors, not classes, and the bundle's end-of-run
table judges each precision against FP32 with checks/judge.py.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.checks.compare import run_arrays, same_model
from vitdeploy.checks.device_check import norm_failure, norm_tolerance, reference_tokens
from vitdeploy.checks.judge import EmbeddingJudge, judge_for
from vitdeploy.checks.metrics import compare, require_finite
from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import IncompatibleArtifact, StaleArtifact, UsageError, VitdeployError
from vitdeploy.core.fileio import printable_name, temp_dir_beside
from vitdeploy.core.lineage import STALE, remake_command, source_link
from vitdeploy.core.manifest import ENGINE_SUFFIXES, Manifest, tool_versions
from vitdeploy.core.naming import ONNX_NAMES, PRECISIONS, calib_cache_name
from vitdeploy.core.preprocess import list_images, resized_uint8, to_array
from vitdeploy.core.task import task_of
from vitdeploy.graph.embed import raw_batch
from vitdeploy.runners.base import Runner
from vitdeploy.stages.bundle_configs import (  # noqa: E402, F401 - the configuration files, re-exported
    TEMPLATES,
    _onnx_io,
    _onnx_ios,
    cpp_config,
    deepstream_config,
    labels_file,
    render,
    triton_config,
    triton_name,
    write_cpp,
)
from vitdeploy.stages.bundle_replace import replace_bundle, written_files
from vitdeploy.stages.embed import raw_variant_name, write_variant

FORMAT = "vitdeploy-bundle/1"
MAX_REFERENCES = 1000  # reference images run.py --check compares: enough for any check, bounded in size and time
# run.py --check passes when max|Δlogit| ≤ tol · max|reference logit| (TensorRT FP32 may use TF32)
CHECK_TOLERANCE = {"fp32": 1e-2, "fp16": 3e-2, "int8": 1e-1}
# the raw-pixel variant must equal its source on ONNX Runtime here (issue: ≤ 1e-4 relative for FP32)
EMBED_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3, "int8": 1e-4}


def check_thresholds(judge: EmbeddingJudge | None, precision: str) -> Any:
    """What run.py --check holds the device's output to, written into the manifest (run.py reads it, it hard-codes
    nothing): a classifier's relative tolerance (CHECK_TOLERANCE), an embedding model's per-image cosine gates, the
    budget checks/judge.py sets for the precision (mean and 1st percentile; run.py reports the minimum too)."""
    if judge is None:
        return CHECK_TOLERANCE[precision]
    b = judge.budget(precision)
    return {"min_cosine": b.min_cosine, "min_cosine_p1": b.min_cosine_p1,
            "max_norm_rel_err": norm_tolerance(precision)}  # each vector's norm (checks/device_check.py)


def below_check(judge: EmbeddingJudge | None, precision: str, reference: np.ndarray, got: np.ndarray) -> str | None:
    """Why ``got`` (a variant on its line's oracle) would fail run.py --check against ``reference``, or None."""
    if judge is None:
        c = compare(reference, got)
        if c.max_rel_diff > CHECK_TOLERANCE[precision]:
            return (f"max |Δlogit| {c.max_rel_diff:.2e} relative to the reference logits, above run.py --check's "
                    f"{CHECK_TOLERANCE[precision]:.0e}")
        return None
    e = judge.compare(reference, got)
    t = check_thresholds(judge, precision)
    if e.cosine_mean < t["min_cosine"] or e.cosine_p1 < t["min_cosine_p1"]:
        return (f"per-image cosine to the reference embeddings mean {e.cosine_mean:.5f}, p1 {e.cosine_p1:.5f}, below "
                f"run.py --check's {t['min_cosine']}/{t['min_cosine_p1']}")
    return norm_failure(precision, reference, got)


@dataclass
class BundleOptions:
    name: str | None = None  # Triton model name (default: the manifest's name)
    precision: str | None = None  # what build_engine.sh, run.py, Triton and DeepStream use (default: int8 > fp16 > fp32)
    min_batch: int = 1
    opt_batch: int = 8
    max_batch: int = 32
    check_images: Sequence[Path] = ()  # reference images for run.py --check (default: calibration/ if it exists)
    references: int = 16
    force: bool = False  # replace an existing bundle folder
    # what the bundle is for: every model given must have been made for it (None: the models' own, which must agree)
    target: str | None = None
    remake: bool = True  # re-make a stale artifact from its current source with its recorded settings (else refuse)
    # the INT8's one verdict on its budget (checks/guard.Verdict) when the caller measured it on the guard's image set
    # (the one command from a checkpoint: stages/prepare.int8_verdict); None: read from the INT8's guard record
    int8_verdict: Any = None
    gallery: Path | None = None  # an index (vitdeploy index) whose vectors and classes run.py labels images with


@dataclass
class BundleResult:
    out: Path
    precisions: list[str]
    default_precision: str
    files: list[str]
    embed_errors: dict[str, float] = field(default_factory=dict)
    reference_source: str = ""
    exported: bool = False
    notes: list[str] = field(default_factory=list)
    # TensorRT line -> precision -> the ONNX build_engine.sh builds there (a no-target bundle: a variant where needed)
    matrix: dict[str, dict[str, str]] = field(default_factory=dict)
    reference_runner: dict[str, str] = field(default_factory=dict)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # unreadable reference images (name, why)
    kept: list[str] = field(default_factory=list)  # --force: what was in the folder that the bundle did not write
    task: str = ""  # the model's task, as core/task.Task.describe() says it
    # an embedding model: each precision judged against FP32 on the reference images (checks/judge.py), in order
    judged: list[dict[str, Any]] = field(default_factory=list)
    verdict: Any = None  # the INT8's verdict on its budget (checks/guard.Verdict), None without an INT8
    default_why: str = ""  # why the default is not the first of int8 > fp16 > fp32 (an INT8 outside its budget)

    @property
    def is_embedding(self) -> bool:
        return bool(self.judged) or self.task.startswith("embedding")


def resolve_models(
    models: Sequence[str | Path], workdir: Path, cwd: Path | None = None, remake: bool = True,
    notes: list[str] | None = None, images: Path | None = None,
) -> tuple[dict[str, Path], dict[str, OnnxArtifact], bool]:
    """{precision: ONNX path}, {precision: its OnnxArtifact, each read once}; a checkpoint is exported into
    ``workdir`` first. True when something was exported.

    Lineage: no stale artifact is returned. Each model is compared with the source its manifest records, the file
    beside it (model.int8.onnx → model.onnx → ckpt.pth); a stale one is re-made where the recorded settings say how
    (``remake``; ``images``: the folder to calibrate on when the recorded images are gone), else refused in one line
    naming it and the command that re-makes it (StaleArtifact, exit 1)."""
    cwd = cwd or Path.cwd()
    notes = notes if notes is not None else []
    paths = [Path(m) for m in models]
    if not paths:
        paths = [cwd / n for n in ONNX_NAMES.values() if (cwd / n).exists()]
        if not paths and (cwd / "ckpt.pth").exists():
            paths = [cwd / "ckpt.pth"]
        if not paths:
            raise UsageError("nothing to bundle here: pass ONNX files or a checkpoint, or run `vitdeploy export` first")
    opened: list[OnnxArtifact] = []
    exported = False
    for p in paths:
        if not p.exists():
            raise VitdeployError(f"{p}: no such file")
        if p.suffix in ENGINE_SUFFIXES:
            raise UsageError(
                f"{p}: engines are tied to the GPU and TensorRT that built them; bundle the ONNX and run build_engine.sh on the device"
            )
        if p.suffix != ".onnx":
            p = _export(p, workdir)
            exported = True
        art = OnnxArtifact.open(p)
        m = art.manifest
        if m.extra.get("input", {}).get("preprocess_in_graph"):
            raise UsageError(f"{p}: a raw-pixel variant; pass the normal export, the bundle makes the variant")
        if m.precision not in PRECISIONS:
            raise VitdeployError(f"{p}: unknown precision {m.precision!r} in its manifest")
        opened.append(art)
    # the FP32 sources first: an INT8/FP16 model is judged against the model.onnx that is current itself
    opened.sort(key=lambda a: a.manifest.precision != "fp32")
    found: dict[str, Path] = {}
    arts: dict[str, OnnxArtifact] = {}
    for art in opened:
        art = ensure_current(art, remake, notes, images)
        prec = art.manifest.precision
        if prec in found:
            raise UsageError(f"two {prec} models given ({found[prec]} and {art.path}); pass one per precision")
        found[prec] = art.path
        arts[prec] = art
    return found, arts, exported


def one_model(arts: dict[str, OnnxArtifact]) -> None:
    """Refuse (exit 1, before anything is packed) an INT8 or FP16 model that is not made from the FP32 model it is
    bundled with (core/lineage.descends_from): made from another model, or its recorded source missing or
    unrecorded. The bundle's references come from the FP32 model; another model's INT8 beside it would be shipped as
    the default and judged against references it never answered. One model's files share a SHA-256 along their
    recorded chains (core/lineage.ancestors): an INT8 made by another tool that kept model.onnx's manifest records
    model.onnx's checkpoint, and is of that model."""
    from vitdeploy.core.lineage import ancestors, descends_from, not_made_from, remember_sha

    for a in arts.values():
        remember_sha(a.path, a.sha256)  # the bytes read: not hashed again
    fp32 = arts["fp32"].path
    ours, _ = ancestors(fp32, arts["fp32"].manifest)
    for prec, art in arts.items():
        if prec == "fp32":
            continue
        d = descends_from(art.path, fp32, art.manifest)
        theirs, stale = ancestors(art.path, art.manifest)
        if not d.usable and not stale and not ours & theirs:
            cmd = "calibrate" if prec == "int8" else "convert-fp16"
            raise not_made_from(d, "bundle", ways=(
                f"nothing written: bundle one model's files, or make it again from {fp32.name} "
                f"(`vitdeploy {cmd} {fp32} -o {art.path}`, which replaces it)"))


def ensure_current(art: OnnxArtifact, remake: bool = True, notes: list[str] | None = None,
                   images: Path | None = None) -> OnnxArtifact:
    """``art`` when its lineage is current (or unrecorded/missing: nothing to compare with), else the artifact
    re-made from the current source with the recorded settings; refused (StaleArtifact) where it cannot be.

    An INT8/FP16 model's source model.onnx is first checked against its own source (ckpt.pth) and re-exported when
    stale, so the chain is current from the checkpoint down."""
    notes = notes if notes is not None else []
    m = art.manifest
    if m.precision != "fp32":
        src = source_link(art.path, m).source
        if src is not None and src.exists() and src.suffix == ".onnx":
            ensure_current(OnnxArtifact.open(src), remake, notes, images)
    link = source_link(art.path, m)
    if link.status != STALE:
        return art
    assert link.source is not None
    why = _cannot_remake(art, link.source, images) if remake else "re-making is off"
    if why is not None:
        raise StaleArtifact(
            f"{art.path} is stale: it was made from an earlier {link.source.name} ({why}); nothing written: re-make it "
            f"with `{remake_command(art.path, m)}`")
    new = _remake(art, link.source, notes, images)
    notes.append(f"{art.path} was stale (made from an earlier {link.source.name}): re-made it")
    return new


def _cannot_remake(art: OnnxArtifact, source: Path, images: Path | None) -> str | None:
    """Why ``art`` cannot be re-made here with its recorded settings (None: it can)."""
    m = art.manifest
    if m.precision == "fp32":
        return None if source.suffix in (".pth", ".pt") else f"it was not exported from a checkpoint ({source.name})"
    if m.precision == "fp16":
        return None if "fp16" in m.extra else "no FP16 record in its manifest (not made by vitdeploy convert-fp16)"
    q = m.extra.get("quantization")
    if not isinstance(q, dict) or "method" not in q:
        return "no calibration record in its manifest (not made by vitdeploy calibrate)"
    if _calibration_folder(art, images) is None:
        return "its calibration images are gone and no --images folder or calibration/ is here"
    return None


def _recorded_images(art: OnnxArtifact) -> list[Path]:
    """The calibration images the INT8 model's cache records (model.int8.calib.json), where they all still exist;
    a relative name is tried against the working folder and the model's folder."""
    q = art.manifest.extra.get("quantization") or {}
    cache = art.path.parent / str(q.get("calibration_cache") or calib_cache_name(art.path).name)
    try:
        names = json.loads(cache.read_text()).get("images") or []
    except (OSError, ValueError, AttributeError, RecursionError):
        return []
    if not isinstance(names, list) or not all(isinstance(n, str) and n and "\x00" not in n for n in names):
        return []  # not a list of file names: the one image rule decides instead
    out: list[Path] = []
    for n in names:
        cands = [Path(n)] if Path(n).is_absolute() else [Path.cwd() / n, art.path.parent / n]
        hit = next((c for c in cands if c.is_file()), None)
        if hit is None:
            return []
        out.append(hit)
    return out


def _calibration_folder(art: OnnxArtifact, images: Path | None) -> tuple[Path | None, int] | None:
    """(folder, number of images) to calibrate again on: the folder the recorded images came from while they all
    still exist there, else the one image rule (--images, then calibration/, then the digits for a digits model:
    folder None, calibrate's own rule); None when none of them has images."""
    files = _recorded_images(art)
    if files:
        root = Path(os.path.commonpath([str(f.parent) for f in files]))
        return root, len(files)
    if images is not None and Path(images).is_dir():
        return Path(images), 512
    if Path("calibration").is_dir() and list_images(Path("calibration")):
        return Path("calibration"), 512
    if art.manifest.source.get("dataset") == "digits":
        return None, 512
    return None


def _remake(art: OnnxArtifact, source: Path, notes: list[str], images: Path | None) -> OnnxArtifact:
    """Re-make ``art`` in place from ``source`` with the settings its manifest records."""
    m = art.manifest
    if m.precision == "fp32":
        from vitdeploy.stages.export import export_onnx

        export_onnx(source, art.path, check=False, target=m.target, opset=art.opset if art.opset else 17)
        return OnnxArtifact.open(art.path)
    if m.precision == "fp16":
        from vitdeploy.stages.precision import fp16_artifact

        return fp16_artifact(source, art.path, target=m.target)
    from vitdeploy.stages.precision import calibrate

    q = m.extra["quantization"]
    folder = _calibration_folder(art, images)
    assert folder is not None
    guard = m.extra.get("guard") or {}
    ev = guard.get("eval")
    budget: dict[str, Any] = {}
    # the budget as the guard recorded it (checks/guard.py: max_drop_points / min_agreement for a classifier,
    # min_cosine for an embedding model); "max_drop" is the key of records made before the rename
    max_drop = guard.get("max_drop_points", guard.get("max_drop"))
    if ev and Path(ev).exists() and guard.get("min_cosine") is not None:
        budget = {"eval_dir": ev, "min_cosine": guard["min_cosine"]}
    elif ev and Path(ev).exists() and (max_drop is not None or guard.get("min_agreement") is not None):
        budget = {"eval_dir": ev, "max_drop": max_drop, "min_agreement": guard.get("min_agreement")}
    # smoothing as recorded: absent (made before calibrate had it) -> its default, None -> off, else the mode given
    sm = q.get("smoothing", {"mode": "auto"})
    smooth = str(sm.get("mode", "auto")) if isinstance(sm, dict) else "off"
    res = calibrate(source, folder[0], art.path, num_images=folder[1], method=q.get("method", "entropy"),
                    quantize_attention=bool(q.get("quantize_attention")), float_type=q.get("float_type"),
                    seed=int(q.get("seed", 0)), target=m.target, smooth=smooth, **budget)
    notes.append(f"{art.path}: calibrated again on {res.images} images from {folder[0] or 'the digits'} "
                 f"({q.get('method')}, smoothing {smooth})")
    return res.artifact or OnnxArtifact.open(art.path)


def _export(ckpt: Path, workdir: Path) -> Path:
    try:
        from vitdeploy.stages.export import export_onnx
    except ImportError:
        raise VitdeployError(f"{ckpt}: exporting a checkpoint needs vitdeploy's export; export it first and pass the ONNX") from None
    out = workdir / f"export-{ckpt.stem}.onnx"
    export_onnx(ckpt, out)
    return out


def check_same_model(manifests: dict[str, Manifest]) -> None:
    """Every model is an artifact of one network: the classes, labels and input size (checks.compare.same_model),
    and the preprocessing run.py, Triton and DeepStream apply."""
    items = list(manifests.items())
    p0, m0 = items[0]
    for p, m in items[1:]:
        why = same_model((p0, m0), (p, m))
        if why:
            what = "labels" if "names class" in why or "classes" in why else "input size"
            raise IncompatibleArtifact(f"the {p0} and {p} models differ in their {what} ({why}): bundle artifacts of one model")
        if m.model != m0.model or m.preprocess != m0.preprocess:
            what = "model" if m.model != m0.model else "preprocess"
            raise IncompatibleArtifact(f"the {p0} and {p} models differ in their {what}: bundle artifacts of one model")
        if task_of(m) != task_of(m0):
            raise IncompatibleArtifact(f"the {p0} model is: {task_of(m0).describe()}; the {p} model: "
                                       f"{task_of(m).describe()}: bundle artifacts of one export")


def check_target(target: str | None, manifests: dict[Path, Manifest], models: dict[Path, Any] | None = None,
                 notes: list[str] | None = None) -> str | None:
    """The bundle's target: ``target`` when every model was made for it, or passes that target's check as it is
    (``models``: the graphs, checked with check-target's rules; then it is packed without a re-export, and a note says
    so); else one line naming the model, its target and the command that re-makes it. Without ``target``, the
    models' own, which must agree."""
    from vitdeploy.core.targets import TARGET_ROWS, resolve_target

    facts = resolve_target(target)  # a TensorRT line, ort, or a JetPack/module: the line it stands for
    if facts is not None:
        target = facts.name
        for path, m in manifests.items():
            if m.target == target or (m.target is not None and resolve_target(m.target) == facts):  # ort = cpu
                continue
            model = (models or {}).get(path)
            if model is not None and m.target is None and target in TARGET_ROWS:
                from vitdeploy.checks import conformance

                if conformance.check_onnx(model, target).ok and conformance.check_int8_intent(model, target).ok:
                    if notes is not None:
                        notes.append(f"{path.name} (made for no target) passes {target} as it is: packed unchanged")
                    continue
            made_for = m.target or "no target (the default)"
            raise VitdeployError(f"{path.name} was made for {made_for}, the bundle is for {target}: re-make it with "
                                 f"`{remake_command(path, m, target)}`")
        return target
    found = {m.target for m in manifests.values()}
    if len(found) > 1:
        raise VitdeployError("the models were made for different targets ("
                             + ", ".join(f"{p.name}: {m.target or 'none'}" for p, m in manifests.items())
                             + "): re-make them for one with --target")
    return found.pop() if found else None


# --- reference images and logits --------------------------------------------------------------------------


@dataclass
class References:
    """The reference images run.py --check uses: the files copied into the bundle, where they came from, their
    decoded uint8 HWC arrays (resized and cropped: the raw-pixel variant's input) and the unreadable ones skipped."""

    files: list[Path]
    source: str
    images: np.ndarray
    skipped: list[tuple[str, str]] = field(default_factory=list)


def reference_images(opts: BundleOptions, manifest: Manifest, folder: Path, cwd: Path) -> References:
    """Images for run.py --check, copied into reference/images by the one image rule (ImageSet.for_model: the
    given folder, calibration/, the digits for a digits model); seeded noise only when it finds none.

    Each copy is decoded as it will be checked; one that cannot be (empty, truncated, not an image) is named in
    ``skipped``, its copy removed, and the next image of the set taken in its place. None readable: one line."""
    from vitdeploy.core.preprocess import ImageReadError
    from vitdeploy.model.imageset import ImageSet

    pp = manifest.pp()
    folder.mkdir(parents=True, exist_ok=True)
    given = list(opts.check_images)
    iset: ImageSet | None
    if len(given) > 1 or (given and Path(given[0]).is_file()):
        files = list_images(*given)
        if not files:
            raise UsageError(f"no images in {', '.join(map(str, given))}")
        iset = ImageSet(files, ", ".join(map(str, given)))
    else:  # a folder without images was refused before any work (check_options)
        iset = ImageSet.for_model(manifest, given[0] if given else None)
    out: list[Path] = []
    arrays: list[np.ndarray] = []
    skipped: list[tuple[str, str]] = []
    if iset is not None and len(iset):
        n = min(opts.references, len(iset))
        pick = [int(i * len(iset) / n) for i in range(n)]  # spread over the set (a class folder each, in turn)
        picked = set(pick)
        spare = [i for i in range(len(iset)) if i not in picked]  # taken in order in place of an unreadable pick
        for i in [*pick, *spare]:
            if len(out) == n:
                break
            item = iset.items[i]
            k = len(out)
            if isinstance(item, Path):
                dst = folder / f"{k:03d}_{item.name}"
                shutil.copyfile(item, dst)
            else:  # an in-memory image (the embedded digits)
                dst = folder / f"{k:03d}_{Path(iset.name_of(i)).name}.png"
                item.save(dst)
            try:
                arrays.append(resized_uint8(dst, pp))  # the copy is decoded: what ships is what was checked
            except ImageReadError as e:
                dst.unlink()
                skipped.append((iset.name_of(i), str(e)))
                continue
            out.append(dst)
        if not out:
            first = f" (e.g. {skipped[0][0]}: {skipped[0][1]})" if skipped else ""
            raise VitdeployError(f"none of the reference images in {iset.source} can be read{first}: pass readable "
                                 "ones with --images")
        source = f"--images {iset.source}" if given else iset.source
        return References(out, source, np.stack(arrays), skipped)
    from PIL import Image

    h, w = manifest.input_size
    rng = np.random.default_rng(0)
    for i in range(opts.references):
        dst = folder / f"{i:03d}_noise.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(dst)
        out.append(dst)
        arrays.append(resized_uint8(dst, pp))
    return References(out, "seeded noise (no --images, no calibration/ folder and not a digits model)",
                      np.stack(arrays))


class _RawRunner(Runner):
    """ONNX Runtime on a graph with the preprocessing folded in (uint8 images in): the embed check's runner,
    its session from the one session builder (runners.onnxruntime.session)."""

    backend = "onnxruntime"

    def __init__(self, model: Any, manifest: Manifest, name: str) -> None:
        from vitdeploy.runners.onnxruntime import session

        super().__init__(manifest, name)
        self.session = session(model)
        self.input_name = self.session.get_inputs()[0].name

    def run(self, batch: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {self.input_name: batch})[0], np.float32)


def _reference_runner(art: OnnxArtifact, target: str | None) -> Runner:
    """The runner whose logits run.py --check compares the device's engine with: for a TensorRT target the oracle
    (what that TensorRT computes, runners.oracle.runner_for_target), else ONNX Runtime on the CPU."""
    from vitdeploy.core.targets import CPU_TARGETS

    if target is not None and target not in CPU_TARGETS:
        from vitdeploy.runners.oracle.runner import runner_for_target

        return runner_for_target(art.model, target)
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    return OnnxRuntimeRunner(art)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| relative to the largest |b| (b the reference)."""
    return compare(b, a).max_rel_diff


def is_bundle(folder: Path) -> bool:
    """Whether ``folder`` is a bundle vitdeploy wrote (its manifest.json has a bundle section): --force replaces
    nothing else."""
    import json

    try:
        return folder.is_dir() and "bundle" in json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def check_options(opts: BundleOptions, out: Path, models: Sequence[str | Path]) -> None:
    """The bundle's own options, refused (UsageError, exit 2) before any work: by ``bundle`` itself, and by the
    one command from a checkpoint before its first artifact is made (stages/prepare.check_before_work)."""
    if not (1 <= opts.min_batch <= opts.opt_batch <= opts.max_batch):
        raise UsageError(f"batch profile must satisfy 1 ≤ min ≤ opt ≤ max, got {opts.min_batch}/{opts.opt_batch}/{opts.max_batch}")
    if not 1 <= opts.references <= MAX_REFERENCES:
        raise UsageError(f"--references {opts.references}: give 1 to {MAX_REFERENCES} (each is an image and a row of "
                         "logits per precision inside the bundle)")
    if opts.precision is not None and opts.precision not in PRECISIONS:
        raise UsageError(f"--precision must be one of {', '.join(PRECISIONS)}, not {opts.precision!r}")
    if out.exists() and not opts.force:
        raise UsageError(f"{out} exists; pass --force to replace it, or choose another -o")
    if out.exists() and not is_bundle(out):
        raise UsageError(f"{out} is not a vitdeploy bundle (no manifest.json with a bundle section): --force replaces "
                         "only a bundle; choose another -o")
    for m in models:
        if Path(m).resolve().is_relative_to(out.resolve()):
            raise UsageError(f"-o {out} holds the input {m}: write the bundle to a new folder")
    given = list(opts.check_images)
    if len(given) == 1 and Path(given[0]).is_dir() and not list_images(Path(given[0])):
        raise UsageError(f"no images in {given[0]}")


def bundle(
    models: Sequence[str | Path],
    out: str | Path = "bundle",
    opts: BundleOptions | None = None,
    progress: Callable[[str], None] | None = None,
    cwd: str | Path | None = None,
) -> BundleResult:
    """Write the bundle folder ``out`` from the given ONNX artifacts (or a checkpoint, exported first)."""
    opts = opts or BundleOptions()
    say = progress or (lambda _msg: None)
    out = Path(out)
    cwd = Path(cwd) if cwd is not None else Path.cwd()
    check_options(opts, out, models)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)
    try:
        result = _write_bundle(models, tmp, opts, say, cwd)
        from vitdeploy.core.fileio import follow_umask

        follow_umask(tmp)  # copies (copymode, copytree) carry the source's mode; the bundle gets the umask's
        result.kept = replace_bundle(tmp, out, opts.force)
        result.out = out
        return result
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_bundle(models: Sequence[str | Path], root: Path, opts: BundleOptions, say: Callable[[str], None], cwd: Path) -> BundleResult:
    work = root / ".work"
    work.mkdir()
    say("reading models")
    notes: list[str] = []
    calib_dir = Path(opts.check_images[0]) if len(opts.check_images) == 1 else None
    found, arts, exported = resolve_models(models, work, cwd, opts.remake, notes, calib_dir)
    manifests = {prec: a.manifest for prec, a in arts.items()}
    check_same_model({str(found[k]): m for k, m in manifests.items()})
    target = check_target(opts.target, {found[k]: m for k, m in manifests.items()},
                          {found[k]: a.model for k, a in arts.items()}, notes)
    if "fp32" in arts:  # each model read (and hashed as read) once above: lineage is told those digests
        one_model(arts)
    precisions = [p for p in PRECISIONS if p in found]
    verdict = opts.int8_verdict
    if verdict is None and "int8" in arts:
        from vitdeploy.checks.guard import recorded_verdict

        verdict = recorded_verdict(manifests["int8"])
    default, default_why = choose_default(opts.precision, found, verdict)
    if default_why:
        notes.append(default_why)
    base = manifests["fp32"] if "fp32" in manifests else manifests[default]
    task = task_of(base)  # asked once: what the outputs are and how they are judged (checks/judge.py)
    if opts.gallery is not None:  # an index of this checkpoint and width, refused before the work (bundle_gallery.py)
        from vitdeploy.stages.bundle_gallery import check_bundle_gallery

        check_bundle_gallery(opts.gallery, Path(found[default]), manifests[default], arts[default].sha256)
    judge = judge_for(base)
    labels_file(base.labels)  # a label labels.txt cannot hold is refused before any work
    pp = base.pp()
    h, w = pp.input_size
    name = triton_name(opts.name or base.name)

    # each model was read once (resolve_models); each file is hashed once: a copy as it is copied,
    # a variant from the bytes written
    artifacts: dict[str, dict[str, Any]] = {}
    sha: dict[str, str] = {}
    raw_models: dict[str, Any] = {}
    for prec in precisions:
        dst = root / ONNX_NAMES[prec]
        # the bytes packed are the bytes read: the file is copied while it is the very file read (same identity
        # before and after the copy), so the SHA-256 taken as it was read is the copy's (a re-export meanwhile: one line)
        arts[prec].require_unchanged("bundle")
        shutil.copyfile(found[prec], dst)
        shutil.copymode(found[prec], dst)
        arts[prec].require_unchanged("bundle")
        sha[prec] = arts[prec].sha256
        # from here on the bundle's own copy is what every runner reads, not the file outside
        arts[prec] = OnnxArtifact(dst, model=arts[prec].model, manifest=manifests[prec], sha256=sha[prec])
        say(f"folding preprocessing into {dst.name}")
        _add_with_raw(root, dst.name, arts[prec].model, manifests[prec], sha[prec], prec, artifacts, raw_models)

    # reference inputs and outputs for run.py --check, and the embedded variants checked against their sources
    what = "embeddings" if task.is_embedding else "logits"
    say(f"computing reference {what}")
    refs = reference_images(opts, base, root / "reference" / "images", cwd)
    ref_files, ref_source, images = refs.files, refs.source, refs.images
    notes += [f"reference image {printable_name(name)} skipped: {why}" for name, why in refs.skipped]
    np.save(root / "reference" / "inputs.npy", images)
    from PIL import Image

    x = np.stack([to_array(Image.fromarray(a), pp) for a in images])
    ref_logits: dict[str, str] = {}
    ref_tokens: dict[str, str] = {}  # an export with --tokens: reference/patch_tokens.<precision>.npy
    ref_runner: dict[str, str] = {}
    embed_err: dict[str, float] = {}
    logits_of: dict[str, np.ndarray] = {}
    for prec in precisions:
        src = root / ONNX_NAMES[prec]
        runner = _reference_runner(arts[prec], target)
        (logits,) = run_arrays([runner], x)
        require_finite(logits, src.name, what)  # NaN reference outputs would make run.py --check meaningless
        rel = f"reference/{what}.{prec}.npy"
        np.save(root / rel, logits)
        ref_logits[prec] = rel
        tokens = reference_tokens(runner, x) if task.tokens else None
        if tokens is not None:
            require_finite(tokens, src.name)
            ref_tokens[prec] = f"reference/patch_tokens.{prec}.npy"
            np.save(root / ref_tokens[prec], tokens)
        ref_runner[prec] = runner.backend
        logits_of[prec] = logits
        embed_err[prec] = _embed_check(root, src.name, arts[prec], artifacts, images, x,
                                       logits if runner.backend == "onnxruntime" else None)

    # the default is right everywhere: a no-target bundle carries, per TensorRT line, a model that line builds
    say("checking every model against each TensorRT line")
    variants: dict[str, OnnxArtifact] = {}
    matrix = support_matrix(root, arts, sha, target, artifacts, raw_models, images, x, logits_of, notes, variants)
    judged = judge_precisions(judge, logits_of, ref_runner, notes, verdict if "int8" in found else None)

    # DeepStream: float 0–255 NCHW input (nvinfer feeds float tensors); a classifier's softmax probabilities out,
    # an embedding model's tensors as they are (attached as tensor meta: bundle_configs.deepstream_config)
    say("writing the DeepStream config")
    ds_dir = root / "deepstream"
    ds_dir.mkdir()
    ds_onnx = ds_dir / "model.ds.onnx"
    softmax = not task.is_embedding
    ds_out = {"name": "probs", "kind": "probs"} if softmax else {"name": task.output, "kind": task.kind}
    ds = write_variant(arts[default].model, manifests[default], ONNX_NAMES[default], sha[default], ds_onnx,
                       dtype="float32", layout="nchw", softmax=softmax)
    ds_in = ds.manifest.extra["input"]
    artifacts[f"deepstream/{ds_onnx.name}"] = {
        "precision": default, "input": ds_in, "output": ds_out, "sha256": ds.sha256,
        "source": ONNX_NAMES[default],
    }
    # where a TensorRT line builds a variant of the default model, DeepStream gets that variant's form too
    # (build_engine.sh --deepstream builds it into the engine file the config names)
    for fname in sorted({row[default] for row in matrix.values() if row.get(default, ONNX_NAMES[default]) != ONNX_NAMES[default]}):
        v = variants[fname]
        ds_name = f"{fname[: -len('.onnx')]}.ds.onnx"
        dsv = write_variant(v.model, v.manifest, fname, v.sha256, ds_dir / ds_name, dtype="float32", layout="nchw",
                            softmax=softmax)
        lines = [line for line, row in matrix.items() if row.get(default) == fname]
        left = [f for line in lines for f in findings(dsv.model, line)]
        if left:
            (ds_dir / ds_name).unlink()
            notes.append(f"deepstream/{ds_name}: not shipped ({left[0]}); build_engine.sh --deepstream refuses there")
            continue
        artifacts[f"deepstream/{ds_name}"] = {
            "precision": default, "input": ds_in, "output": ds_out, "sha256": dsv.sha256,
            "source": fname, "target": v.manifest.target,
        }
    if not task.is_embedding:
        (ds_dir / "labels.txt").write_text(";".join(lab.replace(";", ",") for lab in base.labels) + "\n")
    (ds_dir / "config_infer_primary.txt").write_text(
        deepstream_config(base, default, opts.opt_batch, ds_onnx.name, "model.ds.engine",
                          outputs=["probs"] if softmax else list(task.outputs))
    )

    # Triton: the raw-pixel variant (clients send uint8 HWC images, 4x less than float32)
    say("writing the Triton model repository")
    tri = root / "triton" / name
    (tri / "1").mkdir(parents=True)
    triton_src = raw_variant_name(ONNX_NAMES[default])
    shutil.copyfile(root / triton_src, tri / "1" / "model.onnx")
    (tri / "config.pbtxt").write_text(triton_config(name, raw_models[ONNX_NAMES[default]], opts.max_batch, opts.opt_batch,
                                                    labels=not task.is_embedding))
    if not task.is_embedding:  # an embedding model has no classes: no labels file anywhere
        (tri / "labels.txt").write_text(labels_file(base.labels))
        (root / "labels.txt").write_text(labels_file(base.labels))
    engines = engine_entries(matrix)
    manifest = base.derive(
        precision=default,
        target=target,
        raw_variant=raw_variant_name(ONNX_NAMES[default]),
        bundle={
            "format": FORMAT,
            "default_precision": default,
            "default_model": raw_variant_name(ONNX_NAMES[default]),
            "precisions": precisions,
            "batch": {"min": opts.min_batch, "opt": opts.opt_batch, "max": opts.max_batch},
            "artifacts": artifacts,
            "tensorrt": {"matrix": matrix, "engines": engines,
                         "why": VARIANTS_WHY if target is None else f"made for {target}"},
            "triton": {"name": name, "model": f"triton/{name}/1/model.onnx", "source": triton_src},
            "deepstream": {"config": "deepstream/config_infer_primary.txt", "onnx": f"deepstream/{ds_onnx.name}"},
            "reference": {
                "inputs": "reference/inputs.npy",
                "images": [f"reference/images/{f.name}" for f in ref_files],
                "source": ref_source,
                what: ref_logits,
                **({"patch_tokens": ref_tokens} if ref_tokens else {}),
                "runner": ref_runner,
                # run.py --check's gates, per precision: a classifier's relative tolerance, an embedding model's cosine
                ("check" if task.is_embedding else "tolerance"): (
                    {p: check_thresholds(judge, p) for p in precisions} if task.is_embedding else CHECK_TOLERANCE),
                **({"judged": judged} if judged else {}),
            },
            # the INT8's one verdict on its budget, on the guard's image set (not on the reference images)
            **({"int8_verdict": verdict.to_dict()} if verdict is not None else {}),
            "notes": notes,
            "created_with": tool_versions("onnx", "onnxruntime", "numpy"),
        },
    )

    if opts.gallery is not None:
        from vitdeploy.stages.bundle_gallery import ship_gallery

        say("packing the gallery")
        manifest.extra["bundle"]["gallery"] = ship_gallery(root, opts.gallery, Path(found[default]), manifests[default],
                                                           sha[default], logits_of)

    values = {
        "NAME": name, "PRECISION": default, "AVAILABLE": " ".join(precisions), "H": h, "W": w,
        "MIN": opts.min_batch, "OPT": opts.opt_batch, "MAX": opts.max_batch, "TRITON_SOURCE": triton_src,
        "CLASSES": base.num_classes, "MATRIX": matrix_case(engines), "TARGET": target or "none",
    }
    labels_line = ", ".join(base.labels[:5]) + (" …" if len(base.labels) > 5 else "")
    readme_task = {"WHAT": f"An embedding model ({task.describe()})" if task.is_embedding
                   else f"A Vision Transformer classifier ({base.num_classes} classes: {labels_line})",
                   "TASK_NOTE": embedding_readme(task) if task.is_embedding else ""}
    write_cpp(root, base, raw_variant_name(ONNX_NAMES[default]))
    shutil.copyfile(TEMPLATES / "run.py", root / "run.py")
    # the engine inspector's parser (stdlib only), so run.py --check prints the engine's precision receipt on the device
    shutil.copyfile(Path(__file__).resolve().parents[1] / "runners" / "tensorrt" / "inspector.py", root / "receipt.py")
    (root / "build_engine.sh").write_text(render("build_engine.sh", values))
    (root / "build_engine.sh").chmod(0o755)
    (root / "run.py").chmod(0o755)
    (root / "README.md").write_text(render("README.md", {**values, **readme_task, "PP": json.dumps(base.preprocess),
                                                          "SUPPORT": support_table(matrix, precisions)}))
    shutil.rmtree(work)
    # last: every file written with its SHA-256, so a later --force replaces exactly these (stages/bundle_replace.py)
    manifest.extra["bundle"]["files"] = written_files(root, {**artifacts, f"triton/{name}/1/model.onnx": artifacts[triton_src]})
    (root / "manifest.json").write_text(manifest.to_json(indent=2) + "\n")
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return BundleResult(root, precisions, default, files, embed_err, ref_source, exported, notes, matrix, ref_runner,
                        skipped=refs.skipped, task=task.describe(), judged=judged, verdict=verdict,
                        default_why=default_why)


def choose_default(asked: str | None, found: dict[str, Path], verdict: Any) -> tuple[str, str]:
    """The precision build_engine.sh, run.py, Triton and DeepStream use, and why when it is not the first of
    int8 > fp16 > fp32. An INT8 whose one verdict (``verdict``, checks/guard.Verdict: the guard's, on its image set)
    is outside its budget is never the default: FP16 is (else FP32), and the reason is said; asked for by
    ``--precision int8``, it is refused (exit 1) before any work. Only an INT8 is missing with nothing else given
    is refused too: the bundle never ships an INT8 outside its budget as its default with exit 0."""
    outside = "int8" in found and verdict is not None and verdict.outside
    if asked is not None:
        if asked not in found:
            raise UsageError(f"--precision {asked}: no {asked} model given (have {', '.join(p for p in PRECISIONS if p in found)})")
        if asked == "int8" and outside:
            raise VitdeployError(
                f"--precision int8: {ONNX_NAMES['int8']} is {verdict.line()}; an INT8 outside its budget is never the "
                "bundle's default: calibrate it again with the guard (vitdeploy calibrate model.onnx --eval DIR keeps "
                "layers in float until it fits), or choose --precision fp16")
        return asked, ""
    if outside:
        rest = [p for p in ("fp16", "fp32") if p in found]
        if not rest:
            raise VitdeployError(f"{ONNX_NAMES['int8']} is {verdict.line()}, and no FP16 or FP32 model is given to be "
                                 "the default in its place: pass model.fp16.onnx or model.onnx too, or calibrate again")
        return rest[0], (f"{rest[0].upper()} is the default, not INT8: {ONNX_NAMES['int8']} is {verdict.line()} "
                         f"(it is packed, and build_engine.sh --precision int8 still builds it)")
    return next(p for p in ("int8", "fp16", "fp32") if p in found), ""


def judge_precisions(judge: EmbeddingJudge | None, outputs: dict[str, np.ndarray], runners: dict[str, str],
                     notes: list[str], verdict: Any = None) -> list[dict[str, Any]]:
    """An embedding model's end-of-run table: each precision's reference embeddings (on the runner run.py --check's
    reference came from: the oracle for a TensorRT target) against FP32's, figures by checks/judge.py. A classifier:
    [] (its table is the top-1 receipt).

    The reference images are not a vote on the budget (one nearest neighbour among 16 images is 6 points): an INT8's
    verdict is ``verdict``, the guard's on its image set (checks/guard.Verdict). A precision without one (FP16, an
    INT8 calibrated without --eval) is held here to its per-image cosine gates only (mean, 1st percentile: what
    run.py --check holds the device to); nearest-neighbour agreement is a figure in its row, never a verdict."""
    if judge is None:
        return []
    if "fp32" not in outputs:
        notes.append("no FP32 model given: the precisions are not judged against FP32 here (pass model.onnx too)")
        return []
    rows: list[dict[str, Any]] = []
    for prec, got in outputs.items():
        c = judge.compare(outputs["fp32"], got)
        budget = judge.budget(prec)
        row: dict[str, Any] = {"artifact": ONNX_NAMES[prec], "precision": prec, "runner": runners[prec],
                               "reference": prec == "fp32", **c.to_dict(), "budget": budget.to_dict()}
        if prec == "fp32":
            row.update(verdict="reference", judged_on="", failures=[])
        elif prec == "int8" and verdict is not None and verdict.status != "unjudged":
            row.update(verdict=verdict.status, judged_on=f"{verdict.images} images of {verdict.eval}",
                       failures=list(verdict.failures))
        else:
            failures = [f for f in budget.failures(c) if not f.startswith("nearest-neighbour")]
            row.update(verdict="outside" if failures else "within", failures=failures,
                       judged_on=f"{c.rows} reference images (cosine)")
            if failures:
                notes.append(f"{ONNX_NAMES[prec]} is outside the {prec} embedding budget on the reference images: "
                             f"{'; '.join(failures)} (make it again with vitdeploy calibrate --min-cosine, or bundle "
                             "--precision fp16)")
        rows.append(row)
    return rows


def embedding_readme(task: Any) -> str:
    """The README's paragraph for an embedding model: what run.py, the C++ example, Triton and DeepStream give."""
    outs = " and ".join(f"`{o}`" for o in task.outputs)
    return (
        f"\n**An embedding model.** Every model here answers {outs} (`embedding` [batch, {task.dim}]"
        + (", `patch_tokens` [batch, patches, width]" if task.tokens else "") + "), not logits, and the bundle has no\n"
        "labels. `python3 run.py IMAGES` prints each image's vector (its first values and L2 norm) and\n"
        "`--out emb.npy` saves them all ([N, D] float32) with their file names in `emb.files.txt`, one a line;\n"
        "`python3 run.py --check` compares the engine with `reference/embeddings.<precision>.npy` by per-image\n"
        "cosine (mean, 1st percentile, minimum) and by each vector's norm against the gates in `manifest.json`\n"
        "(`bundle.reference.check`)"
        + (", and its `patch_tokens` with `reference/patch_tokens.<precision>.npy`, token by token;\n`--out` saves "
           "them too (`emb.patch_tokens.npy`)" if task.tokens else "") + ".\n"
        "`cpp/build/classify ENGINE IMAGES [--out emb.npy]` prints and saves the same. Triton's `config.pbtxt`\n"
        "declares the output tensors with their dims (no `label_filename`); DeepStream's config is `network-type=100`\n"
        "with `output-tensor-meta=1`: nvinfer attaches the tensors to each frame/object as `NvDsInferTensorMeta`.\n"
        "Where this README says logits or labels below, read the vector.\n"
    )


def _add_with_raw(root: Path, fname: str, model: Any, manifest: Manifest, digest: str, prec: str,
                  artifacts: dict[str, dict[str, Any]], raw_models: dict[str, Any]) -> None:
    """Record ``fname`` (already in ``root``) and write its raw-pixel variant beside it."""
    raw = root / raw_variant_name(fname)
    variant = write_variant(model, manifest, fname, digest, raw)
    raw_models[fname] = variant.model
    task = task_of(manifest)
    kind = task.kind if task.is_embedding else "logits"  # the output's kind run.py decides by
    for f, m, m_in, d in ((root / fname, model, None, digest),
                          (raw, variant.model, variant.manifest.extra["input"], variant.sha256)):
        i, outs = _onnx_ios(m)
        o = outs[0]
        artifacts[f.name] = {
            "precision": prec,
            "input": m_in or {"name": i["name"], "dtype": "float16" if i["elem_type"] == 10 else "float32",
                              "layout": "NCHW", "shape": i["dims"], "preprocess_in_graph": False},
            "output": {"name": o["name"], "kind": kind},
            "sha256": d,
        }
        if len(outs) > 1:  # --tokens: patch_tokens beside the embedding (run.py and the C++ example read the first)
            artifacts[f.name]["outputs"] = [{"name": v["name"], "shape": v["dims"]} for v in outs]
        if manifest.target:
            artifacts[f.name]["target"] = manifest.target
    artifacts[fname]["raw_variant"] = raw.name
    artifacts[raw.name]["source"] = fname


def _embed_check(root: Path, fname: str, src: OnnxArtifact | Any, artifacts: dict[str, dict[str, Any]],
                 images: np.ndarray, x: np.ndarray, src_logits: np.ndarray | None) -> float:
    """The raw-pixel variant of ``fname`` against ``fname`` itself, both on ONNX Runtime (one comparison run)."""
    from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

    if src_logits is None:
        (src_logits,) = run_arrays([OnnxRuntimeRunner(src)], x)
    raw = root / artifacts[fname]["raw_variant"]
    man = src.manifest if isinstance(src, OnnxArtifact) else OnnxArtifact(fname, model=src).manifest
    (raw_logits,) = run_arrays([_RawRunner(str(raw), man, raw.name)], raw_batch(images, artifacts[raw.name]["input"]))
    err = _rel(raw_logits, src_logits)
    artifacts[raw.name]["max_rel_diff_vs_source"] = err
    prec = artifacts[fname]["precision"]
    if err > EMBED_TOLERANCE[prec]:
        raise VitdeployError(
            f"{raw.name} disagrees with {fname} on the reference images (max |Δ{artifacts[fname]['output']['kind']}| {err:.2e} relative > "
            f"{EMBED_TOLERANCE[prec]:.0e}); this is a bug, please report it"
        )
    return err


# --- the default is right everywhere: a model per TensorRT line ---------------------------------------------

LINES = ("trt8.5", "trt8.6", "trt10", "trt11")
# Why variants, not a re-make on the device: build_engine.sh must work without vitdeploy (trtexec from JetPack alone),
# and re-making an INT8 graph needs onnx + numpy + vitdeploy there; a variant is checked here, before it ships,
# against the line's own sources (checks.conformance) and against its source's logits on the oracle (what that
# TensorRT computes). A variant is the shipped graph re-written for the line: LayerNorm spelled out for 8.5
# (onnx-tensorrt 8.5-GA operators.md: LayerNormalization "N"), float16 Q/DQ at opset 19 for the strongly typed
# 10/11 (they read float16 DequantizeLinear scales; float32 ones make every quantized GEMM an FP32 island). The INT8
# variant keeps the very scales and excluded layers of the calibrated model, so its ranges are the calibration's.
VARIANTS_WHY = ("one ONNX per TensorRT line, made here and checked against that line's parser facts "
                "(build_engine.sh needs only trtexec on the device)")


def findings(model: Any, line: str) -> list[str]:
    """What ``line``'s parser/builder would refuse or misread in ``model`` (check-target's ONNX checks)."""
    from vitdeploy.checks import conformance as cf

    reps = [cf.check_onnx(model, line), cf.check_int8_intent(model, line)]
    return [f.line() for r in reps for f in r.findings]


def variant_graph(model: Any, precision: str, line: str) -> Any:
    """A copy of ``model`` re-written for TensorRT ``line``: LayerNorm spelled out where the parser has no importer,
    float16 Q/DQ at opset 19 where the build is strongly typed and reads float16 scales."""
    import onnx

    from vitdeploy.core.targets import resolve_target
    from vitdeploy.graph.fp16 import to_fp16
    from vitdeploy.graph.target import FP16_QDQ_OPSET, decompose_layernorm, has_layernorm_op, to_opset

    facts = resolve_target(line)
    assert facts is not None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    if not facts.layernorm_op and has_layernorm_op(m):
        decompose_layernorm(m)
    if precision == "int8" and facts.fp16_dq_scales:
        m = to_fp16(to_opset(m, FP16_QDQ_OPSET))
    return m


def support_matrix(root: Path, arts: dict[str, OnnxArtifact], sha: dict[str, str], target: str | None,
                   artifacts: dict[str, dict[str, Any]], raw_models: dict[str, Any], images: np.ndarray,
                   x: np.ndarray, logits_of: dict[str, np.ndarray], notes: list[str],
                   written_out: dict[str, OnnxArtifact] | None = None) -> dict[str, dict[str, str]]:
    """TensorRT line -> precision -> the file build_engine.sh builds there (each variant written is also put in
    ``written_out`` by name). A bundle made for a target serves that
    line only; a no-target bundle serves every line, with a variant where the shipped model does not conform."""
    from vitdeploy.runners.oracle.runner import runner_for_target

    if target is not None:
        return {target: {p: ONNX_NAMES[p] for p in arts}} if target in LINES else {}
    judge = judge_for(next(iter(arts.values())).manifest)
    matrix: dict[str, dict[str, str]] = {line: {} for line in LINES}
    for prec, art in arts.items():
        made: dict[str, Any] = {ONNX_NAMES[prec]: art.model}
        for line in LINES:
            hit = next((n for n, m in made.items() if not findings(m, line)), None)
            if hit is None:
                fname = f"{ONNX_NAMES[prec][: -len('.onnx')]}.{line}.onnx"
                model = variant_graph(art.model, prec, line)
                left = findings(model, line) or _invalid(model)
                if left:
                    notes.append(f"{line}: no {prec} model it builds as intended ({left[0]}); build_engine.sh refuses "
                                 f"{prec} there")
                    continue
                vman = art.manifest.derive(target=line, source={"artifact": ONNX_NAMES[prec], "sha256": sha[prec],
                                                               "kind": "onnx"})
                written = OnnxArtifact.write(model, vman, root / fname)
                if written_out is not None:
                    written_out[fname] = written
                _add_with_raw(root, fname, written.model, vman, written.sha256, prec, artifacts, raw_models)
                artifacts[fname]["variant_of"] = ONNX_NAMES[prec]
                (got,) = run_arrays([runner_for_target(written.model, line)], x)
                require_finite(got, fname, "logits" if judge is None else "embeddings")
                if judge is None:
                    c = compare(logits_of[prec], got)
                    artifacts[fname]["vs_source"] = {"runner": f"oracle ({line})", "agreement": c.agreement,
                                                     "max_rel_diff": c.max_rel_diff}
                else:
                    ec = judge.compare(logits_of[prec], got)
                    artifacts[fname]["vs_source"] = {"runner": f"oracle ({line})", **ec.to_dict()}
                why = below_check(judge, prec, logits_of[prec], got)
                if why:
                    notes.append(f"{fname}: {why} ({ONNX_NAMES[prec]}'s)")
                try:
                    _embed_check(root, fname, written, artifacts, images, x, None)
                except VitdeployError as e:
                    if "this is a bug" in str(e):
                        raise
                    notes.append(f"{fname}: raw-pixel variant not compared here ({e})")
                made[fname] = written.model
                hit = fname
            matrix[line][prec] = hit
    return matrix


def _invalid(model: Any) -> list[str]:
    """The ONNX checker's complaint (full check: types and shapes inferred strictly) about a variant, else []."""
    import onnx

    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as e:  # the checker raises several types; any of them means: do not ship it
        return [f"the rewritten graph is invalid: {str(e).splitlines()[0][:160]}"]
    return []


def engine_entries(matrix: dict[str, dict[str, str]]) -> dict[str, dict[str, dict[str, str]]]:
    """TensorRT line -> shipped model (``model.int8.raw.onnx``, ``model.int8.onnx``, ...) -> the ONNX that line builds
    for it and the engine file it writes: manifest.json's ``bundle.tensorrt.engines``, the ONE entry build_engine.sh
    (its table is rendered from it) and run.py (which reads it) both take the engine's name from."""
    out: dict[str, dict[str, dict[str, str]]] = {}
    for line, row in matrix.items():
        out[line] = {}
        for prec, fname in row.items():
            for shipped, built in ((raw_variant_name(ONNX_NAMES[prec]), raw_variant_name(fname)), (ONNX_NAMES[prec], fname)):
                out[line][shipped] = {"onnx": built, "engine": f"{built[: -len('.onnx')]}.engine", "precision": prec}
    return out


def matrix_case(engines: dict[str, dict[str, dict[str, str]]]) -> str:
    """build_engine.sh's table, rendered from manifest.json's ``engines`` entry: one ``line:precision) echo RAW_ONNX
    RAW_ENGINE ONNX ENGINE ;;`` arm per entry (bash 3 has no maps)."""
    arms = []
    for line, row in engines.items():
        for prec in PRECISIONS:
            raw, plain = row.get(raw_variant_name(ONNX_NAMES[prec])), row.get(ONNX_NAMES[prec])
            if raw and plain:
                arms.append(f"    {line}:{prec}) echo {raw['onnx']} {raw['engine']} {plain['onnx']} {plain['engine']} ;;")
    return "\n".join(arms) if arms else "    none) ;;"


def support_table(matrix: dict[str, dict[str, str]], precisions: Sequence[str]) -> str:
    """The README's support matrix: which file each TensorRT line builds, per precision."""
    head = "| TensorRT | " + " | ".join(precisions) + " |\n|---|" + "---|" * len(precisions) + "\n"
    names = {"trt8.5": "8.5 (JetPack 5.1)", "trt8.6": "8.6 (JetPack 6.0)", "trt10": "9.x/10.x (JetPack 6.1+, 7.x)",
             "trt11": "11.x"}
    rows = [f"| {names.get(line, line)} | " + " | ".join(row.get(p, "—") for p in precisions) + " |"
            for line, row in matrix.items()]
    return head + "\n".join(rows) if rows else "(made for a CPU target: no TensorRT line)"
