"""The fixed GPT model: one architecture, plain modules, fused QKV; used for measurement.

GPT-NeoX style: token embedding without position embedding, rotary q/k, parallel residual
``x + attn(ln1(x)) + mlp(ln2(x))``, GELU MLP, final LayerNorm and an LM head tied to the token
embedding. ``arch.bias`` switches the bias of every Linear and LayerNorm.

Every step of the forward is a module (the attention core, the GELU, the residual sum and the tied LM
head are parameterless ones), so forward hooks see each and the per-module time breakdown
(:mod:`hwgptbench.measure.breakdown`) attributes the whole forward. A :class:`KVCache` makes
autoregressive decoding one token per call; ``recompute`` checkpoints each block's activations
in training (recomputed in the backward pass).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

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


class LayerCache:
    """Keys and values of one attention layer for the positions seen so far."""

    def __init__(self, batch: int, n_head: int, head_size: int, max_len: int,
                 device: torch.device, dtype: torch.dtype) -> None:
        shape = (batch, n_head, max_len, head_size)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0

    def append(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k, v (B, nh, T, hs) after the cached positions; all keys and values so far."""
        T = k.size(2)
        if self.length and T > 1:
            raise ValueError("a cache holding positions takes one new token per call")
        end = self.length + T
        if end > self.k.size(2):
            raise ValueError(f"KV cache full: {end} positions exceed its {self.k.size(2)}")
        self.k[:, :, self.length:end] = k
        self.v[:, :, self.length:end] = v
        self.length = end
        return self.k[:, :, :end], self.v[:, :, :end]


class KVCache:
    """One :class:`LayerCache` per block of a GPT, for generation after a prompt."""

    def __init__(self, layers: list[LayerCache]) -> None:
        self.layers = layers

    @property
    def length(self) -> int:
        """Positions cached (the same in every layer)."""
        return self.layers[0].length

    def truncate(self, length: int) -> None:
        """Forget the positions from length on (to decode again after the same prompt)."""
        for layer in self.layers:
            layer.length = min(layer.length, length)


def causal_attention(q: Tensor, k: Tensor, v: Tensor, n_head: int, cos: Tensor,
                     sin: Tensor, cache: LayerCache | None = None) -> Tensor:
    """Causal attention of q, k, v (B, T, nh * hs) with rotary q and k; returns (B, T, nh * hs).
    With a cache, k and v join the cached positions (cos and sin are those of the new ones)."""
    B, T, C = q.shape
    hs = C // n_head
    q, k, v = (t.view(B, T, n_head, hs).transpose(1, 2) for t in (q, k, v))  # (B, nh, T, hs)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if cache is not None:
        k, v = cache.append(k, v)  # (B, nh, cached + T, hs)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=T > 1)  # (B, nh, T, hs)
    return y.transpose(1, 2).reshape(B, T, C)


class AttentionCore(nn.Module):
    """Rotary, scaled dot-product attention and the head merge (no parameters)."""

    def __init__(self, n_head: int) -> None:
        super().__init__()
        self.n_head = n_head

    def forward(self, q: Tensor, k: Tensor, v: Tensor, cos: Tensor, sin: Tensor,
                cache: LayerCache | None = None) -> Tensor:
        return causal_attention(q, k, v, self.n_head, cos, sin, cache)


class ParallelResidual(nn.Module):
    """The block's output: its input plus the attention and MLP branches (no parameters)."""

    def forward(self, x: Tensor, attn: Tensor, mlp: Tensor) -> Tensor:
        return x + attn + mlp


class TiedLMHead(nn.Module):
    """Logits from the token embedding's weight (no parameters of its own)."""

    def forward(self, x: Tensor, embedding: nn.Embedding) -> Tensor:
        return F.linear(x, embedding.weight)


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
        self.head_size = head_size
        self.qkv = nn.Linear(embed_dim, 3 * n_head * head_size, bias=bias)
        self.core = AttentionCore(n_head)
        self.proj = nn.Linear(n_head * head_size, embed_dim, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                cache: LayerCache | None = None) -> Tensor:
        q, k, v = self.qkv(x).chunk(3, dim=-1)  # 3 x (B, T, nh * hs)
        return self.proj(self.core(q, k, v, cos, sin, cache))


class MLP(nn.Module):
    """Two-layer GELU MLP."""

    def __init__(self, embed_dim: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(embed_dim, hidden, bias=bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, embed_dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(nn.Module):
    """Transformer block with parallel attention and MLP residual branches."""

    def __init__(self, embed_dim: int, n_head: int, head_size: int, hidden: int,
                 bias: bool) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(embed_dim, bias=bias)
        self.attn = CausalSelfAttention(embed_dim, n_head, head_size, bias)
        self.ln2 = nn.LayerNorm(embed_dim, bias=bias)
        self.mlp = MLP(embed_dim, hidden, bias)
        self.residual = ParallelResidual()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                cache: LayerCache | None = None) -> Tensor:
        return self.residual(x, self.attn(self.ln1(x), cos, sin, cache), self.mlp(self.ln2(x)))


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
        self.lm_head = TiedLMHead()
        self.rotary = Rotary(config.rotary_dims, config.block_size)
        self.recompute = False  # training: recompute each block's activations in the backward
        self.apply(_init_weights)

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for batch sequences of up to max_len (default: the context)."""
        max_len = self.config.block_size if max_len is None else max_len
        check_length(max_len, self.config.block_size)
        weight = self.wte.weight
        return KVCache([LayerCache(batch, b.attn.n_head, b.attn.head_size, max_len,
                                   weight.device, weight.dtype) for b in self.blocks])

    def forward(self, idx: Tensor, targets: Tensor | None = None,
                cache: KVCache | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, T, V) of token ids idx (B, T); with targets also the mean loss. With a
        cache, idx continues the cached positions (the prompt, then one token per call)."""
        start = 0 if cache is None else cache.length
        check_length(start + idx.size(1), self.config.block_size)
        cos, sin = self.rotary(idx.size(1), start)
        x = self.wte(idx)  # (B, T, E)
        for i, block in enumerate(self.blocks):
            layer_cache = None if cache is None else cache.layers[i]
            if self.recompute and self.training and torch.is_grad_enabled():
                x = checkpoint(block, x, cos, sin, layer_cache, use_reentrant=False)
            else:
                x = block(x, cos, sin, layer_cache)
        logits = self.lm_head(self.ln_f(x), self.wte)  # (B, T, V), tied LM head
        return lm_output(logits, targets)
