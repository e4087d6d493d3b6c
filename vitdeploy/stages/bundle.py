"""A self-contained folder that carries a model to a Jetson, a Triton server or a DeepStream pipeline.

Engines are tied to the TensorRT version and GPU that built them, so what
travels is the ONNX (FP32, FP16, INT8 Q/DQ) with its raw-pixel variants, the
labels, a torch-free ``run.py``, ``build_engine.sh`` (vitdeploy where it is
installed, else trtexec from JetPack), a Triton model repository, a DeepStream
nvinfer config and reference logits that ``run.py --check`` compares the
device's engine against.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.checks.metrics import compare
from vitdeploy.core.artifact import manifest_from_onnx
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import TMP_TAG, temp_dir_beside
from vitdeploy.core.manifest import ENGINE_SUFFIXES, Manifest, tool_versions
from vitdeploy.core.preprocess import list_images, resized_uint8, to_array
from vitdeploy.graph.embed import raw_batch, raw_variant_name, write_variant

FORMAT = "vitdeploy-bundle/1"
PRECISIONS = ("fp32", "fp16", "int8")
ONNX_NAMES = {"fp32": "model.onnx", "fp16": "model.fp16.onnx", "int8": "model.int8.onnx"}
# run.py --check passes when max|Δlogit| ≤ tol · max|reference logit| (TensorRT FP32 may use TF32)
CHECK_TOLERANCE = {"fp32": 1e-2, "fp16": 3e-2, "int8": 1e-1}
# the raw-pixel variant must equal its source on ONNX Runtime here (issue: ≤ 1e-4 relative for FP32)
MAX_REFERENCES = 1000  # reference images run.py --check compares: enough for any check, bounded in size and time
EMBED_TOLERANCE = {"fp32": 1e-4, "fp16": 2e-3, "int8": 1e-4}
DS_NETWORK_MODE = {"fp32": 0, "int8": 1, "fp16": 2}
DS_SCALING_FILTER = {"nearest": 0, "bilinear": 1, "bicubic": 2}
TEMPLATES = Path(__file__).with_name("bundle_files")
ONNX_TO_TRITON = {1: "TYPE_FP32", 10: "TYPE_FP16", 2: "TYPE_UINT8", 3: "TYPE_INT8", 7: "TYPE_INT64", 6: "TYPE_INT32"}


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


@dataclass
class BundleResult:
    out: Path
    precisions: list[str]
    default_precision: str
    files: list[str]
    embed_errors: dict[str, float] = field(default_factory=dict)
    reference_source: str = ""
    exported: bool = False


def triton_name(name: str) -> str:
    s = re.sub(r"[^A-Za-z0-9_.-]+", "_", name).strip("._-")
    return s or "vit"


def _onnx_io(model: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """Input and output of an onnx.ModelProto (or of the ONNX file at a path)."""
    import onnx

    g = (onnx.load(str(model), load_external_data=False) if isinstance(model, (str, Path)) else model).graph
    inits = {i.name for i in g.initializer}
    (inp,) = [i for i in g.input if i.name not in inits]
    out = g.output[0]

    def desc(v: Any) -> dict[str, Any]:
        dims = [d.dim_param or (d.dim_value if d.HasField("dim_value") else "?") for d in v.type.tensor_type.shape.dim]
        return {"name": v.name, "elem_type": v.type.tensor_type.elem_type, "dims": dims}

    return desc(inp), desc(out)


def resolve_models(
    models: Sequence[str | Path], workdir: Path, cwd: Path | None = None
) -> tuple[dict[str, Path], dict[str, Any], bool]:
    """{precision: ONNX path}, {precision: the model, loaded once}; a checkpoint is exported into ``workdir``
    first. True when something was exported."""
    import onnx

    cwd = cwd or Path.cwd()
    paths = [Path(m) for m in models]
    if not paths:
        paths = [cwd / n for n in ONNX_NAMES.values() if (cwd / n).exists()]
        if not paths and (cwd / "ckpt.pth").exists():
            paths = [cwd / "ckpt.pth"]
        if not paths:
            raise UsageError("nothing to bundle here: pass ONNX files or a checkpoint, or run `vitdeploy export` first")
    found: dict[str, Path] = {}
    loaded: dict[str, Any] = {}
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
        try:
            model = onnx.load(str(p))
        except Exception as e:
            raise VitdeployError(f"{p}: not a readable ONNX model ({type(e).__name__}); re-export it") from None
        m = manifest_from_onnx(model, p)
        if m.extra.get("input", {}).get("preprocess_in_graph"):
            raise UsageError(f"{p}: a raw-pixel variant; pass the normal export, the bundle makes the variant")
        if m.precision not in PRECISIONS:
            raise VitdeployError(f"{p}: unknown precision {m.precision!r} in its manifest")
        if m.precision in found:
            raise UsageError(f"two {m.precision} models given ({found[m.precision]} and {p}); pass one per precision")
        found[m.precision] = p
        loaded[m.precision] = model
    return found, loaded, exported


def _export(ckpt: Path, workdir: Path) -> Path:
    try:
        from vitdeploy.stages.export import export_onnx  # type: ignore[import-not-found]
    except ImportError:
        raise VitdeployError(f"{ckpt}: exporting a checkpoint needs vitdeploy's export; export it first and pass the ONNX") from None
    out = workdir / f"export-{ckpt.stem}.onnx"
    export_onnx(ckpt, out)
    return out


def check_same_model(manifests: dict[str, Manifest]) -> None:
    items = list(manifests.items())
    p0, m0 = items[0]
    for p, m in items[1:]:
        for what in ("model", "labels", "preprocess"):
            if getattr(m, what) != getattr(m0, what):
                raise VitdeployError(f"the {p0} and {p} models differ in their {what}: bundle artifacts of one model")


def check_target(target: str | None, manifests: dict[Path, Manifest]) -> str | None:
    """The bundle's target: ``target`` when every model was made for it (else one line naming the model, its
    target and the command that re-makes it); without ``target``, the models' own, which must agree."""
    from vitdeploy.core.targets import resolve_target
    from vitdeploy.stages.engine import remake_command

    facts = resolve_target(target)  # a TensorRT line, ort, or a JetPack/module: the line it stands for
    if facts is not None:
        target = facts.name
        for path, m in manifests.items():
            if m.target != target:
                made_for = m.target or "no target (the default)"
                raise VitdeployError(f"{path} was made for {made_for}, the bundle is for {target}: re-make it with "
                                     f"`{remake_command(path, m, target)}`")
        return target
    found = {m.target for m in manifests.values()}
    if len(found) > 1:
        raise VitdeployError("the models were made for different targets ("
                             + ", ".join(f"{p.name}: {m.target or 'none'}" for p, m in manifests.items())
                             + "): re-make them for one with --target")
    return found.pop() if found else None


