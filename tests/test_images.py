from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

from vitdeploy.core.images import iter_batches
from vitdeploy.core.preprocess import Preprocess, preprocess_file


def test_batches_keep_order_and_report_unreadable(tmp_path: Path) -> None:
    pp = Preprocess(input_size=(16, 16), resize_mode="squash")
    paths = []
    for i in range(11):
        p = tmp_path / f"{i:02d}.png"
        if i in (3, 10):
            p.write_bytes(b"")
        else:
            Image.new("RGB", (20, 12), (i * 20, 0, 0)).save(p)
        paths.append(p)
    batches = list(iter_batches(paths, pp, batch_size=4, labels=list(range(11)), workers=3))
    got = [p for b in batches for p in b.paths]
    assert got == [p for i, p in enumerate(paths) if i not in (3, 10)]
    assert [len(b.paths) for b in batches] == [4, 4, 1]
    assert [p.name for b in batches for p, _ in b.skipped] == ["03.png", "10.png"]
    assert batches[0].labels == [0, 1, 2, 4]
    np.testing.assert_array_equal(batches[1].array[0], preprocess_file(paths[5], pp))
