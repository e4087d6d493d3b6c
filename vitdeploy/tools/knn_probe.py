"""`vitdeploy train DATA --init BACKBONE --probe knn`: DINOv2's weighted kNN on a frozen backbone's cached features.

Why here: the features and their cache are model/probe.py's (the same cache ``--probe linear`` reads), the vote is
checks/metrics.py's ``knn_predict`` (DINOv2 ``eval/knn.py``: k=20, T=0.07, cosine-weighted), and only a layer above
both may join them. Nothing is written but the features cache: a kNN has no head to fold into a checkpoint. As a
deployed mode kNN is ``infer --gallery``; as a figure of an embedding model, ``verify``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.model.probe import Features, Progress, probe_features
from vitdeploy.model.train_options import TrainOptions


@dataclass(frozen=True)
class KnnFigure:
    """The val top-1 of the kNN on one pooling of the features, the train images as the gallery."""

    pool: str
    accuracy: float
    gallery: int
    queries: int


def knn_probe(data_dir: str | Path | None, opts: TrainOptions, progress: Progress | None = None
              ) -> tuple[Features, list[KnnFigure]]:
    """The features (cached beside ``opts.out``) and, per pooling the probe would fit (model.probe
    ``Backbone.candidates``), the val top-1 of DINOv2's weighted kNN over the train images."""
    from vitdeploy.checks.metrics import knn_predict

    if opts.probe != "knn":
        raise UsageError(f"knn_probe is --probe knn, not {opts.probe!r}")
    feats, bb, _ = probe_features(data_dir, opts, progress)
    tr, va = feats.split(opts.val_fraction, opts.seed)
    if len(va) == 0:
        raise VitdeployError(f"{data_dir}: too few images to hold out a validation split; add images or a val/ folder")
    figures = []
    for pool in bb.candidates(opts.pool):
        x = bb.select(feats.x, pool)
        scores = knn_predict(x[tr], feats.labels[tr], x[va], len(feats.classes))
        acc = float((scores.argmax(1) == feats.labels[va]).mean())
        figures.append(KnnFigure(bb.feature_pool(pool), acc, len(tr), len(va)))
    return feats, figures
