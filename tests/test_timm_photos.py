"""timm's ViT families on real photos: `vitdeploy import` then `vitdeploy infer --json` give timm's class
probabilities, judged by timm's own eval transform (``resolve_data_config`` + ``create_transform`` on the PIL image)
and forward pass.

Each model keeps its real image size, patch and pretrained cfg (the preprocessing is what this test is about) and
comes two ways, as users save it: a ``save_for_hf`` folder of a narrow 2-block copy (all ten models, and two
geometries none of them uses by default), and a bare state dict of the full named architecture imported with
``--arch`` (its preprocessing read from the table generated from timm's registrations; a full-size model costs up to
~40 CPU-s, so CI runs three and VITDEPLOY_SLOW=1 runs all ten). Weights are random and perturbed, the head scaled so
that the probabilities are far from uniform, and a control shows that another crop moves them far beyond the bound.

``pytest -s tests/test_timm_photos.py`` prints one line per model: ``name: max|dp| X (folder), Y (--arch)``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")

from vitdeploy.cli import app  # noqa: E402

# `make test` leaves these out (`make test-all` and CI run them): timm's own transforms against ours on the photos, per family (18 test-s of 920)
pytestmark = pytest.mark.slow

MODELS = [
    "deit_tiny_distilled_patch16_224",
    "deit3_small_patch16_224",
    "vit_small_patch14_dinov2",
    "vit_small_patch14_reg4_dinov2",
    "vit_base_patch16_siglip_224",
    "vit_base_patch32_clip_224",
    "vit_medium_patch16_gap_256",
    "eva02_tiny_patch14_224",
    "vit_small_patch16_dinov3",
    "beit_base_patch16_224",
]
N_CLS = 5
LABELS = [f"class_{i}" for i in range(N_CLS)]
TOL = 2e-3  # the bound on |p_vitdeploy - p_timm|
# Full-size --arch cases cheap enough for CI, one from each name table (timm_archs.json, timm_eva_beit.json) and
# DINOv3, whose input size comes from its pretrained cfg, not its model kwargs; the others (22-88M parameters to build,
# save and load, DINOv2 at 518 px) run with VITDEPLOY_SLOW=1.
ARCH_IN_CI = {"deit_tiny_distilled_patch16_224", "eva02_tiny_patch14_224", "vit_small_patch16_dinov3"}
ARCH_CASES = [n if n in ARCH_IN_CI else pytest.param(n, marks=pytest.mark.skipif(
    not os.environ.get("VITDEPLOY_SLOW"), reason="full-size timm model: set VITDEPLOY_SLOW=1")) for n in MODELS]


def perturb(model: Any, seed: int) -> Any:
    """Every parameter random (LayerScale, q/v biases and relative position tables, which timm initialises to
    constants, included): weights N(0, 0.02), 1-d tensors N(0, 0.05), norm weights N(1, 0.2), LayerScale N(0.5, 0.3)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if n.endswith("gamma") or n.endswith("gamma_1") or n.endswith("gamma_2"):
                p.copy_(0.5 + 0.3 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1 and "norm" in n and n.endswith("weight"):
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=g))
            elif p.ndim == 1:
                p.copy_(0.05 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
    return model.eval()


def timm_pixels(model: Any, images: list[Image.Image], **override: Any) -> Any:
    """timm's eval transform for the model (its pretrained cfg) on the PIL images, as timm users open them."""
    from timm.data import create_transform, resolve_data_config

    t = create_transform(**{**resolve_data_config({}, model=model), **override})
    return torch.stack([t(im) for im in images])


def timm_probs(model: Any, pixels: Any, spread: float | None = None) -> np.ndarray:
    """timm's probabilities; ``spread``: first scale the classifier(s) so the logits on these pixels have that std
    (probabilities far from uniform, so an error in the input shows in them)."""
    with torch.no_grad():
        logits = model(pixels)
        if spread is not None:
            k = spread / float(logits.std())
            for n, p in model.named_parameters():
                if n.split(".")[0] in ("head", "head_dist"):
                    p.mul_(k)
            logits = logits * k  # the heads are linear in their weight and bias
        return np.asarray(logits.softmax(-1).numpy(), np.float64)


def vitdeploy_probs(source: Path, files: list[Path], work: Path, arch: str | None = None) -> np.ndarray:
    """`vitdeploy import SOURCE [--arch NAME]`, then `vitdeploy infer PHOTOS --json`: probabilities in LABELS order."""
    runner = CliRunner()
    ckpt = work / "ckpt.pth"
    r = runner.invoke(app, ["import", str(source), "-o", str(ckpt), *(["--arch", arch] if arch else [])])
    assert r.exit_code == 0, r.output
    out = work / "infer.json"
    r = runner.invoke(app, ["infer", *map(str, files), "-m", str(ckpt), "-k", str(N_CLS), "--json", str(out)])
    assert r.exit_code == 0, r.output
    rows = {Path(row["path"]).name: row for row in json.loads(out.read_text())["predictions"]}
    probs = np.zeros((len(files), N_CLS))
    for i, f in enumerate(files):
        row = rows[f.name]
        for k in range(1, N_CLS + 1):
            probs[i, LABELS.index(row[f"label_{k}"])] = row[f"score_{k}"]
    return probs


@pytest.fixture(scope="module")
def photos(photo_files: list[Path]) -> list[Image.Image]:
    return [Image.open(f).convert("RGB") for f in photo_files]


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, dict[str, float]]]:
    """max |dp| per model and source, printed one line a model when the module ends (visible with -s)."""
    out: dict[str, dict[str, float]] = {}
    yield out
    print()
    for name in [*MODELS, *VARIANTS]:
        got = out.get(name, {})
        cells = [f"{got[k]:.1e} ({k})" if k in got else f"- ({k})" for k in ("folder", "--arch")]
        print(f"{name}: max|dp| {', '.join(cells)}")


