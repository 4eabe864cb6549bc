"""The search algorithms, by name, each a function ``search(evaluate, genome, seed, options)``.

``evaluate`` is the run's :class:`~hwgptbench.moo.evaluator.Evaluator` (archs in, scaled
objective values out, budget enforced by raising ``BudgetExhausted``); ``options`` is the
algorithm's section of ``search.options`` in params.yaml. Each algorithm's module is imported
only when it runs, so one algorithm never loads another's library. The names, their modules
and their options' schemas are declared in :mod:`hwgptbench.search_algorithms`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ...search_algorithms import ALGORITHMS

Search = Callable[[Any, Any, int, dict[str, Any]], None]


def get_algorithm(name: str) -> Search:
    """The search function of an algorithm name."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    algorithm = ALGORITHMS[name]
    return getattr(importlib.import_module(f"{__name__}.{algorithm.module}"), algorithm.function)


def options_of(name: str, options: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The options an algorithm reads, from the whole ``search.options`` section."""
    return dict(options.get(ALGORITHMS[name].options, {}))