def reference_images(opts: BundleOptions, manifest: Manifest, folder: Path, cwd: Path) -> tuple[list[Path], str]:
    """Images for run.py --check, copied into reference/images: the given ones, calibration/, or seeded noise."""
    cand: list[Path] = []
    source = ""
    if opts.check_images:
        cand, source = list_images(*opts.check_images), "--check-images"
        if not cand:
            raise UsageError(f"no images in {', '.join(map(str, opts.check_images))}")
    elif (cwd / "calibration").is_dir() and list_images(cwd / "calibration"):
        cand, source = list_images(cwd / "calibration"), "calibration/"
    folder.mkdir(parents=True, exist_ok=True)
    out: list[Path] = []
    if cand:
        n = min(opts.references, len(cand))
        pick = [cand[int(i * len(cand) / n)] for i in range(n)]
        for i, src in enumerate(pick):
            dst = folder / f"{i:03d}_{src.name}"
            shutil.copyfile(src, dst)
            out.append(dst)
        return out, source
    from PIL import Image

    h, w = manifest.input_size
    rng = np.random.default_rng(0)
    for i in range(opts.references):
        dst = folder / f"{i:03d}_noise.png"
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(dst)
        out.append(dst)
    return out, "seeded noise (no --check-images and no calibration/ folder)"


