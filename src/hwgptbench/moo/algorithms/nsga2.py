"""NSGA-II from pymoo, over the integer genes of the space, through pymoo's ask/tell loop.

Discrete variables use pymoo's integer recipe: integer random sampling, and simulated binary
crossover and polynomial mutation followed by rounding; duplicate gene vectors are removed
from each offspring population. A population with no new offspring restarts the search.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from pymoo.algorithms.moo.nsga2 import NSGA2
from pymoo.core.evaluator import Evaluator as PymooEvaluator
from pymoo.core.problem import Problem
from pymoo.core.termination import NoTermination
from pymoo.operators.crossover.sbx import SBX
from pymoo.operators.mutation.pm import PM
from pymoo.operators.repair.rounding import RoundingRepair
from pymoo.operators.sampling.rnd import IntegerRandomSampling
from pymoo.problems.static import StaticProblem

from ...search_algorithms import NSGA2Options
from ..genome import Genome

if TYPE_CHECKING:  # the evaluator's module imports the reference front, which runs NSGA-II
    from ..evaluator import Evaluator


def make_nsga2(problem: Problem, options: NSGA2Options, seed: int) -> NSGA2:
    """NSGA-II set up on problem with a fresh random population drawn with seed."""
    algorithm = NSGA2(pop_size=options.population_size,
                      sampling=IntegerRandomSampling(),
                      crossover=SBX(prob=options.crossover_prob, eta=options.eta,
                                    vtype=float, repair=RoundingRepair()),
                      mutation=PM(eta=options.eta, vtype=float, repair=RoundingRepair()),
                      eliminate_duplicates=True)
    algorithm.setup(problem, termination=NoTermination(), seed=seed, verbose=False)
    return algorithm


def nsga2(evaluate: Evaluator, genome: Genome, seed: int, options: NSGA2Options) -> None:
    """Generations of NSGA-II until the budget ends the run.

    When no offspring differs from the population (pymoo's ``ask`` gives None: a small space
    the population covers), the search restarts from a new random population, as Pareto local
    search restarts; a restart that spends nothing of the budget ends the run."""
    problem = Problem(n_var=genome.size, n_obj=evaluate.n_objectives, xl=0,
                      xu=genome.cardinalities - 1, vtype=int)
    restarts = 0
    algorithm = make_nsga2(problem, options, seed)
    spent_at_restart = None
    while True:
        population = algorithm.ask()
        if population is None:
            if spent_at_restart == evaluate.spent:
                return
            spent_at_restart = evaluate.spent
            restarts += 1
            algorithm = make_nsga2(problem, options, seed + restarts)
            continue
        genes = np.rint(population.get("X")).astype(np.int64)
        values = evaluate([genome.decode(g) for g in genes])
        PymooEvaluator().eval(StaticProblem(problem, F=values), population)
        algorithm.tell(infills=population)
