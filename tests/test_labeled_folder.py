"""The one labeled-folder reader (model.data.read_labeled_folder) and the one image gatherer, on real digit scans."""

from __future__ import annotations

from pathlib import Path

import pytest

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.preprocess import gather_images
from vitdeploy.model.data import DIGITS_LABELS, digits_images, read_labeled_folder


def _folder(root: Path, classes: dict[str, int]) -> Path:
    imgs, _ = digits_images()
    k = 0
    for c, n in classes.items():
        (root / c).mkdir(parents=True)
        for _ in range(n):
            imgs[k].save(root / c / f"{k:04d}.png")
            k += 1
    return root


def test_labeled_folder_gets_the_index_of_each_folder_name(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"3": 2, "7": 3})
    got = read_labeled_folder(root, DIGITS_LABELS)
    assert got.root == root and len(got.files) == 5 and got.labels == [3, 3, 7, 7, 7] and got.notes == []
    assert read_labeled_folder(root, DIGITS_LABELS, require=True).labels == got.labels


def test_train_and_val_reads_val(tmp_path: Path) -> None:
    _folder(tmp_path / "d" / "train", {"1": 1})
    _folder(tmp_path / "d" / "val", {"2": 2})
    got = read_labeled_folder(tmp_path / "d", DIGITS_LABELS)
    assert got.root == tmp_path / "d" / "val" and got.labels == [2, 2] and "reading val/" in got.notes[0]


def test_unknown_class_is_unlabeled_with_a_note_or_an_error_where_required(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"3": 1, "cat": 2})
    got = read_labeled_folder(root, DIGITS_LABELS)
    assert got.labels is None and len(got.files) == 3
    assert got.notes == ["class folders cat are not among the model's labels: agreement only, no accuracy"]
    with pytest.raises(VitdeployError, match=r"class folder\(s\) cat are not among the model's labels"):
        read_labeled_folder(root, DIGITS_LABELS, require=True)


def test_loose_images_are_unlabeled(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"3": 2})
    digits_images()[0][9].save(root / "loose.png")
    got = read_labeled_folder(root, DIGITS_LABELS)
    assert got.labels is None and len(got.files) == 3
    with pytest.raises(VitdeployError, match="class sub-folders only"):
        read_labeled_folder(root, DIGITS_LABELS, require=True)
    (tmp_path / "empty").mkdir()
    with pytest.raises(VitdeployError, match="no image files"):
        read_labeled_folder(tmp_path / "empty", DIGITS_LABELS)


def test_guard_and_verify_read_folders_alike(tmp_path: Path) -> None:
    from vitdeploy.checks.guard import load_eval_set
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.core.preprocess import Preprocess
    from vitdeploy.model.imageset import ImageSet

    pp = Preprocess(input_size=(32, 32), resize_mode="squash", interpolation="bilinear")
    m = Manifest(model={"num_classes": 10, "image_size": [32, 32]}, labels=list(DIGITS_LABELS), preprocess=pp.to_dict())
    root = _folder(tmp_path / "d", {"3": 2, "7": 1})
    ev = load_eval_set(root, m)
    assert ev.y.tolist() == [3, 3, 7] and ev.x.shape == (3, 3, 32, 32)
    assert ImageSet.labeled(root, m.labels).labels == [3, 3, 7]  # what verify reads
    _folder(tmp_path / "d2", {"3": 1, "dog": 1})
    assert ImageSet.labeled(tmp_path / "d2", m.labels).labels is None
    with pytest.raises(VitdeployError, match="dog"):
        load_eval_set(tmp_path / "d2", m)


def test_gather_images_keeps_named_files_and_walks_folders(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"3": 2})
    notes = tmp_path / "notes.txt"
    notes.write_text("not an image")
    (root / "README.txt").write_text("skipped inside a folder")
    got = gather_images([root, notes])
    assert got == [root / "3" / "0000.png", root / "3" / "0001.png", notes]
    with pytest.raises(VitdeployError, match="no such file"):
        gather_images([tmp_path / "missing"])
    (tmp_path / "e").mkdir()
    with pytest.raises(VitdeployError, match="no images in"):
        gather_images([tmp_path / "e"])
