"""The one image → tensor path.

Training's eval path, calibration, verify, infer and benchmark all call
``load_image`` + ``to_tensor`` (or ``preprocess_file``), driven by the
``preprocess`` block of the manifest. numpy and Pillow only: no torch, so the
same code runs on a Jetson beside an engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from vitdeploy.core.errors import VitdeployError

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")

_INTERP = {
    "nearest": Image.Resampling.NEAREST,
    "bilinear": Image.Resampling.BILINEAR,
    "bicubic": Image.Resampling.BICUBIC,
    "lanczos": Image.Resampling.LANCZOS,
    "box": Image.Resampling.BOX,
    "hamming": Image.Resampling.HAMMING,
}


class ImageReadError(Exception):
    """An image file that cannot be decoded; the message says why."""


@dataclass(frozen=True)
class Preprocess:
    """How an image becomes the model's input.

    resize_mode "shorter": resize the shorter side to input/crop_pct, then
    center-crop (timm's eval transform). "squash": resize straight to the input
    size (Hugging Face's ViTImageProcessor). "squash_crop": resize straight to input/crop_pct, then center-crop
    (transformers' DeiT/BEiT processors with size {height, width} and a crop_size; timm's crop_mode "squash").
    """

    input_size: tuple[int, int] = (224, 224)
    resize_mode: str = "shorter"
    crop_pct: float = 0.875
    interpolation: str = "bicubic"
    mean: tuple[float, float, float] = (0.485, 0.456, 0.406)
    std: tuple[float, float, float] = (0.229, 0.224, 0.225)
    channel_order: str = "RGB"
    rescale: float = 1.0 / 255.0
    # Where the center crop starts when the margin is odd: "round" (torchvision's and timm's int(round(m / 2)),
    # half to even) or "floor" (transformers' center_crop: m // 2). Left out of to_dict at its default.
    crop_offset: str = "round"

    def __post_init__(self) -> None:
        object.__setattr__(self, "input_size", tuple(int(v) for v in self.input_size))
        object.__setattr__(self, "mean", tuple(float(v) for v in self.mean))
        object.__setattr__(self, "std", tuple(float(v) for v in self.std))
        if self.resize_mode not in ("shorter", "squash", "squash_crop"):
            raise ValueError(f"resize_mode must be 'shorter', 'squash' or 'squash_crop', not {self.resize_mode!r}")
        if self.interpolation not in _INTERP:
            raise ValueError(f"interpolation must be one of {', '.join(_INTERP)}, not {self.interpolation!r}")
        if self.crop_offset not in ("round", "floor"):
            raise ValueError(f"crop_offset must be 'round' or 'floor', not {self.crop_offset!r}")
        if self.channel_order not in ("RGB", "BGR"):
            raise ValueError(f"channel_order must be RGB or BGR, not {self.channel_order!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Preprocess:
        known = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in known})

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for k in ("input_size", "mean", "std"):
            d[k] = list(d[k])
        if d["crop_offset"] == "round":  # manifests of every earlier model stay byte-identical
            del d["crop_offset"]
        return d

    @property
    def resize_size(self) -> tuple[int, int]:
        """The (h, w) the image is resized to before cropping, for the shorter-side mode."""
        h, w = self.input_size
        return (math.floor(h / self.crop_pct), math.floor(w / self.crop_pct))


def to_rgb(img: Image.Image) -> Image.Image:
    """Any PIL mode → 8-bit RGB, honouring EXIF orientation.

    16-bit and float modes are scaled to 0–255 instead of clipped (PIL's own
    convert clips I;16 to white); transparency is dropped as timm and
    transformers do.
    """
    try:
        img = ImageOps.exif_transpose(img)
    except Exception:  # a broken EXIF block must not lose the image
        pass
    mode = img.mode
    if mode == "RGB":
        return img
    if mode.startswith("I;16") or mode in ("I", "F"):
        a = np.asarray(img, dtype=np.float64)
        if mode == "F":
            hi = 1.0 if a.size and a.max() <= 1.0 else 255.0
        elif mode.startswith("I;16"):
            hi = 65535.0
        else:
            hi = 65535.0 if a.size and a.max() > 255 else 255.0
        a = np.clip(a / hi * 255.0, 0, 255).round().astype(np.uint8)
        return Image.fromarray(a).convert("RGB")
    if mode == "P" and "transparency" in img.info:
        img = img.convert("RGBA")
    return img.convert("RGB")


_FIRST_FRAME_SAID: list[Path] = []


def _say_first_frame(path: Path, frames: int) -> None:
    """An animated GIF/WebP/PNG is classified by its first frame: said once per process (a one-line warning through
    the CLI's display), naming the first such file, so a folder of GIFs does not print a line per file."""
    if _FIRST_FRAME_SAID:
        return
    _FIRST_FRAME_SAID.append(path)
    import warnings

    from vitdeploy.core.text import printable

    warnings.warn(f"{printable(path)} is animated ({frames} frames): its first frame is used (and so for any other "
                  "animated image)", UserWarning, stacklevel=3)


def load_image(path: str | Path) -> Image.Image:
    """Open and fully decode an image as RGB, or raise ImageReadError saying why."""
    p = Path(path)
    try:
        if p.stat().st_size == 0:
            raise ImageReadError("empty file")
        with Image.open(p) as im:
            im.load()
            if getattr(im, "is_animated", False):
                _say_first_frame(p, int(getattr(im, "n_frames", 0)))
            return to_rgb(im)
    except ImageReadError:
        raise
    except FileNotFoundError:
        raise ImageReadError("no such file") from None
    except Image.UnidentifiedImageError:
        raise ImageReadError("not an image (unrecognised format)") from None
    except Image.DecompressionBombError as e:  # more pixels than PIL will decode (a decompression bomb)
        raise ImageReadError(f"too large to decode safely ({str(e).split('(')[-1].split(')')[0]})") from None
    except Exception as e:  # noqa: BLE001 - any other decoder failure: this file is unreadable, the rest go on
        msg = str(e) or type(e).__name__
        if "truncated" in msg.lower():
            msg = "truncated image"
        raise ImageReadError(msg) from None


def resize_crop(img: Image.Image, pp: Preprocess) -> Image.Image:
    h, w = pp.input_size
    interp = _INTERP[pp.interpolation]
    if pp.resize_mode == "squash":
        return img.resize((w, h), interp) if img.size != (w, h) else img
    # shorter side to the resize size (torchvision/timm Resize(int)), then center crop
    rh, rw = pp.resize_size
    iw, ih = img.size
    if pp.resize_mode == "squash_crop":
        nw, nh = rw, rh
    elif rh == rw:
        short, long = (iw, ih) if iw <= ih else (ih, iw)
        new_short, new_long = rh, int(rh * long / short)
        nw, nh = (new_short, new_long) if iw <= ih else (new_long, new_short)
    else:  # timm's ResizeKeepRatio, its arithmetic to the last bit: the side that fits first sets the ratio
        ratio = min(ih / rh, iw / rw)
        nw, nh = round(iw / ratio), round(ih / ratio)
    if (nw, nh) != (iw, ih):
        img = img.resize((nw, nh), interp)
    if pp.crop_offset == "floor":
        top, left = (nh - h) // 2, (nw - w) // 2
    else:
        top, left = int(round((nh - h) / 2.0)), int(round((nw - w) / 2.0))
    if nh < h or nw < w:  # only for extreme aspect ratios with crop_pct > 1
        img = img.resize((max(nw, w), max(nh, h)), interp)
        top, left = max(top, 0), max(left, 0)
    return img.crop((left, top, left + w, top + h))


def to_array(img: Image.Image, pp: Preprocess) -> np.ndarray:
    """A resized RGB image → normalised float32 CHW."""
    a: np.ndarray = np.asarray(img, dtype=np.float32)
    if pp.channel_order == "BGR":
        a = a[..., ::-1]
    a = a * np.float32(pp.rescale)
    a = (a - np.asarray(pp.mean, np.float32)) / np.asarray(pp.std, np.float32)
    return np.ascontiguousarray(a.transpose(2, 0, 1))


def preprocess_image(img: Image.Image, pp: Preprocess) -> np.ndarray:
    return to_array(resize_crop(to_rgb(img), pp), pp)


def preprocess_file(path: str | Path, pp: Preprocess) -> np.ndarray:
    return to_array(resize_crop(load_image(path), pp), pp)


def resized_uint8(path: str | Path, pp: Preprocess) -> np.ndarray:
    """The resized, cropped RGB image as uint8 HWC: the input of a graph with preprocessing folded in."""
    return np.asarray(resize_crop(load_image(path), pp), dtype=np.uint8)


def is_image_file(path: Path) -> bool:
    return path.suffix.lower() in IMAGE_EXTENSIONS and not path.name.startswith(".")


def list_images(*roots: str | Path) -> list[Path]:
    """Image files under the given files and folders (recursive, sorted, hidden ones skipped)."""
    out: list[Path] = []
    for root in roots:
        r = Path(root)
        if r.is_file():
            if r.suffix.lower() in IMAGE_EXTENSIONS:
                out.append(r)
            continue
        for p in sorted(r.rglob("*")):
            rel = p.relative_to(r).parts
            if any(part.startswith(".") for part in rel):
                continue
            if p.is_file() and is_image_file(p):
                out.append(p)
    return out


def gather_images(inputs: Sequence[str | Path]) -> list[Path]:
    """The images a command runs on: image files under the given folders, and every file named itself.

    A file named on the command line is kept whatever its suffix, so reading it says what is
    wrong with it (rather than "no images"); a missing input or nothing to read is a user error.
    """
    if not inputs:
        raise VitdeployError("no images given: pass image files or folders")
    paths: list[Path] = []
    for i in inputs:
        p = Path(i)
        if not p.exists():
            raise VitdeployError(f"{i}: no such file or folder")
        paths.extend([p] if p.is_file() else list_images(p))
    if not paths:
        raise VitdeployError(
            f"no images in {', '.join(map(str, inputs))}: image files end in {' '.join(IMAGE_EXTENSIONS)}"
        )
    return paths