def _ort_session(path: Path) -> Any:
    import onnxruntime as ort

    from vitdeploy.runners.onnxruntime import session_options

    return ort.InferenceSession(str(path), session_options(), providers=["CPUExecutionProvider"])


def _run(path: Path, x: np.ndarray) -> np.ndarray:
    s = _ort_session(path)
    inp = s.get_inputs()[0]
    if inp.type == "tensor(float16)":
        x = x.astype(np.float16)
    return np.asarray(s.run(None, {inp.name: x})[0], np.float32)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    """max |a − b| relative to the largest |b| (b the reference)."""
    return compare(b, a).max_rel_diff


def _copy_hashed(src: Path, dst: Path, chunk: int = 1 << 20) -> str:
    """Copy a file and return the SHA-256 of the bytes copied: one read serves both."""
    import hashlib

    h = hashlib.sha256()
    with open(src, "rb") as fi, open(dst, "wb") as fo:
        while block := fi.read(chunk):
            h.update(block)
            fo.write(block)
    shutil.copymode(src, dst)
    return h.hexdigest()


def labels_file(labels: Sequence[str]) -> str:
    for lab in labels:
        if "\n" in lab:
            raise VitdeployError(f"label {lab!r} holds a line break; labels.txt has one label per line")
    return "".join(f"{lab}\n" for lab in labels)


def triton_config(name: str, onnx_model: Any, max_batch: int, opt_batch: int, platform: str = "onnxruntime_onnx") -> str:
    """config.pbtxt in Triton's text format (``onnx_model``: a ModelProto or a path): shapes without the batch dim,
    labels on the output."""
    inp, out = _onnx_io(onnx_model)
    layout = "FORMAT_NHWC" if inp["dims"][-1] == 3 else "FORMAT_NCHW"

    def dims(d: list[Any]) -> str:
        return ", ".join(str(v) for v in d[1:])

    preferred = sorted({b for b in (opt_batch, max_batch) if 1 <= b <= max_batch})
    return (
        f'name: "{name}"\n'
        f'platform: "{platform}"\n'
        f"max_batch_size: {max_batch}\n"
        "input [\n  {\n"
        f'    name: "{inp["name"]}"\n    data_type: {ONNX_TO_TRITON[inp["elem_type"]]}\n'
        f"    format: {layout}\n    dims: [ {dims(inp['dims'])} ]\n"
        "  }\n]\n"
        "output [\n  {\n"
        f'    name: "{out["name"]}"\n    data_type: {ONNX_TO_TRITON[out["elem_type"]]}\n'
        f"    dims: [ {dims(out['dims'])} ]\n"
        '    label_filename: "labels.txt"\n'
        "  }\n]\n"
        "dynamic_batching {\n"
        f"  preferred_batch_size: [ {', '.join(map(str, preferred))} ]\n"
        "  max_queue_delay_microseconds: 500\n"
        "}\n"
    )


def deepstream_config(manifest: Manifest, precision: str, batch: int, onnx_name: str, engine_name: str) -> str:
    """An nvinfer classifier config for the float 0–255 NCHW variant: DeepStream only resizes."""
    pp = manifest.pp()
    h, w = pp.input_size
    resize_note = (
        "# resize: the model was trained on the whole image squashed to the input size (maintain-aspect-ratio=0)"
        if pp.resize_mode == "squash" else
        f"# resize: the model was trained with shorter-side resize and a centre crop ({pp.crop_pct}); nvinfer scales the\n"
        "# whole frame/object instead: crop objects tightly (or add nvdspreprocess) to match."
    )
    return "\n".join([
        "# nvinfer config written by `vitdeploy bundle`. Preprocessing (1/255, mean, std, layout) is inside",
        "# the ONNX graph, so DeepStream hands over raw RGB pixels: net-scale-factor=1, offsets=0.",
        "# Build the engine first with ../build_engine.sh --deepstream (else nvinfer builds it from onnx-file).",
        resize_note,
        "[property]",
        "gpu-id=0",
        "net-scale-factor=1.0",
        "offsets=0;0;0",
        f"model-color-format={1 if pp.channel_order == 'BGR' else 0}",
        f"onnx-file={onnx_name}",
        f"model-engine-file={engine_name}",
        "labelfile-path=labels.txt",
        f"batch-size={batch}",
        f"# 0 FP32, 1 INT8, 2 FP16: this bundle's {precision} artifact",
        f"network-mode={DS_NETWORK_MODE[precision]}",
        "network-type=1",
        "process-mode=1",
        "gie-unique-id=1",
        f"infer-dims=3;{h};{w}",
        "network-input-order=0",
        f"maintain-aspect-ratio={0 if pp.resize_mode == 'squash' else 1}",
        f"scaling-filter={DS_SCALING_FILTER.get(pp.interpolation, 1)}",
        "output-blob-names=probs",
        "# the output is softmax probabilities; 0 keeps the top-1 label on every frame",
        "classifier-threshold=0.0",
        "",
    ])


