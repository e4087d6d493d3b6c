"""The one Runner interface: ``run(float32 NCHW batch) -> logits``.

Like Polygraphy's backends: what loads or builds an artifact is separate from
what runs it, and comparing (verify.py) is separate from both. verify, infer
and benchmark only ever see this interface.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.manifest import Manifest


class Runner(ABC):
    backend: str = "?"

    def __init__(self, manifest: Manifest, artifact: str | Path, precision: str | None = None) -> None:
        self.manifest = manifest
        self.artifact = Path(artifact)
        self.precision = precision or manifest.precision

    @abstractmethod
    def run(self, batch: np.ndarray) -> np.ndarray:
        """Logits (float32, [N, classes]) for a float32 NCHW batch preprocessed as the manifest says."""

    def run_with_tokens(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """The first output (as ``run``) and the patch tokens [N, patches, width] where this artifact has them (an
        embedding model exported with --tokens, or an embedding checkpoint), else None. ``run`` stays the one array
        every command reads; verify asks this for its per-patch cosine map."""
        return self(batch), None

    def run_outputs(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Every output by name, the main one first: the task's (logits or embedding) and ``patch_tokens`` where this
        artifact has them. The TensorRT runner answers every output of its engine here."""
        from vitdeploy.core.task import TOKENS_OUTPUT, task_of

        first, tokens = self.run_with_tokens(batch)
        out = {task_of(self.manifest).output: first}
        if tokens is not None:
            out[TOKENS_OUTPUT] = tokens
        return out

    @property
    def max_batch(self) -> int | None:
        """The largest batch one call takes (None: any); larger batches are split by ``__call__``."""
        return None

    def __call__(self, batch: np.ndarray) -> np.ndarray:
        mb = self.max_batch
        if mb is None or len(batch) <= mb:
            return self.run(batch)
        return np.concatenate([self.run(batch[i : i + mb]) for i in range(0, len(batch), mb)])

    def describe(self) -> dict[str, Any]:
        return {"artifact": str(self.artifact), "backend": self.backend, "precision": self.precision}

    def close(self) -> None:  # noqa: B027 - optional hook
        pass

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_input(self, batch: np.ndarray) -> np.ndarray:
        h, w = self.manifest.input_size
        if batch.ndim != 4 or batch.shape[1:] != (3, h, w):
            raise ValueError(f"expected a float32 batch [N, 3, {h}, {w}], got {list(batch.shape)}")
        return np.ascontiguousarray(batch, dtype=np.float32)
