"""Multi-objective Bayesian optimization from BoTorch over the discrete space of archs.

Three algorithms share one loop and differ only in the acquisition function:

* ``rsbo`` -- random (Chebyshev) scalarization, ParEGO style (Knowles 2006; qParEGO of
  Daulton et al. 2020): every iteration draws weights uniformly from the simplex
  (:func:`~botorch.utils.sampling.sample_simplex`) and maximizes
  :class:`~botorch.acquisition.logei.qLogNoisyExpectedImprovement` of the augmented Chebyshev
  scalarization (:func:`~botorch.utils.multi_objective.scalarization.get_chebyshev_scalarization`,
  ``alpha`` 0.05, objectives normalized by the observed ranges) of the multi-output GP's
  samples, through a :class:`~botorch.acquisition.objective.GenericMCObjective`; the baseline
  is every observed arch, pruned to those that may be the best.
* ``lsbo`` -- random linear scalarization: every iteration draws weights ``w`` uniformly from
  the simplex and maximizes the analytic
  :class:`~botorch.acquisition.analytic.LogExpectedImprovement` of ``-w . y`` (the weighted
  sum of the scaled objectives, negated since BoTorch maximizes). The multi-output posterior
  is scalarized exactly by a :class:`~botorch.acquisition.objective.ScalarizedPosteriorTransform`
  (mean ``w . mu``, variance ``w' Sigma w``, Gaussian since a linear map of a Gaussian);
  ``best_f`` is the best observed weighted sum (the objectives are deterministic).
* ``ehvi`` -- expected hypervolume improvement (Emmerich et al. 2006): BoTorch's analytic
  :class:`~botorch.acquisition.multi_objective.analytic.ExpectedHypervolumeImprovement`
  (the exact EHVI of one point with independent Gaussian outputs, Yang et al. 2019) over a
  ``FastNondominatedPartitioning`` (``botorch.utils.multi_objective.box_decompositions``) of
  the observed (negated) objectives; the objectives being deterministic, the noisy variant is
  not needed. Reference point ``-ref_point`` (default ``ref_point`` 1.1: slightly worse than
  the nadir 1 of the scaled objectives, so front extremes still count). The pool's argmax of
  the exact EHVI is what the quasi-MC estimate ``qLogExpectedHypervolumeImprovement`` would
  approximate (log-scaling is monotone and matters to gradient-based optimizers, which a
  discrete pool does not use); scoring a run's pools took 31.8 CPU s on ``s`` with qLogEHVI on
  the 50 of highest exact EHVI, 6.8 s with the exact EHVI alone (docs/search.md).

The shared loop: features are the arch's genes (:meth:`Genome.encode` of the arch, so inactive
layers have their canonical genes), each choice index scaled to [0, 1] (ordinal; the choices of
every gene are sorted numbers). The model is one :class:`~botorch.models.SingleTaskGP` (float64)
with an independent output per objective (a batched GP with its own hyperparameters per output;
BoTorch's default kernel and priors, Gaussian likelihood with inferred noise) and a
:class:`~botorch.models.transforms.outcome.Standardize` outcome transform, fitted by
:func:`~botorch.fit.fit_gpytorch_mll` (L-BFGS-B, at most ``fit_maxiter`` (50) iterations).
Each fit starts from the previous iteration's hyperparameters (warm start: a few iterations
instead of a fit from scratch, and an optimization cut short by ``fit_maxiter`` continues at
the next iteration); with option ``refit_every`` k > 1 the hyperparameters are re-optimized
only every k-th iteration (the model is always conditioned on every observation). Fitting and
scoring run on ``threads`` (default 1) torch and BLAS threads (``threadpoolctl``): the
matrices are small, and on a busy 2-core machine more threads oversubscribe it (a fit was ~20x
slower with 2 torch threads while other processes ran; numpy's BLAS threads, which BoTorch's
L-BFGS-B uses, made the fits of a run 1.6x slower alone and 2.5x beside another job).

The run starts with ``initial`` (default 10) archs sampled uniformly; then one arch per
iteration, chosen among a candidate pool (the space is discrete, so the acquisition function is
scored over the pool rather than optimized over a relaxation): ``candidates`` (default 1000)
uniformly sampled archs not yet evaluated plus every one-gene neighbour
(:meth:`Genome.neighbours`) of the current non-dominated archs not yet evaluated. The pool's
argmax is evaluated, ties going to the first in pool order. No arch is ever evaluated twice.

Determinism: every random draw (initial design, candidate samples, weights, quasi-MC base
samples, the fitting's restarts) is seeded from ``seed`` and the iteration number; torch's
global generator is forked and seeded around each iteration, so a run depends on its seed only.

Options (``search.options.bo``): ``initial`` (10), ``candidates`` (1000), ``neighbours``
(true), ``mc_samples`` (128, quasi-MC samples of rsbo), ``alpha`` (0.05, Chebyshev
augmentation), ``ref_point`` (1.1), ``fit_maxiter`` (50), ``refit_every`` (1), ``threads`` (1).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable

import numpy as np
import torch
from botorch.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.acquisition.multi_objective.analytic import ExpectedHypervolumeImprovement
from botorch.acquisition.objective import GenericMCObjective, ScalarizedPosteriorTransform
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.transforms.outcome import Standardize
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.multi_objective.box_decompositions.non_dominated import (
    FastNondominatedPartitioning,
)
from botorch.utils.multi_objective.scalarization import get_chebyshev_scalarization
from botorch.utils.sampling import sample_simplex
from gpytorch.mlls import ExactMarginalLogLikelihood
from threadpoolctl import ThreadpoolController

from ...search_algorithms import BOOptions
from ...space import Arch
from ..evaluator import Evaluator
from ..genome import Genome
from ..hypervolume import pareto_mask
from .pooled import Marginals, PooledGP

DTYPE = torch.float64
CHUNK = 1024  # candidates scored per acquisition call (bounds the MC tensors' memory)

# (model, observed features, observed objectives to maximize (n, m), seed, options) ->
# a scorer: acquisition values (np.ndarray, larger is better) of candidates (N, 1, d)
Scorer = Callable[[torch.Tensor], np.ndarray]
Acquisition = Callable[[SingleTaskGP, torch.Tensor, torch.Tensor, int, BOOptions], Scorer]


def _scores(acquisition: AcquisitionFunction, candidates: torch.Tensor) -> np.ndarray:
    """Acquisition values of candidates (N, 1, d), in chunks that bound the MC tensors."""
    with torch.no_grad():
        parts = [acquisition(candidates[i:i + CHUNK]) for i in range(0, len(candidates), CHUNK)]
    scores = torch.cat(parts).numpy() if parts else np.empty(0)
    return np.where(np.isnan(scores), -np.inf, scores)


def _weights(m: int, seed: int) -> torch.Tensor:
    """Weights drawn uniformly from the (m-1)-simplex."""
    return sample_simplex(m, n=1, seed=seed, dtype=DTYPE)[0]


def _sampler(seed: int, options: BOOptions) -> SobolQMCNormalSampler:
    return SobolQMCNormalSampler(sample_shape=torch.Size([options.mc_samples]),
                                 seed=seed)


def _chebyshev(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor, seed: int,
               options: BOOptions) -> Scorer:
    """qLogNEI of the augmented Chebyshev scalarization with random simplex weights."""
    scalarize = get_chebyshev_scalarization(_weights(Y.shape[-1], seed), Y,
                                            alpha=options.alpha)
    acquisition = qLogNoisyExpectedImprovement(
        model, X_baseline=X, sampler=_sampler(seed, options),
        objective=GenericMCObjective(scalarize),
        prune_baseline=True, cache_root=True)
    return lambda candidates: _scores(acquisition, candidates)


def _linear(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor, seed: int,
            options: BOOptions) -> Scorer:
    """Analytic LogEI of the weighted sum with random simplex weights."""
    weights = _weights(Y.shape[-1], seed)
    acquisition = LogExpectedImprovement(
        Marginals(model), best_f=(Y @ weights).max(),
        posterior_transform=ScalarizedPosteriorTransform(weights))
    return lambda candidates: _scores(acquisition, candidates)


def _hypervolume(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor, seed: int,
                 options: BOOptions) -> Scorer:
    """Exact (analytic) EHVI over the box decomposition of the observed front."""
    ref_point = torch.full((Y.shape[-1],), -options.ref_point, dtype=DTYPE)
    # the observed points that add hypervolume over the reference point (none: every
    # candidate's improvement is its expected volume beyond the reference point)
    partitioning = FastNondominatedPartitioning(ref_point=ref_point,
                                                Y=Y[(Y > ref_point).all(dim=-1)])
    # BoTorch annotates partitioning as a NondominatedPartitioning, but any box decomposition
    # of the front serves (its own examples pass a FastNondominatedPartitioning)
    acquisition = ExpectedHypervolumeImprovement(
        Marginals(model), ref_point=ref_point.tolist(),
        partitioning=partitioning)  # type: ignore[arg-type]
    return lambda candidates: _scores(acquisition, candidates)


def _seed(*parts: int) -> int:
    """A 31-bit seed derived from the run's seed and the parts (e.g. iteration, purpose)."""
    return int(np.random.SeedSequence([int(p) % 2**32 for p in parts]).generate_state(1)[0]
               >> 1)


