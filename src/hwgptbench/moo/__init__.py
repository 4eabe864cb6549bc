"""Multi-objective optimisation over a search space: problems on the surrogate benchmark
(``problem``), the algorithms (``algorithms``), the evaluation budget (``evaluator``), reference
fronts and hypervolume (``reference``, ``hypervolume``), runs (``runner``), long optimisations
(``optimise``) and run summaries (``summary``).

    from hwgptbench import Benchmark
    from hwgptbench.moo import make_problem, compute_reference, run
    bench = Benchmark.load("tiny")
    problem = make_problem(bench, ["perplexity", "latency_ms"], bench.devices[0],
                           {"batch_size": 1, "seq_len": 128, "dtype": "fp32", "launch": "eager"})
    reference, front = compute_reference(problem, 100_000, seed=0)
    table = run(problem, reference, "nsga2", budget=100, seed=0)
"""

from ..lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "ALGORITHMS": "algorithms",
    "Problem": "problem",
    "Reference": "reference",
    "compute_reference": "reference",
    "load_reference": "reference",
    "make_problem": "problem",
    "run": "runner",
    "run_seeds": "runner",
    "save_reference": "reference",
})
__all__ = ["ALGORITHMS", "Problem", "Reference", "compute_reference", "load_reference",
           "make_problem", "run", "run_seeds", "save_reference"]
