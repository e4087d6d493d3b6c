"""The attention-pooling head (SigLIP's MAP): timm's ``AttentionPoolLatent`` with its parameter names (``attn_pool.*``).

One learned latent query attends over the tokens; the result goes through a projection and a residual MLP. Its
attention is written the way the blocks' is (scaled_dot_product_attention: scale before the first MatMul, nothing
between Softmax and the second MatMul), so TensorRT fuses it too.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class AttentionPoolLatent(nn.Module):
    """timm.layers.AttentionPoolLatent as timm's VisionTransformer(global_pool='map') builds it (latent_len 1,
    q projection, no q/k norm, no position embedding, pool 'token')."""

    def __init__(self, dim: int, num_heads: int, mlp: nn.Module, ln_eps: float) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.scale = self.head_dim**-0.5
        self.latent = nn.Parameter(torch.zeros(1, 1, dim))
        self.q = nn.Linear(dim, dim)
        self.kv = nn.Linear(dim, dim * 2)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim, eps=ln_eps)
        self.mlp = mlp

    def forward(self, x: torch.Tensor, return_attn: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The pooled vector [B, dim] and, with ``return_attn``, the latent's attention over the tokens [B, heads, 1, N]."""
        B, N, C = x.shape
        # the projection of the (constant) latent before the batch Expand: the export folds it into a constant, so
        # no GEMM of a constant is left for the INT8 placement to quantize; exact (the same row for every image)
        q = self.q(self.latent).expand(B, -1, -1).reshape(B, 1, self.num_heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).reshape(B, N, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        attn: torch.Tensor | None = None
        if return_attn:
            attn = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            x = attn @ v
        else:
            x = F.scaled_dot_product_attention(q, k, v)
        x = self.proj(x.transpose(1, 2).reshape(B, 1, C))
        x = x + self.mlp(self.norm(x))
        return x[:, 0], attn
