"""Hugging Face and timm ViTs imported through load_any: identical logits, labels and preprocessing carried over.

The Hugging Face side is checked against transformers itself (model forward and image processor).
timm cannot be imported beside this torch (its torchvision dependency does not load), so the timm
side is checked against a state dict built in timm's documented layout and a small reference
forward written here from that layout (timm/models/vision_transformer.py: Attention, Block,
VisionTransformer.forward_features/forward_head), with preprocessing from timm's eval transform.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from vitdeploy.core.errors import UsageError, VitdeployError
from vitdeploy.core.preprocess import preprocess_file
from vitdeploy.model.importers import load_any
from vitdeploy.model.importers import read_any_manifest as read_manifest
from vitdeploy.model.timm_import import timm_arch
from vitdeploy.model.vit import IMAGENET_MEAN, IMAGENET_STD, VisionTransformer, ViTConfig

HF_LABELS = ["cat", "dog", "bird", "fish"]


def _perturb(module: torch.nn.Module, seed: int) -> None:
    """Random weights well away from the init (LayerNorm gains and biases too), so logits are O(1), not ~0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "layernorm" in name:
                p.copy_((1.0 if name.endswith("weight") else 0.0) + 0.2 * torch.randn(p.shape, generator=g))
            else:
                p.copy_(0.15 * torch.randn(p.shape, generator=g))


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ViTForImageClassification with random weights, saved with a ViTImageProcessor (bicubic, ImageNet mean/std)."""
    from transformers import ViTConfig as HFConfig
    from transformers import ViTForImageClassification, ViTImageProcessor

    torch.manual_seed(0)
    cfg = HFConfig(
        hidden_size=48, num_hidden_layers=2, num_attention_heads=4, intermediate_size=96, image_size=48, patch_size=8,
        num_labels=len(HF_LABELS), id2label=dict(enumerate(HF_LABELS)), label2id={n: i for i, n in enumerate(HF_LABELS)},
    )
    model = ViTForImageClassification(cfg).eval()
    _perturb(model, 1)
    out = tmp_path_factory.mktemp("hf") / "vit-hf"
    model.save_pretrained(out)
    ViTImageProcessor(
        size={"height": 48, "width": 48}, resample=3, image_mean=list(IMAGENET_MEAN), image_std=list(IMAGENET_STD)
    ).save_pretrained(out)
    return out


def _hf_reference(folder: Path, files: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    """transformers' own preprocessing and logits for the files."""
    from transformers import AutoImageProcessor, ViTForImageClassification

    # use_fast=False: transformers 5 picks its torchvision ("fast") processor where torchvision is installed; the
    # PIL one is the processor the folder's config names (ViTImageProcessor), and the one vitdeploy's PIL path matches.
    proc = AutoImageProcessor.from_pretrained(folder, use_fast=False)
    model = ViTForImageClassification.from_pretrained(folder).eval()
    imgs = [Image.open(f).convert("RGB") for f in files]
    pixels = proc(images=imgs, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        logits = model(pixel_values=pixels).logits
    return pixels.numpy(), logits.numpy()


@pytest.fixture(scope="module")
def real_images(photo_files: list[Path], digits_folder: Path) -> list[Path]:
    digits = sorted((digits_folder / "val").rglob("*.png"))[:: 37][:5]
    return list(photo_files) + digits


def test_hf_folder_gives_transformers_logits_labels_and_preprocessing(hf_dir: Path, real_images: list[Path]) -> None:
    ck = load_any(hf_dir)
    m = ck.manifest
    assert m.labels == HF_LABELS
    assert m.model["embed_dim"] == 48 and m.model["depth"] == 2 and m.model["num_heads"] == 4
    assert m.model["ln_eps"] == 1e-12 and m.model["mlp_dim"] == 96
    pp = m.pp()
    assert (pp.input_size, pp.resize_mode, pp.interpolation) == ((48, 48), "squash", "bicubic")
    assert pp.mean == pytest.approx(IMAGENET_MEAN) and pp.std == pytest.approx(IMAGENET_STD)
    assert m.source["format"] == "huggingface"
    assert read_manifest(hf_dir).labels == HF_LABELS  # what verify/infer read for "any artifact"

    ref_pixels, ref_logits = _hf_reference(hf_dir, real_images)
    ours = np.stack([preprocess_file(f, pp) for f in real_images])
    assert np.abs(ours - ref_pixels).max() < 1e-5
    with torch.no_grad():
        logits = ck.build()(torch.from_numpy(ref_pixels)).numpy()
    assert ref_logits.std() > 0.1  # the comparison below is not between near-zero numbers
    assert np.abs(logits - ref_logits).max() <= 1e-4


def test_hf_config_json_path_sharded_and_bin_weights(hf_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file, save_file

    ref = load_any(hf_dir).state_dict
    # pytorch_model.bin instead of safetensors, reached through its config.json
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (bin_dir / name).write_text((hf_dir / name).read_text())
    sd = load_file(hf_dir / "model.safetensors")
    torch.save(sd, bin_dir / "pytorch_model.bin")
    got = load_any(bin_dir / "config.json").state_dict
    assert got.keys() == ref.keys() and all(torch.equal(got[k], ref[k]) for k in ref)
    # two safetensors shards with an index
    shard_dir = tmp_path / "shards"
    shard_dir.mkdir()
    for name in ("config.json", "preprocessor_config.json"):
        (shard_dir / name).write_text((hf_dir / name).read_text())
    keys = sorted(sd)
    halves = {"model-00001-of-00002.safetensors": keys[: len(keys) // 2], "model-00002-of-00002.safetensors": keys[len(keys) // 2 :]}
    for fname, ks in halves.items():
        save_file({k: sd[k].contiguous() for k in ks}, shard_dir / fname)
    index = {"metadata": {}, "weight_map": {k: f for f, ks in halves.items() for k in ks}}
    (shard_dir / "model.safetensors.index.json").write_text(json.dumps(index))
    got = load_any(shard_dir).state_dict
    assert all(torch.equal(got[k], ref[k]) for k in ref)


def test_hf_labels_file_replaces_id2label(hf_dir: Path, tmp_path: Path) -> None:
    f = tmp_path / "labels.txt"
    f.write_text("a\nb\nc\nd\n\n")
    assert load_any(hf_dir, labels=f).manifest.labels == ["a", "b", "c", "d"]
    f.write_text("a\nb\n")
    with pytest.raises(VitdeployError, match="2 class names but the classifier head has 4"):
        load_any(hf_dir, labels=f)


def _copy_hf(hf_dir: Path, dest: Path, **config_changes: object) -> Path:
    dest.mkdir()
    for f in hf_dir.iterdir():
        (dest / f.name).write_bytes(f.read_bytes())
    cfg = json.loads((dest / "config.json").read_text())
    cfg.update(config_changes)
    (dest / "config.json").write_text(json.dumps(cfg))
    return dest


def test_hf_refusals_name_the_problem(hf_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(VitdeployError, match="hidden_act 'relu' has no vitdeploy equivalent"):
        load_any(_copy_hf(hf_dir, tmp_path / "act", hidden_act="relu"))
    from transformers import SwinConfig, SwinForImageClassification  # a real non-ViT family: its tensors are named

    SwinForImageClassification(SwinConfig(image_size=32, patch_size=4, embed_dim=12, depths=[1], num_heads=[2],
                                          window_size=4)).save_pretrained(tmp_path / "swin")
    with pytest.raises(VitdeployError, match="SwinForImageClassification whose tensors vitdeploy cannot map"):
        load_any(tmp_path / "swin")
    with pytest.raises(VitdeployError, match="do not fit"):
        load_any(_copy_hf(hf_dir, tmp_path / "size", intermediate_size=64))
    with pytest.raises(UsageError, match="drop --arch"):
        load_any(hf_dir, arch="vit_base_patch16_224")
    (tmp_path / "empty").mkdir()
    with pytest.raises(VitdeployError, match="folder without config.json"):
        load_any(tmp_path / "empty")
    no_weights = _copy_hf(hf_dir, tmp_path / "nw")
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(VitdeployError, match="no model.safetensors or pytorch_model.bin"):
        load_any(no_weights)


# --- timm ---------------------------------------------------------------------------------------


def timm_state_dict(embed: int, depth: int, patch: int, img: int, n_cls: int, mlp: int, seed: int,
                    fc_norm: bool = False, qkv_bias: bool = True) -> dict[str, torch.Tensor]:
    """Random weights under timm's VisionTransformer parameter names and shapes."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape: int, s: float = 0.05) -> torch.Tensor:
        return s * torch.randn(*shape, generator=g)

    def ln(name: str) -> dict[str, torch.Tensor]:
        return {f"{name}.weight": 1 + r(embed, s=0.2), f"{name}.bias": r(embed, s=0.1)}

    n = (img // patch) ** 2 + 1
    sd = {"cls_token": r(1, 1, embed, s=0.5), "pos_embed": r(1, n, embed, s=0.5),
          "patch_embed.proj.weight": r(embed, 3, patch, patch), "patch_embed.proj.bias": r(embed)}
    for i in range(depth):
        b = f"blocks.{i}."
        sd.update(ln(b + "norm1"))
        sd[b + "attn.qkv.weight"] = r(3 * embed, embed, s=0.1)
        if qkv_bias:
            sd[b + "attn.qkv.bias"] = r(3 * embed)
        sd.update({b + "attn.proj.weight": r(embed, embed), b + "attn.proj.bias": r(embed)})
        sd.update(ln(b + "norm2"))
        sd.update({b + "mlp.fc1.weight": r(mlp, embed), b + "mlp.fc1.bias": r(mlp),
                   b + "mlp.fc2.weight": r(embed, mlp), b + "mlp.fc2.bias": r(embed)})
    sd.update(ln("fc_norm" if fc_norm else "norm"))
    sd.update({"head.weight": r(n_cls, embed, s=0.3), "head.bias": r(n_cls)})
    return sd


def timm_forward(sd: dict[str, torch.Tensor], arch: str, x: torch.Tensor, **kwargs: object) -> torch.Tensor:
    """timm's own forward pass: ``timm.create_model(arch, **kwargs)`` with ``sd`` loaded strictly."""
    timm = pytest.importorskip("timm")
    n_cls = int(sd["head.weight"].shape[0])
    model = timm.create_model(arch, pretrained=False, num_classes=n_cls, weight_init="skip", **kwargs).eval()
    model.load_state_dict(sd, strict=True)
    with torch.no_grad():
        return model(x)


def timm_reference_pixels(path: Path, size: int, crop_pct: float, mean: tuple, std: tuple) -> np.ndarray:
    """timm's eval transform: Resize(floor(size / crop_pct)) of the shorter side (bicubic), CenterCrop, ToTensor, Normalize."""
    img = Image.open(path).convert("RGB")
    scale = math.floor(size / crop_pct)
    w, h = img.size
    if w <= h:
        nw, nh = scale, int(scale * h / w)
    else:
        nw, nh = int(scale * w / h), scale
    img = img.resize((nw, nh), Image.Resampling.BICUBIC)
    top, left = int(round((nh - size) / 2.0)), int(round((nw - size) / 2.0))
    a = np.asarray(img.crop((left, top, left + size, top + size)), np.float32) / 255.0
    return ((a - np.asarray(mean, np.float32)) / np.asarray(std, np.float32)).transpose(2, 0, 1)


TINY = {"embed": 192, "depth": 12, "patch": 16, "img": 224, "mlp": 768}  # vit_tiny_patch16_224 / deit_tiny_patch16_224


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    p = tmp_path_factory.mktemp("timm") / "vit_tiny.pth"
    torch.save(timm_state_dict(n_cls=7, seed=3, **TINY), p)
    return p


def test_timm_fc_norm_avg_pool_no_qkv_bias_and_labels(tmp_path: Path) -> None:
    sd = timm_state_dict(n_cls=5, seed=4, fc_norm=True, qkv_bias=False, **TINY)
    p = tmp_path / "gap.safetensors"
    from safetensors.torch import save_file

    save_file(sd, p)
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join("abcde"))
    ck = load_any(p, arch="deit_tiny_patch16_224", labels=labels)
    m = ck.manifest
    assert m.model["final_norm"] == "fc_norm" and m.model["pool"] == "mean" and m.model["qkv_bias"] is False
    assert m.labels == list("abcde")
    assert m.pp().mean == pytest.approx(IMAGENET_MEAN) and m.pp().crop_pct == 0.9  # timm deit.py _cfg
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        got = ck.build()(x)
    ref = timm_forward(sd, "deit_tiny_patch16_224", x, global_pool="avg", qkv_bias=False)
    assert ref.std() > 0.1
    assert (got - ref).abs().max().item() <= 1e-4


def test_timm_training_checkpoint_uses_ema_and_names_the_arch(tmp_path: Path) -> None:
    small = {"embed": 192, "depth": 12, "patch": 16, "img": 224, "mlp": 768}
    ema = timm_state_dict(n_cls=3, seed=5, **small)
    raw = timm_state_dict(n_cls=3, seed=6, **small)
    p = tmp_path / "model_best.pth.tar"
    torch.save({"epoch": 9, "arch": "visiontransformer", "state_dict": {"module." + k: v for k, v in raw.items()},
                "state_dict_ema": ema, "version": 2, "args": argparse.Namespace(model="vit_tiny_patch16_224", lr=1e-3)}, p)
    with pytest.raises(VitdeployError, match="timm training checkpoint: pass it with --arch NAME .*--arch vit_tiny_patch16_224"):
        load_any(p)
    ck = load_any(p, arch="vit_tiny_patch16_224")
    assert ck.manifest.source["state_dict_key"] == "state_dict_ema"
    assert torch.equal(ck.state_dict["cls_token"], ema["cls_token"])


def test_timm_refusals_name_the_problem(timm_file: Path, tmp_path: Path) -> None:
    with pytest.raises(VitdeployError, match="not vit_small_patch16_224: embed_dim 192 \\(not 384\\)"):
        load_any(timm_file, arch="vit_small_patch16_224")
    with pytest.raises(VitdeployError, match="384x384 inputs.*--arch vit_tiny_patch16_384"):
        p = tmp_path / "384.pth"
        torch.save(timm_state_dict(n_cls=2, seed=1, embed=192, depth=12, patch=16, img=384, mlp=768), p)
        load_any(p, arch="vit_tiny_patch16_224")
    with pytest.raises(VitdeployError, match="do not fit.*missing dist_token"):
        load_any(timm_file, arch="deit_tiny_distilled_patch16_224")
    with pytest.raises(VitdeployError, match="not vit_base_patch16_clip_224: embed_dim 192 \\(not 768\\)"):
        load_any(timm_file, arch="vit_base_patch16_clip_224")
    with pytest.raises(UsageError, match="not a timm ViT name.*did you mean vit_tiny_patch16_224"):
        load_any(timm_file, arch="vit_tiny_patch16_22")
    with pytest.raises(VitdeployError, match="convolutional stem \\(hybrid\\)"):
        load_any(timm_file, arch="vit_base_r50_s16_224")
    sd = torch.load(timm_file, weights_only=True)
    sd["dist_token"] = torch.zeros(1, 1, 192)
    p = tmp_path / "dist.pth"
    torch.save(sd, p)
    with pytest.raises(VitdeployError, match="do not fit.*unexpected dist_token"):
        load_any(p, arch="deit_tiny_patch16_224")
    with pytest.raises(VitdeployError, match="distilled DeiT"):
        load_any(p)
    resnet = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7), "layer1.0.conv1.weight": torch.zeros(64, 64, 3, 3),
                "fc.weight": torch.zeros(1000, 512)}, resnet)
    with pytest.raises(VitdeployError, match="a ResNet state dict .*no patch_embed/cls_token"):
        load_any(resnet)
    with pytest.raises(VitdeployError, match="a ResNet state dict"):
        load_any(resnet, arch="vit_base_patch16_224")


def test_timm_arch_table_follows_timm_cfgs() -> None:
    a = timm_arch("vit_base_patch16_224.augreg2_in21k_ft_in1k")
    assert (a.config.embed_dim, a.config.depth, a.config.num_heads, a.tag) == (768, 12, 12, "augreg2_in21k_ft_in1k")
    assert a.preprocess["crop_pct"] == 0.9 and a.preprocess["mean"] == [0.5, 0.5, 0.5]
    s = timm_arch("vit_small_patch16_384")
    assert s.config.image_size == (384, 384) and s.preprocess["crop_pct"] == 1.0 and s.config.num_heads == 6
    d = timm_arch("deit_small_patch16_224")
    assert d.preprocess["mean"] == list(IMAGENET_MEAN) and d.preprocess["interpolation"] == "bicubic"
    miil = timm_arch("vit_base_patch16_224_miil.in21k_ft_in1k")
    assert miil.config.qkv_bias is False and miil.preprocess["interpolation"] == "bilinear"
    assert timm_arch("vit_small_patch16_224.dino").preprocess["std"] == list(IMAGENET_STD)
    g = timm_arch("vit_giant_patch14_224")
    assert g.config.hidden_dim == 6144
    d3 = timm_arch("deit3_small_patch16_224")
    assert d3.config.init_values == 1e-6 and d3.config.no_embed_class
    with pytest.raises(UsageError, match="no tag 'nope'"):
        timm_arch("vit_small_patch16_224.nope")


def test_default_vit_is_unchanged_by_the_fc_norm_option() -> None:
    cfg = ViTConfig(image_size=(32, 32), patch_size=8, embed_dim=32, depth=1, num_heads=2, num_classes=3)
    m = VisionTransformer(cfg)
    assert m.fc_norm is None and "fc_norm.weight" not in m.state_dict() and "norm.weight" in m.state_dict()
    old = cfg.to_dict()
    del old["final_norm"]  # a manifest written before the option existed
    assert ViTConfig.from_dict(old) == cfg
    fc = VisionTransformer(cfg.with_(final_norm="fc_norm", pool="mean")).eval()
    assert "fc_norm.weight" in fc.state_dict() and "norm.weight" not in fc.state_dict()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        feats = fc.forward_features(x)[0]
        expect = fc.head(fc.fc_norm(feats[:, 1:].mean(1)))
        assert torch.allclose(fc(x), expect)
    with pytest.raises(ValueError, match="final_norm"):
        cfg.with_(final_norm="post")


# --- fine-tuning and the CLI ----------------------------------------------------------------------


def test_finetune_from_hf_folder_keeps_its_preprocessing(hf_dir: Path, tmp_path: Path) -> None:
    from vitdeploy.model.checkpoint import load_checkpoint
    from vitdeploy.model.train import TrainOptions, train

    src = load_any(hf_dir)
    out = tmp_path / "ft.pth"
    res = train(None, TrainOptions(init=hf_dir, epochs=1, batch_size=512, warmup_epochs=0.3, lr=1e-3, out=out, seed=0))
    assert res.checkpoint == out and out.exists()
    ck = load_checkpoint(out)
    assert ck.manifest.preprocess == src.manifest.preprocess  # bicubic, ImageNet mean/std, 48x48 squash
    assert ck.manifest.labels == [str(i) for i in range(10)] and ck.manifest.num_classes == 10
    assert ck.manifest.source["init"] == str(hf_dir)
    # the encoder started from the imported weights, not from scratch: patch embedding moved only a little
    pe0, pe1 = src.state_dict["patch_embed.proj.weight"], ck.state_dict["patch_embed.proj.weight"]
    assert (pe1 - pe0).norm() < 0.5 * pe0.norm()
    assert math.isfinite(res.history[0]["loss"]) and res.best_epoch == 0  # three steps of batch 512
    # and the fine-tuned checkpoint exports like any other
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.export import export_onnx

    onnx_path = tmp_path / "ft.onnx"
    export_onnx(out, onnx_path)
    x = np.random.default_rng(0).standard_normal((3, 3, 48, 48)).astype(np.float32)
    a, b = open_runner(out)(x), open_runner(onnx_path)(x)
    assert a.shape == (3, 10) and np.abs(a - b).max() <= 1e-4
    assert open_runner(onnx_path).manifest.labels == [str(i) for i in range(10)]


def test_cli_train_init_timm_and_one_line_errors(timm_file: Path, mixed_mode_folder: Path, tmp_path: Path) -> None:
    from vitdeploy.cli import app

    runner = CliRunner()
    out = tmp_path / "ft.pth"
    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"n{i}" for i in range(7)))
    r = runner.invoke(app, ["train", str(mixed_mode_folder), "--init", str(timm_file), "--arch", "vit_tiny_patch16_224",
                            "--labels", str(labels), "--image-size", "32", "--epochs", "1", "-o", str(out)])
    assert r.exit_code == 0, r.output
    ck = load_any(out)
    assert ck.manifest.model["embed_dim"] == 192 and ck.manifest.input_size == (32, 32)
    assert ck.manifest.labels == ["class_0", "class_1", "class_2"]  # the data's classes: a new head
    assert ck.manifest.preprocess["mean"] == [0.5, 0.5, 0.5] and ck.manifest.preprocess["interpolation"] == "bicubic"

    resnet = tmp_path / "resnet.pth"
    torch.save({"conv1.weight": torch.zeros(1), "layer1.0.conv1.weight": torch.zeros(1), "fc.weight": torch.zeros(1)}, resnet)
    r = runner.invoke(app, ["train", "--init", str(resnet), "--epochs", "1", "-o", str(tmp_path / "x.pth")])
    assert r.exit_code == 1
    lines = [ln for ln in r.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and "ResNet state dict" in lines[0] and "Traceback" not in r.output
    r = runner.invoke(app, ["train", "--arch", "vit_tiny_patch16_224", "--epochs", "1"])
    assert r.exit_code == 2 and "--init" in r.output
    assert not (tmp_path / "x.pth").exists()


# --- export ----------------------------------------------------------------------------------------


def test_export_hf_folder_matches_transformers_and_carries_labels(hf_dir: Path, real_images: list[Path], tmp_path: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.export import export_onnx

    out = tmp_path / "hf.onnx"
    export_onnx(hf_dir, out)
    m = read_onnx_manifest(out)
    assert m.labels == HF_LABELS
    assert m.preprocess == load_any(hf_dir).manifest.preprocess
    ref_pixels, ref_logits = _hf_reference(hf_dir, real_images)
    runner = open_runner(out)
    x = np.stack([preprocess_file(f, runner.manifest.pp()) for f in real_images])  # vitdeploy's own preprocessing
    logits = runner(x)
    assert ref_logits.std() > 0.1
    assert np.abs(logits - ref_logits).max() <= 1e-4
    assert (logits.argmax(1) == ref_logits.argmax(1)).all()
    # verify and infer take the folder as the reference checkpoint
    from vitdeploy.checks.verify import verify
    from vitdeploy.tools.infer import open_model

    report = verify(hf_dir, [out], real_images[0].parent)
    assert report.passed and report.results[0].backend == "torch"
    assert open_model(hf_dir)[0].manifest.labels == HF_LABELS


def test_timm_state_dict_gives_reference_logits_in_torch_and_onnx(timm_file: Path, photo_files: list[Path], tmp_path: Path) -> None:
    from vitdeploy.core.artifact import read_onnx_manifest
    from vitdeploy.runners import open_runner
    from vitdeploy.stages.export import export_onnx

    ck = load_any(timm_file, arch="vit_tiny_patch16_224")
    m = ck.manifest
    assert m.model["embed_dim"] == 192 and m.model["num_heads"] == 3 and m.model["depth"] == 12
    assert m.num_classes == 7 and m.labels == [f"class_{i}" for i in range(7)]
    pp = m.pp()
    assert (pp.input_size, pp.resize_mode, pp.crop_pct, pp.interpolation) == ((224, 224), "shorter", 0.9, "bicubic")
    assert pp.mean == (0.5, 0.5, 0.5) and pp.std == (0.5, 0.5, 0.5)
    files = photo_files[:2]
    ref_pixels = np.stack([timm_reference_pixels(f, 224, 0.9, (0.5,) * 3, (0.5,) * 3) for f in files])
    ours = np.stack([preprocess_file(f, pp) for f in files])
    assert np.abs(ours - ref_pixels).max() < 1e-5
    ref = timm_forward(torch.load(timm_file, weights_only=True), "vit_tiny_patch16_224", torch.from_numpy(ref_pixels))
    assert ref.std() > 0.1
    with torch.no_grad():
        assert (ck.build()(torch.from_numpy(ours)) - ref).abs().max().item() <= 1e-4

    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"kind {i}" for i in range(7)))
    out = tmp_path / "timm.onnx"
    export_onnx(timm_file, out, arch="vit_tiny_patch16_224", labels=labels, check=False)
    assert read_onnx_manifest(out).labels == [f"kind {i}" for i in range(7)]
    runner = open_runner(out)
    logits = runner(np.stack([preprocess_file(f, runner.manifest.pp()) for f in files]))
    assert np.abs(logits - ref.numpy()).max() <= 1e-4


