"""The ViT families downstream commands are tested on, as digits-sized ViTs (not a test module).

Each is the vit-digits preset (32x32, patch 4, dim 96, depth 4) with the knobs that define the family, as timm's
models set them (vision_transformer.py, eva.py, beit.py). The suite trains each a few epochs on the digits
(``artifact_cache.family_ckpt_entry``) and takes it through explain, train --init, info and the one-command bundle.
"""

from __future__ import annotations

from typing import Any

FAMILIES: dict[str, dict[str, Any]] = {
    # DeiT distilled: a distillation token and a second head; eval answers the mean of the two heads
    "deit_distilled": {"distilled": True},
    # DeiT-III / DINOv2: LayerScale on both branches of every block (folded into the Linear before it at export)
    "layerscale": {"init_values": 0.1},
    # DINOv2 with registers: 4 register tokens after the class token, left out of the head and of explain's map
    "registers": {"reg_tokens": 4, "init_values": 0.1},
    # no class token, mean-pooled with a LayerNorm after the pooling (timm's vit_*_gap_*, SigLIP's backbone)
    "gap": {"class_token": False, "pool": "mean", "final_norm": "fc_norm", "act": "gelu_tanh"},
    # CLIP: LayerNorm before the blocks, quick_gelu
    "clip": {"pre_norm": True, "act": "quick_gelu"},
    # DINOv2's classifier (transformers): the class token and the patch mean, concatenated
    "token_avg": {"pool": "token_avg", "init_values": 0.1},
    # EVA-02: SwiGLU MLP and rotary position embeddings
    "eva02": {"mlp": "swiglu", "mlp_norm": True, "rope": "cat"},
    # BEiT: relative position bias, q/v bias without k bias, no absolute position embedding, LayerScale
    "beit": {"rel_pos_bias": True, "abs_pos_embed": False, "qv_bias": True, "qkv_bias": False, "init_values": 0.1},
}
