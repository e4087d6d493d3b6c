"""Attention maps: where a ViT looked, laid over the image it looked at.

Attention rollout (Abnar & Zuidema, 2020, "Quantifying Attention Flow in
Transformers"): each block's attention, fused over heads, gets the identity
added for the residual connection and its rows renormalised; the product over
the blocks is how much each input token flowed into each output token. The map
is the class token's row (or, for a mean-pooled head, the mean of the patch
tokens' rows, since those are what the head reads), over the patch columns.

The maths (``fuse_heads``, ``rollout``, ``last_layer``) is numpy only. The
attention probabilities come from ``VisionTransformer.forward_with_attention``
for a checkpoint, and for an ONNX model (FP32, FP16 or the INT8 Q/DQ copy) from
its Softmax nodes, made graph outputs and run by ONNX Runtime: so a quantized
copy is checked on where it looks, not only on what it answers.
Drawing uses Pillow plus a matplotlib colour map, so the PNG's geometry is
exact: the input panel and the overlay panel side by side, a caption below.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from vitdeploy.checks import metrics
from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.fileio import atomic_path, move_into, temp_dir_beside
from vitdeploy.core.manifest import Manifest
from vitdeploy.core.preprocess import ImageReadError, Preprocess, gather_images, load_image, resize_crop
from vitdeploy.model.family import TokenLayout
from vitdeploy.runners.attention import open_attention_model

METHODS = ("rollout", "last-layer")
HEAD_FUSIONS = ("mean", "max", "min")

PANEL = 256  # shortest side of each image panel in the PNG, in pixels
MARGIN = 12
CAPTION_H = 92  # top-k line, title line, colour bar, and the map's note (how it was made)
COLORMAP = "jet"
ALPHA = 0.5


# --- the maths (numpy) -------------------------------------------------------------------------------


def fuse_heads(attn: np.ndarray, head_fusion: str = "mean") -> np.ndarray:
    """[B, heads, N, N] → [B, N, N] by the mean, max or min over heads."""
    if head_fusion == "mean":
        return attn.mean(axis=1)
    if head_fusion == "max":
        return attn.max(axis=1)
    if head_fusion == "min":
        return attn.min(axis=1)
    raise UsageError(f"unknown head fusion {head_fusion!r}: choose one of {', '.join(HEAD_FUSIONS)}")


def discard_lowest(a: np.ndarray, ratio: float) -> np.ndarray:
    """Zero the lowest ``ratio`` of each [N, N] map's entries, never the class token's attention to itself.

    Attention to a few tokens is informative, the long tail of small weights is
    noise that the product over blocks smears over the map; as in Gildenblat's
    widely used implementation, the [0, 0] entry is kept so the class token
    keeps its own path.
    """
    if ratio <= 0:
        return a
    b, n, _ = a.shape
    flat = a.reshape(b, n * n).copy()
    k = int(n * n * ratio)
    if k == 0:
        return a
    idx = np.argsort(flat, axis=1, kind="stable")[:, :k]
    for i in range(b):
        drop = idx[i][idx[i] != 0]
        flat[i, drop] = 0.0
    return flat.reshape(b, n, n)


POOLS = ("cls", "mean", "token", "avg", "token_avg", "map")


def _layout(n: int, layout: TokenLayout | None) -> TokenLayout:
    """The given layout, or the plain ViT's for a sequence of ``n`` tokens (one class token, then the patches)."""
    if layout is None:
        return TokenLayout(class_token=True, distilled=False, registers=0, patches=n - 1)
    if layout.length != n:
        raise VitdeployError(f"the attention covers {n} tokens, the model's layout {layout.length} "
                             f"({layout.prefix} prefix + {layout.patches} patches)")
    return layout


def _pool_name(pool: str) -> str:
    return {"cls": "token", "mean": "avg"}.get(pool, pool)


