"""BEiT's relative position bias (timm/models/beit.py): a learned table per block, looked up by a fixed index.

Each block holds ``relative_position_bias_table`` [(2H-1)(2W-1)+3, heads] (timm's name, so timm and BEiT state
dicts load as they are); the index [N, N] that maps every (query, key) pair of tokens to a table row depends only
on the grid, so it is a non-persistent buffer computed from the config (timm drops it from checkpoints too). The
bias [1, heads, N, N] is added to the attention scores before Softmax. At export the lookup (Gather of a weight by
a constant index) is folded by the exporter into one constant per block, so the graph reads
MatMul(Q·scale, Kᵀ) → Add(constant bias) → Softmax → MatMul(·, V).
"""

from __future__ import annotations

import torch
from torch import nn


def relative_position_index(grid: tuple[int, int]) -> torch.Tensor:
    """[N, N] rows of the table (timm's gen_relative_position_index), N = H*W + 1: the class token takes the last
    three rows (class→patch, patch→class, class→class)."""
    h, w = grid
    num_rel = (2 * h - 1) * (2 * w - 1) + 3
    coords = torch.stack(torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")).flatten(1)  # 2, HW
    rel = (coords[:, :, None] - coords[:, None, :]).permute(1, 2, 0).contiguous()  # HW, HW, 2
    rel[:, :, 0] += h - 1
    rel[:, :, 1] += w - 1
    rel[:, :, 0] *= 2 * w - 1
    index = torch.zeros((h * w + 1,) * 2, dtype=torch.long)
    index[1:, 1:] = rel.sum(-1)
    index[0, 0:] = num_rel - 3
    index[0:, 0] = num_rel - 2
    index[0, 0] = num_rel - 1
    return index


class RelativePositionBias(nn.Module):
    """One block's bias; lives in Attention as ``attn.relative_position_bias_table`` (timm's layout) through the
    parent's parameter, so this only holds the index and does the lookup."""

    def __init__(self, grid: tuple[int, int], num_heads: int) -> None:
        super().__init__()
        self.num_relative_distance = (2 * grid[0] - 1) * (2 * grid[1] - 1) + 3
        self.num_heads = num_heads
        self.index: torch.Tensor
        self.register_buffer("index", relative_position_index(grid), persistent=False)

    def forward(self, table: torch.Tensor) -> torch.Tensor:
        n = int(self.index.shape[0])
        return table[self.index.view(-1)].view(n, n, -1).permute(2, 0, 1).unsqueeze(0)
