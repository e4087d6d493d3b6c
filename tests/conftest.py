"""Shared fixtures: real images (scikit-learn digits, scikit-image photos) written by the tests."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

os.environ.setdefault("OMP_NUM_THREADS", "2")


def save_in_mode(img: Image.Image, path: Path, mode: str) -> Path:
    """Save a greyscale/RGB image in the given PIL mode, choosing a format that can hold it."""
    rgb = img.convert("RGB")
    if mode == "I;16":
        a = (np.asarray(img.convert("L"), np.uint16) * 257).astype(np.uint16)
        im = Image.fromarray(a)
        assert im.mode == "I;16"
        path = path.with_suffix(".png")
    elif mode == "CMYK":
        im = rgb.convert("CMYK")
        path = path.with_suffix(".jpg")
    elif mode == "F":
        im = Image.fromarray(np.asarray(img.convert("L"), np.float32) / 255.0)
        path = path.with_suffix(".tiff")
    elif mode == "P":
        im = rgb.convert("P", palette=Image.Palette.ADAPTIVE)
        path = path.with_suffix(".gif")
    elif mode in ("LA", "RGBA"):
        im = rgb.convert(mode)
        path = path.with_suffix(".png")
    elif mode == "1":
        im = img.convert("1")
        path = path.with_suffix(".bmp")
    else:
        im = rgb.convert(mode)
        path = path.with_suffix(".png" if mode != "RGB" else ".jpg")
    im.save(path)
    return path


MODES = ["L", "LA", "P", "RGBA", "CMYK", "I;16", "RGB", "1", "F"]


@pytest.fixture(scope="session")
def digits_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded digits set written as an ImageFolder (train/, val/) of PNGs."""
    from vitdeploy.model.data import write_digits

    out = tmp_path_factory.mktemp("digits")
    write_digits(out)
    return out


@pytest.fixture(scope="session")
def mixed_mode_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 3-class ImageFolder of real digit scans saved in every PIL mode, at various sizes."""
    from vitdeploy.model.data import digits_images

    imgs, y = digits_images()
    root = tmp_path_factory.mktemp("mixed")
    counts: dict[int, int] = {}
    for i, (img, label) in enumerate(zip(imgs, y, strict=True)):
        if label > 2 or counts.get(label, 0) >= 12:
            continue
        n = counts.get(label, 0)
        counts[label] = n + 1
        d = root / f"class_{label}"
        d.mkdir(exist_ok=True)
        size = (16 + 8 * (n % 3), 16 + 4 * (n % 2))
        save_in_mode(img.resize(size, Image.Resampling.BILINEAR), d / f"img{i}", MODES[n % len(MODES)])
    return root


@pytest.fixture(scope="session")
def digits_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A digits ViT trained for a few epochs on the embedded set (shared by export/verify/precision tests)."""
    from vitdeploy.model.train import TrainOptions, train

    out = tmp_path_factory.mktemp("ckpt") / "ckpt.pth"
    train(None, TrainOptions(epochs=12, out=out, seed=0))
    return out


@pytest.fixture(scope="session")
def photo_files(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Real photographs from scikit-image's sample data, written as JPEG and PNG."""
    from skimage import data

    root = tmp_path_factory.mktemp("photos")
    out = []
    for name in ("astronaut", "coffee", "chelsea", "camera", "rocket"):
        arr = getattr(data, name)()
        p = root / f"{name}.{'png' if name == 'camera' else 'jpg'}"
        Image.fromarray(arr).save(p)
        out.append(p)
    return out
