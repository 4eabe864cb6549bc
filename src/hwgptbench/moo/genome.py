"""A fixed-length coding of the archs of a search space, for search algorithms.

The genes of an arch are choice indices: ``embed_dim``, ``n_layer``, one ``n_head_{i}`` and one
``mlp_ratio_{i}`` per possible layer, and ``bias``. Genes of layers beyond ``n_layer`` are
inactive: decoding ignores them, so several gene vectors code one arch (as in the
HW-GPT-Bench and syne-tune codings of these spaces). The same coding is a syne-tune config
space (one categorical hyperparameter per gene) and a pymoo integer problem.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..space import Arch, SearchSpace


class Genome:
    """Genes of the archs of one search space."""

    def __init__(self, space: SearchSpace):
        self.space = space
        layers = range(space.max_n_layer)
        self.names = (["embed_dim", "n_layer"] + [f"n_head_{i}" for i in layers]
                      + [f"mlp_ratio_{i}" for i in layers] + ["bias"])
        self.choices: list[tuple[Any, ...]] = (
            [space.embed_dim, space.n_layer] + [space.n_head] * len(layers)
            + [space.mlp_ratio] * len(layers) + [space.bias])
        self.cardinalities = np.array([len(c) for c in self.choices])

    @property
    def size(self) -> int:
        """Number of genes."""
        return len(self.names)

    def encode(self, arch: Arch) -> np.ndarray:
        """Genes of arch; inactive layers get the genes of the last active layer."""
        self.space.validate(arch)
        n_max = self.space.max_n_layer
        heads = list(arch.n_head) + [arch.n_head[-1]] * (n_max - arch.n_layer)
        ratios = list(arch.mlp_ratio) + [arch.mlp_ratio[-1]] * (n_max - arch.n_layer)
        values = [arch.embed_dim, arch.n_layer, *heads, *ratios, arch.bias]
        genes = [c.index(v) for c, v in zip(self.choices, values, strict=True)]
        return np.array(genes, dtype=np.int64)

    def decode(self, genes: Sequence[int] | np.ndarray) -> Arch:
        """The arch a gene vector codes (inactive genes ignored)."""
        genes = np.asarray(genes, dtype=np.int64)
        if genes.shape != (self.size,) or (genes < 0).any() or (genes >= self.cardinalities).any():
            raise ValueError(f"genes {genes.tolist()} are not {self.size} choice indices below "
                             f"{self.cardinalities.tolist()}")
        values = [c[g] for c, g in zip(self.choices, genes, strict=True)]
        n_max, n_layer = self.space.max_n_layer, values[1]
        return Arch(values[0], n_layer, tuple(values[2:2 + n_layer]),
                    tuple(values[2 + n_max:2 + n_max + n_layer]), values[-1])

    def active(self, arch: Arch) -> list[int]:
        """Indices of the genes that arch depends on."""
        n_max = self.space.max_n_layer
        return ([0, 1] + list(range(2, 2 + arch.n_layer))
                + list(range(2 + n_max, 2 + n_max + arch.n_layer)) + [self.size - 1])

    def neighbours(self, arch: Arch) -> list[Arch]:
        """Every arch that differs from arch in one active gene."""
        genes = self.encode(arch)
        found: dict[str, Arch] = {}
        for gene in self.active(arch):
            for value in range(self.cardinalities[gene]):
                if value != genes[gene]:
                    changed = genes.copy()
                    changed[gene] = value
                    neighbour = self.decode(changed)
                    found.setdefault(neighbour.id, neighbour)
        return list(found.values())

    def mutate(self, arch: Arch, rng: np.random.Generator) -> Arch:
        """arch with one uniformly chosen active gene set to another choice."""
        genes = self.encode(arch)
        candidates = [g for g in self.active(arch) if self.cardinalities[g] > 1]
        gene = candidates[int(rng.integers(len(candidates)))]
        offset = 1 + int(rng.integers(self.cardinalities[gene] - 1))
        genes[gene] = (genes[gene] + offset) % self.cardinalities[gene]
        return self.decode(genes)

    def config_space(self) -> dict[str, Any]:
        """The syne-tune config space of the genes (categorical choice indices)."""
        from syne_tune.config_space import choice

        sizes = zip(self.names, self.cardinalities, strict=True)
        return {name: choice(list(range(n))) for name, n in sizes}

    def from_config(self, config: dict[str, Any]) -> Arch:
        """The arch of a syne-tune config of :meth:`config_space`."""
        return self.decode([int(config[name]) for name in self.names])

    def to_config(self, arch: Arch) -> dict[str, int]:
        """A syne-tune config coding arch."""
        return dict(zip(self.names, map(int, self.encode(arch)), strict=True))
