"""INT8 (explicit Q/DQ) and FP16 ONNX artifacts from an FP32 export, with the accuracy guard.

``calibrate`` and ``convert_fp16`` take an ONNX model and return the artifact
they wrote. The precision is decided here, in the graph, so the same file runs
in ONNX Runtime on any CPU (where its accuracy is measured) and builds as a
strongly typed TensorRT network on 8.5 … 11 (see quantize.py for the placement).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.defaults import DEFAULT_METHOD, DEFAULT_QUANTIZE_ATTENTION, SPREAD_LIMIT
from vitdeploy.core.errors import OpsetTooNew, UsageError, VitdeployError
from vitdeploy.core.fileio import write_text_atomic
from vitdeploy.core.manifest import Manifest, tool_versions
from vitdeploy.core.naming import calib_cache_name, precision_name
from vitdeploy.core.preprocess import list_images
from vitdeploy.core.targets import ALIASES, CPU_TARGETS, TargetFacts, resolve_target
from vitdeploy.model.imageset import ImageSet

if TYPE_CHECKING:
    from vitdeploy.checks.guard import Criterion

FEW_IMAGES = 100
QUANTIZERS = ("vitdeploy", "nncf")  # who places the Q/DQ: ours (the default), or NNCF's (a CPU target)
FLOAT_TYPES = ("fp32", "fp16")
DEFAULT_IMAGES = Path("calibration")
CACHE_FORMAT = "vitdeploy-calibration/1"
CALIB_BATCH = 32  # images per calibration pass (calibrate's --batch-size default): at least one batch is needed
CALIB_IMAGES = 512  # images sampled for calibration (calibrate's --num-images default)

Progress = Callable[[str, dict[str, Any]], None]


@dataclass
class CalibrationResult:
    path: Path
    manifest: Manifest
    excluded: list[str]
    figures: dict[str, Any]  # FP32 vs INT8 on --eval (empty without it)
    quantized: list[str]  # layers (node names) carrying Q/DQ
    cache: Path
    cache_reused: bool
    images: int
    skipped: list[tuple[str, str]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    artifact: OnnxArtifact | None = None  # the artifact written, for a caller that goes on with it (build-engine)
    image_set: ImageSet | None = None  # the calibration images (decoded arrays kept: a later check decodes nothing)


def as_artifact(model_onnx: str | Path | OnnxArtifact) -> OnnxArtifact:
    """The artifact a caller passed, or the one opened for a path (read once either way)."""
    return model_onnx if isinstance(model_onnx, OnnxArtifact) else OnnxArtifact.open(model_onnx)


def _load(art: OnnxArtifact) -> tuple[Any, Manifest]:
    """The artifact's graph with its weights in memory (the precision step changes it in place) and its manifest."""
    model = art.load_weights()
    manifest = art.manifest
    if (manifest.extra.get("input") or {}).get("preprocess_in_graph"):  # written by `export --embed-preprocess`
        raise VitdeployError(
            f"{art.path} has the preprocessing folded into its graph: convert or calibrate the normal export (model.onnx), "
            "then fold the preprocessing into the result"
        )
    return model, manifest


def _save(model: Any, manifest: Manifest, out: Path, src: OnnxArtifact, what: str) -> OnnxArtifact:
    """Write the result, after checking that its source was not replaced since it was read: the manifest's source
    SHA-256 is of the bytes converted (OnnxArtifact hashes them as it reads them), and a source that changed during
    the run is one line with nothing written (core/loaded.py)."""
    src.require_unchanged(what)
    return OnnxArtifact.write(model, manifest, out)


def _source(art: OnnxArtifact) -> dict[str, Any]:
    return art.source_record()


def default_output_made_from(dest: Path, src: Path, command: str) -> None:
    """Refuse (exit 1, before any work) when the file at a command's default output (model.int8.onnx beside
    model.onnx) is not made from ``src``, the command's input: made from another model, or its recorded source
    missing or unrecorded. A stale one (made from an earlier ``src``) is re-made as before; ``-o`` naming the file is
    the explicit way to replace it."""
    from vitdeploy.core.lineage import require_descends

    require_descends(dest, src, command, remake=f"vitdeploy {command} {src} -o {dest}")


# --- FP16 -------------------------------------------------------------------------------------


def convert_fp16(model_onnx: str | Path | OnnxArtifact = "model.onnx", out: str | Path | None = None,
                 target: str | None = None, images: str | Path | None = None, keep_unsafe: bool = True) -> Path:
    """Float16 weights and activations, float32 input/output, LayerNorm/Softmax/reductions kept in float32.

    ``target``: what the artifact is made for (default: the source's target, else none: the graph TensorRT 8.6,
    10, 11 and ONNX Runtime read). For ``trt8.5`` LayerNorm is spelled out in primitive ops (kept in float32).
    """
    return fp16_artifact(model_onnx, out, target, images, keep_unsafe).path


