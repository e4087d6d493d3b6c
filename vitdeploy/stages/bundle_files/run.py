#!/usr/bin/env python3
"""Classify images with this bundle: numpy, Pillow and TensorRT (or ONNX Runtime) only, no torch, no vitdeploy.

Python 3.8+ (JetPack 5), numpy and Pillow as JetPack ships them.

    python3 run.py IMAGE_OR_FOLDER ...          # label and score per image
    python3 run.py --check                      # compare the engine (or ONNX) with the bundle's reference logits

The default model is the raw-pixel variant (uint8 RGB in, logits out: scaling,
mean/std and layout are inside the graph), so this program only decodes,
resizes and crops, exactly as vitdeploy does. With an engine built by
./build_engine.sh beside the ONNX it runs on TensorRT, else on ONNX Runtime.

Every failure is one line on stderr and exit 1 (2 for a wrong option); RUN_PY_DEBUG=1 shows the traceback. Every
run first checks the model file against the SHA-256 that manifest.json records (--check: every model file).
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import hashlib
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
from PIL import Image, ImageOps

HERE = Path(__file__).resolve().parent
EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")
_R = getattr(Image, "Resampling", Image)  # Pillow < 9.1 (JetPack 5's python3-pil) has the constants on Image
INTERP = {"nearest": _R.NEAREST, "bilinear": _R.BILINEAR, "bicubic": _R.BICUBIC, "lanczos": _R.LANCZOS, "box": _R.BOX,
          "hamming": _R.HAMMING}


# --- images: the same decode / resize / crop as vitdeploy.preprocess -----------------------------------


def to_rgb(img: Image.Image) -> Image.Image:
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:
        pass
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float64)
        if mode == "F":
            hi = 1.0 if a.size and a.max() <= 1.0 else 255.0
        elif mode.startswith("I;16"):
            hi = 65535.0
        else:
            hi = 65535.0 if a.size and a.max() > 255 else 255.0
        a = np.clip(a / hi * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(a).convert("RGB")
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


def resize_crop(img: Image.Image, pp: dict) -> Image.Image:
    h, w = (int(v) for v in pp["input_size"])
    interp = INTERP[pp.get("interpolation", "bicubic")]
    if pp.get("resize_mode", "shorter") == "squash":
        return img.resize((w, h), interp) if img.size != (w, h) else img
    crop_pct = float(pp.get("crop_pct", 0.875))
    rh, rw = math.floor(h / crop_pct), math.floor(w / crop_pct)
    iw, ih = img.size
    if rh == rw:
        short, long = (iw, ih) if iw <= ih else (ih, iw)
        new_short, new_long = rh, int(rh * long / short)
        nw, nh = (new_short, new_long) if iw <= ih else (new_long, new_short)
    else:
        scale = max(rh / ih, rw / iw)
        nw, nh = max(rw, round(iw * scale)), max(rh, round(ih * scale))
    if (nw, nh) != (iw, ih):
        img = img.resize((nw, nh), interp)
    top, left = int(round((nh - h) / 2.0)), int(round((nw - w) / 2.0))
    if nh < h or nw < w:
        img = img.resize((max(nw, w), max(nh, h)), interp)
        top, left = max(top, 0), max(left, 0)
    return img.crop((left, top, left + w, top + h))


def load_resized(path: Path, pp: dict) -> np.ndarray:
    """The resized, cropped RGB image as uint8 HWC."""
    with Image.open(path) as im:
        im.load()
        return np.asarray(resize_crop(to_rgb(im), pp), dtype=np.uint8)


def list_images(args: list[str]) -> list[Path]:
    out: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in EXTS
                          and not any(part.startswith(".") for part in f.relative_to(p).parts))
        else:
            out.append(p)
    return out


def model_input(images: np.ndarray, spec: dict, pp: dict) -> np.ndarray:
    """uint8 NHWC images → what the model's input takes (raw pixels, or normalised NCHW for the plain export)."""
    if spec.get("preprocess_in_graph"):
        x = images.transpose(0, 3, 1, 2) if spec.get("layout") == "NCHW" else images
        return np.ascontiguousarray(x, dtype=np.uint8 if spec.get("dtype") == "uint8" else np.float32)
    a: np.ndarray = images.astype(np.float32)
    if pp.get("channel_order", "RGB") == "BGR":
        a = a[..., ::-1]
    a = a * np.float32(float(pp.get("rescale", 1.0 / 255.0)))
    a = (a - np.asarray(pp["mean"], np.float32)) / np.asarray(pp["std"], np.float32)
    a = np.ascontiguousarray(a.transpose(0, 3, 1, 2))
    return a.astype(np.float16) if spec.get("dtype") == "float16" else a


