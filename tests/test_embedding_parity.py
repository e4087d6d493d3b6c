"""Backbones as their own libraries define their output (issue 36, "Embedding parity"): imported, exported as embedding
models, and judged by the library's own forward pass and image processor.

- Hugging Face ``Dinov2Model`` and ``Dinov2WithRegistersModel`` (``save_pretrained`` folders): ``pooler_output``, the
  class token after the final LayerNorm.
- timm, ``forward`` of the model as its users create it: with ``num_classes=0`` that is ``forward_head(pre_logits=True)``
  (DINOv2: the class token; EVA-02 and DINOv3: timm's mean of the patch tokens); a CLIP tower (``.openai``) and
  PE-core keep their ``head``, which is the image tower's projection (timm's pretrained cfg registers it with
  num_classes = the joint width), so their output is the projected embedding. Narrow 2-block copies as
  ``save_for_hf`` folders, and full-size state dicts with ``--arch`` (the cheapest per timm class in CI,
  the rest with VITDEPLOY_SLOW=1).

Each model: ``import`` → ``export`` (its parity check judged as an embedding: relative |Δ|, per-image cosine) → ONNX
Runtime within 1e-4 of the library's output relative to its largest value; and on the scikit-image photos through
vitdeploy's preprocessing against the library's processor (transformers' image processor; timm's
``resolve_input_data_config`` + ``create_transform``), per-image cosine ≥ 0.9999 and, since random weights make
embeddings that barely depend on the image, max |Δ| ≤ 1e-5 of the largest value, which a bilinear-for-bicubic
control breaks. Weights random and perturbed away from their init, so no mapping mistake hides behind a trivial
parameter.

``pytest -s tests/test_embedding_parity.py`` prints one line per model: task, parity max rel. |Δ|, photo cosine min,
photo max rel. |Δ|.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import ort_run
from PIL import Image
from typer.testing import CliRunner

torch = pytest.importorskip("torch")
timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

from vitdeploy.cli import app  # noqa: E402

TOL = 1e-4  # the bound: max |Δ| relative to the library's largest |value|
MIN_PHOTO_COSINE = 0.9999  # the bound on the photos, per image
PHOTO_REL = 1e-5  # and max |Δ| on the photos relative to the library's largest value (measured ≤ 5e-7)


def perturb(model: Any, seed: int) -> Any:
    """Every parameter random: weights N(0, 0.02), 1-d tensors N(0, 0.05), norm gains N(1, 0.2), LayerScale
    N(0.5, 0.3) (timm's gamma, transformers' lambda1), position embeddings N(0, 0.5); the CLIP/PE projection's bias
    non-zero too, so its mapping (proj_bias) is exercised."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if n.endswith(("gamma", "lambda1")):
                p.copy_(0.5 + 0.3 * r)
            elif p.ndim == 1 and "norm" in n and n.endswith("weight"):
                p.copy_(1 + 0.2 * r)
            elif "position" in n or n == "pos_embed":
                p.copy_(0.5 * r)
            elif p.ndim == 1:
                p.copy_(0.05 * r)
            else:
                p.copy_(0.02 * r)
    return model.eval()


@dataclass
class Case:
    """A model as its library holds it: where it is saved, the library's forward (pixels → its embedding) and its
    preprocessing (PIL images → pixels), and the task the import must record."""

    source: Path
    forward: Callable[[Any], np.ndarray]
    pixels: Callable[[list[Image.Image]], Any]
    task: dict[str, Any]
    arch: str | None = None
    library_size: tuple[int, int] = (0, 0)
    extra: dict[str, Any] = field(default_factory=dict)


def _no_grad(fn: Callable[[Any], Any]) -> Callable[[Any], np.ndarray]:
    def run(x: Any) -> np.ndarray:
        with torch.no_grad():
            return np.asarray(fn(x).numpy(), np.float64)
    return run