def fp16_artifact(model_onnx: str | Path | OnnxArtifact = "model.onnx", out: str | Path | None = None,
                  target: str | None = None, images: str | Path | ImageSet | None = None,
                  keep_unsafe: bool = True) -> OnnxArtifact:
    """convert_fp16, returning the artifact written (for a caller that goes on with it: build-engine).

    An ``OnnxArtifact`` passed in is not read again; its graph may be changed in place."""
    from vitdeploy.graph.fp16 import FP32_OPS, fp32_islands, to_fp16
    from vitdeploy.graph.quantize import is_fp16, is_quantized

    art = as_artifact(model_onnx)
    src = art.path
    check_target(target)
    model, manifest = _load(art)
    if manifest.precision == "fp16" or is_fp16(model):
        raise VitdeployError(f"{src} is already FP16: convert the FP32 model (e.g. model.onnx)")
    if manifest.precision == "int8" or is_quantized(model):
        raise VitdeployError(f"{src} is an INT8 (Q/DQ) model: convert the FP32 model, or calibrate with --float fp16")
    target = target or manifest.target
    facts = check_target(target)
    dest = Path(out) if out is not None else precision_name(src, "fp16")
    if out is None:  # the name beside: never another model's FP16 replaced without a word (core/lineage.py)
        default_output_made_from(dest, src, "convert-fp16")
    _fit_graph(model, facts, src)
    unsafe, record = fp16_headroom(model, manifest, images, src, keep_unsafe)
    m16 = to_fp16(model, keep_fp32_nodes=unsafe)
    derived = manifest.derive(
        precision="fp16",
        target=target,
        source=_source(art),
        float_type="fp16",
        fp16={"fp32_ops": sorted(set(FP32_OPS) & {n.op_type for n in m16.graph.node}), "fp32_nodes": len(fp32_islands(m16))},
        versions=tool_versions("onnx", "onnxruntime"),
    )
    if record is not None:
        derived.extra["numerics"] = record
    return _save(m16, derived, dest, art, "convert-fp16")


NUMERICS_IMAGES = 256  # images the FP16 headroom is measured on


def fp16_headroom(model: Any, manifest: Manifest, images: str | Path | ImageSet | None, src: Path,
                  keep_unsafe: bool = True) -> tuple[list[str], dict[str, Any] | None]:
    """The nodes an FP16 graph must keep in float32 because their tensors come within 2x of 65504 on these images
    (checks.numerics, on the images the one rule picks), and the manifest's record of it; ([], None) without images.
    ``keep_unsafe`` False (the user forbade float32 islands): such a tensor is refused in one line instead."""
    from vitdeploy.checks.numerics import fp16_unsafe_nodes, measure

    chosen = images if isinstance(images, ImageSet) else ImageSet.for_model(manifest, images, NUMERICS_IMAGES, seed=0)
    if chosen is None:
        return [], None
    report = measure(model, manifest, chosen, name=str(src))
    over = [t for t in report.tensors if "fp16_overflow" in t.flags]
    unsafe = fp16_unsafe_nodes(report, model)  # what makes or reads a tensor past float16's range
    if over and not keep_unsafe:
        worst = min(over, key=lambda t: t.fp16_headroom or 0.0)
        raise VitdeployError(
            f"{src}: {len(over)} tensor(s) would overflow float16 on {chosen.source} (e.g. {worst.tensor}, {worst.role}: "
            f"max |x| {worst.max_abs:.4g}, headroom {worst.fp16_headroom or 0:.3g}) and float32 islands were "
            "forbidden: allow them, or see `vitdeploy numerics`")
    return unsafe, {"images": report.images, "source": chosen.source, "kept_fp32_nodes": unsafe,
                    "overflow": [{"tensor": t.tensor, "role": t.role, "max_abs": float(t.max_abs)} for t in over]}


def check_target(target: str | None) -> TargetFacts | None:
    """The target's facts (None for none); an unknown target is a usage error that lists the valid ones.

    A JetPack or module name resolves to its TensorRT line (core/devices.py); callers record ``facts.name``."""
    return resolve_target(target)


def _fit_graph(model: Any, facts: TargetFacts | None, src: Path) -> None:
    """What the target's parser needs of the FP32 graph, in place: LayerNorm spelled out where it has no importer,
    an opset within its limit."""
    from vitdeploy.graph.edit import opset
    from vitdeploy.graph.target import decompose_layernorm

    if facts is None:
        return
    if facts.max_opset is not None and opset(model) > facts.max_opset:
        raise OpsetTooNew(f"{src} is ONNX opset {opset(model)}; {facts.name}'s parser reads opsets up to "
                             f"{facts.max_opset}: re-export it with `vitdeploy export --target {facts.name}`")
    if not facts.layernorm_op:
        decompose_layernorm(model)


# --- INT8 -------------------------------------------------------------------------------------


def check_quantizer_target(quantizer: str, target: str | None) -> str | None:
    """The target an INT8 by ``quantizer`` is made for (NNCF's: a CPU's, ``cpu`` when none is given), or a usage
    error: an unknown quantizer, or NNCF's INT8 for a TensorRT target. `bundle` asks it before any work too."""
    if quantizer not in QUANTIZERS:
        raise UsageError(f"--quantizer {quantizer!r}: choose {' or '.join(QUANTIZERS)}")
    if quantizer != "nncf":
        return target
    if target is None:
        return "cpu"
    if ALIASES.get(target, target) not in CPU_TARGETS:
        raise UsageError(f"--quantizer nncf makes an INT8 for a CPU, not for {target}: use -t cpu or -t openvino, "
                         "or drop --quantizer for TensorRT")
    return target


def check_calibration_count(n: int, source: object, batch_size: int = CALIB_BATCH,
                            num_images: int | None = None) -> None:
    """At least one batch of calibration images, else one line whose advice can help: more images in the folder
    (raising --num-images helps only while it is below the batch; `bundle` has neither option, ``num_images`` None)."""
    if n >= batch_size:
        return
    if num_images is not None and num_images < batch_size:
        advice = f"raise --num-images to {batch_size} or more, or pass a smaller --batch-size"
    elif num_images is not None:
        advice = f"add images to {source} ({batch_size} or more), or pass a smaller --batch-size"
    else:
        advice = f"add images to {source}: {batch_size} at least, a few hundred like the deployment's for stable ranges"
    raise VitdeployError(f"{n} calibration image(s) from {source}, fewer than one batch ({batch_size}): {advice}")


