"""The BoTorch search algorithms (rsbo, lsbo, ehvi) on small analytic problems."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pytest
import torch

from hwgptbench.moo import runner
from hwgptbench.moo.algorithms import get_algorithm
from hwgptbench.moo.evaluator import BudgetExhausted, Evaluator
from hwgptbench.moo.genome import Genome
from hwgptbench.moo.hypervolume import hypervolume, pareto_mask
from hwgptbench.moo.reference import Reference
from hwgptbench.search_algorithms import BOOptions
from hwgptbench.settings.sections import AllOptions
from hwgptbench.space import Arch, SearchSpace

METHODS = ["rsbo", "lsbo", "ehvi"]
OPTIONS = BOOptions(initial=5, candidates=200)
SPACE = SearchSpace.from_dict("test", {
    "embed_dim": [64, 96, 128], "n_layer": [1, 2, 3], "n_head": [2, 4], "mlp_ratio": [2, 3, 4],
    "bias": [True, False], "head_size": 16, "block_size": 128, "rotary_fraction": 0.5})
TINY = SearchSpace.from_dict("tiny-test", {  # 12 archs
    "embed_dim": [64, 96], "n_layer": [1], "n_head": [2, 4], "mlp_ratio": [2, 3, 4],
    "bias": [True], "head_size": 16, "block_size": 128, "rotary_fraction": 0.5})


class AnalyticProblem:
    """A Problem stand-in: conflicting analytic objectives of an arch (all minimized)."""

    device = None
    condition = None
    fidelities: list[int] = []

    def __init__(self, space: SearchSpace, metrics: Sequence[str], nan: bool = False):
        self.space, self.metrics, self.nan = space, tuple(metrics), nan

    def _row(self, arch: Arch) -> list[float]:
        params = self.space.n_params(arch, 100) / 1e5
        attention = sum(arch.n_head) / arch.n_layer
        values = {"error": np.exp(-params) + 0.05 * attention + 0.02 * (not arch.bias),
                  "latency": params + 0.3 * arch.n_layer,
                  "memory": attention * arch.n_layer + 0.1 * max(arch.mlp_ratio)}
        row = [values[m] for m in self.metrics]
        if self.nan and arch.n_layer == 3 and not arch.bias:  # failed measurements
            row[0] = float("nan")
        return row

    def values(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        for arch in archs:
            self.space.validate(arch)
        return np.array([self._row(a) for a in archs], dtype=float).reshape(
            len(archs), len(self.metrics))


def reference(problem: AnalyticProblem) -> Reference:
    """Scaling and front of the whole (enumerable) space."""
    values = problem.values(list(problem.space.all_archs()))
    values = values[np.isfinite(values).all(axis=1)]
    ideal, nadir = values.min(axis=0), values.max(axis=0)
    scaled = (values - ideal) / (nadir - ideal)
    hv = hypervolume(scaled[pareto_mask(scaled)], np.ones(len(problem.metrics)))
    return Reference(list(problem.metrics), None, None, ideal.tolist(), nadir.tolist(), hv,
                     len(values), True, 0)


def search(problem: AnalyticProblem, method: str, budget: int, seed: int = 0,
           options: BOOptions | None = None):
    return runner.run(problem, reference(problem), method, budget, seed,
                      AllOptions(bo=OPTIONS if options is None else options))


@pytest.mark.parametrize("method", METHODS)
def test_runs_are_valid_distinct_and_deterministic(method: str) -> None:
    problem = AnalyticProblem(SPACE, ["error", "latency"])
    table = search(problem, method, 12)
    assert table.height == 12
    ids = table["arch_id"].to_list()
    assert len(set(ids)) == len(ids)
    for arch_id in ids:
        SPACE.validate(Arch.from_id(arch_id))
    assert ids[:5] == [a.id for a in SPACE.sample(5, 0)]  # the initial design
    hv = table["hypervolume"].to_numpy()
    assert (np.diff(hv) >= 0).all() and hv[-1] > 0
    again = search(problem, method, 12)
    assert table.drop("elapsed_s").equals(again.drop("elapsed_s"))  # same seed, same run
    assert table["arch_id"].to_list() != search(problem, method, 12, seed=1)["arch_id"].to_list()


@pytest.mark.parametrize("method", METHODS)
def test_three_objectives(method: str) -> None:
    problem = AnalyticProblem(SPACE, ["error", "latency", "memory"])
    table = search(problem, method, 10)
    assert table.height == 10 and table["arch_id"].n_unique() == 10
    assert {"error", "latency", "memory"} <= set(table.columns)


def test_independent_of_global_generators() -> None:
    """A run depends on its seed only, not on the state of torch's or numpy's generators."""
    problem = AnalyticProblem(SPACE, ["error", "latency"])
    ref, ids = reference(problem), []
    for state in (1, 2):
        torch.manual_seed(state)
        np.random.seed(state)
        evaluate = Evaluator(problem, ref, 9.0)
        with pytest.raises(BudgetExhausted):
            get_algorithm("rsbo")(evaluate, Genome(SPACE), 3, OPTIONS)
        ids.append([r["arch"].id for r in evaluate.records])
    assert ids[0] == ids[1] and len(ids[0]) == 9


@pytest.mark.parametrize("method", METHODS)
def test_exhausts_a_small_space_without_repeats(method: str) -> None:
    """The pool shrinks as archs are evaluated; every arch is evaluated once, then it stops."""
    problem = AnalyticProblem(TINY, ["error", "latency"])
    evaluate = Evaluator(problem, reference(problem), 100.0)
    get_algorithm(method)(evaluate, Genome(TINY), 0, OPTIONS)  # returns: nothing left
    ids = [r["arch"].id for r in evaluate.records]
    assert sorted(ids) == sorted(a.id for a in TINY.all_archs())


def test_budget_below_initial_design() -> None:
    table = search(AnalyticProblem(SPACE, ["error", "latency"]), "ehvi", 3)
    assert table["arch_id"].to_list() == [a.id for a in SPACE.sample(3, 0)]


def test_nan_objectives_are_not_modelled() -> None:
    """Archs with a NaN objective count as evaluated but stay out of the GP."""
    problem = AnalyticProblem(SPACE, ["error", "latency"], nan=True)
    table = search(problem, "lsbo", 12, options=BOOptions(initial=5, candidates=200,
                                                          refit_every=2))
    assert table.height == 12 and table["arch_id"].n_unique() == 12


def test_marginals_score_as_the_model_does() -> None:
    """Analytic acquisitions over Marginals (one joint posterior of the pool) give the values
    of the same acquisitions over the model (a posterior per candidate), to rounding."""
    from botorch.acquisition.analytic import LogExpectedImprovement
    from botorch.acquisition.multi_objective.analytic import ExpectedHypervolumeImprovement
    from botorch.acquisition.objective import ScalarizedPosteriorTransform
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.utils.multi_objective.box_decompositions.non_dominated import (
        FastNondominatedPartitioning,
    )

    from hwgptbench.moo.algorithms.pooled import Marginals

    generator = torch.Generator().manual_seed(0)
    X = torch.rand(40, 6, dtype=torch.float64, generator=generator)
    Y = torch.stack([X[:, :3].sum(-1), -X[:, 3:].sum(-1) + X[:, 0]], -1)
    model = SingleTaskGP(X, Y, outcome_transform=Standardize(m=2)).eval()
    candidates = torch.rand(300, 1, 6, dtype=torch.float64, generator=generator)
    weights = torch.tensor([0.3, 0.7], dtype=torch.float64)
    reference = torch.tensor([-1.0, -4.0], dtype=torch.float64)
    partitioning = FastNondominatedPartitioning(ref_point=reference, Y=Y)
    pairs = [(LogExpectedImprovement(m, best_f=(Y @ weights).max(),
                                     posterior_transform=ScalarizedPosteriorTransform(weights))
              for m in (model, Marginals(model, chunk=128))),
             (ExpectedHypervolumeImprovement(m, ref_point=reference.tolist(),
                                             partitioning=partitioning)
              for m in (model, Marginals(model, chunk=128)))]
    with torch.no_grad():
        for plain, joint in pairs:
            expected, got = plain(candidates), joint(candidates)
            assert torch.allclose(expected, got, rtol=1e-9, atol=1e-12)
            assert int(expected.argmax()) == int(got.argmax())
    with pytest.raises(ValueError, match="single points"):
        Marginals(model).posterior(candidates.reshape(100, 3, 6))


def test_pooled_posterior_is_the_gps_and_scores_qlognei_alike(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """PooledGP's posterior of sets sharing a baseline is SingleTaskGP's, set by set, and
    rsbo's qLogNEI (cached root, as the search runs it) scores a pool alike with either."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.acquisition.objective import GenericMCObjective
    from botorch.models import SingleTaskGP
    from botorch.models.transforms.outcome import Standardize
    from botorch.sampling.normal import SobolQMCNormalSampler
    from botorch.utils.low_rank import extract_batch_covar
    from botorch.utils.multi_objective.scalarization import get_chebyshev_scalarization

    from hwgptbench.moo.algorithms.pooled import PooledGP

    generator = torch.Generator().manual_seed(0)
    X = torch.rand(40, 6, dtype=torch.float64, generator=generator)
    Y = torch.stack([X[:, :3].sum(-1), -X[:, 3:].sum(-1) + X[:, 0]], -1)
    plain = SingleTaskGP(X, Y, outcome_transform=Standardize(m=2))
    pooled = PooledGP(X, Y, outcome_transform=Standardize(m=2))
    pooled.load_state_dict(plain.state_dict())
    plain.eval(), pooled.eval()
    candidates = torch.rand(300, 1, 6, dtype=torch.float64, generator=generator)
    sets = torch.cat([X[:7].expand(300, 7, 6), candidates], dim=-2)
    asked: list[tuple[int, ...]] = []  # the inputs SingleTaskGP's posterior is given
    gp_posterior = SingleTaskGP.posterior
    monkeypatch.setattr(SingleTaskGP, "posterior", lambda self, X, *args, **kwargs: (
        asked.append(tuple(X.shape)), gp_posterior(self, X, *args, **kwargs))[1])
    with torch.no_grad():
        expected = plain.posterior(sets)
        asked.clear()
        got = pooled.posterior(sets)
        assert asked == []  # no GPyTorch posterior: not one per set of 8, nor a joint one
        assert torch.allclose(expected.mean, got.mean, rtol=1e-9, atol=1e-12)
        blocks = [extract_batch_covar(p.distribution).to_dense() for p in (expected, got)]
        assert torch.allclose(blocks[0], blocks[1], rtol=1e-7, atol=1e-10)  # (300, 2, 8, 8)
        one = plain.posterior(X[:5])  # anything else: SingleTaskGP's own posterior
        assert torch.equal(one.mean, pooled.posterior(X[:5]).mean)
        scalarize = get_chebyshev_scalarization(torch.tensor([0.3, 0.7], dtype=torch.float64),
                                                Y, alpha=0.05)
        scores = [qLogNoisyExpectedImprovement(
            model, X_baseline=X, objective=GenericMCObjective(scalarize), prune_baseline=True,
            cache_root=True, sampler=SobolQMCNormalSampler(torch.Size([128]), seed=3))(
                candidates) for model in (plain, pooled)]
    assert torch.allclose(scores[0], scores[1], rtol=1e-6, atol=1e-9)
    assert int(scores[0].argmax()) == int(scores[1].argmax())