def cpp_config(manifest: Manifest, default_model: str) -> str:
    """cpp/bundle.cfg: the manifest facts the C++ example reads, as key=value lines (no JSON library there)."""
    import PIL

    pp = manifest.pp()
    h, w = pp.input_size
    # the pass order of the Pillow that made this bundle's reference inputs (Pillow 13 changed it; see vitclassify.h)
    order = "pillow13" if int(PIL.__version__.split(".")[0]) >= 13 else "horizontal"
    facts = {
        "input_height": h, "input_width": w, "resize_mode": pp.resize_mode, "crop_pct": repr(float(pp.crop_pct)),
        "interpolation": pp.interpolation, "resample_order": order, "channel_order": pp.channel_order,
        "num_classes": manifest.num_classes, "labels": "../labels.txt",
        "engine": "../" + str(Path(default_model).with_suffix(".engine")), "batch": 8, "top": 1,
    }
    return "".join([
        "# Written by `vitdeploy bundle`: the facts the C++ library and example (cpp/) read, one key=value a line.\n",
        "# The engine takes uint8 [batch, input_height, input_width, 3] RGB; scaling, mean/std, channel order and\n",
        "# layout are inside its graph. resize_mode/crop_pct/interpolation: run.py's resize and centre crop;\n",
        f"# resample_order: Pillow {PIL.__version__}'s order of the two resize passes (horizontal: Pillow <= 12).\n",
        "# labels and engine are relative to this file; batch and top are run.py's --batch and --top defaults.\n",
        *(f"{k}={v}\n" for k, v in facts.items()),
    ])


def write_cpp(root: Path, manifest: Manifest, default_model: str) -> None:
    """cpp/: the C++ library and `classify` example (bundle_files/cpp) and the bundle.cfg they read."""
    shutil.copytree(TEMPLATES / "cpp", root / "cpp", ignore=shutil.ignore_patterns("build", "__pycache__"))
    (root / "cpp" / "bundle.cfg").write_text(cpp_config(manifest, default_model))


def _render(template: str, values: dict[str, Any]) -> str:
    text = (TEMPLATES / template).read_text()
    for k, v in values.items():
        text = text.replace(f"@@{k}@@", str(v))
    left = re.findall(r"@@[A-Z_]+@@", text)
    if left:
        raise RuntimeError(f"{template}: unfilled placeholders {left}")
    return text


def is_bundle(folder: Path) -> bool:
    """Whether ``folder`` is a bundle vitdeploy wrote (its manifest.json has a bundle section): --force replaces
    nothing else."""
    import json

    try:
        return folder.is_dir() and "bundle" in json.loads((folder / "manifest.json").read_text())
    except (OSError, ValueError, TypeError):
        return False


