from __future__ import annotations

import pytest
import torch

from vitdeploy.model.vit import PRESETS, VisionTransformer, ViTConfig, count_params, get_preset, preset_table

# The reference ViTs at 224x224 with a 1000-class head, as timm builds them.
EXPECTED = {
    "vit-tiny": 5_717_416,
    "vit-small": 22_050_664,
    "vit-base": 86_567_656,
    "vit-large": 304_326_632,
    # timm's vit_huge_patch14_224 is built head-less (its in21k weights have num_classes=0):
    # 630,764,800 without the head; a 1000-class head adds 1280*1000 + 1000.
    "vit-huge": 630_764_800 + 1_281_000,
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_preset_param_counts_match_reference(name: str) -> None:
    cfg = get_preset(name).config.with_(image_size=(224, 224), num_classes=1000)
    with torch.device("meta"):
        model = VisionTransformer(cfg)
    n = sum(p.numel() for p in model.parameters())
    assert n == EXPECTED[name]
    assert count_params(cfg) == n


def test_vit_huge_headless_count_is_timms() -> None:
    cfg = get_preset("vit-huge").config.with_(num_classes=0)
    with torch.device("meta"):
        model = VisionTransformer(cfg)
    assert sum(p.numel() for p in model.parameters()) == 630_764_800


def test_preset_table_reports_reference_counts() -> None:
    rows = {r["name"]: r["params"] for r in preset_table()}
    for name, n in EXPECTED.items():
        assert rows[name] == n
    assert "vit-digits" in rows


@pytest.mark.parametrize("size", [(32, 32), (32, 48), (48, 16)])
def test_forward_shapes_square_and_non_square(size: tuple[int, int]) -> None:
    m = VisionTransformer(ViTConfig(image_size=size, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5)).eval()
    x = torch.randn(3, 3, *size)
    assert m(x).shape == (3, 5)
    feats, _ = m.forward_features(x)
    assert feats.shape == (3, (size[0] // 8) * (size[1] // 8) + 1, 32)


def test_cls_and_mean_pooling_differ_and_mean_is_patch_average() -> None:
    torch.manual_seed(0)
    cls = VisionTransformer(ViTConfig(image_size=32, patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=4)).eval()
    mean = VisionTransformer(cls.cfg.with_(pool="mean")).eval()
    mean.load_state_dict(cls.state_dict())
    x = torch.randn(2, 3, 32, 32)
    feats, _ = cls.forward_features(x)
    torch.testing.assert_close(cls(x), cls.head(feats[:, 0]))
    torch.testing.assert_close(mean(x), cls.head(feats[:, 1:].mean(1)))
    assert not torch.allclose(cls(x), mean(x))


def test_attention_on_request_matches_normal_path() -> None:
    torch.manual_seed(0)
    m = VisionTransformer(ViTConfig(image_size=32, patch_size=8, embed_dim=32, depth=3, num_heads=4, num_classes=4)).eval()
    x = torch.randn(2, 3, 32, 32)
    logits, attns = m.forward_with_attention(x)
    torch.testing.assert_close(logits, m(x), atol=1e-5, rtol=1e-5)
    assert len(attns) == 3 and attns[0].shape == (2, 4, 17, 17)
    torch.testing.assert_close(attns[0].sum(-1), torch.ones(2, 4, 17))


def test_image_size_not_divisible_by_patch_is_refused() -> None:
    with pytest.raises(ValueError, match="not divisible by the patch size 16"):
        ViTConfig(image_size=(224, 200), patch_size=16)


def test_unknown_preset_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match="vit-tiny"):
        get_preset("vit-gigantic")
    assert set(PRESETS) >= {"vit-tiny", "vit-small", "vit-base", "vit-large", "vit-huge", "vit-digits"}
