"""``infer --gallery gallery.faiss``: label images by their nearest vectors in a FAISS index gallery.

The vote is the one ``infer --gallery DIR`` casts (checks/metrics.knn_votes: DINOv2's k=20 neighbours, each weighing
exp(cos / 0.07) for its class); only the search differs: the index (exact for Flat, tuned to its recorded recall
otherwise) instead of a product with every gallery vector. The model querying must come from the checkpoint whose
embeddings the index holds (any precision of it) and give vectors of its width; that is checked before any image is
read (core/gallery.check_query_model).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from vitdeploy.checks import metrics
from vitdeploy.core.gallery import IndexGallery, Lineage, check_query_model, lineage_of, open_gallery, search


def runner_lineage(runner: Any) -> Lineage:
    """The checkpoint an open runner's artifact descends from (its own SHA-256 first)."""
    from vitdeploy.core.fileio import sha256_file

    p = Path(runner.artifact)
    own = getattr(runner, "sha256", None)
    if not isinstance(own, str):
        own = sha256_file(p) if p.is_file() else None
    return lineage_of(p, runner.manifest, own)


def open_for_runner(gallery: str | Path, runner: Any) -> IndexGallery:
    """The index, refused in one line where this runner cannot query it (width, checkpoint, no classes)."""
    from vitdeploy.core.task import task_of

    g = open_gallery(gallery)
    check_query_model(g, runner_lineage(runner), int(task_of(runner.manifest).dim), runner.artifact)
    return g


def knn_rows(g: IndexGallery, paths: list[Path], vectors: Any, top_k: int,
             shown: int) -> tuple[int, list[tuple[list[str], list[float], list[tuple[str, str, float]]]], list[str]]:
    """Per image: its top_k classes by their share of the k neighbours' weighted vote and its ``shown`` nearest
    gallery images (path, class, cosine); with k and notes. A query that is itself a gallery file (same path) never
    votes for itself."""
    import numpy as np

    from vitdeploy.core.fileio import printable_name

    classes = g.classes
    notes: list[str] = []
    show = min(top_k, len(classes))
    if top_k > len(classes):
        notes.append(f"--top-k {top_k} is more than the gallery's {len(classes)} classes: showing {len(classes)}")
    where = {os.path.abspath(p): i for i, p in enumerate(g.paths) if p} if any(g.paths) else {}
    own = np.asarray([where.get(os.path.abspath(p), -1) for p in paths], np.int64) if where else \
        np.full(len(paths), -1, np.int64)
    k = min(metrics.KNN_K, g.size - int(bool((own >= 0).any())))
    if (own >= 0).any():
        notes.append(f"{int((own >= 0).sum())} image(s) are gallery images too: each is labelled by the other "
                     "gallery images (leave-one-out)")
    out: list[tuple[list[str], list[float], list[tuple[str, str, float]]]] = []
    step = metrics.SIM_ROWS
    for s in range(0, len(paths), step):
        mine = own[s : s + step]
        rows, sims = search(g, vectors[s : s + step], k + int(bool((mine >= 0).any())))
        sims = np.where((rows == mine[:, None]) & (mine[:, None] >= 0), -np.inf, sims)
        order = np.argsort(-sims, axis=1, kind="stable")[:, :k]
        rows, sims = np.take_along_axis(rows, order, axis=1), np.take_along_axis(sims, order, axis=1)
        y = g.class_index[np.where(rows >= 0, rows, 0)]
        sims = np.where((rows >= 0) & (y >= 0), sims, -np.inf)  # no neighbour, or one of no class: never votes
        scores = metrics.knn_votes(np.where(y >= 0, y, 0), sims, np.arange(len(classes)), len(classes))
        share = scores / np.maximum(scores.sum(axis=1, keepdims=True), 1e-300)
        top, val = metrics.top_k(share, show)
        for j in range(len(rows)):
            near = [(printable_name(g.paths[r]) if g.paths[r] else f"id {int(g.ids[r])}", classes[int(g.class_index[r])],
                     float(c)) for r, c in zip(rows[j, :shown], sims[j, :shown], strict=True) if np.isfinite(c)]
            out.append(([classes[c] for c in top[j]], [float(v) for v in val[j]], near))
    return k, out, notes
