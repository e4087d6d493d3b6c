"""ONNX Runtime runner (FP32, FP16 and Q/DQ INT8 models alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.artifact import read_onnx_manifest
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.host import available_cores
from vitdeploy.core.manifest import Manifest
from vitdeploy.runners.base import Runner


def session_options(threads: int | None = None) -> Any:
    """The settings measured fastest here: all graph optimizations, one intra-op thread per core, sequential."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.intra_op_num_threads = threads or available_cores()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return so


class OnnxRuntimeRunner(Runner):
    backend = "onnxruntime"

    def __init__(self, path: str | Path, providers: list[str] | None = None, threads: int | None = None,
                 manifest: Manifest | None = None) -> None:
        """``manifest``: the model's, where the caller has read it already (the file is then read by ONNX Runtime only)."""
        try:
            import onnxruntime as ort
        except ImportError:
            raise VitdeployError("onnxruntime is not installed: pip install 'vitdeploy[cpu]' (or [gpu])") from None
        if manifest is None:
            manifest = read_onnx_manifest(path)
        super().__init__(manifest, path)
        avail = ort.get_available_providers()
        providers = [p for p in (providers or ["CPUExecutionProvider"]) if p in avail] or ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(str(path), session_options(threads), providers=providers)
        except Exception as e:
            raise VitdeployError(f"{path}: ONNX Runtime cannot load it ({str(e).splitlines()[0][:160]})") from None
        inp = self.session.get_inputs()[0]
        if inp.type not in ("tensor(float)", "tensor(float16)") or (len(inp.shape) == 4 and inp.shape[1] != 3):
            raise VitdeployError(
                f"{path}: takes {inp.type} {inp.shape} images with the preprocessing folded into the graph; "
                "run it with the bundle's run.py, or give the model without --embed-preprocess (model.onnx)"
            )
        self.input_name = inp.name
        self.input_type = inp.type
        self.output_name = self.session.get_outputs()[0].name

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = self.check_input(batch)
        out = self.session.run([self.output_name], {self.input_name: x})[0]
        return np.asarray(out, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["providers"] = self.session.get_providers()
        return d