def _hf_case(root: Path, arch: str, seed: int) -> Case:
    """A small Hugging Face backbone beside its own image processor, saved with save_pretrained."""
    import transformers as T

    small = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "layerscale_value": 0.5}
    norm = {"image_mean": [0.485, 0.456, 0.406], "image_std": [0.229, 0.224, 0.225], "resample": 3, "do_center_crop": True}
    if arch == "Dinov2Model":  # the Hub's layout: config 518, processor shorter side 256 → crop 224 (interpolated)
        cfg: Any = T.Dinov2Config(**small, image_size=518, patch_size=14)
        proc = T.BitImageProcessor(size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, **norm)
        task = {"kind": "embedding", "dim": 64, "pool": "cls"}
    else:
        cfg = T.Dinov2WithRegistersConfig(**small, image_size=56, patch_size=14, num_register_tokens=4)
        proc = T.BitImageProcessor(size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}, **norm)
        task = {"kind": "embedding", "dim": 64, "pool": "cls", "register_tokens": 4}
    torch.manual_seed(seed)
    model = perturb(getattr(T, arch)(cfg), seed)
    d = root / arch
    model.save_pretrained(d)
    proc.save_pretrained(d)
    lib = T.AutoImageProcessor.from_pretrained(d, backend="pil")

    def pixels(images: list[Image.Image]) -> Any:
        return lib(images=images, return_tensors="pt")["pixel_values"]

    return Case(d, _no_grad(lambda x: model(pixel_values=x).pooler_output), pixels, task)


def _timm_pixels(model: Any) -> Callable[[list[Image.Image]], Any]:
    """timm's eval transform for the model as it is built (timm.data.model_config.resolve_input_data_config: the data
    config save_for_hf records), on the PIL images."""
    from timm.data import create_transform
    from timm.data.model_config import resolve_input_data_config

    t = create_transform(**resolve_input_data_config(model))

    def pixels(images: list[Image.Image]) -> Any:
        return torch.stack([t(im) for im in images])

    return pixels


# The narrow copies: timm's own kwargs (recorded by save_for_hf in model_args) over each named architecture; the
# name, its tag, its pretrained cfg and its head stay the named model's.
TIMM_FOLDERS: dict[str, dict[str, Any]] = {
    "vit_small_patch14_dinov2": {"num_classes": 0, "embed_dim": 64, "num_heads": 2, "img_size": 56},
    "vit_base_patch16_clip_224.openai": {"embed_dim": 192, "num_heads": 3, "img_size": 64},  # head 192 → 512: CLIP's proj
    "eva02_tiny_patch14_224": {"num_classes": 0, "img_size": 56},
    "vit_small_patch16_dinov3": {"num_classes": 0, "embed_dim": 64, "num_heads": 2},  # runs at its cfg's 256
    "vit_pe_core_tiny_patch16_384": {"img_size": 64},  # head 192 → 512: PE's projection, attention pool over 8 heads
}
TASKS: dict[str, dict[str, Any]] = {
    "vit_small_patch14_dinov2": {"pool": "cls"},
    "vit_base_patch16_clip_224.openai": {"pool": "cls", "projection": True, "dim": 512},
    "eva02_tiny_patch14_224": {"pool": "avg"},
    "vit_small_patch16_dinov3": {"pool": "avg", "register_tokens": 4},
    "vit_pe_core_tiny_patch16_384": {"pool": "map", "projection": True, "dim": 512},
}
HF_MODELS = ["Dinov2Model", "Dinov2WithRegistersModel"]
# Full-size state dicts with --arch, one model a case (measured on one core: import + export + ONNX Runtime):
# EVA-02-T 6 s and PE-core-T 10 s run in CI, one per timm class of the Eva family; DINOv2-S at 518 px (19 s),
# DINOv3-S (11 s) and CLIP ViT-B/16 (31 s) with VITDEPLOY_SLOW=1 (VisionTransformer's geometry is held by the
# folders above and test_timm_parity's full-size DeiT/DeiT-III/gap models).
ARCH_IN_CI = {"eva02_tiny_patch14_224", "vit_pe_core_tiny_patch16_384"}
ARCH_CASES = [n if n in ARCH_IN_CI else pytest.param(n, marks=pytest.mark.skipif(
    not os.environ.get("VITDEPLOY_SLOW"), reason="full-size timm model: set VITDEPLOY_SLOW=1")) for n in TIMM_FOLDERS]


def _task(name: str, width: int) -> dict[str, Any]:
    return {"kind": "embedding", "dim": width, **TASKS[name]}


