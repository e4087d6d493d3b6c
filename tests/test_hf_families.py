"""Every Hugging Face ViT family vitdeploy imports, judged by transformers' own image processor and forward pass.

Each family is built with random weights from its transformers config (small widths, 2 layers), every parameter
perturbed well away from its init (LayerScale and position embeddings large, so a mapping mistake shows), saved with
``save_pretrained`` beside its own image processor, then imported, exported to ONNX and run by `vitdeploy infer`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image

from vitdeploy.core.errors import VitdeployError
from vitdeploy.model.importers import load_any

LABELS = ["cat", "dog", "bird", "fish", "frog"]
SMALL = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def _perturb(model: torch.nn.Module, seed: int) -> None:
    """All parameters away from their init: norms' gains near 1, LayerScale near 0.5, position embeddings large."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            elif "lambda" in name:
                p.copy_(0.5 + 0.2 * r)
            elif "position" in name:
                p.copy_(0.5 * r)
            else:
                p.copy_(0.1 * r)


def _labels() -> dict[str, Any]:
    return {"num_labels": len(LABELS), "id2label": dict(enumerate(LABELS)), "label2id": {n: i for i, n in enumerate(LABELS)}}


def _families() -> dict[str, Callable[[], tuple[Any, Any]]]:
    """name → (model, image processor); sizes the processors make are the ones transformers runs the model at."""
    import transformers as T

    sq = {"do_center_crop": False}

    def deit_teacher() -> tuple[Any, Any]:
        c = T.DeiTConfig(**SMALL, image_size=32, patch_size=8, **_labels())
        # DeiT's own processor layout: squash to 40x40 (the Hub's 256), center-crop 32 (224)
        return T.DeiTForImageClassificationWithTeacher(c), T.DeiTImageProcessor(
            size={"height": 40, "width": 40}, crop_size={"height": 32, "width": 32}, do_center_crop=True)

    def deit() -> tuple[Any, Any]:
        c = T.DeiTConfig(**SMALL, image_size=32, patch_size=8, **_labels())
        return T.DeiTForImageClassification(c), T.DeiTImageProcessor(size={"height": 32, "width": 32}, **sq)

    def dinov2() -> tuple[Any, Any]:  # the Hub's layout: config 518, processor 256 → crop 224 (interpolated at run time)
        c = T.Dinov2Config(**SMALL, image_size=518, patch_size=14, layerscale_value=0.5, **_labels())
        return T.Dinov2ForImageClassification(c), T.BitImageProcessor(
            size={"shortest_edge": 256}, crop_size={"height": 224, "width": 224}, do_center_crop=True, resample=3,
            image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])

    def dinov2_reg() -> tuple[Any, Any]:
        c = T.Dinov2WithRegistersConfig(**SMALL, image_size=98, patch_size=14, num_register_tokens=4, **_labels())
        return T.Dinov2WithRegistersForImageClassification(c), T.BitImageProcessor(
            size={"shortest_edge": 64}, crop_size={"height": 56, "width": 56}, do_center_crop=True, resample=3,
            image_mean=[0.485, 0.456, 0.406], image_std=[0.229, 0.224, 0.225])

    def beit() -> tuple[Any, Any]:
        c = T.BeitConfig(**SMALL, image_size=32, patch_size=8, use_relative_position_bias=True, use_mean_pooling=True,
                         layer_scale_init_value=0.5, **_labels())
        return T.BeitForImageClassification(c), T.BeitImageProcessor(size={"height": 32, "width": 32}, **sq, resample=2)

    def data2vec() -> tuple[Any, Any]:  # the shared table (one for all blocks) and absolute position embeddings
        c = T.Data2VecVisionConfig(**SMALL, image_size=32, patch_size=8, use_shared_relative_position_bias=True,
                                   use_relative_position_bias=False, use_absolute_position_embeddings=True,
                                   use_mean_pooling=True, layer_scale_init_value=0.5, **_labels())
        return T.Data2VecVisionForImageClassification(c), T.BeitImageProcessor(size={"height": 32, "width": 32}, **sq)

    def siglip() -> tuple[Any, Any]:
        c = T.SiglipConfig(vision_config={**SMALL, "image_size": 32, "patch_size": 8}, **_labels())
        return T.SiglipForImageClassification(c), T.SiglipImageProcessor(size={"height": 32, "width": 32}, resample=3)

    def clip() -> tuple[Any, Any]:
        c = T.CLIPConfig(vision_config={**SMALL, "image_size": 32, "patch_size": 8}, **_labels())
        return T.CLIPForImageClassification(c), T.CLIPImageProcessor(
            size={"shortest_edge": 36}, crop_size={"height": 32, "width": 32})

    def vit_msn() -> tuple[Any, Any]:
        c = T.ViTMSNConfig(**SMALL, image_size=32, patch_size=8, **_labels())
        return T.ViTMSNForImageClassification(c), T.ViTImageProcessor(size={"height": 32, "width": 32}, resample=3)

    return {"deit_teacher": deit_teacher, "deit": deit, "dinov2": dinov2, "dinov2_reg": dinov2_reg, "beit": beit,
            "data2vec_vision": data2vec, "siglip": siglip, "clip": clip, "vit_msn": vit_msn}


