"""Deploying at another size: `vitdeploy import --image-size` resamples absolute position embeddings as timm does,
judged by timm's own model built at that size from the same weights through timm's own load path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from vitdeploy.core.errors import UsageError
from vitdeploy.core.image_size import parse_image_size
from vitdeploy.model.checkpoint import load_checkpoint


@pytest.fixture(scope="module")
def dinov2_518(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """timm's vit_small_patch14_dinov2 at its own 518 px, random weights perturbed (LayerScale and position
    embeddings large, so a resampling or mapping mistake shows), saved as a state dict."""
    import timm

    torch.manual_seed(0)
    model = timm.create_model("vit_small_patch14_dinov2", pretrained=False, num_classes=10).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            r = torch.randn(p.shape, generator=g)
            if name.endswith("gamma"):
                p.copy_(0.3 + 0.1 * r)
            elif name == "pos_embed":
                p.copy_(0.5 * r)
            elif "norm" in name and name.endswith("weight"):
                p.copy_(1.0 + 0.2 * r)
            else:
                p.copy_(0.05 * r)
    f = tmp_path_factory.mktemp("dinov2") / "vit_small_patch14_dinov2.pth"
    torch.save(model.state_dict(), f)
    return f


def test_import_at_224_equals_timm_built_at_224_from_the_518_weights(dinov2_518: Path, tmp_path: Path) -> None:
    import timm

    from vitdeploy.cli import app

    out = tmp_path / "ck224.pth"
    r = CliRunner().invoke(app, ["import", str(dinov2_518), "--arch", "vit_small_patch14_dinov2", "--image-size", "224",
                                 "-o", str(out)])
    assert r.exit_code == 0, r.output
    ck = load_checkpoint(out)
    assert ck.manifest.model["image_size"] == [224, 224] and ck.manifest.preprocess["input_size"] == [224, 224]
    assert ck.state_dict["pos_embed"].shape[1] == 1 + 16 * 16

    # timm's own path: the 518 weights loaded into a 224 model by its checkpoint_filter_fn (resample_abs_pos_embed)
    ref_model = timm.create_model(
        "vit_small_patch14_dinov2", pretrained=True, img_size=224, num_classes=10,
        pretrained_cfg_overlay={"file": str(dinov2_518), "num_classes": 10},
    ).eval()
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        ref = ref_model(x)
        got = ck.build()(x)
    assert ref.std() > 0.1
    rel = float((got - ref).abs().max() / ref.abs().max())
    print(f"dinov2 518->224 vs timm: max rel diff {rel:.2e}")
    assert rel <= 1e-5


def test_image_size_refusals_are_one_line_exit_2(dinov2_518: Path, tmp_path: Path) -> None:
    from vitdeploy.cli import app

    out = tmp_path / "ck.pth"
    for size, words in (("230", "multiple of"), ("abc", "H or HxW"), ("0x224", "H or HxW")):
        r = CliRunner().invoke(app, ["import", str(dinov2_518), "--arch", "vit_small_patch14_dinov2", "--image-size", size,
                                     "-o", str(out)])
        assert r.exit_code == 2, r.output
        assert words in r.output and "Traceback" not in r.output
        assert not out.exists()


def test_no_absolute_position_embeddings_to_resample_is_refused() -> None:
    from vitdeploy.model.pos_embed import check_resize

    with pytest.raises(UsageError, match="relative position bias"):
        check_resize({"patch_size": 16, "rel_pos_bias": True, "abs_pos_embed": False}, (224, 224), "beit")
    with pytest.raises(UsageError, match="no absolute position embeddings"):
        check_resize({"patch_size": 16, "abs_pos_embed": False}, (224, 224), "m")
    check_resize({"patch_size": 16, "abs_pos_embed": False, "rope": "cat"}, (224, 320), "rope")  # tables recomputed
    assert parse_image_size("224x320") == (224, 320) and parse_image_size("224") == (224, 224)
