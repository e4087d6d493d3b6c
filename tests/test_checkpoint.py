from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vitdeploy.core.errors import VitdeployError
from vitdeploy.core.manifest import Manifest
from vitdeploy.model.checkpoint import load_checkpoint, load_model, save_checkpoint
from vitdeploy.model.importers import read_any_manifest as read_manifest
from vitdeploy.model.vit import VisionTransformer, ViTConfig, get_preset


def _model_and_manifest() -> tuple[VisionTransformer, Manifest]:
    torch.manual_seed(0)
    p = get_preset("vit-digits")
    cfg = p.config.with_(depth=2)
    m = VisionTransformer(cfg).eval()
    man = Manifest(model=cfg.to_dict(), labels=[str(i) for i in range(10)], preprocess=dict(p.preprocess), name=p.name,
                   training={"best_val_accuracy": 0.5})
    return m, man


def test_round_trip_gives_identical_logits_and_weights_only_load(tmp_path: Path) -> None:
    m, man = _model_and_manifest()
    path = save_checkpoint(tmp_path / "ckpt.pth", m, man)
    raw = torch.load(path, weights_only=True)
    assert "vitdeploy_manifest" in raw and "state_dict" in raw
    m2, man2 = load_model(path)
    x = torch.randn(4, 3, 32, 32)
    assert torch.equal(m(x), m2(x))
    assert man2.labels == man.labels and man2.training["best_val_accuracy"] == 0.5
    assert read_manifest(path).preprocess == man.preprocess


def test_truncated_checkpoint_is_named(tmp_path: Path) -> None:
    m, man = _model_and_manifest()
    path = save_checkpoint(tmp_path / "ckpt.pth", m, man)
    data = path.read_bytes()
    bad = tmp_path / "trunc.pth"
    bad.write_bytes(data[: len(data) // 2])
    with pytest.raises(VitdeployError, match="truncated or corrupt"):
        load_checkpoint(bad)


@pytest.mark.parametrize(
    "obj,expect",
    [
        ({"conv1.weight": torch.zeros(1), "layer1.0.conv1.weight": torch.zeros(1), "fc.weight": torch.zeros(1)}, "ResNet"),
        ({"a.weight": torch.zeros(1)}, "plain state_dict"),
        ({"patch_embed.proj.weight": torch.zeros(1), "cls_token": torch.zeros(1)}, "timm-style ViT"),
    ],
)
def test_foreign_checkpoints_say_what_they_look_like(tmp_path: Path, obj: dict, expect: str) -> None:
    p = tmp_path / "x.pth"
    torch.save(obj, p)
    with pytest.raises(VitdeployError, match=expect):
        load_checkpoint(p)


def test_non_checkpoint_files(tmp_path: Path) -> None:
    (tmp_path / "empty.pth").write_bytes(b"")
    (tmp_path / "text.pth").write_text("not a checkpoint")
    with pytest.raises(VitdeployError, match="empty"):
        load_checkpoint(tmp_path / "empty.pth")
    with pytest.raises(VitdeployError, match="not a PyTorch checkpoint"):
        load_checkpoint(tmp_path / "text.pth")
    with pytest.raises(VitdeployError, match="no such checkpoint"):
        load_checkpoint(tmp_path / "missing.pth")


def test_config_round_trip() -> None:
    cfg = ViTConfig(image_size=(32, 48), patch_size=8, embed_dim=32, depth=1, num_heads=2, pool="mean")
    assert ViTConfig.from_dict(cfg.to_dict()) == cfg


def test_a_build_skips_the_random_fill_it_overwrites(monkeypatch: pytest.MonkeyPatch) -> None:
    """weight_init="skip" leaves out the truncated-normal fill (a build loads the weights next); the default keeps it."""
    calls: list[int] = []
    real = torch.nn.init.trunc_normal_
    monkeypatch.setattr(torch.nn.init, "trunc_normal_", lambda t, *a, **k: calls.append(1) or real(t, *a, **k))
    cfg = get_preset("vit-digits").config.with_(depth=2)
    skipped, filled = VisionTransformer(cfg, weight_init="skip"), len(calls)
    VisionTransformer(cfg)
    assert filled == 0 and len(calls) > 0
    assert {k: v.shape for k, v in skipped.state_dict().items()} == {
        k: v.shape for k, v in VisionTransformer(cfg).state_dict().items()}
    with pytest.raises(ValueError, match="weight_init"):
        VisionTransformer(cfg, weight_init="jax")
