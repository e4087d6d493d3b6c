"""PyTorch runner for vitdeploy checkpoints (eager mode)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from vitdeploy.core.host import thread_count
from vitdeploy.runners.base import Runner


class TorchRunner(Runner):
    backend = "torch"

    def __init__(self, path: str | Path, device: str = "cpu", threads: int | None = None) -> None:
        import torch

        from vitdeploy.model.importers import load_any

        ck = load_any(path)
        super().__init__(ck.manifest, path, "fp32")
        if threads:
            torch.set_num_threads(thread_count(threads))
        self._torch = torch
        self.device = torch.device(device)
        self.model = ck.build().to(self.device).eval()

    def run(self, batch: np.ndarray) -> np.ndarray:
        x = self._torch.from_numpy(self.check_input(batch)).to(self.device)
        with self._torch.inference_mode():
            return self.model(x).float().cpu().numpy()

    def run_with_tokens(self, batch: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """An embedding model with a final norm over every token answers its patch tokens as export --tokens writes
        them (``WithPatchTokens``); a classifier, or a model pooled by attention (MAP), has none."""
        from vitdeploy.core.task import task_of
        from vitdeploy.model.vit import WithPatchTokens

        cfg = self.model.cfg
        if not task_of(self.manifest).is_embedding or not cfg.final_norm or cfg.global_pool == "map":
            return super().run_with_tokens(batch)
        x = self._torch.from_numpy(self.check_input(batch)).to(self.device)
        with self._torch.inference_mode():
            first, tokens = WithPatchTokens(self.model)(x)
        return first.float().cpu().numpy(), tokens.float().cpu().numpy()
