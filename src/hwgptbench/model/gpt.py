"""The fixed GPT model: one architecture, plain modules, fused QKV; used for measurement.

Two families share the code (``GPTConfig.family``, from the search space):

- ``gpt_neox`` (the benchmark's spaces): token embedding without position embedding, rotary
  q/k on a fraction of each head, parallel residual ``x + attn(ln1(x)) + mlp(ln2(x))``, GELU
  MLP, final LayerNorm and an LM head tied to the token embedding (no LM-head bias).
  ``arch.bias`` switches the bias of every Linear; the LayerNorms always keep theirs, as in
  HW-GPT-Bench's trained networks (docs/model.md, "Parity with HW-GPT-Bench").
- ``llama``: RMSNorm, sequential residual ``h = x + attn(ln1(x)); h + mlp(ln2(h))``, SwiGLU MLP
  ``proj(silu(gate(x)) * up(x))``, an untied LM head and no biases.

Either family may use grouped-query attention: ``n_kv_head`` key/value heads shared by groups
of ``n_head / n_kv_head`` query heads (query head i reads key/value head i // group, the layout
of Hugging Face LLaMA checkpoints); ``n_kv_head = 0`` gives every query head its own.

Every step of the forward is a module (the attention core, the activation, the residual sums
and the tied LM head are parameterless ones), so forward hooks see each and the per-module time
breakdown (:mod:`hwgptbench.runtime.breakdown`) attributes the whole forward. A
:class:`KVCache` makes autoregressive decoding one token per call; ``recompute`` checkpoints each
block's activations in training (recomputed in the backward pass).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..space import FAMILIES, Arch, SearchSpace
from .rotary import Rotary, apply_rotary


@dataclass(frozen=True)
class GPTConfig:
    """An arch plus the vocabulary and the fixed dims of its search space."""

    arch: Arch
    vocab_size: int
    block_size: int
    head_size: int
    rotary_fraction: float
    family: str = "gpt_neox"
    n_kv_head: int = 0  # 0: one key/value head per query head
    rope_base: float = 10000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for field in ("vocab_size", "block_size", "head_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"{field} must be >= 1, got {getattr(self, field)}")
        if not 0 <= self.rotary_fraction <= 1 or self.rotary_dims % 2:
            raise ValueError(f"rotary_fraction {self.rotary_fraction} must be in [0, 1] and give "
                             f"an even number of rotary dims, got {self.rotary_dims}")
        if self.family not in FAMILIES:
            raise ValueError(f"family {self.family!r} is not one of {FAMILIES}")
        if self.n_kv_head and any(h % self.n_kv_head for h in self.arch.n_head):
            raise ValueError(f"n_head {self.arch.n_head} not all multiples of n_kv_head "
                             f"{self.n_kv_head}")

    @classmethod
    def from_space(cls, space: SearchSpace, arch: Arch, vocab_size: int) -> GPTConfig:
        """Config of an arch of a search space (validated against it)."""
        space.validate(arch)
        return cls(arch, vocab_size, space.block_size, space.head_size, space.rotary_fraction,
                   space.family, space.n_kv_head, space.rope_base, space.norm_eps)

    @property
    def rotary_dims(self) -> int:
        return int(self.head_size * self.rotary_fraction)

    @property
    def llama(self) -> bool:
        return self.family == "llama"

    def kv_heads(self, n_head: int) -> int:
        """Key/value heads of a layer with n_head query heads."""
        return self.n_kv_head or n_head


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
    """Causal attention of q (B, T, nh * hs) and k, v (B, T, nkv * hs) with rotary q and k;
    returns (B, T, nh * hs). Query head i reads key/value head i // (nh / nkv). With a cache, k
    and v join the cached positions (cos and sin are those of the new ones)."""
    B, T, C = q.shape
    hs = C // n_head
    n_kv = k.size(-1) // hs
    q = q.view(B, T, n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
    k, v = (t.view(B, T, n_kv, hs).transpose(1, 2) for t in (k, v))  # (B, nkv, T, hs)
    q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if cache is not None:
        k, v = cache.append(k, v)  # (B, nkv, cached + T, hs)
    # without a cache the mask is causal at every length (one position masks nothing), so the
    # condition is no tensor when torch.export traces T as a symbol
    y = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None or T > 1,
                                       enable_gqa=n_kv != n_head)  # (B, nh, T, hs)
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


class Residual(nn.Module):
    """One residual sum of a sequential block: its input plus a branch (no parameters)."""

    def forward(self, x: Tensor, branch: Tensor) -> Tensor:
        return x + branch


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
    """Multi-head (or grouped-query) causal self-attention with a fused QKV projection."""

    def __init__(self, embed_dim: int, n_head: int, head_size: int, bias: bool,
                 n_kv_head: int = 0) -> None:
        super().__init__()
        self.n_head, self.head_size = n_head, head_size
        self.n_kv_head = n_kv_head or n_head
        self.widths = [n_head * head_size] + [self.n_kv_head * head_size] * 2  # q, k, v
        self.qkv = nn.Linear(embed_dim, sum(self.widths), bias=bias)
        self.core = AttentionCore(n_head)
        self.proj = nn.Linear(n_head * head_size, embed_dim, bias=bias)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                cache: LayerCache | None = None) -> Tensor:
        q, k, v = self.qkv(x).split(self.widths, dim=-1)  # (B, T, nh * hs), 2 x (B, T, nkv * hs)
        return self.proj(self.core(q, k, v, cos, sin, cache))


class MLP(nn.Module):
    """Two-layer GELU MLP (gpt_neox family)."""

    def __init__(self, embed_dim: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.fc = nn.Linear(embed_dim, hidden, bias=bias)
        self.act = nn.GELU()
        self.proj = nn.Linear(hidden, embed_dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.fc(x)))


class GatedMLP(nn.Module):
    """SwiGLU MLP ``proj(silu(gate(x)) * up(x))`` (llama family)."""

    def __init__(self, embed_dim: int, hidden: int, bias: bool) -> None:
        super().__init__()
        self.gate = nn.Linear(embed_dim, hidden, bias=bias)
        self.up = nn.Linear(embed_dim, hidden, bias=bias)
        self.act = nn.SiLU()
        self.proj = nn.Linear(hidden, embed_dim, bias=bias)

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(self.act(self.gate(x)) * self.up(x))


def norm_layer(config: GPTConfig) -> nn.Module:
    """The family's normalization: LayerNorm with scale and shift whatever the bias flag
    (gpt_neox) or RMSNorm (llama)."""
    dim = config.arch.embed_dim
    if config.llama:
        return nn.RMSNorm(dim, eps=config.norm_eps)
    return nn.LayerNorm(dim, eps=config.norm_eps)


class Block(nn.Module):
    """Transformer block: parallel (gpt_neox) or sequential (llama) residual branches."""

    def __init__(self, config: GPTConfig, n_head: int, hidden: int) -> None:
        super().__init__()
        embed_dim, bias = config.arch.embed_dim, config.arch.bias
        self.parallel = not config.llama
        self.ln1 = norm_layer(config)
        self.attn = CausalSelfAttention(embed_dim, n_head, config.head_size, bias,
                                        config.kv_heads(n_head))
        self.ln2 = norm_layer(config)
        self.mlp: MLP | GatedMLP = (GatedMLP if config.llama else MLP)(embed_dim, hidden, bias)
        if self.parallel:
            self.residual = ParallelResidual()
        else:
            self.residual_attn, self.residual_mlp = Residual(), Residual()

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor,
                cache: LayerCache | None = None) -> Tensor:
        attn = self.attn(self.ln1(x), cos, sin, cache)
        if self.parallel:
            return self.residual(x, attn, self.mlp(self.ln2(x)))
        h = self.residual_attn(x, attn)
        return self.residual_mlp(h, self.mlp(self.ln2(h)))


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
        layers = zip(arch.n_head, arch.mlp_hidden, strict=True)
        self.blocks = nn.ModuleList(Block(config, n_head, hidden) for n_head, hidden in layers)
        self.ln_f = norm_layer(config)
        self.lm_head = (nn.Linear(arch.embed_dim, config.vocab_size, bias=False) if config.llama
                        else TiedLMHead())
        self.rotary = Rotary(config.rotary_dims, config.block_size, config.rope_base)
        self.recompute = False  # training: recompute each block's activations in the backward
        self.apply(_init_weights)

    def block_list(self) -> list[Block]:
        """The blocks, typed as such (iterating the nn.ModuleList yields plain modules)."""
        return [cast(Block, block) for block in self.blocks]

    def new_cache(self, batch: int, max_len: int | None = None) -> KVCache:
        """An empty KV cache for batch sequences of up to max_len (default: the context)."""
        max_len = self.config.block_size if max_len is None else max_len
        check_length(max_len, self.config.block_size)
        weight = self.wte.weight
        return KVCache([LayerCache(batch, b.attn.n_kv_head, b.attn.head_size, max_len,
                                   weight.device, weight.dtype) for b in self.block_list()])

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
        x = self.ln_f(x)
        logits = self.lm_head(x) if self.config.llama else self.lm_head(x, self.wte)  # (B, T, V)
        return lm_output(logits, targets)
