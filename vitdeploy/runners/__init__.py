"""Open any artifact vitdeploy reads behind the one Runner interface; backends import lazily."""

from __future__ import annotations

from pathlib import Path

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import ENGINE_SUFFIXES
from vitdeploy.runners.base import Runner

BACKENDS = ("auto", "torch", "onnxruntime", "openvino", "tensorrt", "oracle")
# The backends that can run each kind of artifact.
BACKENDS_OF_KIND = {"checkpoint": ("torch",), "onnx": ("onnxruntime", "openvino"), "engine": ("tensorrt",)}


def artifact_kind(path: str | Path) -> str:
    """'checkpoint', 'onnx' or 'engine', by what the path is."""
    p = Path(path)
    if p.suffix == ".onnx":
        return "onnx"
    if p.suffix in ENGINE_SUFFIXES:
        return "engine"
    return "checkpoint"


def default_backend(path: str | Path, device: str = "cpu") -> str:
    """The fastest installed backend for the artifact (what ``auto`` picks).

    An ONNX model on a CPU runs on OpenVINO where it is installed: measured faster than ONNX Runtime on FP32,
    FP16 and Q/DQ INT8 graphs alike (README "Backends"); else on ONNX Runtime, which also serves ``--device cuda``.
    An INT8 model on a CPU without VNNI runs on ONNX Runtime (``_int8_off_openvino``).
    """
    kind = artifact_kind(path)
    if kind == "onnx":
        from vitdeploy.runners.openvino.loader import openvino_installed

        if device != "cpu" or not openvino_installed():
            return "onnxruntime"
        return "onnxruntime" if _int8_off_openvino(path) else "openvino"
    return {"checkpoint": "torch", "engine": "tensorrt"}[kind]


def _int8_off_openvino(path: str | Path) -> bool:
    """An INT8 model on a CPU without VNNI (AVX2 only) runs on ONNX Runtime: one made for TensorRT (8-bit weights in
    its first layer) because OpenVINO's first-layer int8 kernel saturates there (graph/quantize.py,
    first_layer_overflow_fix), one made for ``-t cpu`` because ONNX Runtime runs it faster there (vit-small: 1.49-1.70x
    ONNX Runtime's FP32, OpenVINO 0.88x; docs/cpu-backends.md). One made for ``-t openvino`` stays on OpenVINO, where
    its guard judged it. A VNNI CPU reads no file here."""
    from vitdeploy.core.host import cpu_int8_dot_exact

    if cpu_int8_dot_exact():
        return False
    from vitdeploy.core.artifact import read_manifest

    try:
        m = read_manifest(path)
    except Exception:  # not ours or unreadable: open_runner says why
        return False
    return m.precision == "int8" and m.target != "openvino"


def open_runner(path: str | Path, backend: str = "auto", threads: int | None = None, device: str = "cpu") -> Runner:
    """A Runner for the artifact on the chosen backend ('auto': the artifact's natural one)."""
    p = Path(path)
    if not p.exists():
        raise VitdeployError(f"{p}: no such file or folder")
    if backend not in BACKENDS:
        raise UsageError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    kind = artifact_kind(p)
    if backend == "oracle" and kind == "onnx":  # named only, never picked by auto: what TensorRT computes (runners/oracle)
        from vitdeploy.runners.oracle.runner import OracleRunner

        return OracleRunner(p, threads=threads)
    want = default_backend(p, device) if backend == "auto" else backend
    ok = BACKENDS_OF_KIND[kind]
    if want not in ok:
        what = {"checkpoint": "a checkpoint", "onnx": "an ONNX model", "engine": "a TensorRT engine"}.get(kind, kind)
        raise VitdeployError(f"{p}: {what} runs on {' or '.join(ok)}, not {want}: pass --backend {ok[0]} (or auto)")
    if want == "torch":
        from vitdeploy.runners.torch import TorchRunner

        return TorchRunner(p, device=device, threads=threads)
    if want == "onnxruntime":
        from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else None
        return OnnxRuntimeRunner(p, providers=providers, threads=threads)
    if want == "openvino":
        if device != "cpu":
            raise VitdeployError(f"{p}: vitdeploy runs OpenVINO on the CPU only; pass --device cpu or --backend onnxruntime")
        from vitdeploy.runners.openvino.loader import import_openvino
        from vitdeploy.runners.openvino.runner import OpenVinoRunner

        import_openvino()  # one line saying how to install it, before the manifest is read
        return OpenVinoRunner(p, threads=threads)
    from vitdeploy.runners.tensorrt.runner import TensorRTRunner  # type: ignore[import-not-found]

    return TensorRTRunner(p)


__all__ = ["Runner", "open_runner", "artifact_kind", "default_backend", "BACKENDS", "BACKENDS_OF_KIND"]
