"""Search of the fine-tuned supernet's sub-networks, evaluated for real (not by surrogates).

Each objective set (e.g. perplexity vs parameters, perplexity vs measured latency) is searched
by each algorithm of the benchmark's search machinery (:mod:`hwgptbench.search`): ``nsga2``
(the genetic algorithm of LLaMA-NAS) and ``iterative`` (NSGA-II on LightGBM surrogates
refitted on the evaluated sub-networks each round), among others. Objectives are scaled
between the largest and the smallest sub-network's values, whose hypervolume reference
point is then the smallest sub-network's perplexity and the largest one's cost.

Outputs: the runs (one row per evaluation, as the benchmark's search runs) and one row per
distinct evaluated sub-network with every metric measured for it, its Pareto membership per
objective set and, for the Pareto sub-networks, the downstream accuracy.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import numpy as np
import polars as pl

from ..moo.hypervolume import pareto_mask
from ..moo.reference import Reference
from ..moo.runner import run
from ..settings.compress import SubnetSearchSettings
from ..space import Arch
from .evaluate import CompressProblem, SubnetEvaluator

log = logging.getLogger(__name__)


def endpoint_reference(problem: CompressProblem, seed: int) -> Reference:
    """Scaling from the largest and the smallest sub-network (ideal: the best of the two in
    every objective, nadir: the worst)."""
    ends = [problem.space.largest(), problem.space.smallest()]
    values = problem.values(ends)
    return Reference(list(problem.metrics), None, None, values.min(axis=0).tolist(),
                     values.max(axis=0).tolist(), 0.0, len(ends), False, seed)


def run_searches(evaluator: SubnetEvaluator, search: SubnetSearchSettings) -> pl.DataFrame:
    """Every (objective set, algorithm) run of ``compress.search``; one row per evaluation."""
    tables = []
    for name, metrics in search.objectives.items():
        problem = CompressProblem(evaluator, tuple(metrics))
        reference = endpoint_reference(problem, search.seed)
        for algorithm in search.algorithms:
            log.info("searching %s with %s (%d evaluations)", name, algorithm, search.budget)
            table = run(problem, reference, algorithm, search.budget, search.seed,
                        search.options)
            tables.append(table.with_columns(objectives=pl.lit(name)))
    return pl.concat(tables, how="diagonal_relaxed")


def subnet_table(evaluator: SubnetEvaluator, runs: pl.DataFrame,
                 objectives: Mapping[str, Sequence[str]]) -> pl.DataFrame:
    """One row per distinct evaluated sub-network: arch_id, n_layer, params, perplexity,
    latency_ms and tokens_per_s (where timed), ``pareto_{set}`` per objective set, and
    accuracy (for the Pareto ones and the largest)."""
    space = evaluator.space
    ids = list(dict.fromkeys([space.largest().id, *runs["arch_id"].to_list()]))
    archs = [Arch.from_id(i) for i in ids]
    table = pl.DataFrame({
        "arch_id": ids,
        "n_layer": [a.n_layer for a in archs],
        "params": [evaluator.params(a) for a in archs],
        "perplexity": [evaluator.perplexity(a) for a in archs],
    })
    timed = {a.id: evaluator.speed(a) for a in archs if evaluator.was_timed(a)}
    table = table.with_columns(
        latency_ms=pl.Series([timed.get(i, {}).get("latency_ms") for i in ids], dtype=pl.Float64),
        tokens_per_s=pl.Series([timed.get(i, {}).get("tokens_per_s") for i in ids],
                               dtype=pl.Float64))
    fronts = []
    for name, metrics in objectives.items():  # over every sub-network with these values
        values = np.array([[evaluator.objective(m, a) if m != "latency_ms" or a.id in timed
                            else np.nan for m in metrics] for a in archs])
        known = ~np.isnan(values).any(axis=1)
        mask = np.zeros(len(archs), dtype=bool)
        mask[known] = pareto_mask(values[known])
        fronts.append(pl.Series(f"pareto_{name}", mask))
    table = table.with_columns(fronts)
    on_front = table.select(pl.any_horizontal(pl.col("^pareto_.*$"))).to_series().to_list()
    accuracy = [evaluator.accuracy(a) if keep or i == 0 else None
                for i, (a, keep) in enumerate(zip(archs, on_front, strict=True))]
    return table.with_columns(accuracy=pl.Series(accuracy, dtype=pl.Float64))
