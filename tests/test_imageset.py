"""One image set and one comparison run: the selection rule, each image decoded once, runners compared in order."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import vitdeploy.core.preprocess as preprocess
from vitdeploy.checks.compare import run, same_model
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import Preprocess
from vitdeploy.model.imageset import ImageSet
from vitdeploy.runners.base import Runner

PP = Preprocess(input_size=(8, 8))


def _folder(root: Path, n: int = 10, bad: tuple[int, ...] = ()) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    from vitdeploy.model.data import digits_images

    imgs, _ = digits_images()
    for i in range(n):
        p = root / f"{i:02d}.png"
        if i in bad:
            p.write_bytes(b"not an image")
        else:
            imgs[i].convert("RGB").save(p)
    return root


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> dict[str, int]:
    seen: dict[str, int] = {}
    real = preprocess.load_image

    def counted(path: Any) -> Image.Image:
        seen[Path(str(path)).name] = seen.get(Path(str(path)).name, 0) + 1
        return real(path)

    monkeypatch.setattr(preprocess, "load_image", counted)
    return seen


def _manifest(**source: Any) -> Manifest:
    return Manifest(model={"num_classes": 10}, labels=[str(i) for i in range(10)], preprocess={"input_size": [8, 8]},
                    source=dict(source))


def test_a_second_pass_and_a_head_decode_nothing_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = ImageSet.folder(_folder(tmp_path / "f", bad=(5,)))
    seen = _count_decodes(monkeypatch)
    names, x, labels = images.arrays(PP, batch_size=3)
    assert len(names) == 9 and labels is None and [p for p, _ in images.skipped] == [str(tmp_path / "f" / "05.png")]
    again = images.arrays(PP, batch_size=4)
    head = images.head(4).arrays(PP)
    assert max(seen.values()) == 1 and len(seen) == 10  # every file decoded once, the unreadable one too
    np.testing.assert_array_equal(again[1], x)
    np.testing.assert_array_equal(head[1], x[:4])
    assert images.skipped and again[0] == names


def test_the_one_rule_names_the_folder_then_calibration_then_digits(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert ImageSet.for_model(_manifest()) is None  # nothing to check on: the caller says what it does then
    digits = ImageSet.for_model(_manifest(dataset="digits"), limit=12)
    assert digits is not None and digits.source == "digits" and len(digits) == 12 and digits.labels is not None
    _folder(tmp_path / "calibration", 6)
    cal = ImageSet.for_model(_manifest(dataset="digits"))
    assert cal is not None and cal.source == "calibration/" and len(cal) == 6
    given = ImageSet.for_model(_manifest(), _folder(tmp_path / "mine", 8), limit=5, seed=0)
    assert given is not None and len(given) == 5 and given.source == str(tmp_path / "mine")
    assert given.items == sorted(given.items)  # a seeded sample kept in folder order
    with pytest.raises(VitdeployError, match="no such folder"):
        ImageSet.for_model(_manifest(), tmp_path / "nowhere")
    with pytest.raises(UsageError, match="at least 1"):
        ImageSet.folder(tmp_path / "mine", limit=0)


class _Fixed(Runner):
    """A runner whose logits are a fixed function of its input (the comparison loop is what is tested)."""

    backend = "fixed"

    def __init__(self, manifest: Manifest, scale: float) -> None:
        super().__init__(manifest, f"fixed{scale}")
        self.scale = scale
        self.calls = 0

    def run(self, batch: np.ndarray) -> np.ndarray:
        self.calls += 1
        return np.repeat(batch.reshape(len(batch), -1)[:, :1], 10, axis=1) * np.arange(10) * self.scale


def test_run_gives_every_runner_the_same_images_in_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    images = ImageSet.folder(_folder(tmp_path / "f", 7, bad=(2,)))
    seen = _count_decodes(monkeypatch)
    a, b = _Fixed(_manifest(), 1.0), _Fixed(_manifest(), 2.0)
    res = run([a, b], images, batch_size=4)
    assert len(res) == 6 and res.paths == [str(p) for i, p in enumerate(images.items) if i != 2]
    np.testing.assert_allclose(res.logits[1], 2 * res.logits[0])
    assert [p for p, _ in res.skipped] == [str(images.items[2])] and max(seen.values()) == 1


def test_same_model_is_one_rule_over_manifests() -> None:
    ref = ("ref", _manifest())
    assert same_model(ref, ("copy", _manifest())) is None
    other = _manifest()
    other.labels[3] = "cat"
    assert "names class 3 'cat'" in str(same_model(ref, ("other", other)))
    fewer = Manifest(model={"num_classes": 5}, labels=list("abcde"), preprocess={"input_size": [8, 8]})
    assert "5 classes" in str(same_model(ref, ("fewer", fewer)))


def test_digits_items_are_named_in_reports() -> None:
    d = ImageSet.digits(limit=3)
    names, x, y = d.arrays(PP)
    assert all(n.startswith("digits/val/") for n in names) and x.shape == (3, 3, 8, 8) and y is not None
    assert os.sep not in names[0].removeprefix("digits/val/")