class _Loop:
    """State of one BO run: the evaluated archs, their features and objective values."""

    def __init__(self, evaluate: Evaluator, genome: Genome, seed: int, options: BOOptions,
                 acquisition: Acquisition):
        self.evaluate, self.genome, self.seed = evaluate, genome, seed
        self.options, self.acquisition = options, acquisition
        self.scale = np.maximum(genome.cardinalities - 1, 1).astype(float)
        self.archs: list[Arch] = []
        self.seen: set[str] = set()
        self.features: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.hyperparameters: dict[str, torch.Tensor] | None = None
        # the non-dominated archs change little from one suggestion to the next: their
        # neighbours and the neighbours' genes are built once (the pool is the same; building
        # and validating ~50 archs per front arch and suggestion was most of a suggestion)
        self._neighbours: dict[str, list[Arch]] = {}
        self._genes: dict[str, np.ndarray] = {}
        # the process's BLAS and OpenMP pools, found once (threadpool_limits looks for them
        # at every call: 2.4 ms against 0.02)
        self._thread_pools = ThreadpoolController()

    def encode(self, archs: list[Arch]) -> np.ndarray:
        genes = np.array([self._genes[a.id] if a.id in self._genes else self.genome.encode(a)
                          for a in archs], dtype=float)
        return genes.reshape(len(archs), self.genome.size) / self.scale

    def neighbours(self, arch: Arch) -> list[Arch]:
        """The one-gene neighbours of arch (:meth:`Genome.neighbours`), built once."""
        if arch.id not in self._neighbours:
            found = self._neighbours[arch.id] = self.genome.neighbours(arch)
            for other in found:
                self._genes.setdefault(other.id, self.genome.encode(other))
        return self._neighbours[arch.id]

    def observe(self, archs: list[Arch]) -> None:
        """Evaluate archs (the Evaluator may end the run here) and record them."""
        for arch in archs:
            if arch.id in self.seen:
                raise RuntimeError(f"arch {arch.id} suggested twice")
        values = self.evaluate(archs)
        for arch, x, y in zip(archs, self.encode(archs), values, strict=True):
            self.archs.append(arch)
            self.seen.add(arch.id)
            self.features.append(x)
            self.values.append(np.asarray(y, dtype=float))

    def observed(self) -> np.ndarray:
        """Objective values (n, m) of the evaluated archs."""
        return np.array(self.values, dtype=float).reshape(-1, self.evaluate.n_objectives)

    def pool(self, iteration: int) -> list[Arch]:
        """Unevaluated candidates: uniform samples, then neighbours of the non-dominated."""
        n_random = self.options.candidates
        found: dict[str, Arch] = {}
        if n_random > 0:
            for arch in self.genome.space.draw(_seed(self.seed, iteration, 1)):
                if arch.id not in self.seen:
                    found[arch.id] = arch
                    if len(found) == n_random:
                        break
        if self.options.neighbours:
            values = self.observed()
            finite = np.flatnonzero(np.isfinite(values).all(axis=1))
            for i in finite[pareto_mask(values[finite])]:
                for arch in self.neighbours(self.archs[i]):
                    if arch.id not in self.seen:
                        found.setdefault(arch.id, arch)
        return list(found.values())

    def fit(self, X: torch.Tensor, Y: torch.Tensor, iteration: int) -> SingleTaskGP:
        """The GP of (X, Y), its hyperparameters warm-started and (re)fitted."""
        model = PooledGP(X, Y, outcome_transform=Standardize(m=Y.shape[-1]))
        if self.hyperparameters is not None:
            model.load_state_dict(self.hyperparameters, strict=False)
        refit_every = self.options.refit_every
        if self.hyperparameters is None or iteration % refit_every == 0:
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
            try:
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {
                    "maxiter": self.options.fit_maxiter}})
            except ModelFittingError:  # keep the warm start (or the prior's defaults)
                pass
        self.hyperparameters = {k: v.detach().clone() for k, v in model.state_dict().items()
                                if not k.startswith(("outcome_transform", "input_transform"))}
        model.eval()
        return model

    def suggest(self, iteration: int) -> Arch | None:
        """The pool's arch of highest acquisition value (None: every arch is evaluated)."""
        pool = self.pool(iteration)
        if not pool:
            return None
        values = self.observed()
        finite = np.isfinite(values).all(axis=1)
        if finite.sum() < 2:  # nothing to model yet: a uniformly sampled candidate
            return pool[0]
        X = torch.tensor(np.array(self.features)[finite], dtype=DTYPE)  # (n, genes)
        Y = -torch.tensor(values[finite], dtype=DTYPE)  # BoTorch maximizes
        seed = _seed(self.seed, iteration, 2)
        threads, limit = torch.get_num_threads(), self.options.threads
        # BLAS too: BoTorch's batched L-BFGS-B runs on numpy, whose OpenBLAS threads (one
        # per core by default) made a fit ~1.6x slower alone and ~2.5x beside a second job
        with (torch.random.fork_rng(), warnings.catch_warnings(),
              self._thread_pools.limit(limits=limit)):
            warnings.simplefilter("ignore")
            torch.manual_seed(seed)
            torch.set_num_threads(limit)
            try:
                model = self.fit(X, Y, iteration)
                score = self.acquisition(model, X, Y, seed, self.options)
                scores = score(torch.tensor(self.encode(pool), dtype=DTYPE).unsqueeze(-2))
            finally:
                torch.set_num_threads(threads)
        return pool[int(np.argmax(scores))]

    def run(self) -> None:
        initial = min(self.options.initial, self.genome.space.size())
        self.observe(self.genome.space.sample(initial, self.seed))
        iteration = 1
        while (arch := self.suggest(iteration)) is not None:
            self.observe([arch])
            iteration += 1


def rsbo(evaluate: Evaluator, genome: Genome, seed: int, options: BOOptions) -> None:
    """Random Chebyshev scalarization BO (ParEGO) until the budget ends the run."""
    _Loop(evaluate, genome, seed, options, _chebyshev).run()


def lsbo(evaluate: Evaluator, genome: Genome, seed: int, options: BOOptions) -> None:
    """Random linear scalarization BO until the budget ends the run."""
    _Loop(evaluate, genome, seed, options, _linear).run()


def ehvi(evaluate: Evaluator, genome: Genome, seed: int, options: BOOptions) -> None:
    """Expected hypervolume improvement BO (exact EHVI) until the budget ends the run."""
    _Loop(evaluate, genome, seed, options, _hypervolume).run()