def test_cli_import_writes_a_plain_checkpoint(timm_file: Path, tmp_path: Path) -> None:
    from vitdeploy.cli import app
    from vitdeploy.model.checkpoint import load_checkpoint

    labels = tmp_path / "labels.txt"
    labels.write_text("\n".join(f"n{i}" for i in range(7)))
    out = tmp_path / "imported.pth"
    r = CliRunner().invoke(app, ["import", str(timm_file), "--arch", "vit_tiny_patch16_224.augreg_in21k_ft_in1k",
                                 "--labels", str(labels), "-o", str(out)])
    assert r.exit_code == 0, r.output
    ck = load_checkpoint(out)  # no --arch needed any more
    assert ck.manifest.labels == [f"n{i}" for i in range(7)] and ck.manifest.name == "vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    assert ck.manifest.source["format"] == "timm" and len(ck.manifest.source["sha256"]) == 64
    src = load_any(timm_file, arch="vit_tiny_patch16_224")
    assert all(torch.equal(ck.state_dict[k], v) for k, v in src.state_dict.items())
    r = CliRunner().invoke(app, ["import", str(timm_file), "-o", str(tmp_path / "no.pth")])
    assert r.exit_code == 1 and "--arch" in r.output and not (tmp_path / "no.pth").exists()


