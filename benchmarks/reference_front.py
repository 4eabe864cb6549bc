"""How far a random sample's Pareto front is from the best known front, and what each step of
the reference front (sample, optimisation on the surrogates, run archives) costs and adds.

    python benchmarks/reference_front.py --scale s --source published --archs 100000 \\
        --evaluations 1000000 --seeds 3 --budget 100

Builds the reference of one objective set on one device (the first of the benchmark unless
--device), runs a few algorithms against it (params.yaml's options), completes the front with
their archives (what `hwgptbench search-summary` does) and prints the time of each step, the
table of how each step moved the front, and the runs' final regret against the sample's front
alone (negative: the run beat it) and against the final front.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import polars as pl

from hwgptbench import Benchmark, params
from hwgptbench.moo.problem import make_problem
from hwgptbench.moo.reference import compute_reference, scores
from hwgptbench.moo.runner import run
from hwgptbench.params import section_of
from hwgptbench.search.front import final_fronts
from hwgptbench.settings.sections import SearchSettings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="s")
    parser.add_argument("--results", default="results")
    parser.add_argument("--source", default="auto", help="Benchmark.load's source")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--objectives", default="ppl-latency")
    parser.add_argument("--device", default=None)
    parser.add_argument("--archs", type=int, default=100_000, help="sampled archs")
    parser.add_argument("--evaluations", type=int, default=None,
                        help="optimisation evaluations (default: 10 per sampled arch)")
    parser.add_argument("--algorithms", nargs="*", default=["rs", "nsga2", "morea", "ls"])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--budget", type=int, default=100)
    args = parser.parse_args()
    section = section_of(SearchSettings, params.load(args.params)["search"])
    bench = Benchmark.load(args.scale, args.results, source=args.source)
    device = args.device or bench.devices[0]
    metrics = section.objective_sets[args.objectives]
    problem = make_problem(bench, metrics, device, None)

    start = time.perf_counter()
    sampled, _ = compute_reference(problem, args.archs, 0, evaluations=0)
    sample_s = time.perf_counter() - start
    start = time.perf_counter()
    reference, table = compute_reference(problem, args.archs, 0, args.evaluations)
    optimisation_s = time.perf_counter() - start - sample_s
    start = time.perf_counter()
    runs = pl.concat([
        run(problem, reference, algorithm, args.budget, seed,
            section.options).with_columns(
            objectives=pl.lit(args.objectives), device=pl.lit(device))
        for algorithm in args.algorithms for seed in range(args.seeds)])
    runs_s = time.perf_counter() - start
    rescored, stages, _ = final_fronts(runs, [(reference, table)],
                                       {args.objectives: metrics})

    print(f"{args.scale} ({bench.space.size():.3g} archs), {args.objectives} on {device}")
    print(f"sample of {sampled.archs}: {sample_s:.1f} s; optimisation of "
          f"{reference.optimised} evaluations: {optimisation_s:.1f} s; "
          f"{runs.select('algorithm', 'seed').n_unique()} runs: {runs_s:.1f} s")
    with pl.Config(tbl_rows=20, tbl_width_chars=200, float_precision=5):
        print(stages.drop("metrics", "ideal", "nadir"))
    against_sample = []
    for (algorithm, seed), part in runs.group_by("algorithm", "seed", maintain_order=True):
        values = part.select(metrics).to_numpy().astype(float)
        regret = scores(sampled, values, part["full_fidelity"].to_numpy())[1]
        against_sample.append({"algorithm": algorithm, "seed": seed,
                               "regret_vs_sample": float(regret[-1])})
    final = rescored.sort("evaluation").group_by("algorithm", "seed").agg(
        pl.col("hv_regret").last().alias("regret_vs_final"))
    table_out = pl.DataFrame(against_sample).join(final, on=["algorithm", "seed"]).group_by(
        "algorithm", maintain_order=True).agg(
        pl.col("regret_vs_sample").mean().alias("regret_vs_sample_mean"),
        pl.col("regret_vs_sample").min().alias("regret_vs_sample_min"),
        pl.col("regret_vs_final").mean().alias("regret_vs_final_mean"),
        pl.col("regret_vs_final").min().alias("regret_vs_final_min"))
    with pl.Config(tbl_rows=20, tbl_width_chars=200, float_precision=5):
        print(table_out)
    print(f"sample front's hypervolume gap in the final box: {stages['hv_gap'][0]:.5f} "
          f"({stages['hv_gap'][0] / stages['hypervolume'][2]:.2%} of the final front's "
          f"{np.round(stages['hypervolume'][2], 5)})")


if __name__ == "__main__":
    main()