def _readout(m: np.ndarray, pool: str, layout: TokenLayout | None = None,
             pool_attn: np.ndarray | None = None) -> np.ndarray:
    """[B, N, N] token-to-token flow → [B, patches] per patch, as the head reads it.

    Only the patch columns are kept: a register or distillation token is no place in the image, so the flow
    into it is left out of the map. The rows are what the head reads: the class token (and, in a distilled
    model, the distillation token, whose head is averaged with the class token's), the mean of the patch tokens
    (avg), half of each (token_avg), or the attention-pooling head's query weights over the tokens (map:
    ``pool_attn`` [B, N], fused over heads)."""
    lay = _layout(m.shape[-1], layout)
    cols = lay.patch_slice()
    p = _pool_name(pool)
    if p == "map":
        if pool_attn is None:
            raise VitdeployError("an attention-pooling head's map needs its pooling attention; the model returned none")
        if pool_attn.shape[-1] == lay.patches and lay.prefix:  # the head pools the patch tokens only
            return np.einsum("bn,bnm->bm", pool_attn, m[:, cols, :])[:, cols]
        return np.einsum("bn,bnm->bm", pool_attn, m)[:, cols]
    patch_rows = m[:, cols, cols].mean(axis=1)
    if p == "avg" or lay.cls_index is None:
        return patch_rows
    rows = [lay.cls_index] + ([lay.dist_index] if lay.dist_index is not None else [])
    token_rows = m[:, rows, cols].mean(axis=1)
    if p == "token_avg":
        return 0.5 * token_rows + 0.5 * patch_rows
    return token_rows


def readout_note(pool: str, layout: TokenLayout | None) -> str:
    """One sentence saying how the map was made and which tokens it leaves out (printed by explain, in the PNG)."""
    p = _pool_name(pool)
    how = {
        "token": "the class token's attention",
        "avg": "the patch tokens' mean attention (the head averages them)",
        "token_avg": "half the class token's, half the patch tokens' mean attention (the head reads both)",
        "map": "the attention-pooling head's attention",
    }[p]
    if layout is not None and p == "token" and layout.cls_index is None:
        how = "the patch tokens' mean attention (no class token)"
    if layout is not None and layout.distilled and p == "token":
        how = "the class and distillation tokens' mean attention (the two heads are averaged)"
    left = []
    if layout is not None and layout.distilled:
        left.append("the distillation token")
    if layout is not None and layout.registers:
        left.append(f"{layout.registers} register tokens")
    return f"map from {how}" + (f"; {' and '.join(left)} left out of the map" if left else "")


def _check(attentions: Sequence[np.ndarray], discard_ratio: float, pool: str) -> None:
    if not attentions:
        raise VitdeployError("no attention probabilities: the model returned none")
    if not 0.0 <= discard_ratio < 1.0:
        raise UsageError(f"--discard-ratio must be in [0, 1), not {discard_ratio}")
    if pool not in POOLS:
        raise UsageError(f"pool must be one of {', '.join(POOLS)}, not {pool!r}")


def _split_pool(attentions: Sequence[np.ndarray], pool: str, head_fusion: str) -> tuple[list[np.ndarray], np.ndarray | None]:
    """The blocks' [B, heads, N, N] attentions and, for a MAP head, its pooling attention fused over heads [B, N]
    (the last entry, one query row)."""
    blocks = list(attentions)
    if _pool_name(pool) != "map":
        return blocks, None
    if len(blocks) < 2 or np.asarray(blocks[-1]).shape[-2] != 1:
        raise VitdeployError("an attention-pooling head's map needs its pooling attention (one query row) after the "
                             "blocks'; the model returned none")
    pooled = fuse_heads(np.asarray(blocks[-1], np.float64), head_fusion)[:, 0, :]
    return blocks[:-1], pooled


def rollout(
    attentions: Sequence[np.ndarray],
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    pool: str = "cls",
    layout: TokenLayout | None = None,
) -> np.ndarray:
    """Attention rollout: [B, patches] relevance of each patch, from per-block [B, heads, N, N] probabilities (for a
    MAP head, its [B, heads, 1, N] pooling attention last)."""
    _check(attentions, discard_ratio, pool)
    blocks, pooled = _split_pool(attentions, pool, head_fusion)
    first = np.asarray(blocks[0], np.float64)
    b, _, n, _ = first.shape
    eye = np.eye(n)
    result = np.broadcast_to(eye, (b, n, n)).copy()
    for attn in blocks:
        a = discard_lowest(fuse_heads(np.asarray(attn, np.float64), head_fusion), discard_ratio)
        a = a + eye
        a = a / a.sum(axis=-1, keepdims=True)
        result = a @ result
    return _readout(result, pool, layout, pooled)


