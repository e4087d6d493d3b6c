"""``--image-size`` H or HxW, parsed without torch (so its refusal is light)."""

from __future__ import annotations

from vitdeploy.core.errors import UsageError

__all__ = ["parse_image_size"]


def parse_image_size(text: str) -> tuple[int, int]:
    """``--image-size`` as H or HxW (positive integers)."""
    parts = text.lower().replace("×", "x").split("x")
    try:
        hw = tuple(int(p) for p in parts)
    except ValueError:
        hw = ()
    if len(hw) == 1:
        hw = (hw[0], hw[0])
    if len(hw) != 2 or min(hw) < 1:
        raise UsageError(f"--image-size {text!r}: give H or HxW in pixels, for example 224 or 224x320")
    return (int(hw[0]), int(hw[1]))