def _sample_images(images: str | Path | None, num_images: int, seed: int, manifest: Manifest,
                   warnings: list[str]) -> ImageSet:
    """The calibration images: a seeded sample of ``num_images`` from the folder. Without a folder (None, or the
    default calibration/ where there is none) the one rule (ImageSet.for_model) picks: the digits for a digits
    model, said in a warning; else the folder is asked for."""
    if num_images < 1:
        raise UsageError("--num-images must be at least 1")
    root = Path(images) if images is not None else DEFAULT_IMAGES
    if not root.exists() and root == DEFAULT_IMAGES:
        chosen = ImageSet.for_model(manifest, None, num_images, seed)
        if chosen is not None:
            warnings.append(f"no {root}/ folder here: calibrating on {chosen.source} (the images the model was trained "
                            "on); pass --images DIR with images like the deployment's")
            return chosen
    if not root.exists():
        raise VitdeployError(
            f"{root}: no such folder of calibration images: put a few hundred images like the deployment's in it "
            "(or pass --images DIR)"
        )
    if not list_images(root):
        raise VitdeployError(f"{root} holds no image files: add a few hundred images like the deployment's")
    return ImageSet.folder(root, num_images, seed)


def _images_key(files: ImageSet) -> str:
    h = hashlib.sha256()
    for i, f in enumerate(files.items):
        if not isinstance(f, Path):  # in memory (the embedded digits): named by their place in the set
            h.update(f"{files.name_of(i)}\n".encode())
            continue
        st = f.stat()
        # a name's own bytes (surrogateescape: b'bad\xff.png' is a legal Linux name, not UTF-8)
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _cache_key(model_sha: str, files: ImageSet, tensors: list[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "model": model_sha, "images": _images_key(files), "tensors": tensors}).encode())
    return h.hexdigest()[:32]


def _read_cache(path: Path, key: str, tensors: list[str], method: str,
                warnings: list[str]) -> tuple[dict[str, dict[str, float]], int] | None:
    """The ranges and image count of a cache written for exactly this key, validated as any input read back: every
    tensor present with a finite, positive range for ``method``, and a positive image count. None: calibrate again
    (a missing cache or one of another key silently, as a stale one; a damaged one said in ``warnings``)."""
    try:
        d = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, RecursionError) as e:
        warnings.append(f"{path.name}: not a readable calibration cache ({type(e).__name__}): calibrated again")
        return None
    if not isinstance(d, dict):
        warnings.append(f"{path.name}: not a calibration cache (a JSON {type(d).__name__}): calibrated again")
        return None
    if d.get("format") != CACHE_FORMAT or d.get("key") != key:
        return None
    why = _cache_defect(d, tensors, method)
    if why is not None:
        warnings.append(f"{path.name}: {why}: calibrated again")
        return None
    return {t: {m: float(v) for m, v in d["ranges"][t].items()} for t in tensors}, int(d["calibrated_images"])


def _cache_defect(d: dict[str, Any], tensors: list[str], method: str) -> str | None:
    """What makes a calibration cache of the right key unusable (None: nothing)."""
    ranges, n = d.get("ranges"), d.get("calibrated_images")
    if not isinstance(ranges, dict):
        return "its 'ranges' is not an object of tensor ranges"
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        return f"'calibrated_images' is {n!r}, not a whole number of at least 1"
    for t in tensors:
        r = ranges.get(t)
        if not isinstance(r, dict):
            return f"no range for tensor {t!r}"
        if method not in r:
            return f"tensor {t!r} has no {method!r} range"
        for m, v in r.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v > 0):
                return f"tensor {t!r} has {m} range {v!r}, not a finite positive number"
    return None


def _read_batches(files: ImageSet, manifest: Manifest, batch_size: int, progress: Progress | None,
                  skipped: list[tuple[str, str]]) -> Iterator[np.ndarray]:
    """The calibration images as preprocessed batches, each counted in ``progress`` once the caller is done with it;
    the unreadable ones appended to ``skipped`` as (path, why)."""
    done = 0
    for b in files.batches(manifest.pp(), batch_size):
        skipped += [(str(p), why) for p, why in b.skipped]
        done += len(b.paths) + len(b.skipped)
        if len(b.paths):
            yield b.array
        if progress:
            progress("calibrate", {"done": done, "total": len(files)})


def _none_read(files: ImageSet, skipped: list[tuple[str, str]]) -> VitdeployError:
    return VitdeployError(f"none of the {len(files)} calibration images could be read (e.g. {skipped[0][0]}: {skipped[0][1]})")


def _collect_ranges(
    model: Any,
    tensors: list[str],
    files: ImageSet,
    manifest: Manifest,
    batch_size: int,
    progress: Progress | None,
) -> tuple[dict[str, dict[str, float]], int, list[tuple[str, str]]]:
    from vitdeploy.graph.quantize import RangeCollector, with_outputs
    from vitdeploy.runners.onnxruntime import session

    sess = session(with_outputs(model, tensors))
    name = sess.get_inputs()[0].name
    rc = RangeCollector(tensors)
    skipped: list[tuple[str, str]] = []
    for x in _read_batches(files, manifest, batch_size, progress, skipped):
        outs = sess.run(tensors, {name: x})
        rc.add(dict(zip(tensors, outs, strict=True)), len(x))
    if rc.images == 0:
        raise _none_read(files, skipped)
    if rc.images < batch_size:
        raise VitdeployError(
            f"only {rc.images} readable calibration image(s), fewer than one batch ({batch_size}): "
            "add images or pass a smaller --batch-size"
        )
    return rc.thresholds(), rc.images, skipped


