"""The search algorithms, declared once: each name, where its code is (a module of
:mod:`hwgptbench.moo.algorithms` and its function) and the key of its options in
``search.options``, and the JSON schema of each options entry. :mod:`hwgptbench.params` builds
``search.algorithms``' choices and ``search.options`` from them; this module imports nothing, so
that the params, at the bottom of the package, can read it.

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

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Algorithm:
    """Where an algorithm is: its module under hwgptbench.moo.algorithms, its function, and
    the key of its options in ``search.options`` (algorithms of one library may share one)."""

    module: str
    function: str
    options: str


ALGORITHMS: dict[str, Algorithm] = {
    "rs": Algorithm("syne_tune_adapter", "random_search", "rs"),
    "ls": Algorithm("local_search", "local_search", "ls"),
    "nsga2": Algorithm("nsga2", "nsga2", "nsga2"),
    "morea": Algorithm("syne_tune_adapter", "morea", "morea"),
    "moasha": Algorithm("syne_tune_adapter", "moasha", "moasha"),
    "rsbo": Algorithm("bo", "rsbo", "bo"),
    "lsbo": Algorithm("bo", "lsbo", "bo"),
    "ehvi": Algorithm("bo", "ehvi", "bo"),
    "iterative": Algorithm("iterative", "iterative", "iterative"),
}
def _options(description: str | None = None, **properties: dict[str, Any]) -> dict[str, Any]:
    """The JSON schema of one entry of ``search.options``: an object of these properties."""
    schema: dict[str, Any] = {"type": "object", "additionalProperties": False,
                              "properties": properties}
    return schema | ({"description": description} if description else {})


def _integer(minimum: int, maximum: int = 10_000_000, description: str = "") -> dict[str, Any]:
    return {"type": "integer", "minimum": minimum, "maximum": maximum,
            **({"description": description} if description else {})}


def _number(description: str = "", **bounds: float) -> dict[str, Any]:
    return {"type": "number", **bounds, **({"description": description} if description else {})}


# the JSON schema of each entry of search.options: hwgptbench.params places them in the params
# schema, and ALGORITHMS' names as search.algorithms' choices, so an algorithm is declared here
# once (its module and, where it is new, its options)
OPTIONS: dict[str, dict[str, Any]] = {
    "rs": _options(),
    "ls": _options(initial=_integer(1, description="uniformly sampled archs before the local "
                                                  "search")),
    "nsga2": _options(population_size=_integer(2), eta=_number(exclusiveMinimum=0),
                      crossover_prob=_number(minimum=0, maximum=1)),
    "iterative": {"$ref": "#/$defs/iterative_options"},  # shared with compress.search
    "morea": _options(population_size=_integer(2), sample_size=_integer(1)),
    "moasha": _options(reduction_factor=_number(exclusiveMinimum=1)),
    "bo": _options(
        "options of rsbo, lsbo and ehvi",
        initial=_integer(2, description="archs of the initial random design"),
        candidates=_integer(1, description="random archs scored by the acquisition per "
                                           "suggestion"),
        neighbours={"type": "boolean", "description": "also score the one-gene neighbours of "
                                                      "the non-dominated archs"},
        mc_samples=_integer(1, description="quasi-MC samples of rsbo"),
        alpha=_number("augmentation of the Chebyshev scalarization (rsbo)", minimum=0),
        ref_point=_number("EHVI reference point in scaled objectives (nadir is 1)",
                          exclusiveMinimum=1),
        fit_maxiter=_integer(1, 100_000_000, "L-BFGS iterations per warm-started GP fit"),
        refit_every=_integer(1, description="refit GP hyperparameters every k-th suggestion"),
        threads=_integer(1, 1024, "torch threads of fitting and scoring")),
}