def test_timm_hub_folder_takes_arch_preprocessing_and_labels_from_config(tmp_path: Path) -> None:
    """A folder as timm's save_for_hf writes it: config.json with architecture/pretrained_cfg/label_names."""
    from safetensors.torch import save_file

    sd = timm_state_dict(n_cls=3, seed=7, **TINY)
    d = tmp_path / "timm-hub"
    d.mkdir()
    save_file(sd, d / "model.safetensors")
    cfg = {
        "architecture": "vit_tiny_patch16_224", "num_classes": 3, "num_features": 192, "global_pool": "token",
        "label_names": ["n01", "n02", "n03"],
        "pretrained_cfg": {"tag": "augreg_in21k_ft_in1k", "custom_load": True, "input_size": [3, 224, 224],
                           "fixed_input_size": True, "interpolation": "bilinear", "crop_pct": 0.95, "crop_mode": "center",
                           "mean": [0.4, 0.5, 0.6], "std": [0.2, 0.3, 0.4], "num_classes": 3, "pool_size": None,
                           "first_conv": "patch_embed.proj", "classifier": "head"},
    }
    (d / "config.json").write_text(json.dumps(cfg))
    ck = load_any(d)
    m = ck.manifest
    assert m.labels == ["n01", "n02", "n03"] and m.model["embed_dim"] == 192 and m.source["format"] == "timm-hub"
    pp = m.pp()
    assert (pp.crop_pct, pp.interpolation, pp.mean, pp.std) == (0.95, "bilinear", (0.4, 0.5, 0.6), (0.2, 0.3, 0.4))
    assert all(torch.equal(ck.state_dict[k], v) for k, v in sd.items())
    cfg["model_args"] = {"reg_tokens": 4}  # a knob the ViT has, but these weights were not trained with it
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(VitdeployError, match="do not fit.*missing reg_token"):
        load_any(d)
    for arg, word in (({"scale_attn_norm": True}, "scale_attn_norm"), ({"lens_flare": 2}, "timm argument lens_flare=2")):
        cfg["model_args"] = arg  # an argument the ViT does not have: named
        (d / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(VitdeployError, match=word):
            load_any(d)


@pytest.mark.parametrize(
    "obj,expect",
    [
        ({"class_token": torch.zeros(1, 1, 8), "conv_proj.weight": torch.zeros(8, 3, 16, 16),
          "encoder.layers.encoder_layer_0.ln_1.weight": torch.zeros(8)}, "a torchvision ViT"),
        ({"stages.0.blocks.0.conv_dw.weight": torch.zeros(1)}, "a ConvNeXt state dict"),
        ({"vit.embeddings.patch_embeddings.projection.weight": torch.zeros(1)}, "save_pretrained folder"),
        ({"optimizer": {"state": {}, "param_groups": []}, "epoch": 3}, "optimizer state without model weights"),
        (torch.zeros(3), "a single tensor"),
    ],
)
def test_foreign_files_say_what_they_are(obj: object, expect: str, tmp_path: Path) -> None:
    p = tmp_path / "x.pth"
    torch.save(obj, p)
    with pytest.raises(VitdeployError, match=expect):
        load_any(p)
