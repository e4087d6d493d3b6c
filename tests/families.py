"""The ViT families downstream commands are tested on, as digits-sized ViTs (not a test module).

Each is the vit-digits preset (32x32, patch 4, dim 96, depth 4) with the knobs that define the family, as timm's
models set them (vision_transformer.py, eva.py, beit.py). The suite trains each a few epochs on the digits
(``artifact_cache.family_ckpt_entry``) and takes it through explain, train --init, info and the one-command bundle.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FAMILIES: dict[str, dict[str, Any]] = {
    # DeiT distilled: a distillation token and a second head; eval answers the mean of the two heads
    "deit_distilled": {"distilled": True},
    # DeiT-III / DINOv2: LayerScale on both branches of every block (folded into the Linear before it at export)
    "layerscale": {"init_values": 0.1},
    # DINOv2 with registers: 4 register tokens after the class token, left out of the head and of explain's map
    "registers": {"reg_tokens": 4, "init_values": 0.1},
    # no class token, mean-pooled with a LayerNorm after the pooling (timm's vit_*_gap_*)
    "gap": {"class_token": False, "global_pool": "avg", "act": "gelu_tanh"},
    # SigLIP: no class token, an attention-pooling (MAP) head, gelu_tanh
    "siglip": {"class_token": False, "global_pool": "map", "act": "gelu_tanh"},
    # CLIP: LayerNorm before the blocks, quick_gelu
    "clip": {"pre_norm": True, "act": "quick_gelu"},
    # DINOv2's classifier (transformers): the class token and the patch mean, concatenated
    "token_avg": {"global_pool": "token_avg", "init_values": 0.1},
    # EVA-02: SwiGLU MLP with its inner LayerNorm and rotary position embeddings
    "eva02": {"mlp": "swiglu", "mlp_norm": True, "rope": "cat"},
    # BEiT: relative position bias, q/v bias without k bias, no absolute position embedding, LayerScale
    "beit": {"rel_pos_bias": True, "abs_pos_embed": False, "qv_bias": True, "qkv_bias": False, "init_values": 0.1},
}


def knobs(name: str) -> dict[str, Any]:
    """The family's knobs in the names this tree's ViTConfig has: timm's (global_pool, fc_norm), or the first
    config's pool / final_norm where global_pool is not a field (a tree without the MAP head cannot build siglip)."""
    from vitdeploy.model.presets import ViTConfig

    k = dict(FAMILIES[name])
    if "global_pool" in ViTConfig.__dataclass_fields__ or "global_pool" not in k:
        return k
    gp = k.pop("global_pool")
    if gp == "avg":
        k.update(pool="mean", final_norm="fc_norm")
    elif gp == "token_avg":
        k["pool"] = "token_avg"
    else:
        k["global_pool"] = gp  # no such field here: building the model says so
    return k


def scaled_residual(model: Any, c: float) -> Any:
    """A copy of a VisionTransformer that is exactly equivalent with its residual stream ×c (as tests/test_numerics.py
    does to the plain ViT's graph, here per family, on the model before export).

    What writes the stream is scaled by c: the embeddings (patch projection, class/distillation/register tokens,
    position embedding), or, in a pre-norm model (CLIP), the LayerNorm before the blocks instead, whose output is the
    stream; and each block's two branch outputs: the LayerScale γ where there is one (DeiT-III, DINOv2, BEiT), else
    the attention projection and the MLP's fc2. Every LayerNorm that reads the stream gets ε·c², since
    LayerNorm(c·x; ε·c²) = LayerNorm(x; ε): norm1, norm2, the final norm, or fc_norm after a pooling of the stream."""
    import copy

    import torch

    m = copy.deepcopy(model).eval()
    cfg = m.cfg
    if cfg.final_norm in ("none", False):
        raise ValueError("a model without a final LayerNorm reads the stream itself: no equivalent ×c rewrite")

    def scale(*params: Any) -> None:
        for p in params:
            if p is not None:
                p.mul_(c)

    with torch.no_grad():
        if cfg.pre_norm:
            scale(m.norm_pre.weight, m.norm_pre.bias)
        else:
            scale(m.patch_embed.proj.weight, m.patch_embed.proj.bias, m.cls_token, m.dist_token, m.reg_token,
                  m.pos_embed)
        for blk in m.blocks:
            if getattr(blk.ls1, "gamma", None) is not None:
                scale(blk.ls1.gamma, blk.ls2.gamma)
            else:
                scale(blk.attn.proj.weight, blk.attn.proj.bias, blk.mlp.fc2.weight, blk.mlp.fc2.bias)
            blk.norm1.eps *= c * c
            blk.norm2.eps *= c * c
        for norm in (m.norm, getattr(m, "fc_norm", None)):
            if isinstance(norm, torch.nn.LayerNorm):
                norm.eps *= c * c
    return m


def small_export(name: str, out: Path) -> Path:
    """An untrained, narrower model of the family (dim 32, depth 2: the same ops as the digits-sized one), exported by
    the product's export steps; no checkpoint needed to judge the graph's placement and ops."""
    import torch

    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.manifest import Manifest
    from vitdeploy.model.vit import VisionTransformer, get_preset
    from vitdeploy.stages.export import _clean, _torch_export

    p = get_preset("vit-digits")
    torch.manual_seed(0)
    net = VisionTransformer(p.config.with_(embed_dim=32, depth=2, num_heads=2, **knobs(name))).eval()
    man = Manifest(model=net.cfg.to_dict(), labels=[str(i) for i in range(10)], preprocess=dict(p.preprocess),
                   name=f"digits-{name}")
    OnnxArtifact.write(_clean(_torch_export(net, out.parent, 32, 32, 17), man, 17), man.derive(precision="fp32"), out)
    return out


def export_in_memory(model: Any, manifest: Any, out: Path) -> Path:
    """The product's export steps (LayerScale folded into the Linear before it, TorchScript export, then its cleanup)
    on a model in memory: a rewritten model's per-LayerNorm ε cannot be said in a checkpoint's config. The graph's
    outputs are the manifest's task's (logits, or embedding [and patch_tokens]), as `vitdeploy export` names them."""
    from vitdeploy.core.artifact import OnnxArtifact
    from vitdeploy.core.task import task_of
    from vitdeploy.model.vit import fold_layer_scale
    from vitdeploy.stages.export import _clean, _torch_export

    h, w = manifest.input_size
    raw = _torch_export(fold_layer_scale(model), out.parent, h, w, 17, task_of(manifest).outputs)
    OnnxArtifact.write(_clean(raw, manifest, 17), manifest.derive(precision="fp32"), out)
    return out
