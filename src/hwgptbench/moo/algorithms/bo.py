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
* ``ehvi`` -- expected hypervolume improvement: ``qLogExpectedHypervolumeImprovement``
  (``botorch.acquisition.multi_objective.logei``) over a ``FastNondominatedPartitioning``
  (``botorch.utils.multi_objective.box_decompositions``) of the observed (negated)
  objectives; the objectives being deterministic, the noisy variant is not needed. Reference
  point ``-ref_point`` (default ``ref_point`` 1.1: slightly worse than the nadir 1 of the
  scaled objectives, so front extremes still count). The MC estimate costs samples x boxes per
  candidate (seconds for a pool of 1000 in three objectives), so the pool is first screened
  with BoTorch's analytic ``ExpectedHypervolumeImprovement``
  (``botorch.acquisition.multi_objective.analytic``; exact for q = 1 and independent outputs,
  as here, but not log-scaled): qLogEHVI ranks the ``screen`` (default 50) candidates of
  highest EHVI.

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
scoring run on ``threads`` (default 1) torch threads: the matrices are small, and on a busy
2-core machine more threads oversubscribe it (a fit was ~20x slower with 2 threads while
other processes ran).

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
(true), ``mc_samples`` (128, quasi-MC samples of rsbo and ehvi), ``alpha`` (0.05, Chebyshev
augmentation), ``ref_point`` (1.1), ``screen`` (50; 0: score the whole pool with qLogEHVI),
``fit_maxiter`` (50), ``refit_every`` (1), ``threads`` (1).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import botorch
import gpytorch
import numpy as np
import torch
from botorch.acquisition import AcquisitionFunction
from botorch.acquisition.analytic import LogExpectedImprovement
from botorch.acquisition.logei import qLogNoisyExpectedImprovement
from botorch.acquisition.multi_objective import logei as botorch_logei
from botorch.acquisition.multi_objective.analytic import ExpectedHypervolumeImprovement
from botorch.acquisition.multi_objective.logei import qLogExpectedHypervolumeImprovement
from botorch.acquisition.objective import GenericMCObjective, ScalarizedPosteriorTransform
from botorch.exceptions.errors import ModelFittingError
from botorch.fit import fit_gpytorch_mll
from botorch.models import SingleTaskGP
from botorch.models.model import Model
from botorch.models.transforms.outcome import Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.sampling.normal import SobolQMCNormalSampler
from botorch.utils.low_rank import extract_batch_covar
from botorch.utils.multi_objective.box_decompositions.non_dominated import (
    FastNondominatedPartitioning,
)
from botorch.utils.multi_objective.scalarization import get_chebyshev_scalarization
from botorch.utils.sampling import sample_simplex
from gpytorch.distributions import MultitaskMultivariateNormal
from gpytorch.mlls import ExactMarginalLogLikelihood
from linear_operator.operators import (
    BlockDiagLinearOperator,
    DenseLinearOperator,
    DiagLinearOperator,
)

from ...space import Arch
from ..evaluator import Evaluator
from ..genome import Genome
from ..hypervolume import pareto_mask

DTYPE = torch.float64


def keep_pure_pytorch_logei() -> None:
    """Keep qLogEHVI on BoTorch's pure-PyTorch path.

    BoTorch 0.18 JIT-compiles a fused C++ kernel for qLogEHVI (-march=native) in the first
    process of a machine that builds one: ~45 s on 2 cores, and numbers that may depend on the
    CPU's instruction set. BoTorch has no public switch for it; marking its private load
    sentinel as attempted keeps the pure-PyTorch path: one search on every machine, 2.6 s
    instead of 1.9 s for 12 evaluations once the kernel is cached. pyproject.toml pins the
    BoTorch minor release that has the sentinel; a release without it raises here instead of
    silently switching paths."""
    if not hasattr(botorch_logei, "_load_attempted"):
        raise ImportError(
            f"botorch {botorch.__version__} has no botorch.acquisition.multi_objective.logei."
            "_load_attempted, which hwgptbench sets to keep qLogEHVI's pure-PyTorch path "
            "(moo/algorithms/bo.py); install the pinned release: pip install 'botorch==0.18.*'")
    botorch_logei._load_attempted = True


keep_pure_pytorch_logei()
CHUNK = 256  # candidates scored per acquisition call (bounds the MC tensors' memory)

# (model, observed features, observed objectives to maximize (n, m), seed, options) ->
# a scorer: acquisition values (np.ndarray, larger is better) of candidates (N, 1, d)
Scorer = Callable[[torch.Tensor], np.ndarray]
Acquisition = Callable[[SingleTaskGP, torch.Tensor, torch.Tensor, int, dict[str, Any]], Scorer]


def _scores(acquisition: AcquisitionFunction, candidates: torch.Tensor) -> np.ndarray:
    """Acquisition values of candidates (N, 1, d), in chunks that bound the MC tensors."""
    with torch.no_grad():
        parts = [acquisition(candidates[i:i + CHUNK]) for i in range(0, len(candidates), CHUNK)]
    scores = torch.cat(parts).numpy() if parts else np.empty(0)
    return np.where(np.isnan(scores), -np.inf, scores)