def _check_options(
    method: str, float_type: str, batch_size: int, max_drop: float | None, min_agreement: float | None,
    eval_dir: str | Path | None, min_cosine: float | None = None,
) -> None:
    """Option values calibrate refuses before reading anything (exit 1, as before)."""
    from vitdeploy.graph.quantize import METHODS

    if method not in METHODS:
        raise UsageError(f"unknown calibration method {method!r}: choose one of {', '.join(METHODS)}")
    if float_type not in FLOAT_TYPES:
        raise UsageError(f"--float must be fp32 or fp16, not {float_type!r}")
    if batch_size < 1:
        raise UsageError("--batch-size must be at least 1")
    if (max_drop is not None or min_agreement is not None or min_cosine is not None) and eval_dir is None:
        raise UsageError("--max-drop/--min-agreement/--min-cosine need --eval DIR (images to measure INT8 against FP32 on)")
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise UsageError(f"--min-agreement is a fraction from 0 to 1, not {min_agreement}")
    from vitdeploy.core.limits import check_range

    check_range("--min-cosine", min_cosine, "fraction")  # the range --help shows: [0.0<=x<=1.0]


def _fp32_source(art: OnnxArtifact) -> tuple[Any, Manifest]:
    """The FP32 model to calibrate and its manifest; a quantized, FP16 or pre-13 opset model is refused."""
    from vitdeploy.graph.edit import opset
    from vitdeploy.graph.quantize import is_fp16, is_quantized

    src = art.path
    model, manifest = _load(art)
    if manifest.precision == "int8" or is_quantized(model):
        raise VitdeployError(f"{src} is already quantized (INT8 Q/DQ): calibrate the FP32 model (e.g. model.onnx)")
    if manifest.precision == "fp16" or is_fp16(model):
        raise VitdeployError(f"{src} is an FP16 model: calibrate the FP32 model; pass --float fp16 for FP16 around the INT8 layers")
    if opset(model) < 13:
        raise VitdeployError(f"{src} has opset {opset(model)}: per-channel Q/DQ needs opset 13 or newer; re-export it")
    return model, manifest


def site_channel_max(model: Any, batches: Iterable[np.ndarray]) -> dict[str, np.ndarray]:
    """Per-channel max |x| of every smoothing site's LayerNorm output (graph.smooth) over the batches, FP32 on ONNX
    Runtime (the one session loader)."""
    from vitdeploy.graph.quantize import with_outputs
    from vitdeploy.graph.smooth import channel_max, sites
    from vitdeploy.runners.onnxruntime import session

    names = [x.output for x in sites(model)]
    if not names:
        return {}
    sess = session(with_outputs(model, names))
    inp = sess.get_inputs()[0].name
    return channel_max(dict(zip(names, sess.run(names, {inp: x}), strict=True)) for x in batches)


def _smooth(model: Any, manifest: Manifest, files: ImageSet, batch_size: int,
            smooth: str | float) -> tuple[Any, dict[str, Any] | None]:
    """SmoothQuant-style migration (graph.smooth) before the ranges are taken: "auto" applies it at strength 0.5 where
    a LayerNorm output feeding the quantized GEMMs has an inter-channel spread over the INT8 limit numerics flags
    (core.defaults.SPREAD_LIMIT, 16: per-tensor INT8 would leave its median channel under 8 levels); a number is the
    strength, always applied; "off" never. Exact in FP32 (initializers only), and the Q/DQ placed afterwards fuse as
    before. Returns the model and the manifest's record (None: no LayerNorm it can edit, or off)."""
    from vitdeploy.graph.smooth import DEFAULT_ALPHA, sites
    from vitdeploy.graph.smooth import smooth as migrate

    if smooth == "off":
        return model, None
    try:
        alpha = DEFAULT_ALPHA if smooth == "auto" else float(smooth)
    except ValueError:
        alpha = -1.0
    if not 0.0 <= alpha <= 1.0:
        raise UsageError(f"--smooth {smooth}: a strength from 0 to 1, auto or off")
    found = sites(model)
    if not found:
        return model, None
    cmax = site_channel_max(model, (b.array for b in files.batches(manifest.pp(), batch_size) if len(b.paths)))
    if not cmax:
        return model, None
    spread = max(float(a.max() / max(float(np.median(a)), 1e-12)) for a in cmax.values())
    record: dict[str, Any] = {"mode": str(smooth), "max_spread": round(spread, 3), "spread_limit": SPREAD_LIMIT}
    if smooth == "auto" and spread <= SPREAD_LIMIT:
        return model, {**record, "applied": False}
    res = migrate(model, cmax, alpha)
    return res.model, {**record, "applied": True, **res.to_dict()}


STRENGTHS = (0.5, 0.25, 0.75, 0.0)  # the smoothing strengths the guard tries, SmoothQuant's default first


def _layers(model: Any, target: str | None, quantize_attention: bool, src: Path) -> tuple[list[Any], list[Any]]:
    """Every MatMul/Conv layer of the graph, and those to quantize for ``target`` (a CPU target also quantizes the
    attention scores, as NNCF's transformer scheme does)."""
    from vitdeploy.graph.quantize import cpu_layers, find_layers

    all_layers = find_layers(model)
    layers = [la for la in all_layers if quantize_attention or la.kind != "attention"]
    if target in CPU_TARGETS:
        layers = cpu_layers(model, all_layers, quantize_attention)
    if not layers:
        raise VitdeployError(f"{src}: no MatMul/Conv layers to quantize were found; is it a ViT exported by vitdeploy?")
    return all_layers, layers


