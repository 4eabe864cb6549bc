"""One search run: (algorithm, objectives, device, budget, seed) against the benchmark.

A run's table has one row per evaluation: the arch, its fidelity and cost, the wall time
since the run started (``elapsed_s``: the one column that is not deterministic), its raw
objective values, and the running hypervolume and hypervolume regret of the full-fidelity
evaluations so far (scaled objectives, reference point of the stored :class:`Reference`: the
front known before the run, so a run may beat it; the summary rescores every run against the
front that includes all runs' archives, see :mod:`.front`). Runs are deterministic: every
random source an algorithm may touch (numpy's and torch's global generators included, which
syne-tune and BoTorch use) is seeded from the run's seed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..outputs import replace_dir
from ..settings.sections import SearchOptions
from ..versions import library_versions
from .algorithms import get_algorithm
from .evaluator import BudgetExhausted, Evaluator
from .genome import Genome
from .problem import Objectives, Problem
from .reference import Reference, scores

log = logging.getLogger(__name__)


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """Seed Python's, numpy's and torch's global generators; restore them afterwards."""
    states = random.getstate(), np.random.get_state(), torch.get_rng_state()
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])


def execute(evaluator: Evaluator, algorithm: str, seed: int,
            options: SearchOptions | None = None) -> None:
    """Run algorithm, seeded, against evaluator until its budget ends the run (with its
    entry of options, or its defaults)."""
    search = get_algorithm(algorithm)
    with seeded(seed):
        try:
            search(evaluator, Genome(evaluator.problem.space), seed,
                   (options or SearchOptions()).of(algorithm))
        except BudgetExhausted:
            pass


def run(problem: Objectives, reference: Reference, algorithm: str, budget: int, seed: int,
        options: SearchOptions | None = None) -> pl.DataFrame:
    """Run algorithm for budget evaluations; the table of its evaluations."""
    get_algorithm(algorithm)  # its library imported before the run's clock starts
    evaluator = Evaluator(problem, reference, float(budget))
    start = evaluator.started
    execute(evaluator, algorithm, seed, options)
    elapsed = time.perf_counter() - start
    if evaluator.spent < budget - 1:
        raise RuntimeError(f"{algorithm} stopped after {evaluator.spent:.2f} of {budget} "
                           "evaluations")
    log.info("%s seed %d: %d evaluations (cost %.2f) in %.2f s", algorithm, seed,
             len(evaluator.records), evaluator.spent, elapsed)
    return trajectory(evaluator, algorithm, seed)


def trajectory(evaluator: Evaluator, algorithm: str, seed: int) -> pl.DataFrame:
    """The evaluation table of a finished run (see the module docstring)."""
    records, reference = evaluator.records, evaluator.reference
    metrics = evaluator.problem.metrics
    values = np.array([r["values"] for r in records], dtype=float).reshape(-1, len(metrics))
    full = np.array([r["full"] for r in records], dtype=bool)
    hv, regret = scores(reference, values, full)
    costs = np.array([r["cost"] for r in records], dtype=float)
    return pl.DataFrame({
        "algorithm": [algorithm] * len(records),
        "seed": [seed] * len(records),
        "evaluation": np.arange(1, len(records) + 1),
        "arch_id": [r["arch"].id for r in records],
        "fidelity": pl.Series([r["fidelity"] for r in records], dtype=pl.Int64),
        "full_fidelity": full,
        "cost": costs,
        "cumulative_cost": np.cumsum(costs),
        "elapsed_s": np.array([r["elapsed"] for r in records], dtype=float),
        **{m: values[:, j] for j, m in enumerate(metrics)},
        "hypervolume": hv,
        "hv_regret": regret,
    })


# the libraries whose code decides which archs a search evaluates and what it scores
SEARCH_LIBRARIES = ("torch", "numpy", "lightgbm", "scikit-learn", "botorch", "gpytorch",
                    "syne-tune", "pymoo", "moocore")


def run_seeds(problem: Problem, reference: Reference, algorithm: str, budget: int,
              seeds: Sequence[int], options: SearchOptions | None,
              out_dir: str | os.PathLike[str],
              labels: dict[str, str] | None = None) -> Path:
    """Run every seed of one algorithm; write ``out_dir/{seed}.parquet`` (atomically, whole:
    out_dir must be new, empty or an earlier output of ``hwgptbench search``),
    with a constant column per ``labels`` entry (e.g. objectives and device) and the versions
    of the :data:`SEARCH_LIBRARIES`."""
    constants = {**(labels or {}), **library_versions(*SEARCH_LIBRARIES)}
    columns = [pl.lit(v, dtype=pl.String).alias(k) for k, v in constants.items()]
    with replace_dir(out_dir, "search") as staging:
        for seed in tqdm(seeds, desc=algorithm, unit="seed"):
            table = run(problem, reference, algorithm, budget, seed, options)
            table.select(*columns, pl.all()).write_parquet(staging / f"{seed}.parquet")
    return Path(out_dir)