def last_layer(
    attentions: Sequence[np.ndarray],
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    pool: str = "cls",
    layout: TokenLayout | None = None,
) -> np.ndarray:
    """The last block's attention alone, read out like ``rollout`` (a MAP head: its pooling attention alone): a
    sharper, less faithful map."""
    _check(attentions, discard_ratio, pool)
    blocks, pooled = _split_pool(attentions, pool, head_fusion)
    if pooled is not None:
        n = pooled.shape[-1]
        return _readout(np.broadcast_to(np.eye(n), (len(pooled), n, n)), pool, layout, pooled)
    a = discard_lowest(fuse_heads(np.asarray(blocks[-1], np.float64), head_fusion), discard_ratio)
    return _readout(a, pool, layout)


def attention_map(
    attentions: Sequence[np.ndarray],
    grid: tuple[int, int],
    method: str = "rollout",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    pool: str = "cls",
    layout: TokenLayout | None = None,
) -> np.ndarray:
    """[B, gh, gw] maps scaled to [0, 1] per image (a constant map stays 0)."""
    if method == "rollout":
        v = rollout(attentions, head_fusion, discard_ratio, pool, layout)
    elif method == "last-layer":
        v = last_layer(attentions, head_fusion, discard_ratio, pool, layout)
    else:
        raise UsageError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    gh, gw = grid
    if v.shape[1] != gh * gw:
        raise VitdeployError(f"{v.shape[1]} patch tokens do not make a {gh}x{gw} grid")
    v = v.reshape(len(v), gh, gw)
    lo = v.min(axis=(1, 2), keepdims=True)
    span = v.max(axis=(1, 2), keepdims=True) - lo
    return np.where(span > 0, (v - lo) / np.where(span > 0, span, 1.0), 0.0).astype(np.float32)


# --- the picture ---------------------------------------------------------------------------------------


def _font(size: int) -> ImageFont.ImageFont | ImageFont.FreeTypeFont:
    try:
        from matplotlib import font_manager

        return ImageFont.truetype(font_manager.findfont("DejaVu Sans"), size)
    except Exception:  # noqa: BLE001 - any font is better than no picture
        return ImageFont.load_default()