def _choose_strength(fp32: Any, manifest: Manifest, files: ImageSet, batch_size: int, facts: TargetFacts | None,
                     src: Path, target: str | None, quantize_attention: bool, method: str, ev: Any, backend: str,
                     record: dict[str, Any], progress: Progress | None, crit: Criterion) -> tuple[Any, dict[str, Any]]:
    """The smoothing strength the guard picks: every one in STRENGTHS calibrated on ``files`` and measured on the
    eval set, on the guard's runner (the oracle for a TensorRT target); the best by the task's criterion wins (a
    classifier: top-1 agreement with FP32, then the smaller drop; an embedding model: nearest-neighbour agreement,
    then 1st-percentile and mean cosine). Returns the FP32 model smoothed at that strength and the manifest's record
    of the choice."""
    import copy

    from vitdeploy.checks.guard import logits, runner_factory
    from vitdeploy.graph.quantize import ensure_node_names, insert_qdq, tensors_to_calibrate
    from vitdeploy.graph.smooth import smooth as migrate

    cmax = site_channel_max(fp32, (b.array for b in files.batches(manifest.pp(), batch_size) if len(b.paths)))
    ref = logits(fp32, ev.x)
    _require_finite_fp32(ref, manifest, ev.root, src)
    factory = runner_factory(backend, manifest, target)
    tried: dict[str, Any] = {}
    best: tuple[tuple[float, ...], float, Any] | None = None
    for i, alpha in enumerate(STRENGTHS):
        if progress:
            progress("strength", {"done": i, "total": len(STRENGTHS), "layer": f"smoothing strength {alpha}"})
        smoothed = migrate(fp32, cmax, alpha).model
        m = copy.deepcopy(smoothed)
        _fit_graph(m, facts, src)
        ensure_node_names(m)
        all_layers, layers = _layers(m, target, quantize_attention, src)
        ranges = _collect_ranges(m, tensors_to_calibrate(all_layers), files, manifest, batch_size, None)[0]
        q = insert_qdq(m, layers, {t: r[method] for t, r in ranges.items()})
        f = crit.figures(ref, logits(q, ev.x, factory=factory), ev)
        d = f.to_dict()
        tried[str(alpha)] = {k: d[k] for k in ("agreement", "drop_points", "cosine_mean", "cosine_p1", "nn_agreement")
                             if k in d}
        key = crit.rank(f)
        if best is None or key > best[0]:
            best = (key, alpha, smoothed)
    assert best is not None
    _, alpha, chosen = best
    res = migrate(fp32, cmax, alpha)
    return chosen, {**record, **res.to_dict(), "chosen_by": f"the guard on {backend}", "tried": tried}


def _require_finite_fp32(ref: Any, manifest: Manifest, eval_dir: str | Path, src: Path | None = None) -> None:
    """The guard judges INT8 against the FP32 model's outputs: where those are NaN or Inf, no budget can be met or
    missed, and loosening it (what a missed budget advises) cannot help (issue 40). One line naming the cause."""
    from vitdeploy.checks.metrics import finite_rows
    from vitdeploy.core.errors import NonFiniteOutput
    from vitdeploy.core.task import task_of

    bad = ~finite_rows(ref)
    if bad.any():
        values = "embeddings" if task_of(manifest).is_embedding else "logits"
        who = f"{src} (the FP32 model)" if src is not None else "the FP32 model"
        raise NonFiniteOutput(f"{who} gives NaN or Inf {values} on {int(bad.sum())} of {len(bad)} --eval images "
                              f"({eval_dir}), so no INT8 can be judged against it and no budget helps; nothing "
                              "written: fix the FP32 model first (re-export it from its checkpoint)")


def _budget_missed(crit: Criterion, after: Any, excluded: int) -> VitdeployError:
    from vitdeploy.core.errors import BudgetMissed

    return BudgetMissed(f"{crit.missed(after, excluded, 'INT8')}; nothing written: loosen the budget or use FP16")


def _write_cache(cpath: Path, key: str, model_sha: str, files: list[str], n_read: int, ranges: dict[str, Any]) -> None:
    cache = {
        "format": CACHE_FORMAT,
        "key": key,
        "model_sha256": model_sha,
        "images": [str(f) for f in files],
        "calibrated_images": n_read,
        "ranges": ranges,
    }
    write_text_atomic(cpath, json.dumps(cache, indent=1))


def _fresh_ranges(
    model: Any, tensors: list[str], files: ImageSet, manifest: Manifest, batch_size: int, images: str | Path,
    progress: Progress | None, num_images: int | None = None,
) -> tuple[dict[str, dict[str, float]], int, list[tuple[str, str]]]:
    """Ranges from a calibration pass (no valid cache): at least one batch of images is needed."""
    check_calibration_count(len(files), images, batch_size, num_images)
    return _collect_ranges(model, tensors, files, manifest, batch_size, progress)


def _quantization_record(
    method: str, quantize_attention: bool, float_type: str, opset: int, n_read: int, cpath: Path, key: str, seed: int,
    layers_quantized: int, excluded: list[str],
) -> dict[str, Any]:
    """The manifest's ``quantization`` entry: how the INT8 model was made."""
    return {
        "method": method,
        "quantize_attention": quantize_attention,
        "float_type": float_type,
        "scheme": "int8 symmetric Q/DQ; weights per output channel, activations per tensor",
        "opset": opset,
        "calibration_images": n_read,
        "calibration_cache": cpath.name,
        "calibration_key": key,
        "seed": seed,
        "layers_quantized": layers_quantized,
        "excluded": excluded,
    }


def _quantize(
    model: Any, manifest: Manifest, layers: list[Any], amax: dict[str, float], eval_dir: str | Path | None,
    crit: Criterion, progress: Progress | None, backend: str = "onnxruntime",
    target: str | None = None, ev: Any = None, written: Callable[[Any, list[str]], Any] | None = None,
) -> tuple[Any, list[str], dict[str, Any], dict[str, Any] | None, Any]:
    """The Q/DQ model, the layers kept in float, the guard's figures and record (None without --eval), and
    (eval set, FP32 logits) to measure the written model on (None without --eval).

    With ``eval_dir`` the guard measures it and keeps layers in float until the budget fits;
    a budget it cannot meet raises (nothing is written).
    """
    from vitdeploy.graph.quantize import SwitchableQDQ, insert_qdq

    if eval_dir is None:
        return insert_qdq(model, layers, amax), [], {}, None, None
    return _guarded(SwitchableQDQ(model, layers, amax), model, manifest, eval_dir, crit, progress, backend, target, ev,
                    written)


