"""Open any artifact vitdeploy reads behind the one Runner interface; backends import lazily."""

from __future__ import annotations

from pathlib import Path

from vitdeploy.errors import VitdeployError
from vitdeploy.manifest import ENGINE_SUFFIXES
from vitdeploy.runners.base import Runner

BACKENDS = ("auto", "torch", "onnxruntime", "tensorrt")
# The backends that can run each kind of artifact.
BACKENDS_OF_KIND = {"checkpoint": ("torch",), "onnx": ("onnxruntime",), "engine": ("tensorrt",)}


def artifact_kind(path: str | Path) -> str:
    """'checkpoint', 'onnx' or 'engine', by what the path is."""
    p = Path(path)
    if p.suffix == ".onnx":
        return "onnx"
    if p.suffix in ENGINE_SUFFIXES:
        return "engine"
    return "checkpoint"


def default_backend(path: str | Path) -> str:
    return {"checkpoint": "torch", "onnx": "onnxruntime", "engine": "tensorrt"}[artifact_kind(path)]


def open_runner(path: str | Path, backend: str = "auto", threads: int | None = None, device: str = "cpu") -> Runner:
    """A Runner for the artifact on the chosen backend ('auto': the artifact's natural one)."""
    p = Path(path)
    if not p.exists():
        raise VitdeployError(f"{p}: no such file or folder")
    if backend not in BACKENDS:
        raise VitdeployError(f"unknown backend {backend!r}: choose one of {', '.join(BACKENDS)}")
    kind = artifact_kind(p)
    want = default_backend(p) if backend == "auto" else backend
    ok = BACKENDS_OF_KIND[kind]
    if want not in ok:
        raise VitdeployError(f"{p}: a {kind} runs on {'/'.join(ok)}, not {want}")
    if want == "torch":
        from vitdeploy.runners.torch import TorchRunner

        return TorchRunner(p, device=device, threads=threads)
    if want == "onnxruntime":
        from vitdeploy.runners.onnxruntime import OnnxRuntimeRunner

        providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if device == "cuda" else None
        return OnnxRuntimeRunner(p, providers=providers, threads=threads)
    from vitdeploy.runners.tensorrt import TensorRTRunner  # type: ignore[import-not-found]

    return TensorRTRunner(p)


__all__ = ["Runner", "open_runner", "artifact_kind", "default_backend", "BACKENDS", "BACKENDS_OF_KIND"]