class Marginals(Model):
    """A GP's posterior at a batch of single points (..., 1, d), computed as one joint
    posterior of all the points of which only the marginals (means and variances) are kept.

    An analytic acquisition of q = 1 reads nothing else of the posterior, so it scores the
    same; but GPyTorch computes a batch of N single-point posteriors as N small products,
    ~20x slower than the N-point posterior (0.21 s against 0.01 s for 400 candidates at 190
    observations, 27 genes, one thread)."""

    def __init__(self, model: SingleTaskGP, chunk: int = 1024):
        super().__init__()
        self.model, self.chunk = model, chunk

    @property
    def num_outputs(self) -> int:
        return self.model.num_outputs

    @property
    def batch_shape(self) -> torch.Size:
        return self.model.batch_shape

    def posterior(self, X: torch.Tensor, output_indices: list[int] | None = None,
                  observation_noise: bool | torch.Tensor = False,
                  posterior_transform: Any = None, **kwargs: Any) -> Any:
        if X.shape[-2] != 1 or output_indices is not None or observation_noise is not False:
            raise ValueError("Marginals serves posteriors of single points (q = 1) only")
        flat = X.reshape(-1, X.shape[-1])
        means, variances = [], []
        # GPyTorch evaluates the test points' whole kernel matrix eagerly below 2048 points,
        # though the variances need its diagonal alone: kept lazy, a chunk costs linear time
        with gpytorch.settings.max_eager_kernel_size(0):
            for i in range(0, len(flat), self.chunk):
                joint = self.model.posterior(flat[i:i + self.chunk])
                means.append(joint.mean)
                variances.append(joint.variance)
        m = self.num_outputs
        mean = torch.cat(means).reshape(*X.shape[:-2], 1, m)
        variance = torch.cat(variances).reshape(*X.shape[:-2], m)
        posterior = GPyTorchPosterior(MultitaskMultivariateNormal(
            mean, DiagLinearOperator(variance)))
        return posterior if posterior_transform is None else posterior_transform(posterior)


class PooledGP(SingleTaskGP):
    """A :class:`SingleTaskGP` whose posterior at a batch of point sets that share all but
    their last point, (N, n + 1, d) with the same first n rows (qLogNEI's baseline followed by
    one candidate each), is one joint posterior of the n shared points and the N last points,
    of which each set's mean and covariance are the rows and columns it indexes.

    The posterior of a set of points is the corresponding block of the posterior of any
    superset, so every set's distribution is the one :meth:`SingleTaskGP.posterior` gives (to
    float rounding), without recomputing the shared rows' cross-covariances with the training
    data for every candidate: those dominated rsbo's time (82% of a 200-evaluation run, docs/
    paper_scale.md). Any other input goes to :meth:`SingleTaskGP.posterior` unchanged."""

    def posterior(  # type: ignore[override]  # SingleTaskGP's own signature
            self, X: torch.Tensor, output_indices: list[int] | None = None,
            observation_noise: bool | torch.Tensor = False,
            posterior_transform: Any = None) -> Any:
        shared = X[..., :-1, :]
        pooled = (X.dim() == 3 and len(X) > 1 and X.shape[-2] > 1 and output_indices is None
                  and observation_noise is False and posterior_transform is None
                  and torch.equal(shared, shared[:1].expand_as(shared)))
        joint = super().posterior(torch.cat([shared[0], X[:, -1]])) if pooled else None
        if not isinstance(joint, GPyTorchPosterior):
            return super().posterior(X, output_indices, observation_noise, posterior_transform)
        n, sets = shared.shape[-2], len(X)
        covariance = extract_batch_covar(joint.distribution).to_dense()  # (m, n + N, n + N)
        index = torch.cat([torch.arange(n).expand(sets, n),
                           (n + torch.arange(sets)).unsqueeze(-1)], dim=-1)  # (N, n + 1)
        blocks = covariance[:, index.unsqueeze(-1), index.unsqueeze(-2)].transpose(0, 1)
        # laid out as SingleTaskGP lays out its outputs: a block per output, not interleaved
        return GPyTorchPosterior(MultitaskMultivariateNormal(
            joint.mean[index], BlockDiagLinearOperator(DenseLinearOperator(blocks), block_dim=-3),
            interleaved=False))


def _weights(m: int, seed: int) -> torch.Tensor:
    """Weights drawn uniformly from the (m-1)-simplex."""
    return sample_simplex(m, n=1, seed=seed, dtype=DTYPE)[0]


def _sampler(seed: int, options: dict[str, Any]) -> SobolQMCNormalSampler:
    return SobolQMCNormalSampler(sample_shape=torch.Size([int(options.get("mc_samples", 128))]),
                                 seed=seed)


