"""The search algorithms, by name, each a function ``search(evaluate, genome, seed, options)``.

``evaluate`` is the run's :class:`~hwgptbench.moo.evaluator.Evaluator` (archs in, scaled
objective values out, budget enforced by raising ``BudgetExhausted``); ``options`` is the
algorithm's section of ``search.options`` in params.yaml. Each algorithm's module is imported
only when it runs, so one algorithm never loads another's library.

| name   | algorithm                                         | provided by            |
|--------|---------------------------------------------------|------------------------|
| rs     | random search                                     | syne-tune              |
| ls     | multi-objective local search                      | this package           |
| nsga2  | NSGA-II                                           | pymoo                  |
| morea  | multi-objective regularized evolution             | syne-tune              |
| moasha | multi-objective asynchronous successive halving   | syne-tune              |
| rsbo   | random-scalarization BO (ParEGO, Chebyshev)       | BoTorch                |
| lsbo   | linear-scalarization BO                           | BoTorch                |
| ehvi   | expected hypervolume improvement (qLogNEHVI)      | BoTorch                |
| iterative | NSGA-II on LightGBM surrogates, refitted each round | pymoo, LightGBM   |
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# name -> (module under this package, function, key of its options in search.options)
ALGORITHMS: dict[str, tuple[str, str, str]] = {
    "rs": ("syne_tune_adapter", "random_search", "rs"),
    "ls": ("local_search", "local_search", "ls"),
    "nsga2": ("nsga2", "nsga2", "nsga2"),
    "morea": ("syne_tune_adapter", "morea", "morea"),
    "moasha": ("syne_tune_adapter", "moasha", "moasha"),
    "rsbo": ("bo", "rsbo", "bo"),
    "lsbo": ("bo", "lsbo", "bo"),
    "ehvi": ("bo", "ehvi", "bo"),
    "iterative": ("iterative", "iterative", "iterative"),
}

Search = Callable[[Any, Any, int, dict[str, Any]], None]


def get_algorithm(name: str) -> Search:
    """The search function of an algorithm name."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    module, function, _ = ALGORITHMS[name]
    return getattr(importlib.import_module(f"{__name__}.{module}"), function)


def options_of(name: str, options: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The options an algorithm reads, from the whole ``search.options`` section."""
    return dict(options.get(ALGORITHMS[name][2], {}))