def _check(name: str, source: str, ours: np.ndarray, ref: np.ndarray, figures: dict[str, dict[str, float]]) -> None:
    dp = float(np.abs(ours - ref).max())
    figures.setdefault(name, {})[source] = dp
    assert ref.max(axis=1).mean() > 0.4, ref  # far from uniform (0.2)
    assert dp <= TOL, (name, source, dp)


# Narrow copies (timm's own kwargs, recorded by save_for_hf in model_args) keep the forward cheap at DINOv2's 518 px;
# the patch, image size and pretrained cfg stay the named model's.
SMALL = {"depth": 2, "embed_dim": 192, "num_heads": 3}
# Geometries none of the ten uses by default, as save_for_hf records them: a non-square input (timm resizes with
# ResizeKeepRatio), and crop_mode squash with crop_pct 0.95 (timm's vit_medium_patch16_gap_384 and
# vit_base_patch32_clip_384 tags: both sides to size / crop_pct, then a center crop).
VARIANTS = {
    "deit_tiny_distilled_patch16_224 at 224x160": ("deit_tiny_distilled_patch16_224", {"img_size": (224, 160)}, None),
    "vit_medium_patch16_gap_256 crop_mode squash": ("vit_medium_patch16_gap_256", {}, {"crop_mode": "squash"}),
}
FOLDER_CASES = {**{n: (n, {}, None) for n in MODELS}, **VARIANTS}


@pytest.mark.parametrize("case", list(FOLDER_CASES))
def test_timm_folder_infers_timms_probabilities_on_photos(
    case: str, photos: list[Image.Image], photo_files: list[Path], tmp_path: Path, figures: dict[str, dict[str, float]]
) -> None:
    """A save_for_hf folder (2 narrow blocks, the real image size and pretrained cfg): import + infer give the
    probabilities of the model timm itself loads from that folder (``local-dir:``), with its data config."""
    from timm.models._hub import save_for_hf

    name, kwargs, data_config = FOLDER_CASES[case]
    model = perturb(timm.create_model(name, pretrained=False, num_classes=N_CLS, **{**SMALL, **kwargs}),
                    seed=list(FOLDER_CASES).index(case))
    # (an in-memory model built with img_size= keeps its name's data config: the size it was built at is asked for)
    timm_probs(model, timm_pixels(model, photos, input_size=(3, *model.patch_embed.img_size)), spread=2.0)
    save_for_hf(model, tmp_path / "hf", data_config=data_config)
    model = timm.create_model(f"local-dir:{tmp_path / 'hf'}", pretrained=True).eval()
    ref = timm_probs(model, timm_pixels(model, photos))
    # the test can fail: timm's own transform with the other crop mode moves the probabilities far beyond the bound
    other = "center" if (data_config or {}).get("crop_mode") == "squash" else "squash"
    control = timm_probs(model, timm_pixels(model, photos, crop_mode=other))
    assert float(np.abs(control - ref).max()) > 5 * TOL
    ours = vitdeploy_probs(tmp_path / "hf", photo_files, tmp_path)
    _check(case, "folder", ours, ref, figures)