def _guarded(
    switch: Any, model: Any, manifest: Manifest, eval_dir: str | Path, crit: Criterion, progress: Progress | None,
    backend: str, target: str | None, ev: Any, written: Callable[[Any, list[str]], Any] | None = None,
) -> tuple[Any, list[str], dict[str, Any], dict[str, Any] | None, Any]:
    """The guard over an INT8 graph whose layers ``switch`` turns back to float (ours or NNCF's), judged against the
    FP32 ``model`` on ``backend`` by the task's criterion (checks/guard.criterion_for); as ``_quantize`` returns."""
    from vitdeploy.checks.guard import guard, load_eval_set, logits, runner_factory

    if progress:
        progress("evaluate", {})
    ev = ev if ev is not None else load_eval_set(eval_dir, manifest)
    ref = logits(model, ev.x)
    _require_finite_fp32(ref, manifest, eval_dir)
    factory = runner_factory(backend, manifest, target)
    qmodel, g = guard(switch, ev, ref, None, progress, factory=factory, criterion=crit, written=written)
    info = g.to_dict()
    info["eval"] = str(Path(eval_dir))
    info["backend"] = backend
    if not g.met:
        raise _budget_missed(crit, g.after, len(g.excluded))
    return qmodel, g.excluded, g.after.to_dict(), info, (ev, ref)


