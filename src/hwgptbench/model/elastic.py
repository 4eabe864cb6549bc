"""Elastic modules: parameters at the maximum size, computed on a leading slice of them.

Each module has ``set_sub(...)`` to select a sub-network (validated against its maximum size),
``reset_sub()`` to return to the full size, and ``sub_state_dict()`` giving the selected weights
in the layout of its fixed counterpart in :mod:`hwgptbench.model.gpt`. The forward pass works on
views of the parameters (``W[:out, :in]``), so selecting a sub-network never copies weights.

Grouped-query attention slices in groups: the query rows (and the output projection's columns)
of each key/value group are a block, and a sub-network keeps the leading heads of every block
(a copy per call, as the fused QKV of the fixed model is). Both families (``gpt_neox`` and
``llama``, :mod:`hwgptbench.model.gpt`) are built from these modules.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..space import SearchSpace
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


def leading(tensor: Tensor, dim: int, size: int, groups: int = 1) -> Tensor:
    """The first size entries of tensor along dim; with groups, the first size / groups of each
    of the groups equal blocks along dim (a view for one group, a copy otherwise)."""
    if groups == 1:
        return tensor.narrow(dim, 0, size)
    blocks = tensor.unflatten(dim, (groups, tensor.size(dim) // groups))
    return blocks.narrow(dim + 1, 0, size // groups).flatten(dim, dim + 1)


class ElasticLinear(nn.Module):
    """Linear layer computed on the leading (out, in) block of its weight.

    ``out_groups``/``in_groups`` > 1 slice the rows/columns per block instead (grouped-query
    attention); ``bias=False`` makes a layer that never has a bias.
    """

    def __init__(self, in_max: int, out_max: int, bias: bool = True, in_groups: int = 1,
                 out_groups: int = 1) -> None:
        super().__init__()
        if in_max % in_groups or out_max % out_groups:
            raise ValueError(f"({out_max}, {in_max}) not divisible into ({out_groups}, "
                             f"{in_groups}) groups")
        self.in_max, self.out_max = in_max, out_max
        self.in_groups, self.out_groups, self.has_bias = in_groups, out_groups, bias
        self.weight = nn.Parameter(torch.empty(out_max, in_max))
        self.bias = nn.Parameter(torch.zeros(out_max)) if bias else None
        nn.init.normal_(self.weight, mean=0.0, std=0.02)
        self.reset_sub()

    def set_sub(self, in_features: int, out_features: int, bias: bool) -> None:
        self.in_features = _check_size("in_features", in_features, self.in_max)
        self.out_features = _check_size("out_features", out_features, self.out_max)
        for name, size, groups in (("in_features", in_features, self.in_groups),
                                   ("out_features", out_features, self.out_groups)):
            if size % groups:
                raise ValueError(f"{name}={size} is not a multiple of its {groups} groups")
        use_bias = _check_bias(bias)
        if use_bias and not self.has_bias:
            raise ValueError("bias=True for a layer without bias")
        self.use_bias = use_bias

    def reset_sub(self) -> None:
        self.set_sub(self.in_max, self.out_max, self.has_bias)

    def sub_weight(self) -> Tensor:
        """The selected weight (out, in): a view, or a copy with groups."""
        rows = leading(self.weight, 0, self.out_features, self.out_groups)
        return leading(rows, 1, self.in_features, self.in_groups)

    def sub_bias(self) -> Tensor | None:
        """The selected bias (out,), or None with bias off."""
        if not self.use_bias:
            return None
        assert self.bias is not None  # set_sub turns bias on only for a layer with one
        return leading(self.bias, 0, self.out_features, self.out_groups)

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


class ElasticRMSNorm(nn.Module):
    """RMSNorm over the leading channels (a scale, no shift)."""

    def __init__(self, dim_max: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim_max, self.eps = dim_max, eps
        self.weight = nn.Parameter(torch.ones(dim_max))
        self.reset_sub()

    def set_sub(self, dim: int) -> None:
        self.dim = _check_size("dim", dim, self.dim_max)

    def reset_sub(self) -> None:
        self.set_sub(self.dim_max)

    def sub_weight(self) -> Tensor:
        """View (dim,) of the selected scale."""
        return self.weight[: self.dim]

    def sub_state_dict(self) -> dict[str, Tensor]:
        return {"weight": self.sub_weight()}

    def forward(self, x: Tensor) -> Tensor:
        return F.rms_norm(x, (self.dim,), self.sub_weight(), self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}/{self.dim_max}"


class ElasticLayerNorm(nn.Module):
    """LayerNorm over the leading channels, always with its shift (bias): the arch's bias flag
    switches the Linear biases only, as in HW-GPT-Bench's trained networks."""

    def __init__(self, dim_max: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.dim_max, self.eps = dim_max, eps
        self.weight = nn.Parameter(torch.ones(dim_max))
        self.bias = nn.Parameter(torch.zeros(dim_max))
        self.reset_sub()

    def set_sub(self, dim: int) -> None:
        self.dim = _check_size("dim", dim, self.dim_max)

    def reset_sub(self) -> None:
        self.set_sub(self.dim_max)

    def sub_weight(self) -> Tensor:
        """View (dim,) of the selected scale."""
        return self.weight[: self.dim]

    def sub_bias(self) -> Tensor:
        """View (dim,) of the selected shift."""
        return self.bias[: self.dim]

    def sub_state_dict(self) -> dict[str, Tensor]:
        return _weight_and_bias(self.sub_weight(), self.sub_bias())

    def forward(self, x: Tensor) -> Tensor:
        return F.layer_norm(x, (self.dim,), self.sub_weight(), self.sub_bias(), self.eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}/{self.dim_max}"


class ElasticCausalSelfAttention(nn.Module):
    """Causal self-attention over the leading query heads (of every key/value group with
    grouped-query attention); q, k, v kept apart for row slicing."""

    def __init__(self, embed_max: int, n_head_max: int, head_size: int, bias: bool = True,
                 n_kv_head: int = 0) -> None:
        super().__init__()
        self.embed_max, self.n_head_max, self.head_size = embed_max, n_head_max, head_size
        self.n_kv_head, self.has_bias = n_kv_head, bias
        width = n_head_max * head_size
        kv_width = n_kv_head * head_size if n_kv_head else width
        groups = max(n_kv_head, 1)
        self.q = ElasticLinear(embed_max, width, bias, out_groups=groups)
        self.k = ElasticLinear(embed_max, kv_width, bias)
        self.v = ElasticLinear(embed_max, kv_width, bias)
        self.proj = ElasticLinear(width, embed_max, bias, in_groups=groups)
        self.reset_sub()

    def set_sub(self, embed_dim: int, n_head: int, bias: bool) -> None:
        self.n_head = _check_size("n_head", n_head, self.n_head_max)
        width = n_head * self.head_size
        kv_width = self.n_kv_head * self.head_size if self.n_kv_head else width
        self.q.set_sub(embed_dim, width, bias)
        for linear in (self.k, self.v):
            linear.set_sub(embed_dim, kv_width, bias)
        self.proj.set_sub(width, embed_dim, bias)

    def reset_sub(self) -> None:
        self.set_sub(self.embed_max, self.n_head_max, self.has_bias)

    def sub_state_dict(self) -> dict[str, Tensor]:
        """Selected weights with q, k, v fused into one qkv projection (copies)."""
        qkv = [linear.sub_state_dict() for linear in (self.q, self.k, self.v)]
        fused = {key: torch.cat([state[key] for state in qkv]) for key in qkv[0]}
        return merge_state_dicts({"qkv": fused, "proj": self.proj.sub_state_dict()})

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        y = causal_attention(self.q(x), self.k(x), self.v(x), self.n_head, cos, sin)
        return self.proj(y)


class ElasticMLP(nn.Module):
    """Two-layer GELU MLP over the first hidden units (gpt_neox family)."""

    def __init__(self, embed_max: int, hidden_max: int, bias: bool = True) -> None:
        super().__init__()
        self.fc = ElasticLinear(embed_max, hidden_max, bias)
        self.proj = ElasticLinear(hidden_max, embed_max, bias)

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


class ElasticGatedMLP(nn.Module):
    """SwiGLU MLP over the first hidden units (llama family)."""

    def __init__(self, embed_max: int, hidden_max: int, bias: bool = False) -> None:
        super().__init__()
        self.gate = ElasticLinear(embed_max, hidden_max, bias)
        self.up = ElasticLinear(embed_max, hidden_max, bias)
        self.proj = ElasticLinear(hidden_max, embed_max, bias)

    def set_sub(self, embed_dim: int, hidden: int, bias: bool) -> None:
        self.gate.set_sub(embed_dim, hidden, bias)
        self.up.set_sub(embed_dim, hidden, bias)
        self.proj.set_sub(hidden, embed_dim, bias)

    def reset_sub(self) -> None:
        for linear in (self.gate, self.up, self.proj):
            linear.reset_sub()

    def sub_state_dict(self) -> dict[str, Tensor]:
        return merge_state_dicts({name: getattr(self, name).sub_state_dict()
                                  for name in ("gate", "up", "proj")})

    def forward(self, x: Tensor) -> Tensor:
        return self.proj(F.silu(self.gate(x)) * self.up(x))


def elastic_norm(space: SearchSpace, dim_max: int) -> ElasticLayerNorm | ElasticRMSNorm:
    """The family's elastic normalization: LayerNorm (gpt_neox) or RMSNorm (llama)."""
    norm = ElasticRMSNorm if space.family == "llama" else ElasticLayerNorm
    return norm(dim_max, space.norm_eps)


class ElasticBlock(nn.Module):
    """Transformer block of a space's family, elastic in every dim: parallel residual
    branches (gpt_neox) or sequential ones (llama)."""

    def __init__(self, space: SearchSpace, embed_max: int, hidden_max: int) -> None:
        super().__init__()
        bias = max(space.bias)
        self.parallel = space.family != "llama"
        self.ln1 = elastic_norm(space, embed_max)
        self.attn = ElasticCausalSelfAttention(embed_max, space.max_n_head, space.head_size,
                                               bias, space.n_kv_head)
        self.ln2 = elastic_norm(space, embed_max)
        mlp = ElasticMLP if self.parallel else ElasticGatedMLP
        self.mlp = mlp(embed_max, hidden_max, bias)

    def set_sub(self, embed_dim: int, n_head: int, hidden: int, bias: bool) -> None:
        self.ln1.set_sub(embed_dim)
        self.attn.set_sub(embed_dim, n_head, bias)
        self.ln2.set_sub(embed_dim)
        self.mlp.set_sub(embed_dim, hidden, bias)

    def reset_sub(self) -> None:
        for module in (self.ln1, self.attn, self.ln2, self.mlp):
            module.reset_sub()

    def sub_state_dict(self) -> dict[str, Tensor]:
        children = {"ln1": self.ln1, "attn": self.attn, "ln2": self.ln2, "mlp": self.mlp}
        return merge_state_dicts({name: m.sub_state_dict() for name, m in children.items()})

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
        if self.parallel:
            return x + self.attn(self.ln1(x), cos, sin) + self.mlp(self.ln2(x))
        h = x + self.attn(self.ln1(x), cos, sin)
        return h + self.mlp(self.ln2(h))