# --- backends ---------------------------------------------------------------------------------------------


class OrtModel:
    backend = "onnxruntime"

    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
        try:
            self.session = ort.InferenceSession(str(path), providers=providers)
        except Exception as e:  # noqa: BLE001 - InvalidProtobuf, NoSuchFile, ...: one line
            raise SystemExit(f"error: {path.name}: ONNX Runtime cannot load it ({type(e).__name__}: "
                             f"{_first_line(e)}): copy the bundle again") from None
        self.input = self.session.get_inputs()[0].name
        self.max_batch = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {self.input: x})[0], np.float32)


NULLPTR = "factory function returned nullptr"
DRIVER_ADVICE = ("check the NVIDIA driver (nvidia-smi; on a Jetson, the JetPack install): it must be new enough for "
                 "this TensorRT's CUDA")


def cuda_message(what: str) -> str:
    """TensorRT's ``pybind11::init(): factory function returned nullptr`` in words that name CUDA and the driver."""
    return f"TensorRT could not start CUDA ({what} failed: {NULLPTR}); {DRIVER_ADVICE}"


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]


class CudaRT:
    """The few CUDA runtime calls an engine needs, through ctypes: no pycuda or cuda-python on a stock JetPack."""

    H2D, D2H = 1, 2

    def __init__(self) -> None:
        names = [ctypes.util.find_library("cudart"), "libcudart.so", "libcudart.so.12", "libcudart.so.11.0",
                 "/usr/local/cuda/lib64/libcudart.so"]
        for n in names:
            if not n:
                continue
            try:
                self.lib = ctypes.CDLL(n)
                break
            except OSError:
                continue
        else:
            raise RuntimeError("libcudart not found: is CUDA installed (JetPack ships it in /usr/local/cuda)?")
        self.lib.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
        self.lib.cudaFree.argtypes = [ctypes.c_void_p]
        self.lib.cudaMemcpyAsync.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        self.lib.cudaStreamCreate.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.lib.cudaStreamSynchronize.argtypes = [ctypes.c_void_p]

    def check(self, rc: int, what: str) -> None:
        if rc != 0:
            raise RuntimeError(f"CUDA {what} failed with error {rc}")

    def malloc(self, n: int) -> int:
        p = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(p), max(n, 1)), "cudaMalloc")
        return int(p.value or 0)

    def free(self, p: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(p))

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreate(ctypes.byref(s)), "cudaStreamCreate")
        return int(s.value or 0)

    def copy(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), n, kind, ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def sync(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")


class TrtModel:
    """An engine through the name-based API that TensorRT 8.5 … 11 share (set_input_shape, execute_async_v3)."""

    backend = "tensorrt"

    def __init__(self, path: Path, dla_core: int | None = None) -> None:
        import tensorrt as trt

        self.trt = trt
        logger = trt.Logger(trt.Logger.WARNING)
        try:
            runtime = trt.Runtime(logger)
        except TypeError as e:  # libnvinfer's factory returned NULL: CUDA did not start (every release 8.6 … 11.4)
            if NULLPTR not in str(e):
                raise
            raise RuntimeError(cuda_message("trt.Runtime")) from None
        self.cuda = CudaRT()
        self.dla_core = engine_dla_core(path) if dla_core is None else dla_core
        if self.dla_core is not None:  # a DLA engine loads on the core it was built for (trtexec sets it too)
            runtime.DLA_core = int(self.dla_core)
        self.runtime = runtime  # the engine must not outlive the runtime that made it
        self.engine = runtime.deserialize_cuda_engine(path.read_bytes())
        if self.engine is None:
            raise RuntimeError(f"{path}: TensorRT cannot load this engine (built by another TensorRT version or GPU?): rebuild it with ./build_engine.sh")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeError(f"{path.name}: TensorRT could not create an execution context (out of GPU memory, or "
                               f"CUDA failed): free GPU memory and try again; {DRIVER_ADVICE}")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        prof = self.engine.get_tensor_profile_shape(self.inputs[0], 0)
        self.min_batch, self.max_batch = int(prof[0][0]), int(prof[2][0])  # DLA: min = max, one fixed batch
        self.stream = self.cuda.stream()

    def receipt(self) -> dict:
        """The engine's precision receipt (receipt.py beside this script: vitdeploy's inspector parser), or why not."""
        import importlib.util

        spec = importlib.util.spec_from_file_location("vitdeploy_bundle_receipt", HERE / "receipt.py")
        if spec is None or spec.loader is None or not (HERE / "receipt.py").is_file():
            return {"status": "unknown", "reason": "no receipt.py in this bundle"}
        mod = importlib.util.module_from_spec(spec)  # loaded by path: sys.path is left alone (the bundle has triton/)
        try:
            sys.modules[spec.name] = mod  # dataclasses look their module up there
            spec.loader.exec_module(mod)
            receipt_from_json = mod.receipt_from_json
        except Exception as e:  # noqa: BLE001 - a damaged receipt.py: unknown, said why
            return {"status": "unknown", "reason": f"receipt.py cannot be loaded ({type(e).__name__})"}
        try:
            info = self.engine.create_engine_inspector().get_engine_information(self.trt.LayerInformationFormat.JSON)
            return receipt_from_json(str(info)).to_dict()
        except Exception as e:  # noqa: BLE001 - an engine or TensorRT without an inspector: unknown, said why
            return {"status": "unknown", "reason": f"the engine inspector failed ({type(e).__name__})"}

    def __call__(self, x: np.ndarray) -> np.ndarray:
        trt, cuda = self.trt, self.cuda
        name = self.inputs[0]
        n = len(x)
        x = np.ascontiguousarray(x, dtype=trt.nptype(self.engine.get_tensor_dtype(name)))
        if n < self.min_batch:  # pad a short batch up to the profile's minimum (a DLA engine's fixed batch)
            x = np.concatenate([x, np.zeros((self.min_batch - n,) + x.shape[1:], x.dtype)])
        if not self.context.set_input_shape(name, tuple(x.shape)):
            raise RuntimeError(f"TensorRT refused input shape {tuple(x.shape)}: the engine's batch profile is "
                               f"{self.min_batch}..{self.max_batch}; rebuild it with ./build_engine.sh --batch MIN:OPT:MAX")
        bufs = []
        try:
            d_in = cuda.malloc(x.nbytes)
            bufs.append(d_in)
            cuda.copy(d_in, x.ctypes.data, x.nbytes, cuda.H2D, self.stream)
            self.context.set_tensor_address(name, d_in)
            outs = {}
            for o in self.outputs:
                shape = tuple(self.context.get_tensor_shape(o))
                host = np.empty(shape, dtype=trt.nptype(self.engine.get_tensor_dtype(o)))
                d = cuda.malloc(host.nbytes)
                bufs.append(d)
                self.context.set_tensor_address(o, d)
                outs[o] = (host, d)
            if not self.context.execute_async_v3(self.stream):
                raise RuntimeError("TensorRT execution failed")
            for host, d in outs.values():
                cuda.copy(host.ctypes.data, d, host.nbytes, cuda.D2H, self.stream)
            cuda.sync(self.stream)
            return np.asarray(outs[self.outputs[0]][0][:n], np.float32)
        finally:
            for b in bufs:
                cuda.free(b)


def engine_dla_core(plan_file: Path) -> int | None:
    """The DLA core an engine was built for: its vitdeploy sidecar (ENGINE.json), else ENGINE.dla (build_engine.sh)."""
    side = Path(str(plan_file) + ".json")
    try:
        core = json.loads(side.read_text()).get("engine", {}).get("options", {}).get("dla_core")
        if core is not None:
            return int(core)
    except (OSError, ValueError, AttributeError):
        pass
    marker = Path(str(plan_file) + ".dla")
    if marker.exists():
        return int(marker.read_text().strip())
    return None


def open_model(path: Path, backend: str, dla_core: int | None = None) -> OrtModel | TrtModel:
    plan_file = path if path.suffix in (".engine", ".plan") else path.with_suffix(".engine")
    onnx = path if path.suffix == ".onnx" else path.with_suffix(".onnx")
    if backend in ("auto", "tensorrt") and plan_file.exists():
        try:
            return TrtModel(plan_file, dla_core)
        except ImportError:
            if backend == "tensorrt":
                raise SystemExit("error: TensorRT's Python bindings are missing (JetPack: sudo apt install python3-libnvinfer)") from None
        except RuntimeError as e:  # a foreign engine, no CUDA runtime, CUDA that cannot start: one line
            raise SystemExit(f"error: {e}") from None
        except Exception as e:  # noqa: BLE001 - a tensorrt module that is not TensorRT's, a garbage plan, ...
            raise SystemExit(f"error: {plan_file.name}: TensorRT cannot load it ({type(e).__name__}: {_first_line(e)}); "
                             "rebuild it with ./build_engine.sh, or run the ONNX with --backend onnxruntime") from None
    elif backend == "tensorrt":
        raise SystemExit(f"error: no engine {plan_file.name}: build it with ./build_engine.sh")
    if not onnx.exists():
        raise SystemExit(f"error: {onnx.name} is not in this bundle")
    try:
        return OrtModel(onnx)
    except ImportError:
        raise SystemExit("error: neither an engine nor onnxruntime here: run ./build_engine.sh, or pip install onnxruntime") from None


def run_batches(model: OrtModel | TrtModel, x: np.ndarray, batch: int) -> np.ndarray:
    b = min(batch, model.max_batch or batch)
    return np.concatenate([model(x[i : i + b]) for i in range(0, len(x), b)])


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class OneLineParser(argparse.ArgumentParser):
    """argparse that says a usage error in one line (exit 2), not the usage block and the error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v}: give 1 or more")
    return v


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def verify_files(info: dict, names: list[str]) -> None:
    """Each model file as manifest.json recorded it (SHA-256): a truncated or corrupted copy is refused."""
    for rel in names:
        want = (info["artifacts"].get(rel) or {}).get("sha256")
        if not want:
            continue
        p = HERE / rel
        if not p.is_file():
            raise SystemExit(f"error: {rel} is missing from this bundle: copy the bundle again")
        if sha256_of(p) != want:
            raise SystemExit(f"error: {rel} is not the file this bundle was made with (its SHA-256 differs from "
                             "manifest.json's): a corrupted or partial copy? copy the bundle again")


def read_manifest() -> tuple[dict, dict, dict, list]:
    """manifest.json's bundle info, preprocessing and labels, or one line saying what is wrong with it."""
    path = HERE / "manifest.json"
    try:
        manifest = json.loads(path.read_text())
        info, pp, labels = manifest["bundle"], manifest["preprocess"], manifest["labels"]
        info["artifacts"], info["default_model"], pp["input_size"]  # noqa: B018 - present, or the except below
    except OSError as e:
        raise SystemExit(f"error: {path.name}: cannot read it ({e.strerror or e}): copy the bundle again") from None
    except ValueError as e:
        raise SystemExit(f"error: {path.name}: not valid JSON ({_first_line(e)}): copy the bundle again") from None
    except (KeyError, TypeError) as e:
        raise SystemExit(f"error: {path.name}: not a bundle manifest (no {e}): copy the bundle again") from None
    return manifest, info, pp, labels


def check_labels(labels: list, classes: int) -> None:
    """The labels (manifest.json, and labels.txt beside it) name every class the model gives."""
    if len(labels) != classes:
        raise SystemExit(f"error: manifest.json lists {len(labels)} labels, the model gives {classes} classes: "
                         "copy the bundle again")
    txt = HERE / "labels.txt"
    if txt.exists():
        n = len(txt.read_text(encoding="utf-8", errors="replace").splitlines())
        if n != classes:
            raise SystemExit(f"error: labels.txt has {n} labels, the model gives {classes} classes: restore it from "
                             "the bundle (one label per line)")


def main(argv: list[str] | None = None) -> int:
    """Run the command; any failure is one line (RUN_PY_DEBUG=1: the traceback), exit 1; usage errors exit 2."""
    try:
        return _main(argv)
    except (SystemExit, KeyboardInterrupt):
        raise
    except Exception as e:  # noqa: BLE001 - the promise: one line, no traceback
        if os.environ.get("RUN_PY_DEBUG"):
            raise
        raise SystemExit(f"error: {type(e).__name__}: {_first_line(e)}") from None


def _main(argv: list[str] | None = None) -> int:
    ap = OneLineParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("images", nargs="*", help="image files or folders")
    ap.add_argument("--model", help="ONNX or engine in this bundle (default: the raw-pixel variant of the bundle's precision)")
    ap.add_argument("--backend", choices=("auto", "tensorrt", "onnxruntime"), default="auto",
                    help="auto: the engine beside the ONNX when TensorRT loads, else ONNX Runtime")
    ap.add_argument("--batch", type=positive_int, default=8, help="images per call")
    ap.add_argument("--top", type=positive_int, default=1, help="labels to print per image")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    ap.add_argument("--dla-core", type=int, default=None,
                    help="the DLA core of a DLA engine (default: from its sidecar, or ENGINE.dla that build_engine.sh writes)")
    ap.add_argument("--check", action="store_true", help="compare with the bundle's reference logits; exit 1 when they differ")
    args = ap.parse_args(argv)

    _, info, pp, labels = read_manifest()
    rel = args.model or info["default_model"]
    path = Path(rel) if Path(rel).is_absolute() else HERE / rel
    try:  # the artifact's key in the manifest: its ONNX path inside the bundle
        onnx_rel = path.resolve().with_suffix(".onnx").relative_to(HERE).as_posix()
    except ValueError:
        onnx_rel = path.with_suffix(".onnx").name
    art = info["artifacts"].get(onnx_rel)
    if art is None:
        raise SystemExit(f"error: {rel} is not one of this bundle's models: {', '.join(info['artifacts'])}")
    verify_files(info, list(info["artifacts"]) if args.check else [onnx_rel])
    model = open_model(path, args.backend, args.dla_core)

    if args.check:
        images = np.load(HERE / info["reference"]["inputs"])
        prec = art["precision"]
        ref = np.load(HERE / info["reference"]["logits"][prec])
        got = run_batches(model, model_input(images, art["input"], pp), args.batch)
        if ref.shape != got.shape:
            raise SystemExit(f"error: {info['reference']['logits'][prec]} holds logits of shape {ref.shape}, the model "
                             f"gives {got.shape} on {len(images)} reference images: copy the bundle again")
        check_labels(labels, got.shape[1])
        if art["output"]["kind"] == "probs":
            ref = softmax(ref)
        diff = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-12))
        agree = float((got.argmax(1) == ref.argmax(1)).mean())
        tol = float(info["reference"]["tolerance"][prec])
        ok = diff <= tol
        result = {"model": onnx_rel, "backend": model.backend, "precision": prec, "images": len(images),
                  "max_rel_diff": diff, "tolerance": tol, "top1_agreement": agree, "ok": ok}
        if isinstance(model, TrtModel):
            result["receipt"] = model.receipt()
        print(json.dumps(result) if args.json else
              f"{'OK' if ok else 'FAILED'}: {onnx_rel} on {model.backend} vs reference {prec} logits: max |Δ| {diff:.2e} of the "
              f"largest logit (tolerance {tol:.0e}), top-1 agreement {agree:.1%} on {len(images)} images")
        if "receipt" in result and not args.json:
            r = result["receipt"]
            share = ", ".join(f"{k} {v:.0%}" for k, v in sorted((r.get("gemm_share") or {}).items(), key=lambda kv: -kv[1]))
            print(f"precision receipt: GEMM FLOPs {share}; attention fused: {(r.get('attention') or {}).get('fused')}; "
                  f"{len(r.get('fp32_layers') or [])} FP32 layers" if r.get("status") == "ok"
                  else f"precision receipt: unknown ({r.get('reason')})")
        return 0 if ok else 1

    files = list_images(args.images)
    if not files:
        ap.error("give image files or folders (or --check)")
    status = 0
    ok_files, arrays = [], []
    for f in files:
        try:
            arrays.append(load_resized(f, pp))
            ok_files.append(f)
        except Exception as e:  # noqa: BLE001 - report the file and go on with the others
            print(f"skipped {f}: {e}", file=sys.stderr)
            status = 3
    if not arrays:
        return 1
    out = run_batches(model, model_input(np.stack(arrays), art["input"], pp), args.batch)
    check_labels(labels, out.shape[1])
    probs = out if art["output"]["kind"] == "probs" else softmax(out)
    for f, p in zip(ok_files, probs):  # noqa: B905 - Python 3.8 (JetPack 5) has no strict=
        top = np.argsort(-p)[: args.top]
        if args.json:
            print(json.dumps({"path": str(f), "label": labels[top[0]], "index": int(top[0]), "score": float(p[top[0]]),
                              "top": [{"label": labels[i], "score": float(p[i])} for i in top]}))
        else:
            print(f"{f}\t" + "\t".join(f"{labels[i]}\t{p[i]:.4f}" for i in top))
    return status


if __name__ == "__main__":
    sys.exit(main())
