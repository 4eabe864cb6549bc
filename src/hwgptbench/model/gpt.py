"""The fixed GPT model: one architecture, plain modules, fused QKV; used for measurement.

GPT-NeoX style: token embedding without position embedding, rotary q/k, parallel residual
``x + attn(ln1(x)) + mlp(ln2(x))``, GELU MLP, final LayerNorm and an LM head tied to the token
embedding. ``arch.bias`` switches the bias of every Linear and LayerNorm.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..space import Arch, SearchSpace
from .rotary import Rotary, apply_rotary


@dataclass(frozen=True)
class GPTConfig:
    """An arch plus the vocabulary and the fixed dims of its search space."""

    arch: Arch
    vocab_size: int
    block_size: int
    head_size: int
    rotary_fraction: float

    def __post_init__(self) -> None:
        for field in ("vocab_size", "block_size", "head_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
        if not 0 <= self.rotary_fraction <= 1 or self.rotary_dims % 2:
            raise ValueError(f"rotary_fraction {self.rotary_fraction} must be in [0, 1] and give "
                             f"an even number of rotary dims, got {self.rotary_dims}")

    @classmethod
    def from_space(cls, space: SearchSpace, arch: Arch, vocab_size: int) -> GPTConfig:
        """Config of an arch of a search space (validated against it)."""
        space.validate(arch)
        return cls(arch, vocab_size, space.block_size, space.head_size, space.rotary_fraction)

    @property
    def rotary_dims(self) -> int:
        return int(self.head_size * self.rotary_fraction)


def check_length(seq_len: int, block_size: int) -> None:
    """Reject sequences longer than the context."""
    if seq_len > block_size:
        raise ValueError(f"sequence length {seq_len} exceeds block_size {block_size}")


def causal_attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, cos: Tensor,
                     sin: Tensor) -> Tensor:
    """Causal attention of q, k, v (B, T, nh * hs) with rotary q and k; returns (B, T, nh * hs)."""
    B, T, C = q.shape
    hs = C // n_head
    q, k, v = (t.view(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, C)


def lm_output(logits: Tensor, targets: Tensor | None) -> Tensor | tuple[Tensor, Tensor]:
    """logits, or (logits, mean cross-entropy) when targets (B, T) are given."""
    if targets is None:
        return logits
    return logits, F.cross_entropy(logits.flatten(0, 1), targets.flatten())


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with a fused QKV projection."""

    def __init__(self, embed_dim: int, n_head: int, head_size: int, bias: bool) -> None:
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(embed_dim, 3 * n_head * head_size, bias=bias)
        self.proj = nn.Linear(n_head * head_size, embed_dim, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, nh * hs)
        return self.proj(causal_attention(q, k, v, self.n_head, cos, sin))


class MLP(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, embed_dim: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(embed_dim, hidden, bias=bias)
        self.proj = nn.Linear(hidden, embed_dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class Block(nn.Module):
    """Transformer block with parallel attention and MLP residual branches."""

    def __init__(self, embed_dim: int, n_head: int, head_size: int, hidden: int,
                 bias: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim, bias=bias)
        self.attn = CausalSelfAttention(embed_dim, n_head, head_size, bias)
        self.ln2 = nn.LayerNorm(embed_dim, bias=bias)
        self.mlp = MLP(embed_dim, hidden, bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x + self.attn(self.ln1(x), cos, sin) + self.mlp(self.ln2(x))


def _init_weights(module: nn.Module) -> None:
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


class GPT(nn.Module):
    """A GPT language model of one fixed architecture."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.config = config
        arch = config.arch
        self.wte = nn.Embedding(config.vocab_size, arch.embed_dim)
        self.blocks = nn.ModuleList(
            Block(arch.embed_dim, n_head, config.head_size, hidden, arch.bias)
            for n_head, hidden in zip(arch.n_head, arch.mlp_hidden)
        )
        self.ln_f = nn.LayerNorm(arch.embed_dim, bias=arch.bias)
        self.rotary = Rotary(config.rotary_dims, config.block_size)
        self.apply(_init_weights)

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, T, V) of token ids idx (B, T); with targets also the mean loss."""
        check_length(idx.size(1), self.config.block_size)
        cos, sin = self.rotary(idx.size(1))
        x = self.wte(idx)  # (B, T, E)
        for block in self.blocks:
            x = block(x, cos, sin)
        logits = F.linear(self.ln_f(x), self.wte.weight)  # (B, T, V), tied LM head
        return lm_output(logits, targets)
