"""OpenVINO runner on the CPU (FP32, FP16 and Q/DQ INT8 ONNX models; x86 and ARM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.artifact import manifest_from_onnx, read_onnx_manifest
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.runners.base import Runner
from vitdeploy.runners.openvino.loader import compile_config, compile_model_proto, compile_onnx


class OpenVinoRunner(Runner):
    backend = "openvino"

    def __init__(self, path: str | Path | Any, threads: int | None = None, cache: bool = True,
                 manifest: Manifest | None = None) -> None:
        """``path``: an ONNX file, or an onnx.ModelProto in memory (the calibrate guard's candidates: not cached)."""
        in_memory = not isinstance(path, (str, Path))
        if manifest is None:
            manifest = manifest_from_onnx(path, "the model in memory") if in_memory else read_onnx_manifest(path)
        super().__init__(manifest, Path("<in memory>") if in_memory else path)
        self.float_type = manifest.extra.get("float_type") or ("fp16" if manifest.precision == "fp16" else "fp32")
        self.compiled = (compile_model_proto(path, threads, self.float_type) if in_memory
                         else compile_onnx(path, threads, self.float_type, cache))
        self.config = compile_config(threads, self.float_type)
        inp = self.compiled.inputs[0]
        shape = inp.get_partial_shape()
        et = inp.get_element_type().get_type_name()
        channels = shape[1] if shape.rank.is_static and shape.rank.get_length() == 4 else None
        if et not in ("f32", "f16") or (channels is not None and channels.is_static and channels.get_length() != 3):
            raise VitdeployError(
                f"{path}: takes {et} {shape} images with the preprocessing folded into the graph; "
                "run it with the bundle's run.py, or give the model without --embed-preprocess (model.onnx)"
            )
        self.request = self.compiled.create_infer_request()

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = self.check_input(batch)
        self.request.infer({0: x})
        return np.array(self.request.get_output_tensor(0).data, dtype=np.float32)

    def run_with_tokens(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        from vitdeploy.core.task import TOKENS_OUTPUT

        at = [i for i, o in enumerate(self.compiled.outputs) if i and TOKENS_OUTPUT in o.get_names()]
        if not at:
            return super().run_with_tokens(batch)
        first = self.run(batch)
        return first, np.array(self.request.get_output_tensor(at[0]).data, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["config"] = dict(self.config)
        return d