@pytest.mark.parametrize("name", ARCH_CASES)
def test_timm_state_dict_with_arch_infers_timms_probabilities_on_photos(
    name: str, photos: list[Image.Image], photo_files: list[Path], tmp_path: Path, figures: dict[str, dict[str, float]]
) -> None:
    """A bare state dict of the full named architecture: --arch gives timm's default pretrained cfg's preprocessing."""
    model = perturb(timm.create_model(name, pretrained=False, num_classes=N_CLS), seed=20 + MODELS.index(name))
    ref = timm_probs(model, timm_pixels(model, photos), spread=2.0)
    torch.save(model.state_dict(), tmp_path / "weights.pth")
    del model
    ours = vitdeploy_probs(tmp_path / "weights.pth", photo_files, tmp_path, arch=name)
    _check(name, "--arch", ours, ref, figures)


def test_timm_folder_pretrained_cfg_read_as_timm_reads_it(tmp_path: Path) -> None:
    """Null fields take timm's defaults (resolve_data_config: crop_pct 0.875, center, bicubic); a value no transform
    can use is one line naming it, exit 1, and no checkpoint written (not an error on first use of the checkpoint)."""
    from timm.models._hub import save_for_hf

    from vitdeploy.model.importers import load_any

    save_for_hf(timm.create_model("deit_tiny_patch16_224", pretrained=False, depth=1, num_classes=N_CLS), tmp_path / "hf")
    cfg_file = tmp_path / "hf" / "config.json"
    cfg = json.loads(cfg_file.read_text())
    cfg["pretrained_cfg"].update(crop_pct=None, crop_mode=None, interpolation=None)
    cfg_file.write_text(json.dumps(cfg))
    pp = load_any(tmp_path / "hf").manifest.pp()
    assert (pp.crop_pct, pp.resize_mode, pp.interpolation) == (0.875, "shorter", "bicubic")
    for field, value, said in (("interpolation", "area", "interpolation must be one of"), ("std", [0.2, 0.0, 0.2], "std"),
                               ("crop_mode", "border", 'crop_mode "border" must be one of center, squash')):
        bad = json.loads(json.dumps(cfg))
        bad["pretrained_cfg"][field] = value
        cfg_file.write_text(json.dumps(bad))
        out = tmp_path / f"{field}.pth"
        r = CliRunner().invoke(app, ["import", str(tmp_path / "hf"), "-o", str(out)])
        assert r.exit_code == 1 and said in r.output and "Traceback" not in r.output, r.output
        assert not out.exists()


def test_non_square_resize_is_timms_to_the_byte() -> None:
    """A non-square input (timm's ResizeKeepRatio): vitdeploy's resize and crop, run.py's and timm's give the same
    bytes, at photo sizes where scaling by max(rh / ih, rw / iw) instead of dividing by timm's min ratio lands one
    pixel off (144x261 → 248x449, not 450)."""
    from helpers import load_run_py
    from skimage import data
    from timm.data import create_transform

    from vitdeploy.core.preprocess import Preprocess, resize_crop

    run_py = load_run_py(Path(__file__).resolve().parents[1] / "vitdeploy" / "stages" / "bundle_files" / "run.py")
    pp = {"input_size": [224, 160], "resize_mode": "shorter", "crop_pct": 0.9, "interpolation": "bicubic",
          "mean": [0.5] * 3, "std": [0.5] * 3, "channel_order": "RGB"}
    t = create_transform(input_size=(3, 224, 160), crop_pct=0.9, interpolation="bicubic", normalize=False)
    for name, (w, h) in (("astronaut", (261, 144)), ("coffee", (225, 240)), ("chelsea", (645, 240))):
        img = Image.fromarray(getattr(data, name)()).convert("RGB").resize((w, h))
        want = t(img).numpy().transpose(1, 2, 0)
        assert np.array_equal(np.asarray(resize_crop(img, Preprocess.from_dict(pp))), want), name
        assert np.array_equal(np.asarray(run_py.resize_crop(img, pp)), want), name