def _timm_folder_case(root: Path, name: str, seed: int) -> Case:
    from timm.models import save_for_hf

    model = perturb(timm.create_model(name, pretrained=False, depth=2, **TIMM_FOLDERS[name]), seed)
    d = root / name
    save_for_hf(model, d)
    return Case(d, _no_grad(model), _timm_pixels(model), _task(name, model.num_features), extra={"model": model})


@pytest.fixture(scope="module")
def figures() -> Iterator[dict[str, tuple[str, float, float, float]]]:
    """Per model: its task line, the export's max rel. |Δ| to the library, the photos' minimum cosine and max rel.
    |Δ|; printed as a table when the module ends (visible with -s)."""
    out: dict[str, tuple[str, float, float, float]] = {}
    yield out
    print("\nmodel | task | parity max rel |Δ| | photo cosine min (1 - cos) | photo max rel |Δ|")
    for name, (task, rel, cos, photo_rel) in out.items():
        print(f"{name} | {task} | {rel:.2e} | {cos:.9f} ({1 - cos:.1e}) | {photo_rel:.1e}")


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Case]:
    root = tmp_path_factory.mktemp("embedding_parity")
    out = {f"hf:{a}": _hf_case(root, a, seed=i) for i, a in enumerate(HF_MODELS)}
    out.update({f"timm:{n}": _timm_folder_case(root, n, seed=10 + i) for i, n in enumerate(TIMM_FOLDERS)})
    return out


@pytest.fixture(scope="module")
def photos(photo_files: list[Path]) -> list[Image.Image]:
    return [Image.open(f).convert("RGB") for f in photo_files]


def judge(name: str, case: Case, work: Path, photo_files: list[Path], photos: list[Image.Image],
          figures: dict[str, tuple[str, float, float, float]], check: bool = True) -> None:
    """import → export → ONNX Runtime against the library, on a random batch and on the photos."""
    from vitdeploy.checks.metrics import compare_embeddings
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.preprocess import preprocess_file
    from vitdeploy.core.task import task_of
    from vitdeploy.model.importers import import_checkpoint
    from vitdeploy.stages.export import export_onnx

    ckpt, manifest = import_checkpoint(case.source, work / "ckpt.pth", arch=case.arch)
    task = task_of(manifest)
    assert manifest.extra["task"] == case.task == task.to_dict(), (manifest.extra.get("task"), case.task)
    assert manifest.labels == [] and manifest.num_classes == 0
    out = export_onnx(ckpt, work / "model.onnx", check=check, images=photo_files[0].parent if check else None)
    assert task_of(read_onnx_manifest(out.path)) == task and read_onnx_manifest(out.path).extra["export"]["output"] == "embedding"
    if check:  # export's own parity check, judged as an embedding model: relative |Δ|, no top-1, the cosine beside it
        assert out.parity is not None and out.parity.passed and out.parity.source.endswith(photo_files[0].parent.name)
        for b in out.parity:
            assert b.embedding and b.tolerance == pytest.approx(TOL * b.max_abs_logit) and b.min_cosine > 0.99999
            assert "top1_mismatches" not in b.to_dict() and "min cosine" in b.describe()

    # the exported graph on the same pixels as the library: its output within 1e-4 of the library's largest value
    h, w = manifest.input_size
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(1))
    ref = case.forward(x)
    got = ort_run(out.path, x.numpy())
    assert got.shape == ref.shape == (2, task.dim)
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    assert np.abs(ref).max() > 1e-3  # not a comparison of near-zero numbers
    assert rel <= TOL, (name, rel)

    # the photos: vitdeploy's preprocessing → ONNX, against the library's processor → the library's model
    lib_pixels = case.pixels(photos)
    assert tuple(lib_pixels.shape[2:]) == (h, w)  # the same input size as the library's processor makes
    ours = ort_run(out.path, np.stack([preprocess_file(f, manifest.pp()) for f in photo_files]))
    lib = case.forward(lib_pixels)
    c = compare_embeddings(lib, ours)
    photo_rel = float(np.abs(ours - lib).max() / np.abs(lib).max())
    figures[name] = (task.describe(), rel, c.cosine_min, photo_rel)
    print(f"{name}: {task.describe()}; max rel |Δ| {rel:.2e}; photos cosine min {c.cosine_min:.9f} "
          f"(1 - cos {1 - c.cosine_min:.1e}), max rel |Δ| {photo_rel:.1e}")
    assert c.cosine_min >= MIN_PHOTO_COSINE, (name, c.per_image_cosine)
    # Random weights make embeddings that barely depend on the image (two different photos: cosine up to 0.99996),
    # so the cosine alone would pass a preprocessing mistake: the photos' relative |Δ| is held too, and a control
    # (resized bilinear, not bicubic as the library does) shows it breaks that bound (measured 1.6e-4 … 2.5e-2).
    assert photo_rel <= PHOTO_REL, (name, photo_rel)
    other = dataclasses.replace(manifest.pp(), interpolation="bilinear")
    wrong = ort_run(out.path, np.stack([preprocess_file(f, other) for f in photo_files]))
    assert float(np.abs(wrong - lib).max() / np.abs(lib).max()) > PHOTO_REL, name

