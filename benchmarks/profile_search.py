"""Where one search run's time goes: cProfile of one run of an algorithm at a budget on the
shipped `s` tables, with the settings of params.yaml and an overlay (default the paper's,
params/hwgptbench.yaml), printing the CPU seconds and the functions of largest cumulative time.

    python benchmarks/profile_search.py --algorithm rsbo --budget 200 [--objectives ppl-latency]
        [--overlay params/hwgptbench.yaml] [--reference-archs 2000] [--top 30]

The reference front only scales the hypervolume; a small sample (``--reference-archs``) keeps
it out of the profile. One torch thread, as the search stage runs each job.
"""

from __future__ import annotations

import argparse
import cProfile
import logging
import pstats
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--algorithm", required=True)
    parser.add_argument("--budget", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--objectives", default="ppl-latency", help="key of search.objective_sets")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--overlay", nargs="*", default=["params/hwgptbench.yaml"])
    parser.add_argument("--reference-archs", type=int, default=2000)
    parser.add_argument("--top", type=int, default=30, help="functions printed")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)

    import torch

    from hwgptbench import Benchmark, params
    from hwgptbench.moo.algorithms import get_algorithm
    from hwgptbench.moo.problem import make_problem
    from hwgptbench.moo.reference import compute_reference
    from hwgptbench.moo.runner import run

    torch.set_num_threads(1)
    config = params.load_typed([args.params, *args.overlay], ["search"]).search
    bench = Benchmark.load("s", source="published")
    problem = make_problem(bench, config.objective_sets[args.objectives], bench.devices[0],
                           None)
    reference, _ = compute_reference(problem, args.reference_archs, 0)
    options = config.options
    get_algorithm(args.algorithm)  # its libraries imported before timing
    profile = cProfile.Profile()
    cpu = time.process_time()
    profile.enable()
    run(problem, reference, args.algorithm, args.budget, args.seed, options)
    profile.disable()
    print(f"{args.algorithm}, budget {args.budget}, {args.objectives} on {bench.devices[0]}, "
          f"options {options.of(args.algorithm)}: {time.process_time() - cpu:.1f} CPU s")
    pstats.Stats(profile).sort_stats("cumulative").print_stats(args.top)


if __name__ == "__main__":
    main()
