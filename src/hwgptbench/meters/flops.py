"""Analytic FLOPs of one forward of the fixed model, in the convention of torch's FlopCounterMode.

A multiply-add counts 2 FLOPs, and only matrix products count: the fused QKV (with fewer
key/value heads under grouped-query attention), attention output, MLP (gate and up in the llama
family's SwiGLU) and LM-head projections, and attention's QK^T and AV over the full T x T score
matrix (FlopCounterMode's SDPA formula ignores the causal mask, as does the math path's bmm). Bias
adds, LayerNorm, rotary, GELU, softmax and the embedding lookup are not counted.
"""

from __future__ import annotations

from ..space import Arch, SearchSpace


def forward_flops(arch: Arch, space: SearchSpace, vocab_size: int, batch: int,
                  seq_len: int) -> int:
    """FLOPs of one forward of arch on a (batch, seq_len) batch of token ids."""
    space.validate(arch)
    tokens = batch * seq_len
    embed = arch.embed_dim
    flops = 2 * tokens * embed * vocab_size  # LM head
    mlp_matrices = 3 if space.family == "llama" else 2
    for n_head, hidden in zip(arch.n_head, arch.mlp_hidden, strict=True):
        width = n_head * space.head_size
        kv_width = space.kv_heads(n_head) * space.head_size
        flops += 2 * tokens * embed * (2 * width + 2 * kv_width + mlp_matrices * hidden)
        flops += 2 * 2 * batch * n_head * seq_len * seq_len * space.head_size  # QK^T and AV
    return flops