@pytest.mark.parametrize("name", [f"hf:{a}" for a in HF_MODELS] + [f"timm:{n}" for n in TIMM_FOLDERS])
def test_backbone_exports_its_librarys_embedding(name: str, cases: dict[str, Case], photo_files: list[Path],
                                                 photos: list[Image.Image], figures: dict, tmp_path: Path) -> None:
    judge(name, cases[name], tmp_path, photo_files, photos, figures)


@pytest.mark.slow  # full-size timm models built and exported (64 s each under load): make test-all
@pytest.mark.parametrize("name", ARCH_CASES)
def test_full_size_state_dict_with_arch_exports_timms_embedding(name: str, photo_files: list[Path],
                                                                photos: list[Image.Image], figures: dict,
                                                                tmp_path: Path) -> None:
    """The full named architecture from a bare state dict and --arch (its size and preprocessing from timm's
    registered pretrained cfg): the projection head of CLIP and PE-core is read from that cfg and the head's shape."""
    from safetensors.torch import save_file

    kwargs = TIMM_FOLDERS[name]
    model = perturb(timm.create_model(name, pretrained=False, **({"num_classes": 0} if "num_classes" in kwargs else {})), 7)
    sd = tmp_path / "weights.safetensors"
    save_file(model.state_dict(), sd)
    case = Case(sd, _no_grad(model), _timm_pixels(model), _task(name, model.num_features), arch=name)
    judge(f"timm --arch {name}", case, tmp_path, photo_files, photos, figures, check=False)


# --- which timm heads are projections ----------------------------------------------------------------------------


@pytest.mark.parametrize(("name", "head_out", "width", "labelled", "projection"), [
    ("vit_base_patch16_clip_224.openai", 512, 768, False, True),  # CLIP image-text weights: num_classes 512
    ("vit_base_patch16_clip_224.laion2b", 512, 768, False, True),
    ("vit_large_patch14_clip_224.openai", 768, 1024, False, True),
    ("vit_pe_core_tiny_patch16_384", 512, 192, False, True),  # the default tag (fb): PE's projection, wider than PE-T
    ("eva02_base_patch16_clip_224.merged2b", 512, 768, False, True),
    ("vit_base_patch16_clip_224.openai", 512, 768, True, False),  # class names given: a 512-class classifier
    ("vit_base_patch16_clip_224.openai", 10, 768, False, False),  # fine-tuned to 10 classes
    ("vit_base_patch16_clip_224.openai_ft_in1k", 1000, 768, False, False),  # ImageNet-1k: a label set
    ("vit_base_patch16_clip_224.laion2b_ft_in12k", 11821, 768, False, False),
    ("vit_base_patch16_clip_224", 1000, 768, False, False),  # the default tag is a fine-tuned classifier
    ("vit_base_patch16_224.bamboo", 115217, 768, False, False),  # Bamboo's classes: far wider than any projection
    ("vit_small_patch14_dinov2", 10, 384, False, False),  # registered headless: any head is a classifier
    ("vit_not_a_model", 512, 768, False, False),
])
def test_projection_head_is_read_from_timms_pretrained_cfg_and_the_heads_shape(
    name: str, head_out: int, width: int, labelled: bool, projection: bool
) -> None:
    from vitdeploy.model.timm_import import projection_head

    assert projection_head(name, None, head_out, width, labelled) is projection


