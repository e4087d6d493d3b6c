"""Reading image files into batches, decoding in a small thread pool ahead of the model.

Pillow releases the GIL while it decodes and resizes, so a few threads keep a
model fed; the window of images in flight is bounded, so memory stays flat on a
folder of any size. Used by verify, calibration and infer.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from vitdeploy.core.host import available_cores
from vitdeploy.core.preprocess import ImageReadError, Preprocess, preprocess_file


@dataclass
class Batch:
    paths: list[Path]
    array: np.ndarray  # float32 NCHW (or whatever ``loader`` returns, stacked)
    labels: list[int] | None = None
    skipped: list[tuple[Path, str]] = field(default_factory=list)  # unreadable files met since the last batch


def default_workers() -> int:
    return max(1, min(4, available_cores()))


def iter_batches(
    paths: Sequence[Any],
    pp: Preprocess,
    batch_size: int,
    labels: Sequence[int] | None = None,
    workers: int | None = None,
    prefetch_batches: int = 2,
    loader: Callable[[Any, Preprocess], np.ndarray] = preprocess_file,
) -> Iterator[Batch]:
    """Batches of decoded images in input order; unreadable files are reported in ``Batch.skipped``.

    A final batch with an empty array may be yielded only to report trailing skipped files.
    """
    if batch_size < 1:
        raise ValueError("batch size must be at least 1")
    items = [Path(p) if isinstance(p, str) else p for p in paths]  # paths, or in-memory images a loader takes
    window = batch_size * (prefetch_batches + 1)
    with ThreadPoolExecutor(max_workers=workers or default_workers(), thread_name_prefix="vitdeploy-read") as pool:
        pending: deque[tuple[int, Future[np.ndarray]]] = deque()
        nxt = 0

        def fill() -> None:
            nonlocal nxt
            while nxt < len(items) and len(pending) < window:
                pending.append((nxt, pool.submit(loader, items[nxt], pp)))
                nxt += 1

        fill()
        b_paths: list[Path] = []
        b_arrays: list[np.ndarray] = []
        b_labels: list[int] = []
        b_skipped: list[tuple[Path, str]] = []
        while pending:
            i, fut = pending.popleft()
            try:
                arr = fut.result()
                b_paths.append(items[i])
                b_arrays.append(arr)
                if labels is not None:
                    b_labels.append(int(labels[i]))
            except ImageReadError as e:
                b_skipped.append((items[i], str(e)))
            fill()
            if len(b_arrays) == batch_size:
                yield Batch(b_paths, np.stack(b_arrays), b_labels if labels is not None else None, b_skipped)
                b_paths, b_arrays, b_labels, b_skipped = [], [], [], []
        if b_arrays or b_skipped:
            arr = np.stack(b_arrays) if b_arrays else np.empty((0,), np.float32)
            yield Batch(b_paths, arr, b_labels if labels is not None else None, b_skipped)
