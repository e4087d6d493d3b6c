"""``--image-size`` H or HxW, parsed without torch (so its refusal is light)."""

from __future__ import annotations

from vitdeploy.core.errors import UsageError
from vitdeploy.core.limits import bounds

__all__ = ["check_image_size", "parse_image_size"]


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
    check_image_size(hw, "--image-size")
    return (int(hw[0]), int(hw[1]))


def check_image_size(hw: tuple[int, ...], where: str) -> None:
    """Refuse (UsageError, exit 2) an input size past core/limits.py's ``image_size`` range, before anything is
    allocated for it (position embeddings, RoPE tables, an export's activations): ``--image-size 32000`` died in the
    allocator, 10**30 in torch's C++ code."""
    b = bounds("image_size")
    for v in hw:
        if not b["min"] <= v <= b["max"]:
            shown = str(v) if len(str(v)) <= 12 else f"{str(v)[:6]}…({len(str(v))} digits)"
            raise UsageError(f"{where} {shown}: an input side must be from {b['min']} to {b['max']} pixels")
