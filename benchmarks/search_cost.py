"""Wall time of the search algorithms against the surrogate benchmark, and the per-suggestion
overhead of the BO methods at ~100 observations.

    python benchmarks/search_cost.py --scale tiny --results results --seeds 10 --budget 100

Uses the surrogates under results/{scale}/surrogates (run `make run` first) and the objective
set, condition and algorithm options of params.yaml's `search` section. Per algorithm it
prints the total time of all seeds (reference, problem table and imports excluded: they are
built once before timing), the mean time between its last 10 evaluations (the time to make
one suggestion once ~budget observations are known), and the mean final hypervolume over the
seeds (and at half the budget). Writes the numbers to --out as JSON too.
"""

from __future__ import annotations

import argparse
import itertools
import json
import time
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import torch

from hwgptbench import Benchmark, params
from hwgptbench.moo.algorithms import get_algorithm
from hwgptbench.moo.evaluator import Evaluator
from hwgptbench.moo.problem import make_problem
from hwgptbench.moo.reference import compute_reference
from hwgptbench.moo.runner import execute, trajectory
from hwgptbench.params import section_of
from hwgptbench.settings.sections import SearchOptions, SearchSettings


@dataclass
class TimedEvaluator(Evaluator):
    """An Evaluator that notes the time of every call."""

    times: list[float] = field(default_factory=list)

    def __call__(self, archs, fidelity=None):
        self.times.append(time.perf_counter())
        return super().__call__(archs, fidelity)


def time_algorithm(problem, reference, name: str, budget: int, seeds: int,
                   options: SearchOptions) -> tuple[float, float, list[float], list[float]]:
    """(total seconds of all seeds, mean seconds per suggestion over the last 10 calls,
    final hypervolume of each seed, hypervolume at half the budget of each seed)."""
    get_algorithm(name)  # import its library before timing
    total, last, final, half = 0.0, [], [], []
    for seed in range(seeds):
        evaluate = TimedEvaluator(problem, reference, float(budget))
        start = time.perf_counter()
        execute(evaluate, name, seed, options)
        total += time.perf_counter() - start
        gaps = [b - a for a, b in itertools.pairwise(evaluate.times)]
        last += gaps[-10:]
        table = trajectory(evaluate, name, seed)
        final.append(table["hypervolume"][-1])
        half.append(table.filter(pl.col("cumulative_cost") <= budget / 2)["hypervolume"][-1])
    return total, sum(last) / len(last), final, half


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--results", default="results")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--objectives", default="ppl-latency")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--bo-seeds", type=int, default=1, help="seeds of each BO method")
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--algorithms", nargs="*", default=None)
    parser.add_argument("--out", default=None, help="also write the numbers here (JSON)")
    args = parser.parse_args()
    section = section_of(SearchSettings, params.load(args.params)["search"])
    bench = Benchmark.load(args.scale, args.results)
    device = bench.devices[0]
    problem = make_problem(bench, section.objective_sets[args.objectives], device,
                           section.condition)
    reference = compute_reference(problem, section.reference_archs,
                                  section.reference_seed)[0]
    for fidelity in problem.fidelities:  # build the lookup tables before timing
        problem.values(bench.sample(1, 0), fidelity)
    names = args.algorithms or section.algorithms
    print(f"{args.objectives} on {device}, budget {args.budget}, "
          f"{torch.get_num_threads()} torch threads")
    results = {}
    for name in names:
        seeds = args.bo_seeds if name in ("rsbo", "lsbo", "ehvi") else args.seeds
        total, per_suggestion, final, half = time_algorithm(
            problem, reference, name, args.budget, seeds, section.options)
        results[name] = {"seeds": seeds, "total_s": round(total, 3),
                         "s_per_suggestion_at_end": round(per_suggestion, 4),
                         "hv_final_mean": float(np.mean(final)),
                         "hv_final_std": float(np.std(final)),
                         "hv_half_budget_mean": float(np.mean(half))}
        print(f"{name:7s} {seeds:3d} seeds x {args.budget} evaluations: {total:8.2f} s total, "
              f"{per_suggestion * 1e3:9.2f} ms per suggestion at the end; hypervolume "
              f"{np.mean(half):.4f} at {args.budget // 2}, {np.mean(final):.4f} ± "
              f"{np.std(final):.4f} at {args.budget}")
    fast = [n for n in ("rs", "ls", "nsga2", "morea", "moasha") if n in results]
    together = sum(results[n]["total_s"] for n in fast)
    print(f"{'+'.join(fast)} together: {together:.2f} s; reference front hypervolume "
          f"{reference.hypervolume:.4f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": device, "budget": args.budget, "algorithms": results,
                       "fast_together_s": together,
                       "reference_hypervolume": reference.hypervolume}, f, indent=2)


if __name__ == "__main__":
    main()
