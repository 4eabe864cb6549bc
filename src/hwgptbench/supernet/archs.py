"""Sampling of the architectures (``results/{scale}/archs.parquet``) that later stages
evaluate and measure: one row per arch, keyed by its canonical id. Stages read the table back
with :func:`hwgptbench.space.read_archs`."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl

from ..space import Arch, SearchSpace


def sample_table(space: SearchSpace, n_archs: int, seed: int, vocab_size: int) -> pl.DataFrame:
    """The smallest and largest arch, then ``n_archs`` uniformly sampled distinct others.

    Columns: arch_id, kind (smallest / largest / sampled), embed_dim, n_layer, bias,
    n_head and mlp_ratio (per layer), params (exact count of the extracted model).
    """
    ends = [space.smallest(), space.largest()]
    sampled = [a for a in space.sample(min(space.size(), n_archs + 2), seed) if a not in ends]
    return _table(space, ends, sampled[:n_archs], vocab_size)


def sample_from(space: SearchSpace, candidates: Sequence[str], n_archs: int, seed: int,
                vocab_size: int) -> pl.DataFrame:
    """As :func:`sample_table`, over given archs (ids) instead of the whole space: the
    candidates with the fewest and the most parameters, then ``n_archs`` of the others drawn
    uniformly without replacement. For perplexities published for a subset of the space."""
    pool = list(dict.fromkeys(Arch.from_id(i) for i in candidates))
    if not pool:
        raise ValueError("no candidate archs to sample from")
    counts = [space.n_params(a, vocab_size) for a in pool]
    smallest = pool[counts.index(min(counts))]
    largest = pool[counts.index(max(counts))]
    ends = list(dict.fromkeys([smallest, largest]))
    others = [a for a in pool if a not in ends]
    picks = np.random.default_rng(seed).permutation(len(others))[:n_archs]
    return _table(space, ends, [others[i] for i in picks], vocab_size)


def _table(space: SearchSpace, ends: list[Arch], sampled: list[Arch], vocab_size: int
           ) -> pl.DataFrame:
    """The archs table: ``ends`` (smallest, then largest) and then ``sampled``."""
    rows = [(a, kind) for a, kind in zip(ends, ("smallest", "largest"), strict=True)]
    rows += [(a, "sampled") for a in sampled]
    return pl.DataFrame({
        "arch_id": [a.id for a, _ in rows],
        "kind": [kind for _, kind in rows],
        "embed_dim": [a.embed_dim for a, _ in rows],
        "n_layer": [a.n_layer for a, _ in rows],
        "bias": [a.bias for a, _ in rows],
        "n_head": [list(a.n_head) for a, _ in rows],
        "mlp_ratio": [[float(r) for r in a.mlp_ratio] for a, _ in rows],
        "params": [space.n_params(a, vocab_size) for a, _ in rows],
    }, schema_overrides={"n_head": pl.List(pl.Int64), "mlp_ratio": pl.List(pl.Float64)})
