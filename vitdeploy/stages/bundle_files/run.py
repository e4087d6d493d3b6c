#!/usr/bin/env python3
"""Classify images (or embed them) with this bundle: numpy, Pillow and TensorRT (or ONNX Runtime) only, no torch,
no vitdeploy.

Python 3.8+ (JetPack 5), numpy and Pillow as JetPack ships them (Pillow only to read images: --help and a
--check of the engine need numpy alone).

    python3 run.py IMAGE_OR_FOLDER ...          # label and score per image (an embedding model: its vector)
    python3 run.py IMAGES --out out.npy         # also save every output row ([N, D]) and out.files.txt, the files
    python3 run.py --check                      # compare the engine (or ONNX) with the bundle's reference outputs

An embedding model (its output kind in manifest.json is "embedding") has no labels: each image's vector is printed
(its first values and L2 norm; --json: all of it) and --check compares it with the reference embeddings by per-image
cosine (mean, 1st percentile, minimum) and by each vector's L2 norm (a vector of the wrong scale has a cosine of 1)
against the gates manifest.json's bundle.reference.check holds per precision. A model exported with --tokens also
answers patch_tokens: --check holds them, token by token, to the same gates against reference/patch_tokens.*.npy,
and --out FILE.npy saves them beside the vectors as FILE.patch_tokens.npy ([N, patches, width]).

The default model is the raw-pixel variant (uint8 RGB in, logits out: scaling,
mean/std and layout are inside the graph), so this program only decodes,
resizes and crops, exactly as vitdeploy does. With the engine ./build_engine.sh
built for this TensorRT (manifest.json's bundle.tensorrt.engines names it) it runs
on TensorRT, else on ONNX Runtime; an engine here without TensorRT's Python module
is said, never passed over for the ONNX quietly. A model made for a CPU (vitdeploy calibrate -t cpu / -t openvino)
runs on OpenVINO where it is installed, else on ONNX Runtime; its INT8 (-t cpu) on an x86 CPU without VNNI runs on
ONNX Runtime, faster there.

Every failure is one line on stderr and exit 1 (2 for a wrong option); RUN_PY_DEBUG=1 shows the traceback. Every
run first checks the model file against the SHA-256 that manifest.json records (--check: every model and reference
file bundle.files lists, before judging: one that differs fails, named; an edited README or Triton/DeepStream config
is named as a warning), and runs the very bytes it hashed. A reference array that is not float32 or not finite is
named as a damaged file. Every file manifest.json names is read only when it is a relative path inside this
folder, a regular file, and not larger than a bundle file may be (the rule `vitdeploy info` and build_engine.sh
apply). Images are decoded one batch at a time.
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import hashlib
import json
import math
import os
import re
import stat
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
EXTS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def pil() -> Any:
    """Pillow, imported when an image is read (JetPack may lack it: the README says pip install pillow)."""
    try:
        from PIL import Image, ImageOps  # noqa: F401 - ImageOps is reached as PIL.ImageOps
    except ImportError:
        raise SystemExit("error: reading images needs Pillow, which is not installed here: python3 -m pip install "
                         "pillow (or sudo apt install python3-pil)") from None
    import PIL

    return PIL


def interp(name: str) -> Any:
    image = pil().Image
    r = getattr(image, "Resampling", image)  # Pillow < 9.1 (JetPack 5's python3-pil) has the constants on Image
    return {"nearest": r.NEAREST, "bilinear": r.BILINEAR, "bicubic": r.BICUBIC, "lanczos": r.LANCZOS, "box": r.BOX,
            "hamming": r.HAMMING}[name]


# --- text: what a label or a path prints as --------------------------------------------------------------

# C0/C1 controls, DEL, and the line/paragraph separators and bidi controls that can forge or reorder a line
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069\ufeff]")


def safe(text: object) -> str:
    """``text`` with control characters escaped (\\x1b, \\u2028, ...): a label or file name prints as one inert line."""
    s = str(text)
    return _UNSAFE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), s) if _UNSAFE.search(s) else s


# --- the bundle's own files: relative, inside, regular, bounded -----------------------------------------------

MAX_BYTES = 8 << 30  # a model, engine or array (ViT-H FP32 is 2.5 GB)
MAX_TEXT_BYTES = 64 << 20  # manifest.json, labels.txt


def bundle_file(rel: object, what: str = "manifest.json lists", limit: int = MAX_BYTES) -> Path:
    """The bundle file ``rel`` names, or one line (exit 1) naming the entry: an absolute or ../ path, a path out of
    the bundle (also through a symlink), anything but a regular file (a FIFO, a device, a folder), or a file larger
    than ``limit``. The same rule as vitdeploy's core/bundle_paths.py (`vitdeploy info`) and build_engine.sh."""
    name = safe(rel)
    if not isinstance(rel, str) or not rel or rel.startswith("/") or "\\" in rel or "\x00" in rel \
            or ".." in rel.split("/"):
        raise SystemExit(f"error: {what} {name!r}: not a relative path inside this bundle: copy the bundle again")
    p = HERE / rel
    try:
        real = p.resolve()
        real.relative_to(HERE)
    except (ValueError, OSError, RuntimeError):
        raise SystemExit(f"error: {what} {name!r}: it leads out of this bundle: copy the bundle again") from None
    try:
        st = os.stat(real)
    except OSError:
        raise SystemExit(f"error: {name} is missing from this bundle: copy the bundle again") from None
    if not stat.S_ISREG(st.st_mode):
        raise SystemExit(f"error: {what} {name!r}: not a regular file: copy the bundle again")
    if st.st_size > limit:
        raise SystemExit(f"error: {what} {name!r}: {st.st_size} bytes, more than a bundle file may hold ({limit}): "
                         "copy the bundle again")
    return real


READ_CHUNK = 16 << 20  # bytes per read past the size fstat gave (a file that grows while read)


