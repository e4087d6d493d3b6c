"""One filter for foreign checkpoint layouts: timm's Eva/Beit parameter names → the vitdeploy ViT's (timm's
vision_transformer.py names), applied to every timm state dict before it is matched against a config.

timm's eva.py and beit.py grew beside vision_transformer.py and named a few things their own way:

- LayerScale: ``blocks.N.gamma_1`` / ``gamma_2`` (a bare parameter) → ``blocks.N.ls1.gamma`` / ``ls2.gamma``;
- unfused projections (``qkv_fused=False``): ``attn.q_proj`` / ``k_proj`` / ``v_proj`` → one ``attn.qkv.weight``
  (rows q, k, v: the order the fused layout uses), with ``q_proj.bias`` / ``v_proj.bias`` → ``attn.q_bias`` /
  ``attn.v_bias`` (Eva's k_proj has no bias: the ViT's ``qv_bias`` layout); a k bias, where one exists, makes
  a plain fused ``attn.qkv.bias``;
- non-persistent buffers some checkpoints carry anyway: ``attn.relative_position_index``, ``attn.k_bias``,
  ``rope.*`` tables (all recomputed from the config).

Everything else (``cls_token``, ``reg_token``, ``pos_embed``, ``norm``, ``fc_norm``, ``head``, ``mlp.*``,
``attn.q_bias``/``v_bias``, ``attn.relative_position_bias_table``) already has the ViT's name. The filter only
renames and concatenates: no value changes, so the timm model's logits are kept exactly.
"""

from __future__ import annotations

import re

import torch

_BLOCK = re.compile(r"^(blocks\.\d+\.)(.*)$")
_DROP = re.compile(r"(^|\.)(relative_position_index|k_bias)$|^rope\.")


def is_eva_beit_layout(sd: dict[str, torch.Tensor]) -> bool:
    """Whether a state dict uses any of Eva/Beit's own names."""
    return any(k.endswith((".gamma_1", ".gamma_2", ".attn.q_proj.weight")) or _DROP.search(k) for k in sd)


def rename_eva_beit(sd: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state dict under the ViT's names (a new dict; the tensors are shared, or concatenated for qkv)."""
    out: dict[str, torch.Tensor] = {}
    proj: dict[str, dict[str, torch.Tensor]] = {}
    for k, v in sd.items():
        if _DROP.search(k):
            continue
        m = _BLOCK.match(k)
        if m is None:
            out[k] = v
            continue
        pre, rest = m.groups()
        if rest in ("gamma_1", "gamma_2"):
            out[f"{pre}ls{rest[-1]}.gamma"] = v
        elif rest.startswith(("attn.q_proj.", "attn.k_proj.", "attn.v_proj.")):
            proj.setdefault(pre, {})[rest[len("attn.") :]] = v
        else:
            out[k] = v
    for pre, p in proj.items():
        if not all(f"{n}_proj.weight" in p for n in "qkv"):  # not Eva's layout: left as it is, for the fit check to name
            out.update({f"{pre}attn.{n}": t for n, t in p.items()})
            continue
        out[pre + "attn.qkv.weight"] = torch.cat([p["q_proj.weight"], p["k_proj.weight"], p["v_proj.weight"]])
        if "k_proj.bias" in p:
            out[pre + "attn.qkv.bias"] = torch.cat([p["q_proj.bias"], p["k_proj.bias"], p["v_proj.bias"]])
        elif "q_proj.bias" in p:
            out[pre + "attn.q_bias"] = p["q_proj.bias"]
            out[pre + "attn.v_bias"] = p["v_proj.bias"]
    return out
