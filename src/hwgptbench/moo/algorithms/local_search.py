"""Pareto local search (Paquete, Chiarandini and Stützle, 2004) over one-gene changes.

No maintained library implements multi-objective local search over a custom discrete space,
so it is written here: evaluate ``initial`` uniformly sampled archs, keep the archive of
non-dominated archs, pick an unexplored one at random, evaluate its neighbours (archs
differing in one active gene) in random order, and add each neighbour no archived arch
dominates. When every archived arch is explored, explore the neighbours of a uniformly
sampled arch.
"""

from __future__ import annotations

import numpy as np

from ...search_algorithms import LSOptions
from ...space import Arch
from ..evaluator import Evaluator
from ..genome import Genome


def _dominates(a: np.ndarray, b: np.ndarray) -> bool:
    return bool((a <= b).all() and (a < b).any())


def local_search(evaluate: Evaluator, genome: Genome, seed: int, options: LSOptions) -> None:
    """Pareto local search until the budget ends the run."""
    rng = np.random.default_rng(seed)
    seen: set[str] = set()
    archive: list[tuple[Arch, np.ndarray]] = []
    explored: set[str] = set()

    def visit(arch: Arch) -> None:
        seen.add(arch.id)
        values = evaluate([arch])[0]
        if any(_dominates(v, values) or (v == values).all() for _, v in archive):
            return
        archive[:] = [(a, v) for a, v in archive if not _dominates(values, v)]
        archive.append((arch, values))

    for arch in genome.space.sample(options.initial, seed):
        visit(arch)
    while True:
        unexplored = [a for a, _ in archive if a.id not in explored]
        if unexplored:
            current = unexplored[int(rng.integers(len(unexplored)))]
        else:  # restart: explore around a random arch, dominated or not
            current = genome.space.sample(1, int(rng.integers(2**31)))[0]
            if current.id not in seen:
                visit(current)
        explored.add(current.id)
        neighbours = genome.neighbours(current)
        for i in rng.permutation(len(neighbours)):
            if neighbours[i].id not in seen:
                visit(neighbours[i])