def test_ehvi_is_the_expected_volume_beyond_the_reference_when_nothing_beats_it() -> None:
    """No observed point better than the reference point (BoTorch's EHVI refuses such a
    front): each candidate's score is the exact EHVI of an empty front, the product over
    independent outputs of E[(y - r)+] = s phi(z) + (mu - r) Phi(z), z = (mu - r) / s."""
    from botorch.models.transforms.outcome import Standardize
    from scipy.stats import norm

    from hwgptbench.moo.algorithms.bo import _hypervolume
    from hwgptbench.moo.algorithms.pooled import Marginals, PooledGP

    generator = torch.Generator().manual_seed(1)
    X = torch.rand(30, 4, dtype=torch.float64, generator=generator)
    Y = -1.15 - 0.3 * torch.stack([X[:, :2].sum(-1), X[:, 2:].sum(-1)], -1) / 2  # maximized
    model = PooledGP(X, Y, outcome_transform=Standardize(m=2)).eval()
    candidates = torch.rand(64, 1, 4, dtype=torch.float64, generator=generator)
    scores = _hypervolume(model, X, Y, 0, BOOptions(ref_point=1.1))(candidates)
    with torch.no_grad():
        posterior = Marginals(model).posterior(candidates)
    mean = posterior.mean.squeeze(-2).numpy()
    sd = posterior.variance.squeeze(-2).sqrt().numpy()
    z = (mean + 1.1) / sd
    expected = np.prod(sd * norm.pdf(z) + (mean + 1.1) * norm.cdf(z), axis=-1)
    assert scores.max() > 0
    np.testing.assert_allclose(scores, expected, rtol=1e-8, atol=1e-15)


def test_fits_and_scores_run_blas_on_the_searchs_threads(monkeypatch: pytest.MonkeyPatch
                                                         ) -> None:
    """BoTorch's L-BFGS-B runs on numpy: its BLAS is held to the ``threads`` option (1), as
    torch is, even where the process allows more (OpenBLAS threads slowed fits 1.6-2.5x)."""
    from threadpoolctl import threadpool_info, threadpool_limits

    from hwgptbench.moo.algorithms import bo

    seen: list[int] = []
    fit = bo._Loop.fit

    def spy(self: bo._Loop, *args: object) -> object:
        seen.extend(pool["num_threads"] for pool in threadpool_info()
                    if pool["user_api"] == "blas")
        return fit(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(bo._Loop, "fit", spy)
    with threadpool_limits(2, user_api="blas"):
        search(AnalyticProblem(SPACE, ["error", "latency"]), "lsbo", 7)
    assert seen and set(seen) == {1}
