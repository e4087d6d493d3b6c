from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from helpers import MODES, save_in_mode
from PIL import Image

from vitdeploy.core.preprocess import ImageReadError, Preprocess, list_images, load_image, preprocess_file, resize_crop


def test_every_pil_mode_becomes_rgb_with_same_content(tmp_path: Path) -> None:
    from vitdeploy.model.data import digits_images

    img = digits_images()[0][0].resize((24, 24))
    ref = np.asarray(img.convert("RGB"), np.float32)
    for mode in MODES:
        p = save_in_mode(img, tmp_path / f"x_{mode.replace(';', '')}", mode)
        rgb = load_image(p)
        assert rgb.mode == "RGB" and rgb.size == (24, 24), mode
        got = np.asarray(rgb, np.float32)
        if mode == "1":  # dithered to black and white: the same picture, not the same grey levels
            assert np.corrcoef(got.ravel(), ref.ravel())[0, 1] > 0.6
        else:
            diff = np.abs(got - ref).mean()
            assert diff < (40 if mode in ("CMYK", "P") else 3), (mode, diff)


def test_exif_orientation_is_honoured(tmp_path: Path) -> None:
    a = np.zeros((20, 40, 3), np.uint8)
    a[:, :10] = 255  # white band on the left
    img = Image.fromarray(a)
    exif = img.getexif()
    exif[0x0112] = 6  # rotate 90° clockwise on display
    p = tmp_path / "rot.jpg"
    img.save(p, exif=exif.tobytes())
    out = load_image(p)
    assert out.size == (20, 40)
    arr = np.asarray(out)
    assert arr[:10].mean() > 200 and arr[-10:].mean() < 50  # the band is now on top


def test_shorter_side_resize_and_center_crop_like_timm() -> None:
    pp = Preprocess(input_size=(224, 224), crop_pct=0.875)
    img = Image.fromarray(np.random.default_rng(0).integers(0, 255, (480, 640, 3), dtype=np.uint8))
    out = resize_crop(img, pp)
    assert out.size == (224, 224)
    # same as resizing the shorter side to 256 then center-cropping 224
    ref = img.resize((341, 256), Image.Resampling.BICUBIC).crop((58, 16, 282, 240))
    assert np.array_equal(np.asarray(out), np.asarray(ref))


def test_normalisation_and_layout(tmp_path: Path) -> None:
    p = tmp_path / "grey.png"
    Image.fromarray(np.full((8, 8), 128, np.uint8)).save(p)
    pp = Preprocess(input_size=(16, 16), resize_mode="squash", mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25))
    x = preprocess_file(p, pp)
    assert x.shape == (3, 16, 16) and x.dtype == np.float32
    np.testing.assert_allclose(x, (128 / 255 - 0.5) / 0.25, rtol=1e-4)


def test_unreadable_files_say_why(tmp_path: Path) -> None:
    (tmp_path / "empty.png").write_bytes(b"")
    (tmp_path / "text.png").write_text("hello")
    Image.new("RGB", (64, 64), "red").save(tmp_path / "ok.jpg")
    data = (tmp_path / "ok.jpg").read_bytes()
    (tmp_path / "trunc.jpg").write_bytes(data[: len(data) // 2])
    with pytest.raises(ImageReadError, match="empty"):
        load_image(tmp_path / "empty.png")
    with pytest.raises(ImageReadError, match="not an image"):
        load_image(tmp_path / "text.png")
    with pytest.raises(ImageReadError, match="truncated"):
        load_image(tmp_path / "trunc.jpg")


def test_list_images_by_extension_case_insensitive_skipping_hidden(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / ".hidden").mkdir()
    for name in ("a.JPG", "sub/b.png", "c.TiFF", "d.webp", "notes.txt", ".e.png", ".hidden/f.png"):
        (tmp_path / name).write_bytes(b"x")
    names = sorted(p.name for p in list_images(tmp_path))
    assert names == ["a.JPG", "b.png", "c.TiFF", "d.webp"]