def test_clip_folder_with_class_names_stays_a_classifier(cases: dict[str, Case], tmp_path: Path) -> None:
    """The same CLIP tower saved with label_names (a classifier fine-tuned to 512 classes) or imported with --labels:
    its head classifies; without names it is the projection (proj_bias from the weights: non-zero here)."""
    import shutil

    from vitdeploy.model.importers import load_any

    src = cases["timm:vit_base_patch16_clip_224.openai"].source
    ck = load_any(src)
    assert ck.manifest.model["proj_dim"] == 512 and ck.manifest.model["proj_bias"] is True
    assert "proj.bias" in ck.state_dict and not any(k.startswith("head.") for k in ck.state_dict)
    d = shutil.copytree(src, tmp_path / "named")
    cfg = json.loads((d / "config.json").read_text())
    cfg["label_names"] = [f"c{i}" for i in range(512)]
    (d / "config.json").write_text(json.dumps(cfg))
    named = load_any(d).manifest
    assert named.num_classes == 512 and named.labels[:2] == ["c0", "c1"] and named.extra["task"]["kind"] == "classifier"
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"k{i}" for i in range(512)) + "\n")
    assert load_any(src, labels=labels).manifest.num_classes == 512

    # CLIP's projection has no bias: timm's checkpoint filter writes a zero one, which the import drops (exact)
    d = shutil.copytree(src, tmp_path / "zero_bias")
    sd = torch.load(d / "pytorch_model.bin", weights_only=True)  # what save_for_hf writes without safe_serialization
    sd["head.bias"] = torch.zeros_like(sd["head.bias"])
    torch.save(sd, d / "pytorch_model.bin")
    ck = load_any(d)
    assert ck.manifest.model["proj_dim"] == 512 and "proj_bias" not in ck.manifest.model and "proj.bias" not in ck.state_dict