def read_bounded(f: Any, limit: int, expect: int = 0) -> bytes:
    """Up to ``limit + 1`` bytes of ``f``: the ``expect`` bytes fstat reported in one read (one allocation of the
    file's size, no copy), then chunks for anything past them. Never ``f.read(limit + 1)``: CPython reserves the
    whole bound up front (8 GiB for a 70 KB model), which fails under an address-space limit or strict overcommit
    (a 4 GB Jetson)."""
    first = f.read(min(max(expect, 0), limit + 1))
    chunks = [first]
    size = len(first)
    while size <= limit:
        chunk = f.read(min(READ_CHUNK, limit + 1 - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return first if len(chunks) == 1 else b"".join(chunks)


def read_bundle_bytes(rel: object, what: str = "manifest.json lists", limit: int = MAX_BYTES) -> bytes:
    """The bytes of a bundle file, read through one descriptor checked again after opening (no FIFO, no growth)."""
    path = bundle_file(rel, what, limit)
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise SystemExit(f"error: {what} {safe(rel)!r}: not a regular file of a bounded size: copy the bundle again")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = read_bounded(f, limit, st.st_size)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise SystemExit(f"error: {what} {safe(rel)!r}: it grew past {limit} bytes while read: copy the bundle again")
    return data


# --- images: the same decode / resize / crop as vitdeploy.preprocess -----------------------------------


def to_rgb(img: Any) -> Any:
    Image, ImageOps = pil().Image, pil().ImageOps  # noqa: N806 - Pillow's module names
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


def resize_crop(img: Any, pp: dict) -> Any:
    h, w = (int(v) for v in pp["input_size"])
    mode = interp(pp.get("interpolation", "bicubic"))
    rmode = pp.get("resize_mode", "shorter")
    if rmode == "squash":
        return img.resize((w, h), mode) if img.size != (w, h) else img
    crop_pct = float(pp.get("crop_pct", 0.875))
    rh, rw = math.floor(h / crop_pct), math.floor(w / crop_pct)
    iw, ih = img.size
    if rmode == "squash_crop":  # transformers' DeiT/BEiT processors: resize to a size, then centre crop
        nw, nh = rw, rh
    elif rh == rw:
        short, long = (iw, ih) if iw <= ih else (ih, iw)
        new_short, new_long = rh, int(rh * long / short)
        nw, nh = (new_short, new_long) if iw <= ih else (new_long, new_short)
    else:  # timm's ResizeKeepRatio: the side that fits first sets the ratio
        ratio = min(ih / rh, iw / rw)
        nw, nh = round(iw / ratio), round(ih / ratio)
    if (nw, nh) != (iw, ih):
        img = img.resize((nw, nh), mode)
    if pp.get("crop_offset", "round") == "floor":  # transformers' centre crop rounds the offset down
        top, left = (nh - h) // 2, (nw - w) // 2
    else:
        top, left = int(round((nh - h) / 2.0)), int(round((nw - w) / 2.0))
    if nh < h or nw < w:
        img = img.resize((max(nw, w), max(nh, h)), mode)
        top, left = max(top, 0), max(left, 0)
    return img.crop((left, top, left + w, top + h))


def file_kind(mode: int) -> str:
    """What a file that is not a regular file is, in words (a FIFO, a character device, ...)."""
    for test, noun in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a folder")):
        if test(mode):
            return noun
    return "a special file"


def load_resized(path: Path, pp: dict) -> np.ndarray:
    """The resized, cropped RGB image as uint8 HWC, decoded from the file opened once and checked to be a regular
    file (a FIFO swapped in after listing would block for ever; /dev/zero would never end)."""
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{file_kind(mode)}, not an image file")
        with pil().Image.open(f) as im:
            im.load()
            return np.asarray(resize_crop(to_rgb(im), pp), dtype=np.uint8)


def list_images(args: list[str]) -> list[Path]:
    """The image files the arguments name: a folder's images (regular files), and each file named; a named FIFO,
    device or socket is one line (reading it would block or never end), as vitdeploy infer refuses it."""
    out: list[Path] = []
    for a in args:
        p = Path(a)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix.lower() in EXTS
                          and not any(part.startswith(".") for part in f.relative_to(p).parts))
            continue
        try:
            mode = os.stat(p).st_mode
        except OSError:
            mode = stat.S_IFREG  # missing: named as skipped when read, as any unreadable file
        if not stat.S_ISREG(mode):
            raise SystemExit(f"error: {safe(a)}: {file_kind(mode)}, not an image file: give image files or folders")
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

    def __init__(self, path: Path, data: bytes | None = None) -> None:
        import onnxruntime as ort

        providers = [p for p in ("CUDAExecutionProvider", "CPUExecutionProvider") if p in ort.get_available_providers()]
        self.name = path.name
        try:  # the bytes that were hashed, when given: what is checked is what runs
            self.session = ort.InferenceSession(data if data is not None else str(path), providers=providers)
        except Exception as e:  # noqa: BLE001 - InvalidProtobuf, NoSuchFile, ...: one line
            raise SystemExit(f"error: {path.name}: ONNX Runtime cannot load it ({type(e).__name__}: "
                             f"{_first_line(e)}): copy the bundle again") from None
        self.input = self.session.get_inputs()[0].name
        self.max_batch = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.session.run(None, {self.input: x})[0], np.float32)

    def outputs(self, x: np.ndarray) -> dict:
        """Every output by name (an embedding model exported with --tokens: embedding and patch_tokens)."""
        names = [o.name for o in self.session.get_outputs()]
        return {n: np.asarray(v, np.float32) for n, v in zip(names, self.session.run(names, {self.input: x}))}  # noqa: B905


class OvModel:
    """OpenVINO on the CPU, float32 float parts (as the model was judged): where it is installed, auto runs a model
    made for a CPU target on it."""

    backend = "openvino"

    def __init__(self, path: Path, data: bytes) -> None:
        import openvino as ov

        core = ov.Core()
        self.name = path.name
        try:  # the bytes that were hashed: what is checked is what runs
            compiled = core.compile_model(core.read_model(data), "CPU", {"PERFORMANCE_HINT": "LATENCY",
                                                                         "INFERENCE_PRECISION_HINT": "f32"})
        except Exception as e:  # noqa: BLE001 - a file OpenVINO cannot read: one line
            raise SystemExit(f"error: {path.name}: OpenVINO cannot load it ({type(e).__name__}: {_first_line(e)}): "
                             "copy the bundle again, or run it with --backend onnxruntime") from None
        self.request = compiled.create_infer_request()
        self.names = [o.get_any_name() for o in compiled.outputs]
        self.max_batch = None

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.request.infer({0: x})[0], np.float32)

    def outputs(self, x: np.ndarray) -> dict:
        """Every output by name, as OrtModel.outputs."""
        res = self.request.infer({0: x})
        return {n: np.asarray(res[i], np.float32) for i, n in enumerate(self.names)}


CPU_TARGETS = ("cpu", "ort", "openvino")  # vitdeploy's CPU targets (ort: cpu's old name)
INT8_DOT_FLAGS = ("avx512_vnni", "avx_vnni", "amx_int8")  # as vitdeploy/core/host.py: this file runs without vitdeploy


ONEDNN_ISAS_WITHOUT_INT8_DOT = ("SSE41", "AVX", "AVX2", "AVX512_CORE")  # as vitdeploy/core/host.py


def cpu_int8_dot_exact(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """Whether OpenVINO has an int8 dot product without int16 saturation on this x86 CPU (True where nothing says
    otherwise): the CPU's flags have one, and ONEDNN_MAX_CPU_ISA (oneDNN, inside OpenVINO) was not set below it."""
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or ""
    if isa.strip().upper() in ONEDNN_ISAS_WITHOUT_INT8_DOT:
        return False
    try:
        with open(cpuinfo, encoding="utf-8", errors="replace") as f:
            text = f.read(1 << 20)
    except OSError:
        return True
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), None)
    return flags is None or any(f in flags for f in INT8_DOT_FLAGS)


def openvino_for(art: dict, backend: str, cpuinfo: str = "/proc/cpuinfo") -> str:
    """open_onnx's openvino argument: "yes" when asked for; "auto" (OpenVINO where installed) for a model made for a
    CPU, except an INT8 one made for -t cpu on a CPU without VNNI, which ONNX Runtime runs faster there (vitdeploy's
    docs/cpu-backends.md); "no" otherwise."""
    if backend == "openvino":
        return "yes"
    if backend != "auto" or art.get("target") not in CPU_TARGETS:
        return "no"
    if art.get("precision") == "int8" and art.get("target") != "openvino" and not cpu_int8_dot_exact(cpuinfo):
        return "no"
    return "auto"
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

    def __init__(self, path: Path, dla_core: int | None = None, output: str | None = None) -> None:
        import tensorrt as trt

        self.name = path.name
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
        self.engine = runtime.deserialize_cuda_engine(read_bundle_bytes(path.relative_to(HERE).as_posix(), "engine"))
        if self.engine is None:
            raise RuntimeError(f"{path}: TensorRT cannot load this engine (built by another TensorRT version or GPU?): rebuild it with ./build_engine.sh")
        self.context = self.engine.create_execution_context()
        if self.context is None:
            raise RuntimeError(f"{path.name}: TensorRT could not create an execution context (out of GPU memory, or "
                               f"CUDA failed): free GPU memory and try again; {DRIVER_ADVICE}")
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.output_names = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        # the output the manifest names (an embedding model exported with --tokens has patch_tokens beside it)
        self.output = output if output in self.output_names else self.output_names[0]
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
        return self.outputs(x)[self.output]

    def outputs(self, x: np.ndarray) -> dict:
        """Every output of the engine by name (an engine built with --tokens: embedding and patch_tokens)."""
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
            for o in self.output_names:
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
            return {o: np.asarray(host[:n], np.float32) for o, (host, _) in outs.items()}
        finally:
            for b in bufs:
                cuda.free(b)


def engine_dla_core(plan_file: Path) -> int | None:
    """The DLA core an engine was built for: its vitdeploy sidecar (ENGINE.json), else ENGINE.dla (build_engine.sh)."""
    side = Path(str(plan_file) + ".json")
    try:
        if not side.exists():
            raise OSError(side.name)
        text = read_bundle_bytes(side.relative_to(HERE).as_posix(), "the engine's sidecar", MAX_TEXT_BYTES)
        core = json.loads(text).get("engine", {}).get("options", {}).get("dla_core")
        if core is not None:
            return int(core)
    except (OSError, ValueError, AttributeError, RecursionError):  # no usable sidecar: the .dla marker decides
        pass
    marker = Path(str(plan_file) + ".dla")
    if marker.exists():
        core_text = read_bundle_bytes(marker.relative_to(HERE).as_posix(), "the DLA core file", 64).decode("ascii", "replace")
        try:
            return int(core_text.strip())
        except ValueError:
            raise SystemExit(f"error: {marker.name}: not a DLA core number: rebuild the engine with "
                             "./build_engine.sh --dla N") from None
    return None