def calibrate(
    model_onnx: str | Path | OnnxArtifact = "model.onnx",
    images: str | Path | None = "calibration",
    out: str | Path | None = None,
    num_images: int = CALIB_IMAGES,
    batch_size: int = CALIB_BATCH,
    method: str = DEFAULT_METHOD,
    quantize_attention: bool = DEFAULT_QUANTIZE_ATTENTION,
    float_type: str | None = None,
    seed: int = 0,
    max_drop: float | None = None,
    eval_dir: str | Path | None = None,
    progress: Progress | None = None,
    min_agreement: float | None = None,
    target: str | None = None,
    backend: str = "auto",
    smooth: str | float = "auto",
    quantizer: str = "vitdeploy",
    min_cosine: float | None = None,
) -> CalibrationResult:
    """Quantize an FP32 ONNX model to explicit int8 Q/DQ from calibration images; optionally guard its accuracy.

    ``float_type``: the type of everything left unquantized (fp32 for ONNX Runtime
    on a CPU, fp16 for a TensorRT build); None, the default, takes the target's (fp16 for a TensorRT target,
    fp32 for ``ort`` and for no target). With ``eval_dir`` the INT8 model's top-1
    is measured against the FP32 model's; with ``max_drop`` too, the layers that
    cost most are kept in float until the drop fits (and, with ``min_agreement``, the
    top-1 agreement with FP32 reaches that fraction). Raises VitdeployError (exit 1)
    when it cannot, after writing nothing. ``target`` "ort" (a CPU: ONNX Runtime or OpenVINO) also quantizes
    the attention scores (Q·Kᵀ), as NNCF's transformer scheme does (quantize.cpu_layers); None keeps the
    TensorRT placement. ``target`` (default: the source's) is what the artifact is made for: for ``trt10`` and
    ``trt11`` (strongly typed builds that read float16 DequantizeLinear scales) the model goes to opset 19 and the
    Q/DQ pairs, their scales and the quantized GEMMs are float16, so no Cast sits next to a quantized GEMM; for
    ``trt8.5`` LayerNorm is spelled out in primitive ops. ``backend``: where the guard evaluates the INT8 model ("auto": the TensorRT oracle for a TensorRT target,
    ONNX Runtime otherwise; or onnxruntime, openvino, oracle) (onnxruntime or
    openvino: where it will run). An ``OnnxArtifact`` passed as ``model_onnx`` (build-engine's) is not read again;
    its graph may be changed in place.

    ``quantizer``: who places the Q/DQ. "vitdeploy" (the default): ours (graph.quantize; for a CPU target the CPU
    placement above; ``smooth`` is its SmoothQuant). "nncf" (also ``method="nncf"``, as a manifest records it): NNCF's transformer scheme on the ONNX
    graph (graph.nncf_ptq), for a CPU target only (``cpu`` when none is given), with NNCF's own SmoothQuant:
    ``smooth`` other than "auto" (the default) is refused (exit 2) rather than ignored. Measured in docs/cpu-backends.md: as
    fast on OpenVINO here and less accurate unguarded, hence not the default. The guard, manifest and lineage are the
    same for both.

    The guard judges by the model's task (checks/guard.criterion_for, checks/judge.py). For an embedding model
    ``eval_dir`` is any folder of images (an ImageFolder also gives the kNN top-1), and ``min_cosine`` (the mean
    per-image cosine to FP32, e.g. 0.99) puts the INT8 embedding budget in force: that mean, a 1st percentile of
    0.97 and nearest-neighbour agreement of 0.97 (``min_agreement`` replaces it); ``max_drop`` is then the kNN top-1
    drop in points and needs a labeled folder. ``min_cosine`` on a classifier, or ``max_drop`` on an embedding model
    without labels, is refused in one line (exit 2) before anything is read.
    """
    from vitdeploy.checks.guard import criterion_for
    from vitdeploy.graph.edit import opset
    from vitdeploy.graph.fp16 import to_fp16
    from vitdeploy.graph.quantize import ensure_node_names, tensors_to_calibrate

    check_quantizer_target(quantizer, None)
    if method == "nncf":
        quantizer = "nncf"
    if quantizer == "nncf" and str(smooth) != "auto":  # issue 37, P11: it was ignored without a word
        raise UsageError(f"--smooth {smooth} is our quantizer's: NNCF's transformer scheme applies its own SmoothQuant "
                         "at its tuned strength; drop --smooth, or use --quantizer vitdeploy")
    _check_options(DEFAULT_METHOD if quantizer == "nncf" else method, float_type or "fp32", batch_size, max_drop,
                   min_agreement, eval_dir, min_cosine)
    check_target(target)
    if backend not in ("auto", "onnxruntime", "openvino", "oracle"):
        raise UsageError(f"the guard evaluates on auto, onnxruntime, openvino or oracle, not {backend!r}")
    if backend == "openvino":
        from vitdeploy.runners.openvino.loader import import_openvino

        import_openvino()  # one line saying how to install it
    art = as_artifact(model_onnx)
    src = art.path
    model, manifest = _fp32_source(art)
    crit = criterion_for(manifest, max_drop, min_agreement, min_cosine, eval_dir)  # before any image is read
    target = target or manifest.target
    facts = check_target(target)
    target = ALIASES.get(target, target) if target is not None else None  # ort: the cpu target's old name
    made_for = check_quantizer_target(quantizer, target)
    if made_for != target:  # NNCF's INT8 is a CPU's
        target, facts = made_for, check_target(made_for)
    if backend == "auto":  # a TensorRT target is judged on what TensorRT computes (the oracle), a CPU where it runs
        backend = ("oracle" if target is not None and target not in CPU_TARGETS
                   else "openvino" if target == "openvino" else "onnxruntime")
        if backend == "openvino":
            from vitdeploy.runners.openvino.loader import import_openvino

            import_openvino()
    if float_type is None:
        float_type = "fp16" if facts is not None and facts.float_dtype_int8 == "float16" else "fp32"
    if facts is not None and facts.fp16_dq_scales and float_type != "fp16":
        raise UsageError(f"--target {target} builds strongly typed: its INT8 keeps the unquantized parts in float16 "
                         "(float32 would run every layer in FP32); drop --float fp32, or use --target ort for a CPU")
    dest = Path(out) if out is not None else precision_name(src, "int8")
    if out is None:  # the name beside: never another model's INT8 replaced without a word (core/lineage.py)
        default_output_made_from(dest, src, "calibrate")
    warnings: list[str] = []
    if quantizer == "nncf":
        from vitdeploy.graph.nncf_ptq import import_nncf

        import_nncf()  # one line saying how to install it, before any image is read
        if float_type != "fp32":
            raise UsageError("--float fp16 with NNCF's CPU INT8: its unquantized parts are float32 (a CPU's type); "
                             "drop --float, or make the INT8 for a TensorRT target")
        files = _sample_images(images, num_images, seed, manifest, warnings)
        return _calibrate_nncf(art, model, manifest, files, dest, target, batch_size, seed, eval_dir, crit, backend,
                               progress, warnings)
    files = _sample_images(images, num_images, seed, manifest, warnings)
    fp32 = model
    model, smoothing = _smooth(model, manifest, files, batch_size, smooth)  # before LayerNorm is spelled out
    ev = None
    if eval_dir is not None and smooth == "auto" and smoothing and smoothing.get("applied"):
        # the guard chooses the strength: each candidate calibrated and measured on --eval, the best agreement kept
        from vitdeploy.checks.guard import load_eval_set

        ev = load_eval_set(eval_dir, manifest)
        model, smoothing = _choose_strength(fp32, manifest, files, batch_size, facts, src, target, quantize_attention,
                                            method, ev, backend, smoothing, progress, crit)
    _fit_graph(model, facts, src)
    ensure_node_names(model)
    all_layers, layers = _layers(model, target, quantize_attention, src)

    tensors = tensors_to_calibrate(all_layers)
    model_sha = art.sha256
    key = _cache_key(model_sha, files, tensors + [f"smoothing={smoothing}"])
    unsafe, headroom = fp16_headroom(model, manifest, files, src) if float_type == "fp16" else ([], None)
    cpath = calib_cache_name(dest)
    cached = _read_cache(cpath, key, tensors, method, warnings)
    reused = cached is not None
    ranges, n_read, skipped = cached + ([],) if cached else _fresh_ranges(
        model, tensors, files, manifest, batch_size, files.source, progress, num_images)
    if n_read < FEW_IMAGES:
        warnings.append(f"only {n_read} calibration images: 500 or more give stable ranges (fewer than {FEW_IMAGES} may not)")
    amax = {t: r[method] for t, r in ranges.items()}

    def as_written(q: Any, excluded: Iterable[str] = ()) -> Any:
        """The INT8 graph ``q`` (``excluded`` layers in float) as it is written for the target: the graph the guard
        judges, so what it measured is what the file holds (a float16 form can miss a budget its float32 form met:
        an embedding model's nearest neighbours move with float16 rounding alone)."""
        if float_type == "fp16" and facts is not None and facts.fp16_dq_scales:
            # TensorRT 10/11 read float16 scales (opset 19): Q/DQ, scales and the quantized GEMMs are all float16, so
            # a strongly typed build runs them in int8/float16 with no Cast island around any GEMM
            from vitdeploy.graph.target import FP16_QDQ_OPSET, to_opset

            return to_fp16(to_opset(q, FP16_QDQ_OPSET), keep_fp32_nodes=unsafe)
        if float_type == "fp16":
            # the quantized layers stay float32 so each DequantizeLinear feeds its MatMul/Conv directly (TensorRT fuses
            # that pair into an int8 kernel); Casts go before the QuantizeLinear and after the layer
            out = set(excluded)
            return to_fp16(q, keep_fp32_nodes=[la.node for la in layers if la.node not in out] + unsafe)
        return q

    qmodel, excluded, figs, guard_info, _ = _quantize(model, manifest, layers, amax, eval_dir, crit, progress,
                                                      backend, target, ev,
                                                      as_written if float_type == "fp16" else None)
    quantized = [la.node for la in layers if la.node not in set(excluded)]
    qmodel = as_written(qmodel, excluded)
    if guard_info is not None and float_type == "fp16":
        guard_info["written"] = figs  # the guard measured the float16 graph written (kept for older readers)
    quant = _quantization_record(method, quantize_attention, float_type, opset(qmodel), n_read, cpath, key, seed,
                                 len(quantized), excluded)
    quant["quantizer"] = "vitdeploy"
    if target in CPU_TARGETS:
        quant["attention_scores"] = True
    quant["smoothing"] = smoothing
    quant["scales"] = "float16" if float_type == "fp16" and facts is not None and facts.fp16_dq_scales else "float32"
    derived = manifest.derive(precision="int8", target=target, source=_source(art), float_type=float_type,
                              quantization=quant, versions=tool_versions("onnx", "onnxruntime"))
    if guard_info is not None:
        derived.extra["guard"] = guard_info
    if headroom is not None:
        derived.extra["numerics"] = headroom
    art.require_unchanged("calibrate")  # before the cache too: nothing written for a source that changed
    if not reused:
        _write_cache(cpath, key, model_sha, [files.name_of(i) for i in range(len(files))], n_read, ranges)
    try:
        written = _save(qmodel, derived, dest, art, "calibrate")
    except BaseException:
        if not reused:  # a failed write (a full disk) leaves no calibration cache without its model
            cpath.unlink(missing_ok=True)
        raise
    return CalibrationResult(
        path=dest,
        manifest=derived,
        excluded=excluded,
        figures=figs,
        quantized=quantized,
        cache=cpath,
        cache_reused=reused,
        images=n_read,
        skipped=skipped,
        warnings=warnings,
        artifact=written,
        image_set=files,
    )



