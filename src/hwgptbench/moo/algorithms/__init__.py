"""The search algorithms, by name, each a function ``search(evaluate, genome, seed, options)``.

``evaluate`` is the run's :class:`~hwgptbench.moo.evaluator.Evaluator` (archs in, scaled
objective values out, budget enforced by raising ``BudgetExhausted``); ``options`` is the
algorithm's entry of ``search.options`` in params.yaml as its options type
(``SearchOptions.of(name)``: the type's defaults where params leave it out). Each algorithm's
module is imported only when it runs, so one algorithm never loads another's library. The
names, their modules and their options' types are declared in
:mod:`hwgptbench.search_algorithms`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from ...search_algorithms import ALGORITHMS

Search = Callable[[Any, Any, int, Any], None]


def get_algorithm(name: str) -> Search:
    """The search function of an algorithm name."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown search algorithm {name!r}; known: {', '.join(ALGORITHMS)}")
    algorithm = ALGORITHMS[name]
    return getattr(importlib.import_module(f"{__name__}.{algorithm.module}"), algorithm.function)