def panel_size(input_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of one image panel: the shorter side PANEL, the model's aspect ratio."""
    h, w = input_size
    s = PANEL / min(h, w)
    return (round(w * s), round(h * s))


def png_size(input_size: tuple[int, int]) -> tuple[int, int]:
    """(width, height) of the PNG ``render`` draws for a model of this input size."""
    pw, ph = panel_size(input_size)
    return (3 * MARGIN + 2 * pw, 2 * MARGIN + ph + CAPTION_H)


def colorize(heat: np.ndarray, size: tuple[int, int]) -> Image.Image:
    """A [gh, gw] map in [0, 1] → an RGB heat image of ``size`` (w, h), upsampled smoothly."""
    from matplotlib import colormaps

    up = Image.fromarray(heat.astype(np.float32), mode="F").resize(size, Image.Resampling.BILINEAR)
    a = np.clip(np.asarray(up), 0.0, 1.0)
    rgb = colormaps[COLORMAP](a)[..., :3]
    return Image.fromarray((rgb * 255).round().astype(np.uint8), "RGB")


def overlay(image: Image.Image, heat: np.ndarray, alpha: float = ALPHA) -> Image.Image:
    """The heat map blended over the image (both at the image's size)."""
    return Image.blend(image.convert("RGB"), colorize(heat, image.size), alpha)


def render(
    image: Image.Image,
    heat: np.ndarray,
    top: Sequence[tuple[str, float]],
    title: str = "",
    note: str = "",
    headline: str = "",
) -> Image.Image:
    """Input panel | overlay panel, a colour bar and the top predictions in the caption (an embedding model, which
    has no classes: ``headline``, what its vector is)."""
    pw, ph = panel_size((image.height, image.width))
    # small inputs (32x32 digits) are shown as their pixels, large ones smoothly
    interp = Image.Resampling.NEAREST if min(image.size) < PANEL // 2 else Image.Resampling.BICUBIC
    shown = image.convert("RGB").resize((pw, ph), interp)
    over = overlay(shown, heat)
    W, H = png_size((image.height, image.width))
    canvas = Image.new("RGB", (W, H), "white")
    canvas.paste(shown, (MARGIN, MARGIN))
    canvas.paste(over, (2 * MARGIN + pw, MARGIN))
    draw = ImageDraw.Draw(canvas)
    y = 2 * MARGIN + ph - 4
    big, small = _font(15), _font(12)
    caption = (f"top-{len(top)}:  " + "  ·  ".join(f"{name} ({score:.1%})" for name, score in top)) if top else headline
    draw.text((MARGIN, y), caption, fill="black", font=big)
    if title:
        draw.text((MARGIN, y + 24), title, fill=(90, 90, 90), font=small)
    # colour bar under the overlay panel: low → high attention
    bar_w, bar_h = min(pw - 80, 160), 10
    x0 = W - MARGIN - 32 - bar_w
    bar = colorize(np.linspace(0, 1, 64, dtype=np.float32)[None, :], (bar_w, bar_h))
    canvas.paste(bar, (x0, y + 48))
    draw.text((x0 - 30, y + 45), "low", fill=(90, 90, 90), font=small)
    draw.text((x0 + bar_w + 5, y + 45), "high", fill=(90, 90, 90), font=small)
    if note:
        draw.text((MARGIN, y + 64), note, fill=(90, 90, 90), font=small)
    return canvas


# --- images in, PNGs out ---------------------------------------------------------------------------------


@dataclass
class Explanation:
    source: Path
    output: Path
    heatmap: np.ndarray  # [gh, gw] in [0, 1]
    top: list[tuple[str, float]]  # empty for an embedding model: it has no classes


@dataclass
class ExplainResult:
    explanations: list[Explanation] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    method: str = "rollout"
    model: str = ""
    precision: str = "fp32"
    backend: str = "torch"
    note: str = ""  # how the map was made and which tokens it leaves out (readout_note)
    task: str = ""  # what the model answers (core/task.py Task.describe)


@dataclass
class MapAgreement:
    """How closely a copy's maps follow the reference's on the same images (maps in [0, 1])."""

    model: str
    precision: str
    backend: str
    images: int
    top1_agreement: float | None  # None for an embedding model (no classes to agree on)
    max_abs_diff: float
    mean_abs_diff: float
    min_correlation: float
    mean_correlation: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def compare_maps(reference: ExplainResult, candidate: ExplainResult) -> MapAgreement:
    """Per image |Δ| and Pearson correlation of the two maps, and whether the top-1 labels agree."""
    ref = {e.source: e for e in reference.explanations}
    pairs = [(ref[e.source], e) for e in candidate.explanations if e.source in ref]
    if not pairs:
        raise VitdeployError("no image was explained by both models")
    c = metrics.compare(
        np.stack([r.heatmap for r, _ in pairs]), np.stack([e.heatmap for _, e in pairs]),
        extra={"correlation": metrics.pearson_rows},
    )
    corr = c.extra["correlation"]
    return MapAgreement(
        model=candidate.model,
        precision=candidate.precision,
        backend=candidate.backend,
        images=len(pairs),
        top1_agreement=(float(np.mean([r.top[0][0] == e.top[0][0] for r, e in pairs]))
                        if all(r.top and e.top for r, e in pairs) else None),
        max_abs_diff=c.max_abs_diff,
        mean_abs_diff=c.mean_abs_diff,
        min_correlation=float(corr.min()),
        mean_correlation=float(corr.mean()),
    )


def check_comparable(model: Path, others: Sequence[Path]) -> None:
    """Refuse, before any map is drawn, a --compare copy of another model (checks.compare.same_model: classes, names,
    input size), or "top-1 agreement" would compare unrelated labels (verify refuses the same)."""
    if not others:
        return
    from vitdeploy.checks.compare import same_model
    from vitdeploy.model.importers import read_any_manifest

    def manifest(p: Path) -> Manifest:
        if not p.exists():
            raise VitdeployError(f"{p}: no such file")
        return read_any_manifest(p)

    ref = (model.name, manifest(model))
    for o in others:
        why = same_model(ref, (str(o), manifest(o)))
        if why:
            raise UsageError(f"--compare {o}: {why}; compare copies of the same model (its FP16/INT8/ONNX forms)")


def output_names(paths: Sequence[Path], out_dir: Path, suffix: str = ".attention.png") -> list[Path]:
    """One PNG per input, named after it; inputs that share a name get their parent folders prefixed."""
    names = [p.stem for p in paths]
    for depth in range(1, 8):
        seen: dict[str, int] = {}
        for n in names:
            seen[n] = seen.get(n, 0) + 1
        if all(c == 1 for c in seen.values()):
            break
        names = [
            "_".join([*_folders(p)[-depth:], p.stem]) if seen[n] > 1 else n
            for p, n in zip(paths, names, strict=True)
        ]
    else:  # still clashing (the same file twice): number them
        names = [f"{n}_{i}" for i, n in enumerate(names)]
    # a plain name, never a path: every map lands inside out_dir
    return [out_dir / f"{n}{suffix}".replace("/", "_").replace("\\", "_") for n in names]


def _folders(p: Path) -> tuple[str, ...]:
    """The parent folders' names, without the root ('/' of an absolute path, or a drive)."""
    return tuple(q for q in p.parent.parts if q not in (p.anchor, "", "/"))




def explain(
    images: Sequence[str | Path],
    model: str | Path = "ckpt.pth",
    out_dir: str | Path = "attention",
    method: str = "rollout",
    head_fusion: str = "mean",
    discard_ratio: float = 0.0,
    top_k: int = 3,
    batch_size: int = 16,
    threads: int | None = None,
    on_image: Callable[[Explanation], Any] | None = None,
) -> ExplainResult:
    """Attention maps for image files (or folders of them) as PNGs in ``out_dir``.

    Unreadable images are listed in ``result.skipped`` (the others are written);
    when none can be read, VitdeployError.
    """
    if method not in METHODS:
        raise UsageError(f"unknown method {method!r}: choose one of {', '.join(METHODS)}")
    if head_fusion not in HEAD_FUSIONS:
        raise UsageError(f"unknown head fusion {head_fusion!r}: choose one of {', '.join(HEAD_FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:
        raise UsageError(f"--discard-ratio must be in [0, 1), not {discard_ratio}")
    if Path(out_dir).exists() and not Path(out_dir).is_dir():
        raise VitdeployError(f"-o {out_dir}: a file, not a folder; pass a folder for the PNGs")
    paths = gather_images(images)

    from vitdeploy.core.task import task_of

    am = open_attention_model(model, threads)
    pp: Preprocess = am.manifest.pp()
    labels = am.manifest.labels
    task = task_of(am.manifest)  # an embedding model's output is a vector: no feature is ever named as a class
    grid, pool, layout = am.grid, am.pool, am.layout
    note = readout_note(pool, layout)
    out = Path(out_dir)
    names = output_names(paths, out)
    title = f"attention {method} · heads {head_fusion}" + (f" · discard {discard_ratio:g}" if discard_ratio else "")
    title += f" · {Path(model).name} ({am.manifest.precision}, {am.backend})"
    shown_note = note if layout.prefix != 1 or pool != "token" else ""  # the plain ViT's map needs no words
    result = ExplainResult(method=method, model=str(model), precision=am.manifest.precision, backend=am.backend,
                           note=note, task=task.describe())

    # the maps are made in a folder beside -o and moved in at the end: a failure (a full disk) leaves none behind
    import shutil

    staged = temp_dir_beside(out)
    try:
        for start in range(0, len(paths), batch_size):
            chunk = list(range(start, min(start + batch_size, len(paths))))
            shown: list[Image.Image] = []
            keep: list[int] = []
            for i in chunk:
                try:
                    shown.append(resize_crop(load_image(paths[i]), pp))
                    keep.append(i)
                except ImageReadError as e:
                    result.skipped.append((paths[i], str(e)))
            if not keep:
                continue
            logits, attns = am.forward(shown)
            heat = attention_map(attns, grid, method, head_fusion, discard_ratio, pool, layout)
            order, best = metrics.top_k(metrics.softmax(logits), top_k)
            for j, i in enumerate(keep):
                top = [] if task.is_embedding else [
                    (labels[c] if c < len(labels) else str(c), float(p)) for c, p in zip(order[j], best[j], strict=True)]
                png = render(shown[j], heat[j], top, title, shown_note, headline=task.describe())
                with atomic_path(staged / names[i].name) as tmp:
                    png.save(tmp, format="PNG")
                ex = Explanation(paths[i], names[i], heat[j], top)
                result.explanations.append(ex)
                if on_image is not None:
                    on_image(ex)
        if result.explanations:
            move_into(staged, out)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    if not result.explanations:
        first = result.skipped[0]
        raise VitdeployError(f"none of the {len(paths)} image(s) could be read (first: {first[0]}: {first[1]})")
    return result