def _replace_dir(tmp: Path, out: Path, force: bool) -> None:
    """Move the finished bundle into place; an existing one is replaced only with force, and only now."""
    if out.exists():
        if not force:
            raise UsageError(f"{out} exists; pass --force to replace it, or choose another -o")
        old = out.with_name(f".{out.name}{TMP_TAG}{os.getpid()}-old")  # a killed run's is removed by the next
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except OSError:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)


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
    if not (1 <= opts.min_batch <= opts.opt_batch <= opts.max_batch):
        raise UsageError(f"batch profile must satisfy 1 ≤ min ≤ opt ≤ max, got {opts.min_batch}/{opts.opt_batch}/{opts.max_batch}")
    if out.exists() and not opts.force:
        raise UsageError(f"{out} exists; pass --force to replace it, or choose another -o")
    if out.exists() and not is_bundle(out):
        raise UsageError(f"{out} is not a vitdeploy bundle (no manifest.json with a bundle section): --force replaces "
                         "only a bundle; choose another -o")
    for m in models:
        if Path(m).resolve().is_relative_to(out.resolve()):
            raise UsageError(f"-o {out} holds the input {m}: write the bundle to a new folder")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_dir_beside(out)
    try:
        result = _write_bundle(models, tmp, opts, say, cwd)
        _replace_dir(tmp, out, opts.force)
        result.out = out
        return result
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