def _chebyshev(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor, seed: int,
               options: dict[str, Any]) -> Scorer:
    """qLogNEI of the augmented Chebyshev scalarization with random simplex weights."""
    scalarize = get_chebyshev_scalarization(_weights(Y.shape[-1], seed), Y,
                                            alpha=float(options.get("alpha", 0.05)))
    acquisition = qLogNoisyExpectedImprovement(
        model, X_baseline=X, sampler=_sampler(seed, options),
        objective=GenericMCObjective(scalarize),
        prune_baseline=True, cache_root=True)
    return lambda candidates: _scores(acquisition, candidates)


def _linear(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor, seed: int,
            options: dict[str, Any]) -> Scorer:
    """Analytic LogEI of the weighted sum with random simplex weights."""
    weights = _weights(Y.shape[-1], seed)
    acquisition = LogExpectedImprovement(
        Marginals(model), best_f=(Y @ weights).max(),
        posterior_transform=ScalarizedPosteriorTransform(weights))
    return lambda candidates: _scores(acquisition, candidates)


def _hypervolume(model: SingleTaskGP, X: torch.Tensor, Y: torch.Tensor, seed: int,
                 options: dict[str, Any]) -> Scorer:
    """qLogEHVI over the box decomposition of the observed front, on the candidates of
    highest analytic EHVI."""
    ref_point = torch.full((Y.shape[-1],), -float(options.get("ref_point", 1.1)), dtype=DTYPE)
    partitioning = FastNondominatedPartitioning(ref_point=ref_point, Y=Y)
    # BoTorch annotates partitioning as a NondominatedPartitioning, but any box decomposition
    # of the front serves (its own examples pass a FastNondominatedPartitioning)
    try:
        screen = ExpectedHypervolumeImprovement(
            Marginals(model), ref_point=ref_point.tolist(),
            partitioning=partitioning)  # type: ignore[arg-type]
    except ValueError:  # no observed point better than the reference point: no screening
        screen = None
    acquisition = qLogExpectedHypervolumeImprovement(
        model, ref_point=ref_point,
        partitioning=partitioning,  # type: ignore[arg-type]
        sampler=_sampler(seed, options))
    keep = int(options.get("screen", 50))

    def score(candidates: torch.Tensor) -> np.ndarray:
        scores = np.full(len(candidates), -np.inf)
        if screen is None or keep <= 0 or keep >= len(candidates):
            top = np.arange(len(candidates))
        else:  # the kept: highest analytic EHVI, ties to the first in pool order
            top = np.sort(np.argsort(-_scores(screen, candidates), kind="stable")[:keep])
        scores[top] = _scores(acquisition, candidates[torch.as_tensor(top)])
        return scores

    return score


def _seed(*parts: int) -> int:
    """A 31-bit seed derived from the run's seed and the parts (e.g. iteration, purpose)."""
    return int(np.random.SeedSequence([int(p) % 2**32 for p in parts]).generate_state(1)[0]
               >> 1)


class _Loop:
    """State of one BO run: the evaluated archs, their features and objective values."""

    def __init__(self, evaluate: Evaluator, genome: Genome, seed: int, options: dict[str, Any],
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
        n_random = int(self.options.get("candidates", 1000))
        found: dict[str, Arch] = {}
        if n_random > 0:
            for arch in self.genome.space.draw(_seed(self.seed, iteration, 1)):
                if arch.id not in self.seen:
                    found[arch.id] = arch
                    if len(found) == n_random:
                        break
        if self.options.get("neighbours", True):
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
        refit_every = max(1, int(self.options.get("refit_every", 1)))
        if self.hyperparameters is None or iteration % refit_every == 0:
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
            try:
                fit_gpytorch_mll(mll, optimizer_kwargs={"options": {
                    "maxiter": int(self.options.get("fit_maxiter", 50))}})
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
        threads = torch.get_num_threads()
        with torch.random.fork_rng(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(seed)
            torch.set_num_threads(int(self.options.get("threads", 1)))
            try:
                model = self.fit(X, Y, iteration)
                score = self.acquisition(model, X, Y, seed, self.options)
                scores = score(torch.tensor(self.encode(pool), dtype=DTYPE).unsqueeze(-2))
            finally:
                torch.set_num_threads(threads)
        return pool[int(np.argmax(scores))]

    def run(self) -> None:
        initial = min(int(self.options.get("initial", 10)), self.genome.space.size())
        self.observe(self.genome.space.sample(initial, self.seed))
        iteration = 1
        while (arch := self.suggest(iteration)) is not None:
            self.observe([arch])
            iteration += 1


def rsbo(evaluate: Evaluator, genome: Genome, seed: int, options: dict[str, Any]) -> None:
    """Random Chebyshev scalarization BO (ParEGO) until the budget ends the run."""
    _Loop(evaluate, genome, seed, options, _chebyshev).run()


def lsbo(evaluate: Evaluator, genome: Genome, seed: int, options: dict[str, Any]) -> None:
    """Random linear scalarization BO until the budget ends the run."""
    _Loop(evaluate, genome, seed, options, _linear).run()


def ehvi(evaluate: Evaluator, genome: Genome, seed: int, options: dict[str, Any]) -> None:
    """Expected hypervolume improvement BO (qLogEHVI) until the budget ends the run."""
    _Loop(evaluate, genome, seed, options, _hypervolume).run()
