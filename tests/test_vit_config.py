"""The timm knobs of ViTConfig: defaults leave today's manifest and state dict as they were; old manifests read the same."""

from __future__ import annotations

import pytest

from vitdeploy.model.presets import PRESETS, ViTConfig

# The manifest's "model" before the timm knobs: every artifact written so far carries exactly these keys.
OLD_KEYS = [
    "image_size", "patch_size", "in_chans", "num_classes", "embed_dim", "depth", "num_heads", "mlp_ratio", "mlp_dim",
    "qkv_bias", "pool", "final_norm", "ln_eps", "drop_rate", "attn_drop_rate",
]


def test_default_config_writes_the_same_manifest_keys_and_values() -> None:
    d = ViTConfig().to_dict()
    assert list(d) == OLD_KEYS
    assert (d["pool"], d["final_norm"], d["image_size"]) == ("cls", "norm", [224, 224])
    for p in PRESETS.values():
        assert list(p.config.to_dict()) == OLD_KEYS


def test_old_manifests_map_onto_the_timm_knobs() -> None:
    base = ViTConfig().to_dict()
    assert ViTConfig.from_dict(base) == ViTConfig()
    mean_norm = ViTConfig.from_dict({**base, "pool": "mean"})  # mean pooling, LayerNorm over all tokens first
    assert (mean_norm.global_pool, mean_norm.use_fc_norm, mean_norm.final_norm) == ("avg", False, True)
    fc = ViTConfig.from_dict({**base, "pool": "mean", "final_norm": "fc_norm"})
    assert (fc.global_pool, fc.use_fc_norm) == ("avg", True)
    old = dict(base)
    del old["final_norm"]
    assert ViTConfig.from_dict({**old, "pool": "mean"}).use_fc_norm is False
    assert ViTConfig().with_(pool="mean").use_fc_norm is False  # `train --pool mean` keeps the norm where it was
    old_ctor = ViTConfig(pool="mean")  # the old constructor keyword still builds the old model
    assert (old_ctor.global_pool, old_ctor.use_fc_norm, old_ctor.to_dict()["pool"]) == ("avg", False, "mean")
    assert ViTConfig(pool="mean", final_norm="fc_norm") == ViTConfig().with_(pool="mean", final_norm="fc_norm")


@pytest.mark.parametrize(
    "kw",
    [
        {"class_token": False, "global_pool": "avg", "fc_norm": False, "no_embed_class": True},
        {"reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5},
        {"distilled": True},
        {"global_pool": "map", "class_token": False, "act": "gelu_tanh"},
        {"pre_norm": True, "act": "quick_gelu", "ln_eps": 1e-5},
        {"global_pool": "avg", "final_norm": False, "pool_include_prefix": True, "class_token": False},
        {"global_pool": "token_avg", "mlp": "swiglu_packed", "qk_norm": True},
        {"mlp": "swiglu", "mlp_norm": True, "act": "silu"},
    ],
)
def test_new_knobs_round_trip_and_appear_only_when_set(kw: dict) -> None:
    cfg = ViTConfig(**kw)
    d = cfg.to_dict()
    assert ViTConfig.from_dict(d) == cfg
    assert set(d) - set(OLD_KEYS) == {k for k in kw if k not in ("global_pool", "fc_norm", *OLD_KEYS)}


@pytest.mark.parametrize(
    ("kw", "word"),
    [
        ({"global_pool": "max"}, "global_pool"),
        ({"class_token": False}, "class token"),
        ({"distilled": True, "global_pool": "avg"}, "distilled"),
        ({"act": "relu"}, "act"),
        ({"mlp": "glu"}, "mlp"),
        ({"init_values": 0.0}, "init_values"),
        ({"reg_tokens": -1}, "reg_tokens"),
    ],
)
def test_bad_knob_values_are_named(kw: dict, word: str) -> None:
    with pytest.raises(ValueError, match=word):
        ViTConfig(**kw)


@pytest.mark.parametrize(
    "kw",
    [
        {},
        {"class_token": False, "global_pool": "avg", "fc_norm": False, "no_embed_class": True, "pre_norm": True},
        {"reg_tokens": 4, "no_embed_class": True, "init_values": 1e-5, "qk_norm": True},
        {"distilled": True, "mlp": "swiglu_packed", "mlp_norm": True},
        {"global_pool": "map", "class_token": False, "mlp": "swiglu"},
        {"global_pool": "token_avg", "fc_norm": True},
        {"global_pool": "avg", "final_norm": False, "qkv_bias": False, "mlp": "swiglu", "mlp_norm": True},
        # PE-core: a pre-norm, an attention pool with its own heads and MLP width over every token, a projection
        {"global_pool": "map", "pre_norm": True, "pool_include_prefix": True, "pool_heads": 4, "pool_mlp_dim": 48,
         "proj_dim": 24, "proj_bias": True},
        {"embed_pool": "cls+mean", "proj_dim": 16},
    ],
)
def test_count_params_equals_the_built_model(kw: dict) -> None:
    import torch

    from vitdeploy.model.vit import VisionTransformer

    cfg = ViTConfig(image_size=(32, 32), patch_size=8, embed_dim=32, depth=2, num_heads=2, num_classes=5, **kw)
    with torch.device("meta"):
        m = VisionTransformer(cfg, weight_init="skip")
    from vitdeploy.model.presets import count_params

    assert count_params(cfg) == sum(p.numel() for p in m.parameters())
