"""Multi-objective NAS against the surrogate benchmark: algorithms, hypervolume, runs.

    from hwgptbench import Benchmark
    from hwgptbench.search import make_problem, compute_reference, run
    bench = Benchmark.load("tiny")
    problem = make_problem(bench, ["perplexity", "latency_ms"], bench.devices[0],
                           {"batch_size": 1, "seq_len": 128, "dtype": "fp32", "launch": "eager"})
    reference, front = compute_reference(problem, 100_000, seed=0)
    table = run(problem, reference, "nsga2", budget=100, seed=0)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import Benchmark
from ..measure.condition import condition_id
from .algorithms import ALGORITHMS
from .problem import Problem
from .reference import Reference, compute_reference, load_reference, save_reference
from .runner import run, run_seeds


def make_problem(benchmark: Benchmark, metrics: Sequence[str], device: str,
                 condition: dict[str, Any] | None) -> Problem:
    """The problem of minimizing metrics on device, hardware metrics under condition
    (``batch_size``, ``seq_len``, ``dtype``, ``launch``; None: the device's only one)."""
    return Problem(benchmark, tuple(metrics), device,
                   None if condition is None else condition_id(**condition))


__all__ = ["ALGORITHMS", "Problem", "Reference", "compute_reference", "load_reference",
           "make_problem", "run", "run_seeds", "save_reference"]