def _write_bundle(models: Sequence[str | Path], root: Path, opts: BundleOptions, say: Callable[[str], None], cwd: Path) -> BundleResult:
    work = root / ".work"
    work.mkdir()
    say("reading models")
    found, loaded, exported = resolve_models(models, work, cwd)
    manifests = {prec: manifest_from_onnx(m, found[prec]) for prec, m in loaded.items()}
    check_same_model({str(found[k]): m for k, m in manifests.items()})
    target = check_target(opts.target, {found[k]: m for k, m in manifests.items()})
    precisions = [p for p in PRECISIONS if p in found]
    default = opts.precision or next(p for p in ("int8", "fp16", "fp32") if p in found)
    if default not in found:
        raise UsageError(f"--precision {default}: no {default} model given (have {', '.join(precisions)})")
    base = manifests["fp32"] if "fp32" in manifests else manifests[default]
    pp = base.pp()
    h, w = pp.input_size
    name = triton_name(opts.name or base.name)

    # each model was loaded once (resolve_models); each file is hashed once: a copy as it is copied,
    # a variant from the bytes written
    artifacts: dict[str, dict[str, Any]] = {}
    sha: dict[str, str] = {}
    raw_models: dict[str, Any] = {}
    for prec in precisions:
        dst = root / ONNX_NAMES[prec]
        sha[prec] = _copy_hashed(found[prec], dst)
        say(f"folding preprocessing into {dst.name}")
        raw = root / raw_variant_name(dst.name)
        variant = write_variant(loaded[prec], manifests[prec], dst.name, sha[prec], raw)
        raw_models[prec] = variant.model
        for f, model, m_in, digest in ((dst, loaded[prec], None, sha[prec]),
                                       (raw, variant.model, variant.manifest.extra["input"], variant.sha256)):
            i, o = _onnx_io(model)
            artifacts[f.name] = {
                "precision": prec,
                "input": m_in or {"name": i["name"], "dtype": "float16" if i["elem_type"] == 10 else "float32",
                                  "layout": "NCHW", "shape": i["dims"], "preprocess_in_graph": False},
                "output": {"name": o["name"], "kind": "logits"},
                "sha256": digest,
            }
        artifacts[dst.name]["raw_variant"] = raw.name
        artifacts[raw.name]["source"] = dst.name

    # reference inputs and logits for run.py --check, and the embedded variants checked against their sources
    say("computing reference logits")
    ref_files, ref_source = reference_images(opts, base, root / "reference" / "images", cwd)
    images = np.stack([resized_uint8(f, pp) for f in ref_files])
    np.save(root / "reference" / "inputs.npy", images)
    from PIL import Image

    x = np.stack([to_array(Image.fromarray(a), pp) for a in images])
    ref_logits: dict[str, str] = {}
    embed_err: dict[str, float] = {}
    for prec in precisions:
        src = root / ONNX_NAMES[prec]
        logits = _run(src, x)
        rel = f"reference/logits.{prec}.npy"
        np.save(root / rel, logits)
        ref_logits[prec] = rel
        raw = root / artifacts[src.name]["raw_variant"]
        err = _rel(_run(raw, raw_batch(images, artifacts[raw.name]["input"])), logits)
        embed_err[prec] = err
        artifacts[raw.name]["max_rel_diff_vs_source"] = err
        if err > EMBED_TOLERANCE[prec]:
            raise VitdeployError(
                f"{raw.name} disagrees with {src.name} on the reference images (max |Δlogit| {err:.2e} relative > "
                f"{EMBED_TOLERANCE[prec]:.0e}); this is a bug, please report it"
            )

    # DeepStream: float 0–255 NCHW input (nvinfer feeds float tensors), softmax probabilities out
    say("writing the DeepStream config")
    ds_dir = root / "deepstream"
    ds_dir.mkdir()
    ds_onnx = ds_dir / "model.ds.onnx"
    ds = write_variant(loaded[default], manifests[default], ONNX_NAMES[default], sha[default], ds_onnx,
                       dtype="float32", layout="nchw", softmax=True)
    ds_in = ds.manifest.extra["input"]
    artifacts[f"deepstream/{ds_onnx.name}"] = {
        "precision": default, "input": ds_in, "output": {"name": "probs", "kind": "probs"}, "sha256": ds.sha256,
        "source": ONNX_NAMES[default],
    }
    (ds_dir / "labels.txt").write_text(";".join(lab.replace(";", ",") for lab in base.labels) + "\n")
    (ds_dir / "config_infer_primary.txt").write_text(
        deepstream_config(base, default, opts.opt_batch, ds_onnx.name, "model.ds.engine")
    )

    # Triton: the raw-pixel variant (clients send uint8 HWC images, 4x less than float32)
    say("writing the Triton model repository")
    tri = root / "triton" / name
    (tri / "1").mkdir(parents=True)
    triton_src = raw_variant_name(ONNX_NAMES[default])
    shutil.copyfile(root / triton_src, tri / "1" / "model.onnx")
    (tri / "config.pbtxt").write_text(triton_config(name, raw_models[default], opts.max_batch, opts.opt_batch))
    (tri / "labels.txt").write_text(labels_file(base.labels))

    (root / "labels.txt").write_text(labels_file(base.labels))
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
            "triton": {"name": name, "model": f"triton/{name}/1/model.onnx", "source": triton_src},
            "deepstream": {"config": "deepstream/config_infer_primary.txt", "onnx": f"deepstream/{ds_onnx.name}"},
            "reference": {
                "inputs": "reference/inputs.npy",
                "images": [f"reference/images/{f.name}" for f in ref_files],
                "source": ref_source,
                "logits": ref_logits,
                "tolerance": CHECK_TOLERANCE,
            },
            "created_with": tool_versions("onnx", "onnxruntime", "numpy"),
        },
    )
    (root / "manifest.json").write_text(manifest.to_json(indent=2) + "\n")

    values = {
        "NAME": name, "PRECISION": default, "AVAILABLE": " ".join(precisions), "H": h, "W": w,
        "MIN": opts.min_batch, "OPT": opts.opt_batch, "MAX": opts.max_batch, "TRITON_SOURCE": triton_src,
        "CLASSES": base.num_classes,
    }
    write_cpp(root, base, raw_variant_name(ONNX_NAMES[default]))
    shutil.copyfile(TEMPLATES / "run.py", root / "run.py")
    (root / "build_engine.sh").write_text(_render("build_engine.sh", values))
    (root / "build_engine.sh").chmod(0o755)
    (root / "run.py").chmod(0o755)
    (root / "README.md").write_text(_render("README.md", {**values, "LABELS": ", ".join(base.labels[:5]) + (" …" if len(base.labels) > 5 else ""),
                                                          "PP": json.dumps(base.preprocess)}))
    shutil.rmtree(work)
    files = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())
    return BundleResult(root, precisions, default, files, embed_err, ref_source, exported)
    if not 1 <= opts.references <= MAX_REFERENCES:
        raise UsageError(f"--references {opts.references}: give 1 to {MAX_REFERENCES} (each is an image and a row of "
                         "logits per precision inside the bundle)")
        from vitdeploy.core.fileio import follow_umask

        follow_umask(tmp)  # copies (copymode, copytree) carry the source's mode; the bundle gets the umask's
        from vitdeploy.checks.metrics import require_finite

        require_finite(logits, src.name)  # NaN reference logits would make run.py --check meaningless
