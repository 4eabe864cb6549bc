"""The search algorithms, declared once: each name, where its code is (a module of
:mod:`hwgptbench.moo.algorithms` and its function), the key of its options in
``search.options`` and their type: a params model whose fields hold each option's default,
bounds and description. The settings build ``search.algorithms``' choices and the model of
``search.options`` (and ``compress.search.options``) from them
(:func:`hwgptbench.settings.sections.options_model`); this module imports only pydantic, so
that the settings, at the bottom of the package, can read it.

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

from pydantic import BaseModel, ConfigDict, Field


class Model(BaseModel):
    """An options type: a params model (frozen, strict, unknown keys refused), as those of
    :mod:`hwgptbench.settings`, which read this registry."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)


# integers of the options are bounded so that a typo (1e12) is refused with the params
LARGEST = 10_000_000


def option(default: Any, description: str, **bounds: float) -> Any:
    """A field of an options type: its default (the only place it is written), its bounds
    (``ge``, ``le``, ``gt``) and description; whole numbers at most :data:`LARGEST`."""
    if isinstance(default, int) and not isinstance(default, bool):
        bounds.setdefault("le", LARGEST)
    return Field(default, description=description, **bounds)  # type: ignore[call-overload]


class NoOptions(Model):
    """An algorithm without options of its own (``search.options.rs``)."""


class LSOptions(Model):
    """Pareto local search (``search.options.ls``)."""

    initial: int = option(10, "uniformly sampled archs before the local search", ge=1)


class NSGA2Options(Model):
    """NSGA-II (``search.options.nsga2``)."""

    population_size: int = option(20, "archs per generation", ge=2)
    eta: float = option(3.0, "distribution index of SBX crossover and polynomial mutation", gt=0)
    crossover_prob: float = option(0.9, "probability of crossover per mating", ge=0, le=1)


class MOREAOptions(Model):
    """Multi-objective regularized evolution (``search.options.morea``)."""

    population_size: int = option(20, "archs kept alive", ge=2)
    sample_size: int = option(5, "archs of each tournament", ge=1)


class MOASHAOptions(Model):
    """MOASHA (``search.options.moasha``)."""

    reduction_factor: float = option(2.0, "share of trials promoted per rung, inverted", gt=1)


class BOOptions(Model):
    """Options of rsbo, lsbo and ehvi (``search.options.bo``)."""

    initial: int = option(10, "archs of the initial random design", ge=2)
    candidates: int = option(1000, "random archs scored by the acquisition per suggestion", ge=1)
    neighbours: bool = option(True, "also score the one-gene neighbours of the non-dominated "
                                    "archs")
    mc_samples: int = option(128, "quasi-MC samples of rsbo", ge=1)
    alpha: float = option(0.05, "augmentation of the Chebyshev scalarization (rsbo)", ge=0)
    ref_point: float = option(1.1, "EHVI reference point in scaled objectives (nadir is 1)",
                              gt=1)
    fit_maxiter: int = option(50, "L-BFGS iterations per warm-started GP fit", ge=1,
                              le=100_000_000)
    refit_every: int = option(1, "refit GP hyperparameters every k-th suggestion", ge=1)
    threads: int = option(1, "torch threads of fitting and scoring", ge=1, le=1024)


class IterativeOptions(Model):
    """Surrogate-assisted NSGA-II (``search.options.iterative``, docs/search.md)."""

    initial: int = option(10, "uniformly sampled archs evaluated first", ge=2)
    per_round: int = option(5, "archs of the predicted front evaluated per round", ge=1)
    population_size: int = option(20, "NSGA-II population on the surrogates", ge=2)
    generations: int = option(10, "NSGA-II generations on the surrogates per round", ge=1)
    boost_rounds: int = option(100, "boosting rounds of each LightGBM surrogate", ge=1)


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