TRT_MODULE_MISSING = ("TensorRT's Python module is not installed here (JetPack: sudo apt install python3-libnvinfer; "
                      "a pip install: pip install tensorrt)")


def tensorrt_line(version: object) -> str | None:
    """The TensorRT line a version builds for, as build_engine.sh decides it (8.0-8.5, 8.6, 9/10, 11+)."""
    m = re.match(r"(\d+)\.(\d+)", str(version or ""))
    if not m:
        return None
    major, minor = int(m.group(1)), int(m.group(2))
    if major <= 8:
        return "trt8.5" if minor <= 5 else "trt8.6"
    return "trt10" if major <= 10 else "trt11"


def engine_entries(info: dict, model_rel: str) -> dict[str, dict]:
    """TensorRT line -> {onnx, engine} that build_engine.sh builds for ``model_rel`` there (manifest.json's
    bundle.tensorrt.engines, from which build_engine.sh's table was rendered); where no line builds it (a bundle
    made before that entry, or a model no line builds as intended): the engine beside the model, as
    ``vitdeploy build-engine`` names it."""
    engines = (info.get("tensorrt") or {}).get("engines")
    out = {}
    for line, row in (engines.items() if isinstance(engines, dict) else ()):
        e = row.get(model_rel) if isinstance(row, dict) else None
        if isinstance(e, dict) and isinstance(e.get("engine"), str) and isinstance(e.get("onnx"), str):
            out[line] = e
    if not out:  # no line builds this model (or an older bundle): an engine made from it by hand sits beside it
        out["any"] = {"onnx": model_rel, "engine": model_rel[: -len(".onnx")] + ".engine"}
    return out


def find_engine(info: dict, model_rel: str, backend: str) -> tuple[dict | None, bool]:
    """(the entry of the engine to run, TensorRT importable). With TensorRT: the entry of its line, where that
    engine exists; without: an engine of any line that exists here is one line (never the ONNX in its place)."""
    try:
        import tensorrt as trt
    except ImportError:
        trt = None
    if trt is not None and getattr(trt, "__file__", None) is None and getattr(trt, "__path__", None) is not None:
        trt = None  # a namespace package (tensorrt-stubs, or the bindings' wrapper without its libraries): not TensorRT
    entries = engine_entries(info, model_rel)
    line = tensorrt_line(getattr(trt, "__version__", None)) if trt is not None else None
    present = [e for e in entries.values() if (HERE / e["engine"]).exists() or os.path.islink(HERE / e["engine"])]
    if trt is not None and line in entries:
        want = entries[line]
        if (HERE / want["engine"]).exists() or os.path.islink(HERE / want["engine"]):
            return want, True
        others = sorted({e["engine"] for e in present})
        if others and backend != "onnxruntime":  # engines of other lines only: said, never the ONNX in their place
            raise SystemExit(f"error: {', '.join(others)} {'is' if len(others) == 1 else 'are'} here, but TensorRT "
                             f"{safe(trt.__version__)} runs {want['engine']}: build it with ./build_engine.sh, or check "
                             "the ONNX with --backend onnxruntime")
        if backend == "tensorrt":
            raise SystemExit(f"error: no engine {want['engine']} for TensorRT {safe(trt.__version__)}: build it with "
                             "./build_engine.sh")
        return None, True
    if trt is not None and "any" in entries and present:
        return present[0], True
    if trt is not None and line is None and present:  # a TensorRT whose version is not said: the one engine here
        return present[0], True
    names = sorted({e["engine"] for e in present})
    if trt is None and names and backend != "onnxruntime":
        raise SystemExit(f"error: {', '.join(names)} {'is' if len(names) == 1 else 'are'} here but {TRT_MODULE_MISSING}; "
                         "or check the ONNX with --backend onnxruntime")
    if trt is None and backend == "tensorrt":
        raise SystemExit(f"error: {TRT_MODULE_MISSING}")
    if backend == "tensorrt":
        made = ", ".join(f"{k}: {v['engine']}" for k, v in sorted(entries.items())) or "none"
        raise SystemExit(f"error: no engine for {model_rel} on TensorRT {safe(getattr(trt, '__version__', '?'))} "
                         f"(this bundle builds: {made}): build it with ./build_engine.sh")
    return None, trt is not None


def open_engine(plan_rel: str, dla_core: int | None, output: str | None = None) -> TrtModel:
    plan_file = bundle_file(plan_rel, "engine")
    try:
        return TrtModel(plan_file, dla_core, output)
    except SystemExit:
        raise
    except ImportError:
        raise SystemExit(f"error: {plan_rel} is here but {TRT_MODULE_MISSING}") from None
    except RuntimeError as e:  # a foreign engine, no CUDA runtime, CUDA that cannot start: one line
        raise SystemExit(f"error: {e}") from None
    except Exception as e:  # noqa: BLE001 - a tensorrt module that is not TensorRT's, a garbage plan, ...
        raise SystemExit(f"error: {Path(plan_rel).name}: TensorRT cannot load it ({type(e).__name__}: {_first_line(e)}); "
                         "rebuild it with ./build_engine.sh, or run the ONNX with --backend onnxruntime") from None


def open_onnx(onnx_rel: str, data: bytes, openvino: str = "no") -> OrtModel | OvModel:
    """ONNX Runtime on the ONNX; ``openvino``: "yes" OpenVINO (one line when it is not installed), "auto" OpenVINO
    where it is installed (a model made for a CPU target), "no" never."""
    if openvino != "no":
        try:
            return OvModel(HERE / onnx_rel, data)
        except ImportError:
            if openvino == "yes":
                raise SystemExit("error: OpenVINO is not installed: pip install openvino, or run it with --backend "
                                 "onnxruntime") from None
    try:
        return OrtModel(HERE / onnx_rel, data)
    except ImportError:
        raise SystemExit("error: neither an engine nor onnxruntime here: run ./build_engine.sh, or pip install "
                         "onnxruntime") from None


def open_model(path: Path, backend: str, dla_core: int | None = None) -> OrtModel | OvModel | TrtModel:
    """The engine (``path`` ending .engine/.plan) or the ONNX at ``path``, inside this bundle (tests and callers)."""
    rel = path.resolve().relative_to(HERE).as_posix() if path.is_absolute() else path.as_posix()
    if path.suffix in (".engine", ".plan"):
        return open_engine(rel, dla_core)
    return open_onnx(rel, read_bundle_bytes(rel), "yes" if backend == "openvino" else "no")


def run_batches(model: OrtModel | OvModel | TrtModel, x: np.ndarray, batch: int) -> np.ndarray:
    b = min(batch, model.max_batch or batch)
    return np.concatenate([model(x[i : i + b]) for i in range(0, len(x), b)])


def run_batches_all(model: OrtModel | OvModel | TrtModel, x: np.ndarray, batch: int) -> dict:
    """Every output of the model by name over ``x``, in batches (run_batches for all outputs)."""
    b = min(batch, model.max_batch or batch)
    parts = [model.outputs(x[i : i + b]) for i in range(0, len(x), b)]
    return {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}


def decoded_batches(files: list[Path], pp: dict, batch: int) -> Iterator[tuple[list[Path], np.ndarray]]:
    """(files, uint8 NHWC images) per ``batch`` files, decoded only when the batch is asked for (bounded memory);
    an unreadable file is named on stderr and left out."""
    for i in range(0, len(files), batch):
        ok_files, arrays = [], []
        for f in files[i : i + batch]:
            try:
                arrays.append(load_resized(f, pp))
                ok_files.append(f)
            except SystemExit:
                raise
            except Exception as e:  # noqa: BLE001 - report the file and go on with the others
                print(f"skipped {safe(f)}: {safe(_first_line(e))}", file=sys.stderr)
        yield ok_files, (np.stack(arrays) if arrays else np.zeros((0,), np.uint8))


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