FAMILIES = ["deit_teacher", "deit", "dinov2", "dinov2_reg", "beit", "data2vec_vision", "siglip", "clip", "vit_msn"]


@pytest.fixture(scope="session")
def hf_family_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_families")
    out = {}
    for i, (name, make) in enumerate(_families().items()):
        torch.manual_seed(i)
        model, proc = make()
        _perturb(model.eval(), 100 + i)
        d = root / name
        model.save_pretrained(d)
        proc.save_pretrained(d)
        out[name] = d
    assert list(out) == FAMILIES
    return out


def _reference(folder: Path, files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' PIL image processor and the model class its config names: pixels and logits."""
    import transformers as T

    proc = T.AutoImageProcessor.from_pretrained(folder, use_fast=False)
    arch = json.loads((folder / "config.json").read_text())["architectures"][0]
    model = getattr(T, arch).from_pretrained(folder).eval()
    pixels = proc(images=[Image.open(f).convert("RGB") for f in files], return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
    return pixels.numpy(), logits.numpy()


@pytest.mark.parametrize("family", FAMILIES)
def test_hf_family_exports_transformers_logits_and_infers_its_probabilities(
    family: str, hf_family_dirs: dict[str, Path], photo_files: list[Path], tmp_path: Path
) -> None:
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.export import export_onnx
    from vitdeploy.tools.infer import infer

    folder = hf_family_dirs[family]
    ck = load_any(folder)
    assert ck.manifest.labels == LABELS
    onnx_path = tmp_path / "model.onnx"
    export_onnx(folder, onnx_path)
    pixels, ref = _reference(folder, photo_files)
    assert ref.std() > 0.1  # not a comparison between near-zero numbers
    assert tuple(ck.manifest.pp().input_size) == pixels.shape[2:]

    # the exported graph on transformers' own pixels: logits within 1e-4 of the largest
    got = open_runner(onnx_path)(np.ascontiguousarray(pixels))
    rel = float(np.abs(got - ref).max() / np.abs(ref).max())
    print(f"{family}: export max rel diff {rel:.2e}")
    assert rel <= 1e-4

    # vitdeploy infer on the photo files (its own preprocessing, the ONNX model): transformers' probabilities
    res = infer(photo_files, model=onnx_path, top_k=len(LABELS))
    assert not res.skipped and len(res.predictions) == len(photo_files)
    want = torch.softmax(torch.from_numpy(ref), -1).numpy()
    by_path = {p.path: p for p in res.predictions}
    dp = 0.0
    for i, f in enumerate(photo_files):
        p = by_path[f]
        ours = np.array([p.scores[p.labels.index(n)] for n in LABELS])
        dp = max(dp, float(np.abs(ours - want[i]).max()))
    print(f"{family}: infer max |dp| {dp:.2e}")
    assert dp <= 2e-3


def test_hf_features_read_from_the_config_and_tensors(hf_family_dirs: dict[str, Path]) -> None:
    m = {f: load_any(hf_family_dirs[f]).manifest.model for f in FAMILIES}
    assert m["deit_teacher"].get("distilled") and not m["deit"].get("distilled") and m["deit"].get("reg_tokens") == 1
    assert m["dinov2"]["pool"] == "token_avg" and m["dinov2"]["image_size"] == [224, 224]
    assert m["dinov2_reg"]["reg_tokens"] == 4 and m["dinov2_reg"]["init_values"] is not None
    assert m["beit"]["rel_pos_bias"] and m["beit"]["qv_bias"] and not m["beit"].get("abs_pos_embed", True)
    assert m["beit"]["final_norm"] == "fc_norm" and m["beit"]["pool"] == "mean" and m["data2vec_vision"]["rel_pos_bias"]
    assert m["siglip"]["class_token"] is False and m["siglip"]["act"] == "gelu_tanh"
    assert m["clip"]["pre_norm"] and m["clip"]["final_norm"] == "none" and m["clip"]["pool"] == "mean" and m["clip"]["act"] == "quick_gelu"


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def test_hf_processor_with_zero_or_nonfinite_std_is_refused_at_import(hf_family_dirs: dict[str, Path], tmp_path: Path) -> None:
    for i, bad in enumerate(([0.5, 0.0, 0.5], [0.5, float("nan"), 0.5])):
        d = _copy(hf_family_dirs["vit_msn"], tmp_path / f"bad{i}")
        f = d / "preprocessor_config.json"
        pc = json.loads(f.read_text())
        pc["image_std"] = bad
        f.write_text(json.dumps(pc))
        with pytest.raises(VitdeployError, match="image_std"):
            load_any(d)


def test_hf_feature_vitdeploy_lacks_is_named(hf_family_dirs: dict[str, Path], tmp_path: Path) -> None:
    d = _copy(hf_family_dirs["siglip"], tmp_path / "act")
    cfg = json.loads((d / "config.json").read_text())
    cfg["vision_config"]["hidden_act"] = "relu6"
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VitdeployError, match="hidden_act 'relu6'"):
        load_any(d)
