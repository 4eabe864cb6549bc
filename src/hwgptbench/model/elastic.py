"""Elastic modules: parameters at the maximum size, computed on a leading slice of them.

Each module has ``set_sub(...)`` to select a sub-network (validated against its maximum size),
``reset_sub()`` to return to the full size, and ``sub_state_dict()`` giving the selected weights
in the layout of its fixed counterpart in :mod:`hwgptbench.model.gpt`. The forward pass works on
views of the parameters (``W[:out, :in]``), so selecting a sub-network never copies weights.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from .gpt import causal_attention


def _check_size(name: str, value: int, maximum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= maximum:
        raise ValueError(f"{name}={value!r} not an int in [1, {maximum}]")
    return value


def _check_bias(bias: bool) -> bool:
    if not isinstance(bias, bool):
        raise ValueError(f"bias={bias!r} is not a bool")
    return bias


def merge_state_dicts(states: dict[str, dict[str, Tensor]]) -> dict[str, Tensor]:
    """One state dict from those of named children, keys prefixed by the child name."""
    return {f"{name}.{key}": tensor for name, state in states.items()
            for key, tensor in state.items()}


def _weight_and_bias(weight: Tensor, bias: Tensor | None) -> dict[str, Tensor]:
    return {"weight": weight} if bias is None else {"weight": weight, "bias": bias}


class ElasticLinear(nn.Module):
    """Linear layer computed on the leading (out, in) block of its weight."""

    def __init__(self, in_max: int, out_max: int) -> None:
        super().__init__()
        self.in_max, self.out_max = in_max, out_max
        self.weight = nn.Parameter(torch.empty(out_max, in_max))
        self.bias = nn.Parameter(torch.empty(out_max))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.bias)
        self.reset_sub()

    def set_sub(self, in_features: int, out_features: int, bias: bool) -> None:
        self.in_features = _check_size("in_features", in_features, self.in_max)
        self.out_features = _check_size("out_features", out_features, self.out_max)
        self.use_bias = _check_bias(bias)

    def reset_sub(self) -> None:
        self.set_sub(self.in_max, self.out_max, True)

    def sub_weight(self) -> Tensor:
        """View (out, in) of the selected weight."""
        return self.weight[: self.out_features, : self.in_features]

    def sub_bias(self) -> Tensor | None:
        """View (out,) of the selected bias, or None with bias off."""
        return self.bias[: self.out_features] if self.use_bias else None

    def sub_state_dict(self) -> dict[str, Tensor]:
        return _weight_and_bias(self.sub_weight(), self.sub_bias())

    def forward(self, x: Tensor) -> Tensor:
        return F.linear(x, self.sub_weight(), self.sub_bias())

    def extra_repr(self) -> str:
        return (f"in={self.in_features}/{self.in_max}, out={self.out_features}/{self.out_max}, "
                f"bias={self.use_bias}")


class ElasticEmbedding(nn.Module):
    """Token embedding computed on the leading embedding channels."""

    def __init__(self, num_embeddings: int, dim_max: int) -> None:
        super().__init__()
        self.dim_max = dim_max
        self.weight = nn.Parameter(torch.empty(num_embeddings, dim_max))
        nn.init.normal_(self.weight, mean=0.0, std=0.02)
        self.reset_sub()

    def set_sub(self, dim: int) -> None:
        self.dim = _check_size("dim", dim, self.dim_max)

    def reset_sub(self) -> None:
        self.set_sub(self.dim_max)

    def sub_weight(self) -> Tensor:
        """View (V, dim) of the selected embedding table."""
        return self.weight[:, : self.dim]

    def sub_state_dict(self) -> dict[str, Tensor]:
        return {"weight": self.sub_weight()}

    def forward(self, idx: Tensor) -> Tensor:
        return F.embedding(idx, self.sub_weight())

    def extra_repr(self) -> str:
        return f"dim={self.dim}/{self.dim_max}"


class ElasticLayerNorm(nn.Module):
    """LayerNorm over the leading channels."""

    def __init__(self, dim_max: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim_max, self.eps = dim_max, eps
        self.weight = nn.Parameter(torch.ones(dim_max))
        self.bias = nn.Parameter(torch.zeros(dim_max))
        self.reset_sub()

    def set_sub(self, dim: int, bias: bool) -> None:
        self.dim = _check_size("dim", dim, self.dim_max)
        self.use_bias = _check_bias(bias)

    def reset_sub(self) -> None:
        self.set_sub(self.dim_max, True)

    def sub_weight(self) -> Tensor:
        """View (dim,) of the selected scale."""
        return self.weight[: self.dim]

    def sub_bias(self) -> Tensor | None:
        """View (dim,) of the selected shift, or None with bias off."""
        return self.bias[: self.dim] if self.use_bias else None

    def sub_state_dict(self) -> dict[str, Tensor]:
        return _weight_and_bias(self.sub_weight(), self.sub_bias())

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.dim,), self.sub_weight(), self.sub_bias(), self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}/{self.dim_max}, bias={self.use_bias}"


class ElasticCausalSelfAttention(nn.Module):
    """Causal self-attention over the first n_head heads; q, k, v kept apart for row slicing."""

    def __init__(self, embed_max: int, n_head_max: int, head_size: int) -> None:
        super().__init__()
        self.embed_max, self.n_head_max, self.head_size = embed_max, n_head_max, head_size
        width = n_head_max * head_size
        self.q = ElasticLinear(embed_max, width)
        self.k = ElasticLinear(embed_max, width)
        self.v = ElasticLinear(embed_max, width)
        self.proj = ElasticLinear(width, embed_max)
        self.reset_sub()

    def set_sub(self, embed_dim: int, n_head: int, bias: bool) -> None:
        self.n_head = _check_size("n_head", n_head, self.n_head_max)
        width = n_head * self.head_size
        for linear in (self.q, self.k, self.v):
            linear.set_sub(embed_dim, width, bias)
        self.proj.set_sub(width, embed_dim, bias)

    def reset_sub(self) -> None:
        self.set_sub(self.embed_max, self.n_head_max, True)

    def sub_state_dict(self) -> dict[str, Tensor]:
        """Selected weights with q, k, v fused into one qkv projection (copies)."""
        qkv = [linear.sub_state_dict() for linear in (self.q, self.k, self.v)]
        fused = {key: torch.cat([state[key] for state in qkv]) for key in qkv[0]}
        return merge_state_dicts({"qkv": fused, "proj": self.proj.sub_state_dict()})

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        y = causal_attention(self.q(x), self.k(x), self.v(x), self.n_head, cos, sin)
        return self.proj(y)


class ElasticMLP(nn.Module):
    """Two-layer GELU MLP over the first hidden units."""

    def __init__(self, embed_max: int, hidden_max: int) -> None:
        super().__init__()
        self.fc = ElasticLinear(embed_max, hidden_max)
        self.proj = ElasticLinear(hidden_max, embed_max)

    def set_sub(self, embed_dim: int, hidden: int, bias: bool) -> None:
        self.fc.set_sub(embed_dim, hidden, bias)
        self.proj.set_sub(hidden, embed_dim, bias)

    def reset_sub(self) -> None:
        self.fc.reset_sub()
        self.proj.reset_sub()

    def sub_state_dict(self) -> dict[str, Tensor]:
        return merge_state_dicts({"fc": self.fc.sub_state_dict(),
                                  "proj": self.proj.sub_state_dict()})

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.gelu(self.fc(x)))


class ElasticBlock(nn.Module):
    """Transformer block with parallel residual branches, elastic in every dim."""

    def __init__(self, embed_max: int, n_head_max: int, head_size: int, hidden_max: int) -> None:
        super().__init__()
        self.ln1 = ElasticLayerNorm(embed_max)
        self.attn = ElasticCausalSelfAttention(embed_max, n_head_max, head_size)
        self.ln2 = ElasticLayerNorm(embed_max)
        self.mlp = ElasticMLP(embed_max, hidden_max)

    def set_sub(self, embed_dim: int, n_head: int, hidden: int, bias: bool) -> None:
        self.ln1.set_sub(embed_dim, bias)
        self.attn.set_sub(embed_dim, n_head, bias)
        self.ln2.set_sub(embed_dim, bias)
        self.mlp.set_sub(embed_dim, hidden, bias)

    def reset_sub(self) -> None:
        for module in (self.ln1, self.attn, self.ln2, self.mlp):
            module.reset_sub()

    def sub_state_dict(self) -> dict[str, Tensor]:
        children = {"ln1": self.ln1, "attn": self.attn, "ln2": self.ln2, "mlp": self.mlp}
        return merge_state_dicts({name: m.sub_state_dict() for name, m in children.items()})

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        return x + self.attn(self.ln1(x), cos, sin) + self.mlp(self.ln2(x))
