"""The search algorithms, declared once: each name, where its code is (a module of
:mod:`hwgptbench.moo.algorithms` and its function), the key of its options in
``search.options`` and their type: a frozen dataclass whose fields hold each option's default
and JSON schema bounds. :mod:`hwgptbench.params` builds ``search.algorithms``' choices and the
schema of ``search.options`` (and ``compress.search.options``) from them, and the settings
build each options entry as its type (:class:`hwgptbench.settings.sections.SearchOptions`);
this module imports only the standard library, so that the params, at the bottom of the
package, can read it.

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

import dataclasses
from dataclasses import dataclass, field
from typing import Any, get_type_hints

# integers of the options are bounded so that a typo (1e12) is caught by the schema
LARGEST = 10_000_000


def option(default: Any, description: str = "", **bounds: float) -> Any:
    """A field of an options type: its default (the only place it is written) and its JSON
    schema bounds (``minimum``, ``maximum``, ``exclusiveMinimum``) and description."""
    schema = {**bounds, **({"description": description} if description else {})}
    return field(default=default, metadata={"schema": schema})


@dataclass(frozen=True)
class NoOptions:
    """An algorithm without options of its own (``search.options.rs``)."""


@dataclass(frozen=True)
class LSOptions:
    """Pareto local search (``search.options.ls``)."""

    initial: int = option(10, "uniformly sampled archs before the local search", minimum=1)


@dataclass(frozen=True)
class NSGA2Options:
    """NSGA-II (``search.options.nsga2``)."""

    population_size: int = option(20, minimum=2)
    eta: float = option(3.0, "distribution index of SBX crossover and polynomial mutation",
                        exclusiveMinimum=0)
    crossover_prob: float = option(0.9, minimum=0, maximum=1)


@dataclass(frozen=True)
class MOREAOptions:
    """Multi-objective regularized evolution (``search.options.morea``)."""

    population_size: int = option(20, minimum=2)
    sample_size: int = option(5, minimum=1)


@dataclass(frozen=True)
class MOASHAOptions:
    """MOASHA (``search.options.moasha``)."""

    reduction_factor: float = option(2, exclusiveMinimum=1)


@dataclass(frozen=True)
class BOOptions:
    """Options of rsbo, lsbo and ehvi (``search.options.bo``)."""

    initial: int = option(10, "archs of the initial random design", minimum=2)
    candidates: int = option(1000, "random archs scored by the acquisition per suggestion",
                             minimum=1)
    neighbours: bool = option(True, "also score the one-gene neighbours of the non-dominated "
                                    "archs")
    mc_samples: int = option(128, "quasi-MC samples of rsbo", minimum=1)
    alpha: float = option(0.05, "augmentation of the Chebyshev scalarization (rsbo)",
                          minimum=0)
    ref_point: float = option(1.1, "EHVI reference point in scaled objectives (nadir is 1)",
                              exclusiveMinimum=1)
    fit_maxiter: int = option(50, "L-BFGS iterations per warm-started GP fit", minimum=1,
                              maximum=100_000_000)
    refit_every: int = option(1, "refit GP hyperparameters every k-th suggestion", minimum=1)
    threads: int = option(1, "torch threads of fitting and scoring", minimum=1, maximum=1024)


@dataclass(frozen=True)
class IterativeOptions:
    """Surrogate-assisted NSGA-II (``search.options.iterative``, docs/search.md)."""

    initial: int = option(10, "uniformly sampled archs evaluated first", minimum=2)
    per_round: int = option(5, "archs of the predicted front evaluated per round", minimum=1)
    population_size: int = option(20, "NSGA-II population on the surrogates", minimum=2)
    generations: int = option(10, "NSGA-II generations on the surrogates per round",
                              minimum=1)
    boost_rounds: int = option(100, "boosting rounds of each LightGBM surrogate", minimum=1)


@dataclass(frozen=True)
class Algorithm:
    """Where an algorithm is: its module under hwgptbench.moo.algorithms, its function, the
    key of its options in ``search.options`` (algorithms of one library may share one) and
    their type."""

    module: str
    function: str
    options: str
    options_type: type = NoOptions


ALGORITHMS: dict[str, Algorithm] = {
    "rs": Algorithm("syne_tune_adapter", "random_search", "rs"),
    "ls": Algorithm("local_search", "local_search", "ls", LSOptions),
    "nsga2": Algorithm("nsga2", "nsga2", "nsga2", NSGA2Options),
    "morea": Algorithm("syne_tune_adapter", "morea", "morea", MOREAOptions),
    "moasha": Algorithm("syne_tune_adapter", "moasha", "moasha", MOASHAOptions),
    "rsbo": Algorithm("bo", "rsbo", "bo", BOOptions),
    "lsbo": Algorithm("bo", "lsbo", "bo", BOOptions),
    "ehvi": Algorithm("bo", "ehvi", "bo", BOOptions),
    "iterative": Algorithm("iterative", "iterative", "iterative", IterativeOptions),
}

_JSON_TYPES: dict[Any, dict[str, Any]] = {
    int: {"type": "integer", "maximum": LARGEST}, float: {"type": "number"},
    bool: {"type": "boolean"}}


def options_schema(kind: type) -> dict[str, Any]:
    """The JSON schema of one entry of ``search.options``: an object of the options type's
    fields."""
    hints = get_type_hints(kind)
    properties = {f.name: {**_JSON_TYPES[hints[f.name]], **f.metadata["schema"]}
                  for f in dataclasses.fields(kind)}
    return {"type": "object", "additionalProperties": False,
            "description": (kind.__doc__ or "").strip(), "properties": properties}


def options_schemas(algorithms: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """The schema of each options key of algorithms (default: all): what
    :mod:`hwgptbench.params` places under ``search.options`` and ``compress.search.options``."""
    declared = [ALGORITHMS[name] for name in (algorithms or ALGORITHMS)]
    return {a.options: options_schema(a.options_type) for a in declared}


def options_type(key: str) -> type:
    """The options type of an options key of ``search.options``."""
    for algorithm in ALGORITHMS.values():
        if algorithm.options == key:
            return algorithm.options_type
    raise KeyError(key)
