"""Rotary position embeddings (GPT-NeoX style: rotate-half on the leading dims of each head)."""

from __future__ import annotations

import torch
import torch.nn as nn
from torch import Tensor


class Rotary(nn.Module):
    """Cached cos/sin tables for positions 0..block_size-1 over n_dims rotary dims."""

    cos: Tensor  # buffers (block_size, n_dims), registered in __init__
    sin: Tensor

    def __init__(self, n_dims: int, block_size: int, base: float = 10000.0) -> None:
        super().__init__()
        inv_freq = 1.0 / base ** (torch.arange(0, n_dims, 2, dtype=torch.float32) / n_dims)
        freqs = torch.outer(torch.arange(block_size, dtype=torch.float32), inv_freq)
        angles = torch.cat((freqs, freqs), dim=-1)  # (block_size, n_dims)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, seq_len: int, start: int = 0) -> tuple[Tensor, Tensor]:
        """cos and sin tables (T, n_dims) for the seq_len positions from start."""
        return self.cos[start:start + seq_len], self.sin[start:start + seq_len]


def apply_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate the first cos.size(-1) dims of x (B, nh, T, hs); the rest pass through."""
    n_dims = cos.size(-1)
    rot, rest = x[..., :n_dims], x[..., n_dims:]
    x1, x2 = rot[..., : n_dims // 2], rot[..., n_dims // 2 :]
    rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((rot * cos + rotated * sin, rest), dim=-1)