def test_dinov3_pool_cls_is_its_class_token_after_the_final_norm(cases: dict[str, Case], tmp_path: Path) -> None:
    """timm's DINOv3 with num_classes 0 answers the mean of its patch tokens (timm's global_pool 'avg'); `export --pool
    cls` gives DINOv3's class token after the final norm (what transformers' pooler_output is), registers skipped."""
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.core.task import task_of
    from vitdeploy.stages.export import EmbeddingOptions, export_onnx

    case = cases["timm:vit_small_patch16_dinov3"]
    out = export_onnx(case.source, tmp_path / "cls.onnx", check=False, embedding=EmbeddingOptions(pool="cls")).path
    task = task_of(read_onnx_manifest(out))
    assert (task.pool, task.dim, task.register_tokens) == ("cls", 64, 4)
    h, w = read_onnx_manifest(out).input_size
    x = torch.randn(2, 3, h, w, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = case.extra["model"].forward_features(x)[:, 0].numpy()
    got = ort_run(out, x.numpy())
    assert float(np.abs(got - ref).max() / np.abs(ref).max()) <= TOL


def test_pool_choice_is_refused_where_a_projection_reads_its_own_pooling(cases: dict[str, Case], tmp_path: Path) -> None:
    from vitdeploy.core.errors import UsageError
    from vitdeploy.stages.export import EmbeddingOptions, export_onnx

    with pytest.raises(UsageError, match="projection was trained on its own pooling"):
        export_onnx(cases["timm:vit_pe_core_tiny_patch16_384"].source, tmp_path / "m.onnx",
                    embedding=EmbeddingOptions(pool="cls"))
    assert not (tmp_path / "m.onnx").exists()


# --- parity judged by the task --------------------------------------------------------------------------------------


def test_embedding_parity_is_relative_to_its_own_scale_without_a_top1_test(tmp_path: Path) -> None:
    """An L2-normalised embedding's values are far below 1: an error the classifier's rule (1e-4 × max(1, max |logit|))
    lets through fails the embedding's (1e-4 × max |value|), and no argmax is judged."""
    import copy

    from vitdeploy.checks.metrics import compare
    from vitdeploy.checks.parity import check_parity
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.vit import VisionTransformer, ViTConfig
    from vitdeploy.stages.export import export_onnx

    cfg = ViTConfig(image_size=(32, 32), patch_size=8, embed_dim=96, depth=1, num_heads=2, num_classes=0, l2_norm=True)
    torch.manual_seed(0)
    model = perturb(VisionTransformer(cfg), 3)
    pp = {"input_size": [32, 32], "resize_mode": "squash", "crop_pct": 1.0, "interpolation": "bilinear",
          "mean": [0.5] * 3, "std": [0.5] * 3, "channel_order": "RGB"}
    ckpt = save_checkpoint(tmp_path / "emb.pth", model, Manifest(model=cfg.to_dict(), labels=[], preprocess=pp, name="emb"))
    onnx_path = export_onnx(ckpt, tmp_path / "emb.onnx", check=False).path
    same = check_parity(model, onnx_path, batch_sizes=(8,))
    assert same.passed and same[0].embedding and same[0].min_cosine > 0.99999
    assert same[0].max_abs_logit < 0.4 and same[0].tolerance == pytest.approx(TOL * same[0].max_abs_logit)

    # a copy whose final norm is shifted so that its outputs differ by 6e-5 at most: over 1.5e-4 of their largest
    # value (below 0.4), within 1e-4 absolute
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((8, 3, 32, 32), dtype=np.float32))
    with torch.no_grad():
        ref = model(x).numpy()
    off = copy.deepcopy(model)
    shift = 1e-4 * torch.randn(cfg.embed_dim, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        off.norm.bias.add_(shift)
        d0 = float(np.abs(off(x).numpy() - ref).max())
        off.norm.bias.add_(shift * (6e-5 / d0 - 1))
    rep = check_parity(off, onnx_path, batch_sizes=(8,))
    b = rep[0]
    assert not rep.passed and 1.5e-4 < b.max_rel_diff < 1e-3 and b.max_abs_diff < TOL, b.describe()
    with torch.no_grad():
        cls_rule = compare(off(x).numpy(), ref)
    assert cls_rule.within(TOL)  # the classifier's rule, with its floor at 1, would have passed it
    assert "max |embedding|" in b.describe() and "top-1" not in b.describe() and "min cosine" in b.describe()


# --- info ----------------------------------------------------------------------------------------------------------


def test_import_export_info_on_the_command_line_show_the_task(cases: dict[str, Case], tmp_path: Path) -> None:
    """`vitdeploy import` → `export` → `info` (text and --json): the task line, never a traceback, on the folder, the
    checkpoint, the ONNX model, an older 0-class checkpoint without a task entry, and one whose entry is damaged."""
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.checkpoint import save_checkpoint
    from vitdeploy.model.importers import load_any

    runner = CliRunner()
    src = cases["hf:Dinov2WithRegistersModel"].source
    ckpt, onnx_path = tmp_path / "dino.pth", tmp_path / "dino.onnx"
    r = runner.invoke(app, ["import", str(src), "-o", str(ckpt)])
    assert r.exit_code == 0, r.output
    r = runner.invoke(app, ["export", str(ckpt), "-o", str(onnx_path), "--pool", "cls+mean", "--tokens"])
    assert r.exit_code == 0, r.output
    assert "parity passed" in r.output and "max |embedding|" in r.output and "min cosine" in r.output
    line = "embedding 64-d (cls)"
    for path, want in ((src, line), (ckpt, line),
                       (onnx_path, "embedding 128-d (cls+mean, + patch tokens, 4 registers dropped)")):
        r = runner.invoke(app, ["info", str(path)])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        assert f"task           {want}" in r.output and "classes" not in r.output, r.output
    out = tmp_path / "info.json"
    r = runner.invoke(app, ["info", str(onnx_path), "--json", str(out)])
    assert r.exit_code == 0, r.output
    (row,) = json.loads(out.read_text())
    assert row["task"] == {"kind": "embedding", "dim": 128, "pool": "cls+mean", "tokens": True, "register_tokens": 4}
    assert row["task_line"].startswith("embedding 128-d")

    ck = load_any(ckpt)
    for name, task in (("old.pth", None), ("damaged.pth", {"kind": "regression"})):
        m = Manifest(model=ck.manifest.model, labels=[], preprocess=ck.manifest.preprocess, name="old",
                     extra={"task": task} if task else {})
        p = save_checkpoint(tmp_path / name, ck.build(), m)
        r = runner.invoke(app, ["info", str(p)])
        assert r.exit_code == 0 and "Traceback" not in r.output, r.output
        assert ("task           embedding 64-d (cls)" if task is None else "task           unreadable") in r.output
