from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from PIL import Image

from vitdeploy.core.errors import VitdeployError
from vitdeploy.model.checkpoint import load_checkpoint
from vitdeploy.model.train import TrainOptions, train

FAST = dict(preset="vit-digits", image_size=16, patch_size=4, batch_size=16)


def test_train_end_to_end_on_mixed_mode_folder(mixed_mode_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "sub" / "ckpt.pth"  # a missing output folder is created
    r = train(mixed_mode_folder, TrainOptions(epochs=3, out=out, **FAST))
    assert out.exists() and 0.0 <= r.best_val_accuracy <= 1.0
    ck = load_checkpoint(out)
    assert ck.manifest.labels == ["class_0", "class_1", "class_2"]
    assert ck.manifest.training["best_val_accuracy"] == r.best_val_accuracy
    assert ck.manifest.preprocess["input_size"] == [16, 16]
    raw = torch.load(out, weights_only=True)
    assert "train_state" in raw


def test_same_seed_same_result(mixed_mode_folder: Path, tmp_path: Path) -> None:
    a = train(mixed_mode_folder, TrainOptions(epochs=2, out=tmp_path / "a.pth", **FAST))
    b = train(mixed_mode_folder, TrainOptions(epochs=2, out=tmp_path / "b.pth", **FAST))
    sa, sb = load_checkpoint(tmp_path / "a.pth").state_dict, load_checkpoint(tmp_path / "b.pth").state_dict
    assert a.history == b.history
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


def test_train_val_layout_and_resume_and_init(digits_folder: Path, tmp_path: Path) -> None:
    small = tmp_path / "small"
    for sub in ("train", "val"):
        for c in ("0", "1", "7"):
            dst = small / sub / c
            dst.mkdir(parents=True)
            for f in sorted((digits_folder / sub / c).iterdir())[:10]:
                shutil.copy(f, dst)
    ck = tmp_path / "ckpt.pth"
    r = train(small, TrainOptions(epochs=2, out=ck, **FAST))
    assert r.history and len(r.history) == 2
    r2 = train(small, TrainOptions(epochs=3, out=ck, resume=ck, batch_size=16))
    assert [h["epoch"] for h in r2.history] == [r.best_epoch + 1 + i for i in range(len(r2.history))]
    # fine-tune on other classes: the head is replaced
    two = tmp_path / "two"
    for c in ("3", "4"):
        shutil.copytree(small / "train" / "0", two / c)
    ft = tmp_path / "ft.pth"
    train(two, TrainOptions(epochs=1, out=ft, init=ck, batch_size=16))
    m = load_checkpoint(ft)
    assert m.manifest.labels == ["3", "4"] and m.state_dict["head.weight"].shape[0] == 2
    assert m.manifest.source["init"] == str(ck)
    src = load_checkpoint(ck).state_dict["patch_embed.proj.weight"]
    fresh_gap = (torch.randn_like(src) * 0.02 - src).abs().mean()
    assert (m.state_dict["patch_embed.proj.weight"] - src).abs().mean() < fresh_gap / 3  # started from ck


def _folder(root: Path, classes: dict[str, int]) -> Path:
    for c, n in classes.items():
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.new("L", (8, 8), 40 * i).save(root / c / f"{i}.png")
    return root


@pytest.mark.parametrize(
    "setup,match",
    [
        (lambda p: p / "nope", "does not exist"),
        (lambda p: (p / "empty").mkdir() or p / "empty", "holds no images"),
        (lambda p: _folder(p / "one", {"a": 3}), "only one class"),
    ],
)
def test_bad_data_dirs(tmp_path: Path, setup, match: str) -> None:
    out = tmp_path / "ckpt.pth"
    with pytest.raises(VitdeployError, match=match):
        train(setup(tmp_path), TrainOptions(epochs=1, out=out, **FAST))
    assert not out.exists()


def test_class_with_no_readable_image(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"a": 3, "b": 3})
    (root / "c").mkdir()
    (root / "c" / "x.png").write_text("not an image")
    with pytest.raises(VitdeployError, match="no readable image: c"):
        train(root, TrainOptions(epochs=1, out=tmp_path / "o.pth", **FAST))


def test_unreadable_files_elsewhere_are_skipped(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"a": 4, "b": 4})
    (root / "a" / "bad.png").write_bytes(b"")
    r = train(root, TrainOptions(epochs=1, out=tmp_path / "o.pth", **FAST))
    assert [Path(p).name for p, _ in r.skipped] == ["bad.png"]


def test_bad_sizes_presets_and_checkpoints(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"a": 3, "b": 3})
    with pytest.raises(VitdeployError, match="not divisible by the patch size"):
        train(root, TrainOptions(epochs=1, out=tmp_path / "o.pth", preset="vit-digits", image_size=30))
    with pytest.raises(ValueError, match="unknown preset 'vit-nope'.*vit-tiny"):
        train(root, TrainOptions(epochs=1, out=tmp_path / "o.pth", preset="vit-nope"))
    bad = tmp_path / "bad.pth"
    bad.write_text("junk")
    for kw in ("resume", "init"):
        with pytest.raises(VitdeployError, match="not a PyTorch checkpoint"):
            train(root, TrainOptions(epochs=1, out=tmp_path / "o.pth", batch_size=4, **{kw: bad}))
    assert not (tmp_path / "o.pth").exists()


def test_existing_checkpoint_survives_a_failed_run(tmp_path: Path) -> None:
    root = _folder(tmp_path / "d", {"a": 4, "b": 4})
    out = tmp_path / "ckpt.pth"
    train(root, TrainOptions(epochs=1, out=out, **FAST))
    before = out.read_bytes()
    with pytest.raises(VitdeployError):
        train(tmp_path / "missing", TrainOptions(epochs=1, out=out, **FAST))
    assert out.read_bytes() == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".ckpt")]


@pytest.mark.parametrize(
    "kw,match",
    [
        ({"epochs": 0}, "--epochs must be at least 1"),
        ({"batch_size": 0}, "--batch-size must be at least 1"),
        ({"lr": -1.0}, "--lr must be a positive number"),
        ({"label_smoothing": 2.0}, r"--label-smoothing must be in \[0, 1\)"),
        ({"val_fraction": 1.0}, "--val-fraction"),
        ({"preset": "vit-nope"}, "unknown preset"),
        ({"out": "t.onnx"}, "a checkpoint is a .pth file"),
    ],
)
def test_impossible_values_are_usage_errors_before_any_work(tmp_path: Path, kw: dict, match: str) -> None:
    from vitdeploy.core.errors import EXIT_USAGE

    opts = TrainOptions(**{"out": tmp_path / "o.pth", **kw})
    with pytest.raises(VitdeployError, match=match) as e:
        train(tmp_path / "missing", opts)  # the folder is never looked at: the value is refused first
    assert e.value.exit_code == EXIT_USAGE
    assert list(tmp_path.iterdir()) == []
