"""The GPT supernet: one set of weights at the maximum size of a search space.

``set_arch(arch)`` selects a sub-network (the first E channels, first L layers, first h_i
heads and first int(r_i * E) hidden units of layer i, biases on or off); its forward pass runs
on views of the supernet weights. ``extract(arch)`` copies a sub-network out as a fixed
:class:`~hwgptbench.model.gpt.GPT`.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..space import Arch, SearchSpace
from .elastic import ElasticBlock, ElasticEmbedding, ElasticLayerNorm, merge_state_dicts
from .gpt import GPT, GPTConfig, check_length, lm_output
from .rotary import Rotary


class SuperGPT(nn.Module):
    """A weight-sharing GPT supernet over a search space."""

    def __init__(self, space: SearchSpace, vocab_size: int) -> None:
        super().__init__()
        self.space, self.vocab_size = space, vocab_size
        largest = space.largest()
        embed_max, hidden_max = largest.embed_dim, largest.mlp_hidden[0]
        self.wte = ElasticEmbedding(vocab_size, embed_max)
        self.blocks = nn.ModuleList(
            ElasticBlock(embed_max, space.max_n_head, space.head_size, hidden_max)
            for _ in range(largest.n_layer)
        )
        self.ln_f = ElasticLayerNorm(embed_max)
        self.rotary = Rotary(space.rotary_dims, space.block_size)
        self.set_arch(largest)

    def set_arch(self, arch: Arch) -> None:
        """Select the sub-network of arch; raise InvalidArchError if it is not in the space."""
        self.space.validate(arch)
        self.arch = arch
        self.wte.set_sub(arch.embed_dim)
        for i, block in enumerate(self.blocks):
            if i < arch.n_layer:
                block.set_sub(arch.embed_dim, arch.n_head[i], arch.mlp_hidden[i], arch.bias)
            else:
                block.reset_sub()
        self.ln_f.set_sub(arch.embed_dim, arch.bias)

    def reset_arch(self) -> None:
        """Select the full network (the largest arch)."""
        self.set_arch(self.space.largest())

    def forward(self, idx: Tensor, targets: Tensor | None = None) -> Tensor | tuple[Tensor, Tensor]:
        """Logits (B, T, V) of the selected sub-network; with targets also the mean loss."""
        check_length(idx.size(1), self.space.block_size)
        cos, sin = self.rotary(idx.size(1))
        x = self.wte(idx)  # (B, T, E)
        for block in self.blocks[: self.arch.n_layer]:
            x = block(x, cos, sin)
        logits = F.linear(self.ln_f(x), self.wte.sub_weight())  # (B, T, V), tied LM head
        return lm_output(logits, targets)

    def _sub_state_dict(self) -> dict[str, Tensor]:
        """Selected weights in the layout of the fixed GPT."""
        blocks = self.blocks[: self.arch.n_layer]
        states = {f"blocks.{i}": block.sub_state_dict() for i, block in enumerate(blocks)}
        states |= {"wte": self.wte.sub_state_dict(), "ln_f": self.ln_f.sub_state_dict()}
        return merge_state_dicts(states)

    def extract(self, arch: Arch | None = None) -> GPT:
        """A standalone fixed GPT with a copy of the weights of arch (default: the selected one)."""
        current = self.arch
        self.set_arch(current if arch is None else arch)
        config = GPTConfig.from_space(self.space, self.arch, self.vocab_size)
        state = self._sub_state_dict()
        self.set_arch(current)
        weight = self.wte.weight
        with torch.device(weight.device):
            model = GPT(config).to(weight.dtype)
        model.load_state_dict(state)
        return model
