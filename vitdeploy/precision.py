"""INT8 (explicit Q/DQ) and FP16 ONNX artifacts from an FP32 export, with the accuracy guard.

``calibrate`` and ``convert_fp16`` take an ONNX model and return the artifact
they wrote. The precision is decided here, in the graph, so the same file runs
in ONNX Runtime on any CPU (where its accuracy is measured) and builds as a
strongly typed TensorRT network on 8.5 … 11 (see quantize.py for the placement).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.errors import VitdeployError
from vitdeploy.fileio import atomic_path, sha256_file, write_text_atomic
from vitdeploy.manifest import Manifest, manifest_from_onnx, set_onnx_manifest, tool_versions

# Defaults chosen by measurement on the digits model (see README "calibrate"):
DEFAULT_METHOD = "entropy"
DEFAULT_QUANTIZE_ATTENTION = False
FEW_IMAGES = 100
FLOAT_TYPES = ("fp32", "fp16")
CACHE_FORMAT = "vitdeploy-calibration/1"

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


def default_out(model_onnx: str | Path, precision: str) -> Path:
    """model.onnx → model.int8.onnx / model.fp16.onnx (beside the input)."""
    p = Path(model_onnx)
    stem = p.name[: -len(".onnx")] if p.name.endswith(".onnx") else p.stem
    for tag in (".fp32", ".fp16", ".int8"):
        if stem.endswith(tag):
            stem = stem[: -len(tag)]
    return p.with_name(f"{stem}.{precision}.onnx")


def cache_path(out: str | Path) -> Path:
    """The calibration cache beside the INT8 model: model.int8.onnx → model.int8.calib.json."""
    o = Path(out)
    return o.with_name(o.name[: -len(".onnx")] + ".calib.json" if o.name.endswith(".onnx") else o.name + ".calib.json")


def _load(model_onnx: str | Path) -> tuple[Any, Manifest]:
    import onnx

    p = Path(model_onnx)
    if not p.is_file():
        raise VitdeployError(f"{p}: no such ONNX model; export one with `vitdeploy export`")
    try:
        model = onnx.load(str(p))
    except Exception as e:
        raise VitdeployError(f"{p}: not a readable ONNX model ({type(e).__name__}); re-export it") from None
    manifest = manifest_from_onnx(model, p)
    if (manifest.extra.get("input") or {}).get("preprocess_in_graph"):  # written by `export --embed-preprocess`
        raise VitdeployError(
            f"{p} has the preprocessing folded into its graph: convert or calibrate the normal export (model.onnx), "
            "then fold the preprocessing into the result"
        )
    return model, manifest


def _save(model: Any, manifest: Manifest, out: Path) -> None:
    import onnx

    set_onnx_manifest(model, manifest)
    with atomic_path(out) as tmp:
        onnx.save(model, str(tmp))


def _source(path: Path, sha256: str | None = None) -> dict[str, Any]:
    return {"artifact": path.name, "sha256": sha256 or sha256_file(path)}


# --- FP16 -------------------------------------------------------------------------------------


def convert_fp16(model_onnx: str | Path = "model.onnx", out: str | Path | None = None) -> Path:
    """Float16 weights and activations, float32 input/output, LayerNorm/Softmax/reductions kept in float32."""
    from vitdeploy.fp16 import FP32_OPS, fp32_islands, to_fp16
    from vitdeploy.quantize import is_fp16, is_quantized

    src = Path(model_onnx)
    model, manifest = _load(src)
    if manifest.precision == "fp16" or is_fp16(model):
        raise VitdeployError(f"{src} is already FP16: convert the FP32 model (e.g. model.onnx)")
    if manifest.precision == "int8" or is_quantized(model):
        raise VitdeployError(f"{src} is an INT8 (Q/DQ) model: convert the FP32 model, or calibrate with --float fp16")
    dest = Path(out) if out is not None else default_out(src, "fp16")
    m16 = to_fp16(model)
    derived = manifest.derive(
        precision="fp16",
        source=_source(src),
        float_type="fp16",
        fp16={"fp32_ops": sorted(set(FP32_OPS) & {n.op_type for n in m16.graph.node}), "fp32_nodes": len(fp32_islands(m16))},
        versions=tool_versions("onnx", "onnxruntime"),
    )
    _save(m16, derived, dest)
    return dest


# --- INT8 -------------------------------------------------------------------------------------


def _sample_images(images: str | Path, num_images: int, seed: int) -> list[Path]:
    from vitdeploy.preprocess import list_images

    root = Path(images)
    if not root.exists():
        raise VitdeployError(
            f"{root}: no such folder of calibration images: put a few hundred images like the deployment's in it "
            "(or pass --images DIR)"
        )
    files = list_images(root)
    if not files:
        raise VitdeployError(f"{root} holds no image files: add a few hundred images like the deployment's")
    if num_images < 1:
        raise VitdeployError("--num-images must be at least 1")
    if len(files) > num_images:
        rng = np.random.default_rng(seed)
        pick = np.sort(rng.choice(len(files), num_images, replace=False))
        files = [files[i] for i in pick]
    return files


def _images_key(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        st = f.stat()
        h.update(f"{f.resolve()}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def _cache_key(model_sha: str, files: list[Path], tensors: list[str]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "model": model_sha, "images": _images_key(files), "tensors": tensors}).encode())
    return h.hexdigest()[:32]


def _read_cache(path: Path, key: str) -> tuple[dict[str, dict[str, float]], int] | None:
    """The ranges and image count of a cache written for exactly this key (else None: calibrate again)."""
    try:
        d = json.loads(path.read_text())
        if d.get("format") != CACHE_FORMAT or d.get("key") != key:
            return None
        ranges = {k: {m: float(v) for m, v in r.items()} for k, r in d["ranges"].items()}
        return ranges, int(d["calibrated_images"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _collect_ranges(
    model: Any,
    tensors: list[str],
    files: list[Path],
    manifest: Manifest,
    batch_size: int,
    progress: Progress | None,
) -> tuple[dict[str, dict[str, float]], int, list[tuple[str, str]]]:
    from vitdeploy.guard import session
    from vitdeploy.images import iter_batches
    from vitdeploy.quantize import RangeCollector, with_outputs

    sess = session(with_outputs(model, tensors))
    name = sess.get_inputs()[0].name
    rc = RangeCollector(tensors)
    skipped: list[tuple[str, str]] = []
    done = 0
    for b in iter_batches(files, manifest.pp(), batch_size):
        skipped += [(str(p), why) for p, why in b.skipped]
        if len(b.paths):
            outs = sess.run(tensors, {name: b.array})
            rc.add(dict(zip(tensors, outs, strict=True)), len(b.paths))
        done += len(b.paths) + len(b.skipped)
        if progress:
            progress("calibrate", {"done": done, "total": len(files)})
    if rc.images == 0:
        raise VitdeployError(f"none of the {len(files)} calibration images could be read (e.g. {skipped[0][0]}: {skipped[0][1]})")
    if rc.images < batch_size:
        raise VitdeployError(
            f"only {rc.images} readable calibration image(s), fewer than one batch ({batch_size}): "
            "add images or pass a smaller --batch-size"
        )
    return rc.thresholds(), rc.images, skipped


def calibrate(
    model_onnx: str | Path = "model.onnx",
    images: str | Path = "calibration",
    out: str | Path | None = None,
    num_images: int = 512,
    batch_size: int = 32,
    method: str = DEFAULT_METHOD,
    quantize_attention: bool = DEFAULT_QUANTIZE_ATTENTION,
    float_type: str = "fp32",
    seed: int = 0,
    max_drop: float | None = None,
    eval_dir: str | Path | None = None,
    progress: Progress | None = None,
    min_agreement: float | None = None,
) -> CalibrationResult:
    """Quantize an FP32 ONNX model to explicit int8 Q/DQ from calibration images; optionally guard its accuracy.

    ``float_type``: the type of everything left unquantized (fp32 for ONNX Runtime
    on a CPU, fp16 for a TensorRT build). With ``eval_dir`` the INT8 model's top-1
    is measured against the FP32 model's; with ``max_drop`` too, the layers that
    cost most are kept in float until the drop fits (and, with ``min_agreement``, the
    top-1 agreement with FP32 reaches that fraction). Raises VitdeployError (exit 1)
    when it cannot, after writing nothing.
    """
    from vitdeploy.fp16 import opset_of, to_fp16
    from vitdeploy.quantize import (
        METHODS,
        ensure_node_names,
        find_layers,
        insert_qdq,
        is_fp16,
        is_quantized,
        tensors_to_calibrate,
    )

    if method not in METHODS:
        raise VitdeployError(f"unknown calibration method {method!r}: choose one of {', '.join(METHODS)}")
    if float_type not in FLOAT_TYPES:
        raise VitdeployError(f"--float must be fp32 or fp16, not {float_type!r}")
    if batch_size < 1:
        raise VitdeployError("--batch-size must be at least 1")
    if (max_drop is not None or min_agreement is not None) and eval_dir is None:
        raise VitdeployError("--max-drop/--min-agreement need --eval DIR (labeled images to measure the drop on)")
    if min_agreement is not None and not 0.0 <= min_agreement <= 1.0:
        raise VitdeployError(f"--min-agreement is a fraction from 0 to 1, not {min_agreement}")
    src = Path(model_onnx)
    model, manifest = _load(src)
    if manifest.precision == "int8" or is_quantized(model):
        raise VitdeployError(f"{src} is already quantized (INT8 Q/DQ): calibrate the FP32 model (e.g. model.onnx)")
    if manifest.precision == "fp16" or is_fp16(model):
        raise VitdeployError(f"{src} is an FP16 model: calibrate the FP32 model; pass --float fp16 for FP16 around the INT8 layers")
    if opset_of(model) < 13:
        raise VitdeployError(f"{src} has opset {opset_of(model)}: per-channel Q/DQ needs opset 13 or newer; re-export it")
    dest = Path(out) if out is not None else default_out(src, "int8")
    ensure_node_names(model)
    all_layers = find_layers(model)
    layers = [la for la in all_layers if quantize_attention or la.kind != "attention"]
    if not layers:
        raise VitdeployError(f"{src}: no MatMul/Conv layers to quantize were found; is it a ViT exported by vitdeploy?")

    files = _sample_images(images, num_images, seed)
    warnings: list[str] = []
    tensors = tensors_to_calibrate(all_layers)
    model_sha = sha256_file(src)
    key = _cache_key(model_sha, files, tensors)
    cpath = cache_path(dest)
    cached = _read_cache(cpath, key)
    reused = cached is not None
    skipped: list[tuple[str, str]] = []
    if cached is None:
        if len(files) < batch_size:
            raise VitdeployError(
                f"{images} has {len(files)} image(s), fewer than one batch ({batch_size}): "
                "add images or pass a smaller --batch-size"
            )
        ranges, n_read, skipped = _collect_ranges(model, tensors, files, manifest, batch_size, progress)
    else:
        ranges, n_read = cached
    if n_read < FEW_IMAGES:
        warnings.append(f"only {n_read} calibration images: 500 or more give stable ranges (fewer than {FEW_IMAGES} may not)")
    amax = {t: r[method] for t, r in ranges.items()}

    def build(excluded: list[str]) -> Any:
        keep = [la for la in layers if la.node not in set(excluded)]
        return insert_qdq(model, keep, amax)

    guard_info: dict[str, Any] | None = None
    excluded: list[str] = []
    figs: dict[str, Any] = {}
    met = True
    if eval_dir is not None:
        from vitdeploy.guard import guard, load_eval_set, logits

        if progress:
            progress("evaluate", {})
        ev = load_eval_set(eval_dir, manifest)
        ref = logits(model, ev.x)
        qmodel, g = guard(build, [la.node for la in layers], ev, ref, max_drop, progress, min_agreement)
        excluded, met = g.excluded, g.met
        figs = g.after.to_dict()
        guard_info = g.to_dict()
        guard_info["eval"] = str(Path(eval_dir))
    else:
        qmodel = build([])
    if not met:
        assert guard_info is not None  # the guard is the only way to miss the budget
        a = guard_info["after"]
        want = " and ".join(
            ([f"--max-drop {max_drop}"] if max_drop is not None else [])
            + ([f"--min-agreement {min_agreement}"] if min_agreement is not None else [])
        )
        raise VitdeployError(
            f"INT8 top-1 drop {a.get('drop_points')} points, agreement {a.get('agreement')}: exceeds {want} even with "
            f"all {len(excluded)} quantized layers kept in float; nothing written: loosen the budget or use FP16"
        )
    quantized = [la.node for la in layers if la.node not in set(excluded)]
    if float_type == "fp16":
        # the quantized layers stay float32 so each DequantizeLinear feeds its MatMul/Conv directly (TensorRT fuses
        # that pair into an int8 kernel); Casts go before the QuantizeLinear and after the layer
        qmodel = to_fp16(qmodel, keep_fp32_nodes=quantized)
    quant = {
        "method": method,
        "quantize_attention": quantize_attention,
        "float_type": float_type,
        "scheme": "int8 symmetric Q/DQ; weights per output channel, activations per tensor",
        "opset": opset_of(qmodel),
        "calibration_images": n_read,
        "calibration_cache": cpath.name,
        "calibration_key": key,
        "seed": seed,
        "layers_quantized": len(quantized),
        "excluded": excluded,
    }
    derived = manifest.derive(
        precision="int8",
        source=_source(src, model_sha),
        float_type=float_type,
        quantization=quant,
        versions=tool_versions("onnx", "onnxruntime"),
    )
    if guard_info is not None:
        derived.extra["guard"] = guard_info
    if not reused:
        cache = {
            "format": CACHE_FORMAT,
            "key": key,
            "model_sha256": model_sha,
            "images": [str(f) for f in files],
            "calibrated_images": n_read,
            "ranges": ranges,
        }
        write_text_atomic(cpath, json.dumps(cache, indent=1))
    _save(qmodel, derived, dest)
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
    )

