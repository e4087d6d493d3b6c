"""ONNX Runtime runner (FP32, FP16 and Q/DQ INT8 models alike)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.artifact import OnnxArtifact
from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.task import TOKENS_OUTPUT
from vitdeploy.runners.base import Runner
from vitdeploy.runners.onnxruntime.loader import session


class OnnxRuntimeRunner(Runner):
    backend = "onnxruntime"

    def __init__(self, src: str | Path | OnnxArtifact | Any, providers: list[str] | None = None,
                 threads: int | None = None, manifest: Manifest | None = None) -> None:
        """``src``: a path, an OnnxArtifact or an onnx.ModelProto in memory; ``manifest``: the model's, where the
        caller has it already (otherwise it comes from the artifact, read without parsing the graph)."""
        if isinstance(src, (str, Path)):
            src = OnnxArtifact.open(src)
        if isinstance(src, OnnxArtifact):
            path = src.path
            manifest = manifest or src.manifest
        else:
            path = Path("<in memory>")
            manifest = manifest or OnnxArtifact(path, model=src).manifest
        super().__init__(manifest, path)
        self.session = session(src, threads, providers)
        inp = self.session.get_inputs()[0]
        if inp.type not in ("tensor(float)", "tensor(float16)") or (len(inp.shape) == 4 and inp.shape[1] != 3):
            raise VitdeployError(
                f"{path}: takes {inp.type} {inp.shape} images with the preprocessing folded into the graph; "
                "run it with the bundle's run.py, or give the model without --embed-preprocess (model.onnx)"
            )
        self.input_name = inp.name
        self.input_type = inp.type
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.output_name = self.output_names[0]

    def _feed(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        x = self.check_input(batch)
        return {self.input_name: x.astype(np.float16) if self.input_type == "tensor(float16)" else x}

    def run(self, batch: np.ndarray) -> np.ndarray:
        out = self.session.run([self.output_name], self._feed(batch))[0]
        return np.asarray(out, dtype=np.float32)

    def run_with_tokens(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        if TOKENS_OUTPUT not in self.output_names[1:]:
            return super().run_with_tokens(batch)
        first, tokens = self.session.run([self.output_name, TOKENS_OUTPUT], self._feed(batch))
        return np.asarray(first, dtype=np.float32), np.asarray(tokens, dtype=np.float32)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["providers"] = self.session.get_providers()
        return d
