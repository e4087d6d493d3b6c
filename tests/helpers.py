"""Helpers shared by several test modules (not a test module: test modules import it, never each other)."""

from __future__ import annotations

import ctypes
import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import onnx
from onnx import numpy_helper
from PIL import Image

from vitdeploy.core.manifest import Manifest, set_onnx_manifest


def export_model_onnx(model: Any, out: Path, manifest: Manifest) -> Path:
    """An in-memory torch model (no checkpoint) written as `vitdeploy export` lays it out: input pixel_values, output
    logits, dynamic batch, the manifest in metadata_props. For the digits model use the session fixtures instead."""
    import torch

    h, w = manifest.input_size
    torch.onnx.export(
        model.eval(), (torch.zeros(1, 3, h, w),), str(out), dynamo=False, opset_version=17,
        input_names=["pixel_values"], output_names=["logits"],
        dynamic_axes={"pixel_values": {0: "batch"}, "logits": {0: "batch"}},
    )
    m = onnx.load(str(out))
    set_onnx_manifest(m, manifest)
    onnx.save(m, str(out))
    return out


def ort_run(path: Path, x: np.ndarray) -> np.ndarray:
    """Logits of an ONNX model on ONNX Runtime's CPU provider (2 threads), independent of vitdeploy's runners."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    s = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])
    return np.asarray(s.run(None, {s.get_inputs()[0].name: x})[0], np.float32)


def paired_margin(a: np.ndarray, b: np.ndarray) -> float:
    """The margin, in images, within which two paired success counts (``a``, ``b``: per image, did each model get it
    right, or agree with FP32) are a tie: two standard errors of their difference (McNemar), 2·sqrt(d), d the images on
    which exactly one of the two succeeds. Two INT8 models of one FP32 model differ on a handful of images, and which
    of those each gets right moves with the CPU's INT8 kernels (oneDNN and MLAS run VNNI/AMX, AVX-512 and AVX2 paths
    that round differently): on a VNNI CPU NNCF's INT8 scored 2 images above FP32 while ours scored 1 below, 3 images
    (0.83 pt of 360) apart. A difference within this margin is noise, not a ranking; assert ``a.sum() >= b.sum() -
    paired_margin(a, b)`` for "a is not significantly worse than b"."""
    return 2.0 * float(np.sqrt(np.count_nonzero(np.asarray(a) != np.asarray(b))))


def rel_err(a: np.ndarray, b: np.ndarray) -> float:
    """Largest absolute difference relative to the largest magnitude of the reference ``b``."""
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def load_run_py(path: Path) -> ModuleType:
    """A bundle's run.py imported as a module under a name of its own (several copies may be loaded in one session)."""
    spec = importlib.util.spec_from_file_location(f"bundle_run_{abs(hash(str(path)))}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class HostCuda:
    """libcudart stand-in: 'device' buffers are host buffers, copies are memmoves."""

    H2D, D2H = 1, 2

    def __init__(self) -> None:
        self.buffers: dict[int, ctypes.Array] = {}
        self.copies: list[int] = []

    def malloc(self, n: int) -> int:
        buf = (ctypes.c_uint8 * max(n, 1))()
        self.buffers[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    def free(self, p: int) -> None:
        del self.buffers[p]

    def stream(self) -> int:
        return 0

    def copy(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.copies.append(kind)
        ctypes.memmove(dst, src, n)

    def sync(self, stream: int) -> None:
        pass


def write_plan(engine: Path, onnx_path: Path, version: str, min_batch: int, opt_batch: int, max_batch: int,
               dla_core: int | None = None) -> None:
    """An engine file as tests/trt_mock.py's builder writes it (the ONNX it runs, the profile, the DLA core)."""
    import onnxruntime as ort

    inp = ort.InferenceSession(str(onnx_path), providers=["CPUExecutionProvider"]).get_inputs()[0]
    rest = list(inp.shape[1:])
    plan = {"version": version, "onnx": str(onnx_path), "dla_core": dla_core,
            "profile": [inp.name, [min_batch, *rest], [opt_batch, *rest], [max_batch, *rest]]}
    engine.write_bytes(json.dumps(plan).encode())


class FakeHostCuda:
    """vitdeploy.runners.tensorrt.cuda.CudaRuntime stand-in: "device" memory is host memory, copies are memmoves."""

    def __init__(self, cc: tuple[int, int] = (8, 7)) -> None:
        self.cc = cc
        self.blocks: dict[int, Any] = {}
        self.copies = 0

    def _alloc(self, n: int) -> int:
        buf = ctypes.create_string_buffer(max(int(n), 1))
        self.blocks[ctypes.addressof(buf)] = buf
        return ctypes.addressof(buf)

    malloc = malloc_host = _alloc

    def free(self, p: int) -> None:
        self.blocks.pop(p)

    free_host = free

    def memcpy_async(self, dst: int, src: int, n: int, kind: int, stream: int) -> None:
        self.copies += 1
        ctypes.memmove(dst, src, n)

    def device_count(self) -> int:
        return 1

    def set_device(self, d: int) -> None:
        pass

    def compute_capability(self, d: int = 0) -> tuple[int, int]:
        return self.cc

    def device_name(self, d: int = 0) -> str:
        return "Fake Orin"

    def runtime_version(self) -> str:
        return "12.6"

    def stream_create(self) -> int:
        return 1234

    def stream_synchronize(self, s: int) -> None:
        pass

    def stream_destroy(self, s: int) -> None:
        pass


def save_in_mode(img: Image.Image, path: Path, mode: str) -> Path:
    """Save a greyscale/RGB image in the given PIL mode, choosing a format that can hold it."""
    rgb = img.convert("RGB")
    if mode == "I;16":
        a = (np.asarray(img.convert("L"), np.uint16) * 257).astype(np.uint16)
        im = Image.fromarray(a)
        assert im.mode == "I;16"
        path = path.with_suffix(".png")
    elif mode == "CMYK":
        im = rgb.convert("CMYK")
        path = path.with_suffix(".jpg")
    elif mode == "F":
        im = Image.fromarray(np.asarray(img.convert("L"), np.float32) / 255.0)
        path = path.with_suffix(".tiff")
    elif mode == "P":
        im = rgb.convert("P", palette=Image.Palette.ADAPTIVE)
        path = path.with_suffix(".gif")
    elif mode in ("LA", "RGBA"):
        im = rgb.convert(mode)
        path = path.with_suffix(".png")
    elif mode == "1":
        im = img.convert("1")
        path = path.with_suffix(".bmp")
    else:
        im = rgb.convert(mode)
        path = path.with_suffix(".png" if mode != "RGB" else ".jpg")
    im.save(path)
    return path


MODES = ["L", "LA", "P", "RGBA", "CMYK", "I;16", "RGB", "1", "F"]


def with_spread(model: onnx.ModelProto, k: float, channels: list[int]) -> onnx.ModelProto:
    """The exactly equivalent model with a k× spread: LayerNorm γ/β of ``channels`` ×k, the consuming rows ÷k (at every
    LayerNorm → MatMul site graph.smooth can edit, so on every family: QKV, fc1 or SwiGLU's fc1_g/fc1_x, a MAP head's kv)."""
    m = onnx.ModelProto()
    m.CopyFrom(model)
    inits = {i.name: i for i in m.graph.initializer}

    def edit(name: str, rows: slice | list[int], by: float) -> None:
        a = numpy_helper.to_array(inits[name]).copy()
        a[rows] *= np.float32(by)
        inits[name].CopyFrom(numpy_helper.from_array(a, name))

    from vitdeploy.graph.smooth import sites

    for s in sites(m):
        for name in (s.gamma, s.beta):
            if name:
                edit(name, channels, k)
        for w in s.weights:
            edit(w, channels, 1.0 / k)
    return m


def tiny_bundle(d: Path, target: str | None = None) -> Path:
    """A real bundle (``vitdeploy.stages.bundle``) of a one-MatMul classifier made for ``target``, under ``d``:
    seconds to make, so run.py's reads can be tried on copies of it."""
    from onnx import TensorProto, helper

    from vitdeploy.core.preprocess import Preprocess
    from vitdeploy.stages.bundle import BundleOptions, bundle

    w = numpy_helper.from_array(np.random.default_rng(0).normal(0, 0.02, (3 * 16 * 16, 5)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("Flatten", ["pixel_values"], ["flat"], axis=1, name="flatten"),
         helper.make_node("MatMul", ["flat", "W"], ["logits"], name="head")],
        "linear", [helper.make_tensor_value_info("pixel_values", TensorProto.FLOAT, ["batch", 3, 16, 16])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 5])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    pp = Preprocess(input_size=(16, 16), resize_mode="squash", interpolation="bilinear")
    set_onnx_manifest(model, Manifest(model={"num_classes": 5, "image_size": [16, 16]}, labels=list("abcde"),
                                      preprocess=pp.to_dict(), name="tiny", precision="fp32", target=target))
    onnx.save(model, str(d / "model.onnx"))
    out = d / "bundle"
    bundle([d / "model.onnx"], out, BundleOptions(references=4))
    return out