class OneLineParser(argparse.ArgumentParser):
    """argparse that says a usage error in one line (exit 2), not the usage block and the error."""

    def error(self, message: str) -> None:  # type: ignore[override]
        print(f"error: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(2)


BATCH_MAX = 4096  # images per model call: vitdeploy's core/limits.py BATCH_MAX (this file runs without vitdeploy)


def positive_int(text: str, most: int | None = None) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"{v}: give 1 or more")
    if most is not None and v > most:
        raise argparse.ArgumentTypeError(f"{v}: give at most {most}")
    return v


def batch_int(text: str) -> int:
    """--batch: 1 to BATCH_MAX (a billion images per call would reserve their memory before the first one)."""
    return positive_int(text, BATCH_MAX)


def verify_files(info: dict, names: list[str], keep: str | None = None) -> bytes | None:
    """Each model file as manifest.json recorded it (SHA-256): a truncated or corrupted copy is refused. Returns the
    bytes of ``keep`` as they were hashed, so that what runs is what was checked."""
    kept = None
    for rel in names:
        rec = info["artifacts"].get(rel)
        want = rec.get("sha256") if isinstance(rec, dict) else None
        if not want and rel != keep:
            bundle_file(rel)  # unhashed, still one of the bundle's own regular files
            continue
        data = read_bundle_bytes(rel)
        if want and hashlib.sha256(data).hexdigest() != want:
            raise SystemExit(f"error: {safe(rel)} is not the file this bundle was made with (its SHA-256 differs from "
                             "manifest.json's): a corrupted or partial copy? copy the bundle again")
        if rel == keep:
            kept = data
    return kept


