"""The GPT supernet: one set of weights at the maximum size of a search space.

``set_arch(arch)`` selects a sub-network (the first E channels, first L layers, first h_i
heads (of every key/value group, with grouped-query attention) and first int(r_i * E) hidden
units of layer i, Linear biases on or off); its forward pass runs on views of the supernet
weights.
The space's ``family`` picks the blocks (:mod:`hwgptbench.model.elastic`).
``extract(arch)`` copies a sub-network out as a fixed
:class:`~hwgptbench.model.gpt.GPT`.
"""

from __future__ import annotations

from typing import cast

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch import Tensor

from ..space import Arch, SearchSpace
from .elastic import ElasticBlock, ElasticEmbedding, ElasticLinear, elastic_norm, merge_state_dicts
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
        self.blocks = nn.ModuleList(ElasticBlock(space, embed_max, hidden_max)
                                    for _ in range(largest.n_layer))
        self.ln_f = elastic_norm(space, embed_max)
        self.tied = space.family != "llama"
        if not self.tied:
            self.lm_head = ElasticLinear(embed_max, vocab_size, bias=False)
        self.rotary = Rotary(space.rotary_dims, space.block_size, space.rope_base)
        self.set_arch(largest)

    def set_arch(self, arch: Arch) -> None:
        """Select the sub-network of arch; raise InvalidArchError if it is not in the space."""
        self.space.validate(arch)
        self.arch = arch
        self.wte.set_sub(arch.embed_dim)
        for i, block in enumerate(self.block_list()):
            if i < arch.n_layer:
                block.set_sub(arch.embed_dim, arch.n_head[i], arch.mlp_hidden[i], arch.bias)
            else:
                block.reset_sub()
        self.ln_f.set_sub(arch.embed_dim)
        if not self.tied:
            self.lm_head.set_sub(arch.embed_dim, self.vocab_size, False)

    def block_list(self) -> list[ElasticBlock]:
        """The blocks, typed as such (iterating the nn.ModuleList yields plain modules)."""
        return [cast(ElasticBlock, block) for block in self.blocks]

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
        x = self.ln_f(x)
        logits = F.linear(x, self.wte.sub_weight()) if self.tied else self.lm_head(x)  # (B, T, V)
        return lm_output(logits, targets)

    def _sub_state_dict(self) -> dict[str, Tensor]:
        """Selected weights in the layout of the fixed GPT."""
        blocks = self.block_list()[: self.arch.n_layer]
        states = {f"blocks.{i}": block.sub_state_dict() for i, block in enumerate(blocks)}
        states |= {"wte": self.wte.sub_state_dict(), "ln_f": self.ln_f.sub_state_dict()}
        if not self.tied:
            states["lm_head"] = self.lm_head.sub_state_dict()
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

    def _dense_mismatches(self, config: GPTConfig) -> list[str]:
        """Fields in which a fixed model's config differs from the space's largest arch."""
        largest = self.space.largest()
        expected = GPTConfig.from_space(self.space, largest, self.vocab_size)
        problems = [f"{field}: model {getattr(config, field)!r}, space {getattr(expected, field)!r}"
                    for field in ("arch", "vocab_size", "head_size", "rotary_fraction", "family",
                                  "rope_base", "norm_eps")
                    if getattr(config, field) != getattr(expected, field)]
        kv = [config.kv_heads(h) for h in config.arch.n_head]
        if kv != [expected.kv_heads(h) for h in largest.n_head]:
            problems.append(f"key/value heads per layer: model {kv}, space n_kv_head "
                            f"{self.space.n_kv_head}")
        return problems

    @torch.no_grad()
    def load_dense(self, model: GPT) -> None:
        """Copy the weights of a dense fixed model, which must be the space's largest arch, into
        the supernet: the largest sub-network then computes exactly what model does."""
        problems = self._dense_mismatches(model.config)
        if problems:
            raise ValueError("the dense model is not the largest arch of search space "
                             f"{self.space.name!r}:\n" + "\n".join(f"  - {p}" for p in problems))
        state = dict(model.state_dict())
        for i, block in enumerate(model.block_list()):
            prefix = f"blocks.{i}.attn."
            for kind in ("weight", "bias"):
                fused = state.pop(f"{prefix}qkv.{kind}", None)
                if fused is not None:
                    for name, part in zip("qkv", fused.split(block.attn.widths), strict=True):
                        state[f"{prefix}{name}.{kind}"] = part
        missing, unexpected = self.load_state_dict(state, strict=False)
        if unexpected or missing:
            raise ValueError(f"dense state does not fit the supernet: missing {sorted(missing)}, "
                             f"unexpected {unexpected}")
        self.reset_arch()
