"""The per-batch function: decode and preprocess (the code ``infer`` runs: ``preprocess_file``), the runner, and
what its outputs become (an embedding model's vectors; a classifier's label, score and top-k). Both executors call
these, so a shard's rows do not depend on where they were made.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vitdeploy.checks import metrics
from vitdeploy.core.preprocess import ImageReadError, Preprocess, preprocess_file
from vitdeploy.tools.corpus.sink import ShardRows

NAN_REASON = "the model gave NaN or Inf values for it"


def decode(path: str, pp: Preprocess) -> tuple[np.ndarray | None, str | None]:
    """One image as the model's float32 CHW input, or None and why it could not be read."""
    try:
        return preprocess_file(path, pp), None
    except ImageReadError as e:
        return None, str(e)


def output_columns(runner: Any, array: np.ndarray, top_k: int) -> tuple[dict[str, Any], np.ndarray]:
    """The runner's answers for a decoded batch, as shard columns, and which rows are finite (the others are
    skipped, as infer skips them)."""
    from vitdeploy.core.task import task_of

    out = np.asarray(runner(array), np.float32)
    ok = np.asarray(metrics.finite_rows(out), bool)
    if task_of(runner.manifest).is_embedding:
        return {"embedding": out}, ok
    labels = list(runner.manifest.labels)
    k = min(top_k, len(labels))
    idx, prob = metrics.top_k(metrics.softmax(out), k)
    cols: dict[str, Any] = {"label": [labels[i[0]] for i in idx], "score": prob[:, 0].astype(np.float32)}
    for j in range(k):
        cols[f"label_{j + 1}"] = [labels[i[j]] for i in idx]
        cols[f"score_{j + 1}"] = prob[:, j].astype(np.float32)
    return cols, ok


def output_names(manifest: Any, top_k: int) -> list[str]:
    """The model's columns in a shard, from its manifest alone (a Ray driver may have no GPU to open an engine)."""
    from vitdeploy.core.task import task_of

    if task_of(manifest).is_embedding:
        return ["embedding"]
    k = min(top_k, len(manifest.labels))
    return ["label", "score", *[c for j in range(1, k + 1) for c in (f"label_{j}", f"score_{j}")]]


@dataclass
class ShardBuilder:
    """One partition's rows as they arrive, batch by batch, in any order; ``rows()`` puts them in id order."""

    size: int
    has_classes: bool
    ids: list[int] = field(default_factory=list)
    paths: list[str] = field(default_factory=list)
    classes: list[str | None] = field(default_factory=list)
    cols: dict[str, list[Any]] = field(default_factory=dict)
    skipped: list[tuple[int, str, str]] = field(default_factory=list)
    nodes: dict[str, int] = field(default_factory=dict)

    @property
    def seen(self) -> int:
        return len(self.ids) + len(self.skipped)

    @property
    def complete(self) -> bool:
        return self.seen >= self.size

    def add(self, ids: list[int], paths: list[str], classes: list[str | None], cols: dict[str, Any],
            ok: np.ndarray, node: str | None = None) -> None:
        """Rows of one model batch; those not ``ok`` (NaN or Inf answers) are skipped with the reason."""
        keep = [i for i, good in enumerate(ok) if good]
        for i, good in enumerate(ok):
            if not good:
                self.skipped.append((ids[i], paths[i], NAN_REASON))
        self.ids += [ids[i] for i in keep]
        self.paths += [paths[i] for i in keep]
        self.classes += [classes[i] for i in keep]
        for name, value in cols.items():
            if isinstance(value, np.ndarray):
                self.cols.setdefault(name, []).append(value[np.asarray(keep, np.int64)])
            else:
                self.cols.setdefault(name, []).append([value[i] for i in keep])
        if node is not None:
            self.nodes[node] = self.nodes.get(node, 0) + len(ids)

    def skip(self, i: int, path: str, reason: str, node: str | None = None) -> None:
        self.skipped.append((i, path, reason))
        if node is not None:
            self.nodes[node] = self.nodes.get(node, 0) + 1

    def rows(self, names: list[str], dim: int | None) -> ShardRows:
        order = np.argsort(np.asarray(self.ids, np.int64), kind="stable")
        outputs: dict[str, Any] = {}
        for name in names:
            parts = self.cols.get(name, [])
            if name == "embedding":
                arr = np.concatenate(parts) if parts else np.zeros((0, int(dim or 0)), np.float32)
                outputs[name] = arr[order]
            elif name.startswith("score"):
                arr = np.concatenate(parts) if parts else np.zeros((0,), np.float32)
                outputs[name] = arr[order]
            else:
                flat = [v for p in parts for v in p]
                outputs[name] = [flat[i] for i in order]
        skipped = sorted(self.skipped)
        return ShardRows([self.ids[i] for i in order], [self.paths[i] for i in order],
                         [self.classes[i] for i in order] if self.has_classes else None, outputs,
                         [(p, r) for _, p, r in skipped])