def _calibrate_nncf(art: OnnxArtifact, model: Any, manifest: Manifest, files: ImageSet, dest: Path,
                    target: str | None, batch_size: int, seed: int, eval_dir: str | Path | None,
                    crit: Criterion, backend: str, progress: Progress | None,
                    warnings: list[str]) -> CalibrationResult:
    """The CPU INT8 made by NNCF (graph.nncf_ptq) with our guard, manifest and lineage on top.

    The guard reverts NNCF's layers to float (quantize.QuantizedGraphSwitch) rather than quantizing again with an
    ignored scope: one NNCF pass, and each probe is what the written model computes. The calibration record (the
    images, no ranges: NNCF keeps its own) lets `bundle` make it again."""
    from vitdeploy.graph.edit import opset
    from vitdeploy.graph.nncf_ptq import nncf_quantize, nncf_version
    from vitdeploy.graph.quantize import QuantizedGraphSwitch

    skipped: list[tuple[str, str]] = []
    batches = list(_read_batches(files, manifest, batch_size, progress, skipped))
    n_read = sum(len(b) for b in batches)
    if n_read == 0:
        raise _none_read(files, skipped)
    if n_read < FEW_IMAGES:
        warnings.append(f"only {n_read} calibration images: 300 or more give NNCF stable ranges (fewer than {FEW_IMAGES} may not)")
    fp32 = model
    qnncf = nncf_quantize(fp32, batches)
    switch = QuantizedGraphSwitch(qnncf, fp32)
    excluded: list[str] = []
    figs: dict[str, Any] = {}
    guard_info: dict[str, Any] | None = None
    if eval_dir is None:
        qmodel = switch.final([])
    else:
        qmodel, excluded, figs, guard_info, _ = _guarded(switch, fp32, manifest, eval_dir, crit, progress, backend,
                                                         target, None)
    quantized = [la.node for la in switch.layers if la.node not in set(excluded)]
    cpath = calib_cache_name(dest)
    quant = {
        "quantizer": "nncf",
        "nncf": nncf_version(),
        "method": "nncf",
        "model_type": "transformer",
        "quantize_attention": False,
        "attention_scores": any(la.kind == "attention" for la in switch.layers if la.node in set(quantized)),
        "float_type": "fp32",
        "scheme": "NNCF's transformer scheme: SmoothQuant, int8 weights per output channel, activations per tensor "
                  "(u8 with a zero point where NNCF chooses), Q·Kᵀ quantized, first layer's weights in 7 bits",
        "opset": opset(qmodel),
        "calibration_images": n_read,
        "calibration_cache": cpath.name,
        "seed": seed,
        "layers_quantized": len(quantized),
        "excluded": excluded,
        "scales": "float32",
    }
    derived = manifest.derive(precision="int8", target=target, source=_source(art), float_type="fp32",
                              quantization=quant, versions=tool_versions("onnx", "onnxruntime", "nncf"))
    if guard_info is not None:
        derived.extra["guard"] = guard_info
    key = _cache_key(art.sha256, files, ["nncf", str(nncf_version())])
    _write_cache(cpath, key, art.sha256, [files.name_of(i) for i in range(len(files))], n_read, {})
    try:
        written = _save(qmodel, derived, dest, art, "calibrate")
    except BaseException:
        cpath.unlink(missing_ok=True)
        raise
    return CalibrationResult(path=dest, manifest=derived, excluded=excluded, figures=figs, quantized=quantized,
                             cache=cpath, cache_reused=False, images=n_read, skipped=skipped, warnings=warnings,
                             artifact=written, image_set=files)
