"""Random search, MOREA and MOASHA from syne-tune, driven one evaluation at a time.

The genes of :class:`~hwgptbench.moo.genome.Genome` form the config space (one categorical
per gene); metrics are the scaled objectives, all minimized. Random search and MOREA run
through syne-tune's ``AskTellScheduler``. MOASHA (a multi-fidelity scheduler, which the
ask/tell wrapper does not drive) gets each trial's results rung by rung: the resource is the
supernet's training steps (``Evaluator.fidelities``), and a trial climbs to the next fidelity
while the scheduler says CONTINUE -- a sequential simulation of one worker.
"""

from __future__ import annotations

import datetime
import itertools

import numpy as np
from syne_tune.backend.trial_status import Trial
from syne_tune.optimizer.scheduler import SchedulerDecision
from syne_tune.optimizer.schedulers.ask_tell_scheduler import AskTellScheduler
from syne_tune.optimizer.schedulers.multiobjective.moasha import MOASHA
from syne_tune.optimizer.schedulers.multiobjective.multi_objective_regularized_evolution import (
    MultiObjectiveRegularizedEvolution,
)
from syne_tune.optimizer.schedulers.single_fidelity_scheduler import SingleFidelityScheduler

from ...search_algorithms import MOASHAOptions, MOREAOptions, NoOptions
from ..evaluator import Evaluator
from ..genome import Genome

RESOURCE = "train_steps"


def _metrics(evaluate: Evaluator) -> list[str]:
    return [f"objective_{i}" for i in range(evaluate.n_objectives)]


def _result(names: list[str], values: np.ndarray) -> dict[str, float]:
    return {name: float(v) for name, v in zip(names, values, strict=True)}


def _ask_tell(evaluate: Evaluator, genome: Genome, scheduler: SingleFidelityScheduler) -> None:
    """Evaluate the scheduler's suggestions until the budget ends the run."""
    names, loop = _metrics(evaluate), AskTellScheduler(base_scheduler=scheduler)
    while True:
        trial = loop.ask()
        values = evaluate([genome.from_config(trial.config)])[0]
        loop.tell(trial, _result(names, values))


def random_search(evaluate: Evaluator, genome: Genome, seed: int, options: NoOptions) -> None:
    """syne-tune's multi-objective random search (uniform over the genes)."""
    _ask_tell(evaluate, genome, SingleFidelityScheduler(
        genome.config_space(), metrics=_metrics(evaluate), do_minimize=True,
        searcher="random_search", random_seed=seed))


def morea(evaluate: Evaluator, genome: Genome, seed: int, options: MOREAOptions) -> None:
    """syne-tune's multi-objective regularized evolution (non-dominated sorting priority)."""
    space = genome.config_space()
    searcher = MultiObjectiveRegularizedEvolution(
        space, population_size=options.population_size,
        sample_size=options.sample_size, random_seed=seed)
    _ask_tell(evaluate, genome, SingleFidelityScheduler(
        space, metrics=_metrics(evaluate), do_minimize=True, searcher=searcher,
        random_seed=seed))


def moasha(evaluate: Evaluator, genome: Genome, seed: int, options: MOASHAOptions) -> None:
    """syne-tune's MOASHA over the supernet's training-step fidelities."""
    fidelities = evaluate.fidelities
    if len(fidelities) < 2:
        raise ValueError(
            "moasha needs perplexity at several training steps (fidelities), found "
            f"{fidelities}: set supernet.snapshots in params.yaml and include perplexity in "
            "the objectives")
    names = _metrics(evaluate)
    scheduler = MOASHA(genome.config_space(), metrics=names, do_minimize=True,
                       time_attr=RESOURCE, max_t=fidelities[-1], grace_period=fidelities[0],
                       reduction_factor=options.reduction_factor, random_seed=seed)
    for trial_id in itertools.count():
        config = scheduler.suggest().config
        trial = Trial(trial_id=trial_id, config=config, creation_time=datetime.datetime.now())
        scheduler.on_trial_add(trial)
        arch = genome.from_config(config)
        for fidelity in fidelities:
            values = evaluate([arch], fidelity=fidelity)[0]
            decision = scheduler.on_trial_result(
                trial, {RESOURCE: fidelity, **_result(names, values)})
            if decision == SchedulerDecision.STOP:
                break