def sha256_of(rel: str) -> str:
    """The SHA-256 of a bundle file, read in chunks through one descriptor (a model may be gigabytes)."""
    path = bundle_file(rel)
    h = hashlib.sha256()
    fd = os.open(str(path), os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SystemExit(f"error: manifest.json lists {safe(rel)!r}: not a regular file: copy the bundle again")
        for chunk in iter(lambda: f.read(READ_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def must_match(rel: str, info: dict) -> bool:
    """Whether a listed file decides what --check judges (a model, a reference array or image): it must be the very
    file the bundle was made with. The rest (README, Triton and DeepStream configs, labels.txt, the C++ example, these
    scripts) a user may edit: named as edited, a warning."""
    return rel in info["artifacts"] or rel.endswith(".onnx") or rel.startswith("reference/")


def verify_listed_files(info: dict, hashed: list[str]) -> list[str]:
    """Before judging: every model and reference file manifest.json's bundle.files lists (rel -> SHA-256) is the file
    the bundle was made with, or one line naming it (exit 1); returns the other listed files that were edited or
    removed (a warning). ``hashed``: files verify_files checked already. A bundle without the list: nothing to check."""
    listed = info.get("files")
    if not isinstance(listed, dict):
        return []
    edited = []
    for rel, want in sorted(listed.items()):
        if rel in hashed or not isinstance(rel, str) or not isinstance(want, str):
            continue
        if must_match(rel, info):
            if sha256_of(rel) != want:
                raise SystemExit(f"error: {safe(rel)} is not the file this bundle was made with (its SHA-256 differs "
                                 "from manifest.json's bundle.files): an edited or damaged copy; copy the bundle again")
            continue
        p = HERE / rel
        if not (p.exists() or os.path.islink(p)):
            edited.append(f"{rel} (removed)")
            continue
        try:
            same = sha256_of(rel) == want
        except SystemExit:  # a link out of the bundle, a FIFO in its place: not the file listed
            same = False
        if not same:
            edited.append(rel)
    return edited


def load_reference(rel: object) -> np.ndarray:
    """A reference array (outputs the bundle computed): float32 and finite as vitdeploy wrote it, or one line naming
    the file as damaged (a NaN would read as a cosine of 0, a float16 cast as a model that drifted)."""
    a = load_npy(rel)
    if a.dtype != np.float32:
        raise SystemExit(f"error: {safe(rel)} holds {a.dtype} values, not the float32 the bundle wrote: a damaged or "
                         "edited reference; copy the bundle again")
    bad = int(a.size - np.count_nonzero(np.isfinite(a)))
    if bad:
        raise SystemExit(f"error: {safe(rel)}: {bad} of its {a.size} values are not finite (NaN or infinity): a damaged "
                         "reference file; copy the bundle again")
    return a


# run.py --check's gate on each vector's L2 norm, relative to the reference's, where manifest.json's gates do not say
# (bundles made before the gate): vitdeploy's checks/device_check.py NORM_TOLERANCE (a test holds the two equal)
NORM_TOLERANCE = {"fp32": 0.01, "fp16": 0.01, "int8": 0.05}


def norm_rel_err(got: np.ndarray, ref: np.ndarray) -> np.ndarray:
    """Per row: |‖got‖ − ‖ref‖| / ‖ref‖ in float64 (a zero reference row: 0 when got is zero too, else infinite)."""
    g = np.linalg.norm(np.asarray(got, np.float64), axis=1)
    r = np.linalg.norm(np.asarray(ref, np.float64), axis=1)
    d = np.abs(g - r)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(r > 0, d / np.where(r > 0, r, 1.0), np.where(d > 0, np.inf, 0.0))
    return np.where(np.isfinite(g), out, np.inf)


def norm_gate(info: dict, prec: str) -> float:
    """The largest relative norm error --check allows for ``prec``: manifest.json's, else NORM_TOLERANCE."""
    g = ((info.get("reference") or {}).get("check") or {}).get(prec)
    v = g.get("max_norm_rel_err") if isinstance(g, dict) else None
    if v is None:
        return NORM_TOLERANCE.get(prec, NORM_TOLERANCE["int8"])
    try:
        v = float(v)
    except (TypeError, ValueError):
        v = float("nan")
    if not 0.0 < v < 1.0:
        raise SystemExit(f"error: manifest.json's norm gate for {prec} ({safe(v)}) is not in (0, 1): copy the bundle again")
    return v


def judge_vectors(got: np.ndarray, ref: np.ndarray, gate_mean: float, gate_p1: float, gate_norm: float) -> dict:
    """Rows of ``got`` against ``ref``: per-row cosine (mean, 1st percentile, minimum) and relative norm error (the
    largest); passes when the cosine gates hold and every row's norm is within ``gate_norm`` of the reference's."""
    cos = cosine_rows(got, ref)
    nerr = norm_rel_err(got, ref)
    mean, p1, low = float(cos.mean()), float(np.percentile(cos, 1)), float(cos.min())
    worst = float(nerr.max()) if nerr.size else 0.0
    ok = mean >= gate_mean and p1 >= gate_p1 and worst <= gate_norm
    return {"cosine_mean": mean, "cosine_p1": p1, "cosine_min": low, "norm_rel_err_max": worst if math.isfinite(worst)
            else None, "max_norm_rel_err": gate_norm, "ok": ok}


def read_manifest() -> tuple[dict, dict, dict, list]:
    """manifest.json's bundle info, preprocessing and labels, or one line saying what is wrong with it."""
    name = "manifest.json"
    try:
        manifest = json.loads(read_bundle_bytes(name, "the bundle's", MAX_TEXT_BYTES).decode("utf-8"))
        info, pp, labels = manifest["bundle"], manifest["preprocess"], manifest["labels"]
        info["artifacts"], info["default_model"], pp["input_size"]  # noqa: B018 - present, or the except below
        if not isinstance(info["artifacts"], dict) or not isinstance(labels, list):
            raise TypeError("artifacts")
    except OSError as e:
        raise SystemExit(f"error: {name}: cannot read it ({e.strerror or e}): copy the bundle again") from None
    except ValueError as e:
        raise SystemExit(f"error: {name}: not valid JSON ({_first_line(e)}): copy the bundle again") from None
    except RecursionError:  # [[[[...]]]] deeper than Python's stack: json gives up by recursion, not ValueError
        raise SystemExit(f"error: {name}: nested too deeply to be a bundle manifest: copy the bundle again") from None
    except (KeyError, TypeError) as e:
        raise SystemExit(f"error: {name}: not a bundle manifest (no {e}): copy the bundle again") from None
    return manifest, info, pp, labels


def read_labels_txt() -> list[str] | None:
    """labels.txt's lines, split on '\\n' only (a label may hold \\r, \\x85 or \\u2028 that str.splitlines() breaks
    on), or None where the bundle has none."""
    if not (HERE / "labels.txt").exists() and not os.path.islink(HERE / "labels.txt"):
        return None
    text = read_bundle_bytes("labels.txt", "the bundle's", MAX_TEXT_BYTES).decode("utf-8", errors="replace")
    if not text:
        return []
    return (text[:-1] if text.endswith("\n") else text).split("\n")


def check_labels(labels: list, classes: int) -> None:
    """The labels (manifest.json, and labels.txt beside it) name every class the model gives."""
    if len(labels) != classes:
        raise SystemExit(f"error: manifest.json lists {len(labels)} labels, the model gives {classes} classes: "
                         "copy the bundle again")
    txt = read_labels_txt()
    if txt is not None and len(txt) != classes:
        raise SystemExit(f"error: labels.txt has {len(txt)} labels, the model gives {classes} classes: restore it from "
                         "the bundle (one label per line)")


def load_npy(rel: object) -> np.ndarray:
    import io

    try:
        return np.load(io.BytesIO(read_bundle_bytes(rel)), allow_pickle=False)
    except ValueError as e:
        raise SystemExit(f"error: {safe(rel)}: not a numpy array file ({_first_line(e)}): copy the bundle again") from None


def is_embedding(art: dict) -> bool:
    """Whether a model of this bundle answers an embedding (manifest.json's output kind), not logits."""
    out = art.get("output")
    return isinstance(out, dict) and out.get("kind") == "embedding"


def check_dim(manifest: dict, dim: int) -> None:
    """The vector is as wide as the manifest's task says (an engine of another model gives another width)."""
    task = manifest.get("task")
    want = task.get("dim") if isinstance(task, dict) else None
    if isinstance(want, int) and want > 0 and want != dim:
        raise SystemExit(f"error: manifest.json's task is a {want}-d embedding, the model gives {dim} values per image: "
                         "copy the bundle again, or rebuild the engine with ./build_engine.sh")


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Per-row cosine in float64; a row that is not finite or is all zeros on either side scores 0 (never passes)."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ok: np.ndarray = np.asarray(np.isfinite(a64).all(axis=1) & np.isfinite(b64).all(axis=1))
    a64, b64 = np.where(ok[:, None], a64, 0.0), np.where(ok[:, None], b64, 0.0)
    den = np.linalg.norm(a64, axis=1) * np.linalg.norm(b64, axis=1)
    return np.where(ok & (den > 0), (a64 * b64).sum(axis=1) / np.where(den > 0, den, 1.0), 0.0)


def embedding_gates(info: dict, prec: str) -> tuple[float, float]:
    """(mean, 1st-percentile) per-image cosine run.py --check holds an embedding model to: manifest.json's
    bundle.reference.check[precision], written by vitdeploy bundle from its judge's budget (nothing hard-coded here)."""
    try:
        g = info["reference"]["check"][prec]
        mean, p1 = float(g["min_cosine"]), float(g["min_cosine_p1"])
    except (KeyError, TypeError, ValueError):
        raise SystemExit(f"error: manifest.json has no cosine gates for {prec} (bundle.reference.check): copy the "
                         "bundle again") from None
    if not (0.0 < mean <= 1.0 and 0.0 < p1 <= 1.0):
        raise SystemExit(f"error: manifest.json's cosine gates for {prec} ({mean}, {p1}) are not in (0, 1]: copy the "
                         "bundle again")
    return mean, p1


def check_embeddings(model: Any, art: dict, info: dict, pp: dict, manifest: dict, batch: int) -> dict:
    """--check for an embedding model: the reference inputs through the model, each vector's cosine to the
    reference embedding of the same precision; passes when the mean and 1st percentile meet the manifest's gates."""
    images = load_npy(info["reference"]["inputs"])
    prec = art["precision"]
    try:
        ref_rel = info["reference"]["embeddings"][prec]
    except (KeyError, TypeError):
        raise SystemExit(f"error: manifest.json names no reference embeddings for {prec}: copy the bundle again") from None
    ref = load_reference(ref_rel)
    tok_refs = info["reference"].get("patch_tokens")
    tok_rel = tok_refs.get(prec) if isinstance(tok_refs, dict) else None
    ref_tokens = load_reference(tok_rel) if tok_rel is not None else None
    gate_mean, gate_p1 = embedding_gates(info, prec)
    gate_norm = norm_gate(info, prec)
    outs = run_batches_all(model, model_input(images, art["input"], pp), batch)
    out_name = art["output"].get("name") if isinstance(art.get("output"), dict) else None
    got = outs[out_name] if out_name in outs else next(iter(outs.values()))  # the manifest's output, by name
    if ref.shape != got.shape or got.ndim != 2:
        raise SystemExit(f"error: {safe(ref_rel)} holds embeddings of shape {ref.shape}, the model gives {got.shape} on "
                         f"{len(images)} reference images: copy the bundle again")
    check_dim(manifest, got.shape[1])
    res = {"precision": prec, "images": len(images), "min_cosine": gate_mean, "min_cosine_p1": gate_p1,
           **judge_vectors(got, ref, gate_mean, gate_p1, gate_norm)}
    if ref_tokens is not None:  # the patch tokens, token by token, held to the same gates
        tokens = outs.get(TOKENS_OUTPUT)
        if tokens is None:
            raise SystemExit(f"error: {safe(tok_rel)} holds reference patch tokens, but the model gives no "
                             f"{TOKENS_OUTPUT} output (outputs: {', '.join(map(safe, outs))}): rebuild the engine from "
                             "this bundle's model with ./build_engine.sh")
        if tokens.shape != ref_tokens.shape or tokens.ndim != 3:
            raise SystemExit(f"error: {safe(tok_rel)} holds patch tokens of shape {ref_tokens.shape}, the model gives "
                             f"{tokens.shape} on {len(images)} reference images: copy the bundle again")
        w = tokens.shape[2]
        t = judge_vectors(tokens.reshape(-1, w), ref_tokens.reshape(-1, w), gate_mean, gate_p1, gate_norm)
        res["patch_tokens"] = {"tokens": int(tokens.shape[0] * tokens.shape[1]), **t}
        res["ok"] = bool(res["ok"] and t["ok"])
    return res


TOKENS_OUTPUT = "patch_tokens"  # the second output of an export with --tokens (vitdeploy's core/task.py)


def check_line(r: dict) -> str:
    """The figures of an embedding check after the cosine: the norm, and the patch tokens where checked."""
    err = r["norm_rel_err_max"]
    line = (f"; each vector's norm within {'inf' if err is None else f'{err:.2%}'} of the reference's (at most "
            f"{r['max_norm_rel_err']:.0%})")
    t = r.get("patch_tokens")
    if t:
        terr = t["norm_rel_err_max"]
        line += (f"; patch tokens: {'OK' if t['ok'] else 'FAILED'}, per-token cosine mean {t['cosine_mean']:.6f}, 1st "
                 f"percentile {t['cosine_p1']:.6f}, min {t['cosine_min']:.6f}, norm within "
                 f"{'inf' if terr is None else f'{terr:.2%}'} on {t['tokens']} tokens")
    return line


# --- a gallery (vitdeploy bundle --gallery gallery.faiss): kNN labels by exact search over its vectors -------------
# numpy cannot read a FAISS file, so the bundle ships the index's vectors (float16, L2-normalised, [N, D]) and each
# vector's class; a label is DINOv2's weighted kNN vote (k neighbours, each weighing exp(cos / T) for its class), the
# vote `vitdeploy infer --gallery` casts. The search goes through the gallery GALLERY_CHUNK rows at a time (a memory
# map, never all of it as float32), keeping each image's best k: memory stays bounded at any gallery size.

GALLERY_CHUNK = 65536


def gallery_of(info: dict) -> dict | None:
    g = info.get("gallery")
    return g if isinstance(g, dict) else None


def file_sha256(rel: str) -> str:
    path = bundle_file(rel)
    h = hashlib.sha256()
    with open(str(path), "rb") as f:
        while True:
            block = f.read(READ_CHUNK)
            if not block:
                break
            h.update(block)
    return h.hexdigest()


def load_gallery(g: dict) -> tuple:
    """(vectors [N, D] float16 memory map, class index per row, class names, k, T), each file checked against the
    SHA-256 manifest.json records for it."""
    try:
        vec_rel, cls_rel, names = g["vectors"], g["classes"], g["names"]
        k, temp, sha = int(g["k"]), float(g["temperature"]), g["sha256"]
    except (KeyError, TypeError, ValueError) as e:
        raise SystemExit(f"error: manifest.json's bundle.gallery has no valid {e}: copy the bundle again") from None
    for rel in (vec_rel, cls_rel):
        if not isinstance(sha, dict) or file_sha256(rel) != sha.get(rel):
            raise SystemExit(f"error: {safe(rel)} is not the file this bundle was made with (its SHA-256 differs from "
                             "manifest.json's): a corrupted or partial copy? copy the bundle again")
    try:
        vectors = np.load(str(bundle_file(vec_rel)), mmap_mode="r", allow_pickle=False)
    except ValueError as e:
        raise SystemExit(f"error: {safe(vec_rel)}: not a numpy array file ({_first_line(e)}): copy the bundle again") from None
    classes = load_npy(cls_rel)
    if vectors.ndim != 2 or classes.shape != (vectors.shape[0],) or not (0 < k) or not (temp > 0) or \
            not isinstance(names, list) or (len(classes) and (classes.min() < 0 or classes.max() >= len(names))):
        raise SystemExit(f"error: {safe(vec_rel)} and {safe(cls_rel)} do not make a gallery ({vectors.shape}, "
                         f"{classes.shape}, {len(names) if isinstance(names, list) else '?'} classes): copy the bundle again")
    return vectors, classes, [str(n) for n in names], k, temp


def knn_labels(vectors: np.ndarray, classes: np.ndarray, num_classes: int, queries: np.ndarray, k: int,
               temperature: float, chunk: int = GALLERY_CHUNK) -> tuple:
    """(class index, vote share of it) per query: the exact k most cosine-similar gallery rows, searched a chunk of
    rows at a time, vote exp(cos / T) each for their class."""
    q = np.asarray(queries, np.float32)
    q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    k = max(1, min(k, vectors.shape[0]))
    best_s = np.full((len(q), k), -np.inf, np.float32)
    best_i = np.zeros((len(q), k), np.int64)
    for s in range(0, vectors.shape[0], chunk):
        block = np.asarray(vectors[s : s + chunk], np.float32)
        sim = q @ block.T
        cand_s = np.concatenate([best_s, sim], axis=1)
        cand_i = np.concatenate([best_i, np.broadcast_to(np.arange(s, s + len(block)), sim.shape)], axis=1)
        top = np.argpartition(-cand_s, k - 1, axis=1)[:, :k]
        best_s, best_i = np.take_along_axis(cand_s, top, axis=1), np.take_along_axis(cand_i, top, axis=1)
    z = best_s.astype(np.float64) / temperature
    w = np.exp(z - z.max(axis=1, keepdims=True))
    scores = np.zeros((len(q), num_classes))
    np.add.at(scores, (np.repeat(np.arange(len(q)), k), classes[best_i].ravel()), w.ravel())
    label = scores.argmax(axis=1)
    share = scores[np.arange(len(q)), label] / np.maximum(scores.sum(axis=1), 1e-300)
    return label, share


def check_gallery(model: Any, art: dict, info: dict, pp: dict, batch: int) -> dict:
    """--check with a gallery: the reference images' kNN labels from this model's embeddings equal the ones the
    bundle computed the same way (this function's knn_labels) from its reference embeddings of this precision."""
    g = gallery_of(info)
    vectors, classes, names, k, temp = load_gallery(g or {})
    prec = art["precision"]
    want = (g or {}).get("reference_labels", {}).get(prec) if isinstance((g or {}).get("reference_labels"), dict) else None
    if not isinstance(want, list):
        raise SystemExit(f"error: manifest.json names no reference kNN labels for {prec} (bundle.gallery): copy the "
                         "bundle again")
    images = load_npy(info["reference"]["inputs"])
    got = run_batches(model, model_input(images, art["input"], pp), batch)
    label, _ = knn_labels(vectors, classes, len(names), got, k, temp)
    mine = [names[i] for i in label]
    differ = [i for i, (a, b) in enumerate(zip(mine, want)) if a != b]  # noqa: B905 - Python 3.8
    return {"gallery": {"images": len(mine), "vectors": int(vectors.shape[0]), "k": k, "agree": len(mine) - len(differ),
                        "differ": differ, "ok": not differ and len(want) == len(mine)}}


def gallery_lines(gallery: tuple, files: list, out: np.ndarray, as_json: bool) -> None:
    """Each image's kNN label and its vote share (the bundle's gallery), one line (or JSON line) per image."""
    vectors, classes, names, k, temp = gallery
    label, share = knn_labels(vectors, classes, len(names), out, k, temp)
    for f, i, sh in zip(files, label, share):  # noqa: B905 - Python 3.8 (JetPack 5) has no strict=
        print(json.dumps({"path": str(f), "label": names[i], "index": int(i), "score": float(sh), "knn": k})
              if as_json else f"{safe(f)}\t{safe(names[i])}\t{sh:.4f}")
    sys.stdout.flush()


HEAD_VALUES = 8  # values of each vector printed as text (--json prints all); the C++ example prints as many


def vector_line(path: object, v: np.ndarray) -> str:
    """One text line per image for an embedding model: path, width, L2 norm, the first values."""
    norm = float(np.linalg.norm(np.asarray(v, np.float64)))
    head = " ".join(f"{float(x):.4f}" for x in v[:HEAD_VALUES]) + (" ..." if len(v) > HEAD_VALUES else "")
    return f"{safe(path)}\t{len(v)}-d\tnorm {norm:.4f}\t{head}"


def sidecar_name(out: Path) -> Path:
    """The file-name list beside --out's array: emb.npy -> emb.files.txt."""
    return out.with_name(out.name[: -len(".npy")] + ".files.txt")


def _spot(p: object) -> str:
    """Where a path's name sits: its folder resolved, its last part as given (a link there is not followed)."""
    a = os.path.abspath(str(p))
    return os.path.join(os.path.realpath(os.path.dirname(a)), os.path.basename(a))


def _same_file(a: object, b: object) -> bool:
    try:
        return os.path.samefile(str(a), str(b))
    except OSError:
        return False


def bundle_listed(info: dict) -> list[Path]:
    """The bundle's own files, which --out never writes: manifest.json, every file it lists (bundle.files), its
    models and its reference arrays."""
    names = ["manifest.json"]
    files = info.get("files")
    names += [k for k in files if isinstance(k, str)] if isinstance(files, dict) else []
    names += [k for k in info.get("artifacts") or {} if isinstance(k, str)]
    ref: dict = info["reference"] if isinstance(info.get("reference"), dict) else {}
    logits: dict = ref["logits"] if isinstance(ref.get("logits"), dict) else {}
    for v in [ref.get("inputs"), *logits.values()]:
        if isinstance(v, str):
            names.append(v)
    return [HERE / n for n in names]


def out_refusal(out: Path, inputs: list[Path], listed: list[Path]) -> str:
    """Why --out (or its file list) may not be written, '' when it may: it is an input, a symlink or hard link to
    one, or an existing file of an input folder; or it is one of the bundle's own files (``listed``), by its name or
    through a link. The rule of vitdeploy's core/outputs.py (output_refusal, its check_output), copied here since
    run.py cannot import vitdeploy; tests hold the two to the same cases. The rename that writes --out replaces a
    link there, never writes through it."""
    for i in inputs:
        if os.path.exists(str(i)) and _same_file(out, i):
            return f"{safe(out)} is the input {safe(i)}"
    for i in inputs:
        if os.path.isdir(str(i)) and os.path.exists(str(out)) and not os.path.isdir(str(out)):
            real, folder = os.path.realpath(str(out)), os.path.realpath(str(i))
            if real.startswith(folder.rstrip(os.sep) + os.sep):
                return f"{safe(out)} is a file of the input folder {safe(i)}"
    for f in listed:
        if _spot(out) == _spot(f) or (os.path.exists(str(f)) and _same_file(out, f)):
            return f"{safe(out)} is the bundle's own {safe(os.path.relpath(str(f), str(HERE)))}"
    return ""


# FILE.files.txt's lines: vitdeploy's core/file_list.py rule, copied (this file cannot import vitdeploy; a test holds
# the two alike): a backslash as \\, LF/CR/tab as \n \r \t, other ASCII controls and bytes that are not UTF-8 as \xNN,
# C1 controls, bidi marks, separators and the BOM as \uXXXX. One line means one name: "a<LF>b.png" is a\nb.png, a
# name spelled a\nb.png is a\\nb.png.
_LISTED = re.compile("[\\\\\x00-\x1f\x7f-\x9f\u200e\u200f\u2028-\u202e\u2066-\u2069\ufeff\ud800-\udfff]")


def _list_escape(c: str) -> str:
    named = {"\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    o = ord(c)
    if c in named:
        return named[c]
    if o < 0x80:
        return f"\\x{o:02x}"
    return f"\\x{o - 0xDC00:02x}" if 0xDC80 <= o <= 0xDCFF else f"\\u{o:04x}"


def list_line(name: object) -> str:
    """One line of FILE.files.txt (no line end): the file name, escaped as the rule above says."""
    s = os.fsdecode(name) if isinstance(name, (bytes, os.PathLike)) else str(name)
    return _LISTED.sub(lambda m: _list_escape(m.group()), s)


def save_outputs(out: Path, rows: list[np.ndarray], files: list[Path]) -> None:
    """--out: the [N, D] float32 array (numpy's .npy) and the file names (one a line, escaped by ``list_line`` so that
    each line means one name), each written to a temporary file beside it and renamed into place (a link there is
    replaced, never written through; out_refusal has refused an input or a bundle file before any work)."""
    import tempfile

    arr = np.concatenate(rows) if rows else np.zeros((0, 0), np.float32)
    mask = os.umask(0o022)
    os.umask(mask)
    for dest, write in ((out, lambda f: np.save(f, np.ascontiguousarray(arr, np.float32), allow_pickle=False)),
                        (sidecar_name(out), lambda f: f.write("".join(f"{list_line(p)}\n" for p in files).encode("utf-8")))):
        fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=str(dest.parent))
        try:
            os.fchmod(fd, 0o666 & ~mask)  # the mode a new file gets here (mkstemp alone: 0600)
            with os.fdopen(fd, "wb") as f:
                write(f)
            os.replace(tmp, dest)
        except BaseException:
            if os.path.exists(tmp):
                os.unlink(tmp)
            raise


def tokens_name(out: Path) -> Path:
    """The patch tokens beside --out's array, for a model exported with --tokens: emb.npy -> emb.patch_tokens.npy."""
    return out.with_name(out.name[: -len(".npy")] + ".patch_tokens.npy")


def save_tokens(out: Path, parts: list[np.ndarray]) -> Path:
    """--out of a model with patch tokens: its [N, patches, width] float32 array too, written to a temporary file
    beside it and renamed into place (as save_outputs writes the vectors)."""
    import tempfile

    dest = tokens_name(out)
    arr = np.ascontiguousarray(np.concatenate(parts) if parts else np.zeros((0, 0, 0), np.float32), np.float32)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.", dir=str(dest.parent))
    try:
        with os.fdopen(fd, "wb") as f:
            np.save(f, arr, allow_pickle=False)
        os.replace(tmp, dest)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return dest


def has_tokens(art: dict) -> bool:
    """Whether a model of this bundle answers patch tokens too (manifest.json's outputs: an export with --tokens)."""
    outs = art.get("outputs")
    return isinstance(outs, list) and any(isinstance(o, dict) and o.get("name") == TOKENS_OUTPUT for o in outs)


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
    ap.add_argument("--backend", choices=("auto", "tensorrt", "onnxruntime", "openvino"), default="auto",
                    help="auto: the engine beside the ONNX when TensorRT loads; else, for a model made for a CPU target "
                         "(calibrate -t cpu), OpenVINO where it is installed; else ONNX Runtime")
    ap.add_argument("--batch", type=batch_int, default=8, help=f"images per call (1 to {BATCH_MAX})")
    ap.add_argument("--top", type=positive_int, default=1, help="labels to print per image")
    ap.add_argument("--json", action="store_true", help="print JSON lines instead of text")
    ap.add_argument("--dla-core", type=int, default=None,
                    help="the DLA core of a DLA engine (default: from its sidecar, or ENGINE.dla that build_engine.sh writes)")
    ap.add_argument("--check", action="store_true", help="compare with the bundle's reference logits (an embedding "
                    "model: embeddings, by per-image cosine); exit 1 when they differ")
    ap.add_argument("--out", metavar="FILE.npy", help="also save every image's output row (an embedding model: its "
                    "vector) as one [N, D] float32 array, and the file names in FILE.files.txt, one a line (a "
                    "backslash written \\\\, a line feed \\n)")
    args = ap.parse_args(argv)
    out_path = None
    if args.out is not None:
        if args.check:
            ap.error("--out saves the outputs of the images given; --check compares the bundle's references")
        out_path = Path(args.out)
        if not out_path.name.endswith(".npy") or out_path.name == ".npy":
            ap.error(f"--out {safe(args.out)}: give a file name ending in .npy")
        if not out_path.parent.is_dir():
            ap.error(f"--out {safe(args.out)}: no folder {safe(out_path.parent)}")

    manifest, info, pp, labels = read_manifest()
    for dest in ([out_path, sidecar_name(out_path)] if out_path is not None else []):
        why = out_refusal(dest, [Path(a) for a in args.images], bundle_listed(info))
        if why:
            ap.error(f"--out {safe(args.out)}: {why}: save it elsewhere (the bundle's files and the images are never "
                     "written over)")
    rel = args.model if args.model is not None else info["default_model"]
    if not isinstance(rel, str) or not rel:
        raise SystemExit(f"error: manifest.json's bundle.default_model is {safe(repr(rel))}, not the name of one of its "
                         "models: copy the bundle again")
    given = Path(rel)
    try:  # a model of this bundle: a path relative to it, or an absolute path into it; never a file elsewhere
        rel = (given.resolve() if given.is_absolute() else (HERE / given).resolve()).relative_to(HERE).as_posix()
    except (ValueError, OSError, RuntimeError):
        if args.model is None:  # the manifest's own default, not an option the user gave
            raise SystemExit(f"error: manifest.json's bundle.default_model {safe(rel)!r}: not a file of this bundle: "
                             "copy the bundle again") from None
        ap.error(f"--model {safe(args.model)}: not a file of this bundle (give one of: {', '.join(map(safe, info['artifacts']))})")
    entry = None
    if Path(rel).suffix in (".engine", ".plan"):  # an engine named: the entry whose engine it is
        found = [(k, e) for row in ((info.get("tensorrt") or {}).get("engines") or {}).values() if isinstance(row, dict)
                 for k, e in row.items() if isinstance(e, dict) and e.get("engine") == rel]
        onnx_rel, entry = found[0] if found else (rel.rsplit(".", 1)[0] + ".onnx", {"onnx": rel.rsplit(".", 1)[0] + ".onnx", "engine": rel})
        if args.backend in ("onnxruntime", "openvino"):
            named = f"--model {safe(rel)}" if args.model is not None else f"manifest.json's default model {safe(rel)}"
            ap.error(f"{named} is an engine: --backend {args.backend} runs an ONNX (--model {safe(onnx_rel)})")
    else:
        onnx_rel = rel
    if onnx_rel not in info["artifacts"]:
        raise SystemExit(f"error: {safe(rel)} is not one of this bundle's models: {', '.join(map(safe, info['artifacts']))}")
    if entry is None and args.backend not in ("onnxruntime", "openvino"):
        entry, _ = find_engine(info, onnx_rel, args.backend)
    run_onnx = entry["onnx"] if entry else onnx_rel
    art = info["artifacts"].get(run_onnx)
    if not isinstance(art, dict):
        raise SystemExit(f"error: manifest.json's engine entry names {safe(run_onnx)}, which is not one of its models: "
                         "copy the bundle again")
    data = verify_files(info, list(info["artifacts"]) if args.check else [run_onnx], None if entry else run_onnx)
    edited = verify_listed_files(info, list(info["artifacts"])) if args.check else []
    if edited:  # files a user may edit (README, Triton/DeepStream configs): said, the check does not read them
        print(f"warning: edited since the bundle was made (their SHA-256 differs from manifest.json's bundle.files): "
              f"{', '.join(map(safe, edited))}", file=sys.stderr)
    ov = openvino_for(art, args.backend)
    out_name = art["output"].get("name") if isinstance(art.get("output"), dict) else None
    model: OrtModel | OvModel | TrtModel = (open_engine(entry["engine"], args.dla_core, out_name) if entry
                                            else open_onnx(run_onnx, data or b"", ov))
    del data
    ran = f"{entry['engine']} (built from {run_onnx})" if entry else run_onnx

    embedding = is_embedding(art)
    if args.check and embedding:
        result = {"model": run_onnx, "engine": entry["engine"] if entry else None, "backend": model.backend,
                  **check_embeddings(model, art, info, pp, manifest, args.batch), "edited": edited}
        if gallery_of(info) is not None:  # the kNN labels too, against the bundle's on the reference images
            result.update(check_gallery(model, art, info, pp, args.batch))
            result["ok"] = result["ok"] and result["gallery"]["ok"]
        if isinstance(model, TrtModel):
            result["receipt"] = model.receipt()
        r = result
        print(json.dumps(result) if args.json else
              f"{'OK' if r['ok'] else 'FAILED'}: {safe(ran)} on {model.backend} vs reference {r['precision']} embeddings: "
              f"per-image cosine mean {r['cosine_mean']:.6f} (at least {r['min_cosine']}), 1st percentile "
              f"{r['cosine_p1']:.6f} (at least {r['min_cosine_p1']}), min {r['cosine_min']:.6f} on {r['images']} images"
              + check_line(r))
        if "receipt" in result and not args.json:
            print_receipt(result["receipt"])
        if "gallery" in result and not args.json:
            gr = result["gallery"]
            print(f"{'OK' if gr['ok'] else 'FAILED'}: kNN labels over the gallery's {gr['vectors']} vectors (k={gr['k']}) "
                  f"agree with the bundle's on {gr['agree']} of {gr['images']} reference images"
                  + (f" (differ: {', '.join(map(str, gr['differ']))})" if gr["differ"] else ""))
        return 0 if r["ok"] else 1
    if args.check:
        images = load_npy(info["reference"]["inputs"])
        prec = art["precision"]
        ref = load_reference(info["reference"]["logits"][prec])
        got = run_batches(model, model_input(images, art["input"], pp), args.batch)
        if ref.shape != got.shape:
            raise SystemExit(f"error: {safe(info['reference']['logits'][prec])} holds logits of shape {ref.shape}, the "
                             f"model gives {got.shape} on {len(images)} reference images: copy the bundle again")
        check_labels(labels, got.shape[1])
        if art["output"]["kind"] == "probs":
            ref = softmax(ref)
        diff = float(np.abs(got - ref).max() / max(float(np.abs(ref).max()), 1e-12))
        agree = float((got.argmax(1) == ref.argmax(1)).mean())
        tol = float(info["reference"]["tolerance"][prec])
        ok = diff <= tol
        result = {"model": run_onnx, "engine": entry["engine"] if entry else None, "backend": model.backend,
                  "precision": prec, "images": len(images), "max_rel_diff": diff, "tolerance": tol,
                  "top1_agreement": agree, "ok": ok, "edited": edited}
        if isinstance(model, TrtModel):
            result["receipt"] = model.receipt()
        print(json.dumps(result) if args.json else
              f"{'OK' if ok else 'FAILED'}: {safe(ran)} on {model.backend} vs reference {prec} logits: max |Δ| {diff:.2e} of "
              f"the largest logit (tolerance {tol:.0e}), top-1 agreement {agree:.1%} on {len(images)} images")
        if "receipt" in result and not args.json:
            print_receipt(result["receipt"])
        return 0 if ok else 1

    files = list_images(args.images)
    if not files:
        ap.error("give image files or folders (or --check)")
    gallery = load_gallery(gallery_of(info) or {}) if embedding and gallery_of(info) is not None else None
    status, done, checked = 0, 0, False
    saved_rows: list[np.ndarray] = []
    saved_tokens: list[np.ndarray] = []
    tokens_too = out_path is not None and has_tokens(art)  # --out of an export with --tokens: saved beside it
    saved_files: list[Path] = []
    for ok_files, batch in decoded_batches(files, pp, args.batch):
        if len(ok_files) < min(args.batch, len(files) - done):
            status = 3
        done += min(args.batch, len(files) - done)
        if not ok_files:
            continue
        if tokens_too:
            outs = run_batches_all(model, model_input(batch, art["input"], pp), args.batch)
            main_name = art["output"].get("name") if isinstance(art.get("output"), dict) else None
            out = outs[main_name] if main_name in outs else next(iter(outs.values()))
            if TOKENS_OUTPUT not in outs:
                raise SystemExit(f"error: {safe(ran)} gives no {TOKENS_OUTPUT} output, though manifest.json lists one: "
                                 "rebuild the engine from this bundle's model with ./build_engine.sh")
            saved_tokens.append(outs[TOKENS_OUTPUT])
        else:
            out = run_batches(model, model_input(batch, art["input"], pp), args.batch)
        if not checked:
            if embedding:
                check_dim(manifest, out.shape[1])
            else:
                check_labels(labels, out.shape[1])
            checked = True
        if out_path is not None:
            saved_rows.append(out)
            saved_files += ok_files
        if gallery is not None:  # an embedding model with a gallery: each image's kNN label
            gallery_lines(gallery, ok_files, out, args.json)
            continue
        if embedding:
            for f, v in zip(ok_files, out):  # noqa: B905 - Python 3.8 (JetPack 5) has no strict=
                print(json.dumps({"path": str(f), "dim": int(v.shape[0]), "norm": float(np.linalg.norm(v.astype(np.float64))),
                                  "embedding": [float(x) for x in v]}) if args.json else vector_line(f, v))
            sys.stdout.flush()
            continue
        probs = out if art["output"]["kind"] == "probs" else softmax(out)
        for f, p in zip(ok_files, probs):  # noqa: B905 - Python 3.8 (JetPack 5) has no strict=
            top = np.argsort(-p)[: args.top]
            if args.json:
                print(json.dumps({"path": str(f), "label": labels[top[0]], "index": int(top[0]), "score": float(p[top[0]]),
                                  "top": [{"label": labels[i], "score": float(p[i])} for i in top]}))
            else:
                print(f"{safe(f)}\t" + "\t".join(f"{safe(labels[i])}\t{p[i]:.4f}" for i in top))
        sys.stdout.flush()
    if out_path is not None and checked:
        save_outputs(out_path, saved_rows, saved_files)
        print(f"saved {sum(len(r) for r in saved_rows)} rows to {safe(out_path)} and their files to "
              f"{safe(sidecar_name(out_path))}", file=sys.stderr)
        if tokens_too:
            print(f"saved their patch tokens to {safe(save_tokens(out_path, saved_tokens))}", file=sys.stderr)
    return status if checked else 1


def print_receipt(r: dict) -> None:
    """The engine's precision receipt, one line (run.py --check on TensorRT)."""
    share = ", ".join(f"{k} {v:.0%}" for k, v in sorted((r.get("gemm_share") or {}).items(), key=lambda kv: -kv[1]))
    print(f"precision receipt: GEMM FLOPs {share}; attention fused: {(r.get('attention') or {}).get('fused')}; "
          f"{len(r.get('fp32_layers') or [])} FP32 layers" if r.get("status") == "ok"
          else f"precision receipt: unknown ({safe(r.get('reason'))})")


if __name__ == "__main__":
    sys.exit(main())
