"""Search: genome coding, hypervolume, budget accounting, algorithms, runs and summaries.

Algorithms run against an analytic problem (objectives computed from the arch), so these tests
need no trained supernet; the CLI test runs the real stages on a fitted synthetic benchmark.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import polars as pl
import pytest

from hwgptbench.moo.evaluator import BudgetExhausted, Evaluator
from hwgptbench.moo.genome import Genome
from hwgptbench.moo.hypervolume import hypervolume, hypervolume_trace, pareto_mask
from hwgptbench.moo.reference import compute_reference
from hwgptbench.moo.runner import run
from hwgptbench.moo.summary import attainment, final_runs, metrics_document, summarize
from hwgptbench.search_algorithms import IterativeOptions, NSGA2Options
from hwgptbench.settings.sections import AllOptions
from hwgptbench.space import Arch, SearchSpace

SPACE = SearchSpace.from_dict("tiny", {
    "embed_dim": [64, 96, 128], "n_layer": [2, 3, 4], "n_head": [2, 4], "mlp_ratio": [2, 3, 4],
    "bias": [True, False], "head_size": 16, "block_size": 128, "rotary_fraction": 0.5})
NON_BO = ["rs", "ls", "nsga2", "morea", "moasha", "iterative"]


@dataclass
class AnalyticProblem:
    """Objectives from the arch: error falls with size (and with training steps), latency
    grows with depth and width, memory with parameters. Same interface as Problem."""

    metrics: tuple[str, ...] = ("perplexity", "latency_ms")
    space: SearchSpace = SPACE
    fidelities: list[int] = field(default_factory=lambda: [25, 50, 100])
    device: str = "analytic"
    condition: str | None = None

    def values(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        steps = fidelity or (self.fidelities or [100])[-1]
        rows = []
        for a in archs:
            params = self.space.n_params(a, 512)
            columns = {
                "perplexity": 2e3 / np.log(params) ** 1.5 * (1 + 10 / steps)
                + 0.3 * sum(a.n_head) / a.n_layer,
                "latency_ms": 0.4 * a.n_layer + params / 2e5 + 0.05 * sum(a.mlp_ratio),
                "memory_peak_mb": params * 4 / 2**20 + 0.1 * a.embed_dim / 64,
            }
            rows.append([columns[m] for m in self.metrics])
        return np.array(rows, dtype=float).reshape(len(archs), len(self.metrics))


@pytest.fixture(scope="module")
def problem() -> AnalyticProblem:
    return AnalyticProblem()


@pytest.fixture(scope="module")
def reference(problem: AnalyticProblem):
    return compute_reference(problem, 100_000, seed=0)[0]


def test_genome_round_trip_neighbours_and_config() -> None:
    genome = Genome(SPACE)
    rng = np.random.default_rng(0)
    for arch in SPACE.sample(50, seed=1):
        assert genome.decode(genome.encode(arch)) == arch
        assert genome.from_config(genome.to_config(arch)) == arch
        neighbours = genome.neighbours(arch)
        assert arch not in neighbours and len({n.id for n in neighbours}) == len(neighbours)
        for n in neighbours:
            SPACE.validate(n)
            if n.n_layer == arch.n_layer:  # else layers were dropped or added
                active = genome.active(arch)
                assert (genome.encode(n)[active] != genome.encode(arch)[active]).sum() == 1
        mutant = genome.mutate(arch, rng)
        assert mutant != arch and mutant in neighbours
    with pytest.raises(ValueError, match="choice indices"):
        genome.decode([9] * genome.size)


def test_hypervolume_of_known_sets() -> None:
    ref2 = np.ones(2)
    points = np.array([[0.2, 0.6], [0.4, 0.3], [0.7, 0.1]])
    assert hypervolume(points, ref2) == pytest.approx(0.08 + 0.21 + 0.27)
    # dominated points and points beyond the reference point change nothing
    extra = np.vstack([points, [[0.5, 0.5], [1.2, 0.0], [0.0, 1.0]]])
    assert hypervolume(extra, ref2) == pytest.approx(0.56)
    ref3 = np.ones(3)
    assert hypervolume(np.array([[0.5, 0.5, 0.5]]), ref3) == pytest.approx(0.125)
    two = np.array([[0.5, 0.5, 0.5], [0.0, 0.75, 0.75]])
    assert hypervolume(two, ref3) == pytest.approx(0.125 + 0.0625 - 0.03125)
    assert hypervolume(np.empty((0, 3)), ref3) == 0.0
    assert pareto_mask(extra).tolist() == [True, True, True, False, True, True]


def test_hypervolume_trace_is_the_running_hypervolume() -> None:
    rng = np.random.default_rng(0)
    points = rng.uniform(0, 1.2, size=(60, 3))
    points[[5, 17]] = np.nan  # low-fidelity rows do not count
    trace = hypervolume_trace(points, np.ones(3))
    assert (np.diff(trace) >= 0).all()
    for i in (0, 10, 30, 59):
        seen = points[:i + 1][~np.isnan(points[:i + 1]).any(axis=1)]
        assert trace[i] == pytest.approx(hypervolume(seen, np.ones(3)))


def test_evaluator_budget_and_fidelity_costs(problem: AnalyticProblem, reference) -> None:
    evaluate = Evaluator(problem, reference, budget=3.0)
    a, b, c, d = SPACE.sample(4, seed=3)
    evaluate([a], fidelity=25)  # 0.25
    evaluate([a], fidelity=50)  # resumes: +0.25
    evaluate([a])  # +0.5
    assert evaluate.spent == pytest.approx(1.0)
    with pytest.raises(BudgetExhausted):
        evaluate([b, c, d])  # only b and c fit
    assert [r["arch"] for r in evaluate.records][-2:] == [b, c]
    assert evaluate.spent == pytest.approx(3.0)
    with pytest.raises(ValueError, match="fidelity 7"):
        evaluate([d], fidelity=7)


def test_reference_enumerates_the_tiny_space(problem: AnalyticProblem, reference) -> None:
    assert reference.enumerated and reference.archs == SPACE.size()
    values = problem.values(list(SPACE.all_archs()))
    assert reference.ideal == pytest.approx(values.min(axis=0).tolist())
    scaled = reference.normalize(values)
    assert scaled.min() == pytest.approx(0) and scaled.max() == pytest.approx(1)
    assert reference.hypervolume == pytest.approx(hypervolume(scaled, reference.point))


@pytest.mark.parametrize("algorithm", NON_BO)
def test_algorithm_runs_are_valid_deterministic_and_within_budget(
        algorithm: str, problem: AnalyticProblem, reference) -> None:
    table = run(problem, reference, algorithm, budget=30, seed=7)
    again = run(problem, reference, algorithm, budget=30, seed=7)
    assert table.drop("elapsed_s").equals(again.drop("elapsed_s"))  # wall time alone varies
    elapsed = table["elapsed_s"].to_numpy()
    assert (elapsed > 0).all() and (np.diff(elapsed) >= 0).all()
    assert table["cumulative_cost"][-1] <= 30 + 1e-9
    assert table["cumulative_cost"][-1] > 29
    for arch_id in table["arch_id"]:
        SPACE.validate(Arch.from_id(arch_id))
    assert (table["hypervolume"].diff().drop_nulls() >= 0).all()
    assert (table["hv_regret"] >= -1e-12).all()
    values = problem.values([Arch.from_id(i) for i in table.filter("full_fidelity")["arch_id"]])
    assert np.allclose(table.filter("full_fidelity").select(problem.metrics).to_numpy(), values)
    other = run(problem, reference, algorithm, budget=30, seed=8)
    assert other["arch_id"].to_list() != table["arch_id"].to_list()


def test_moasha_climbs_fidelities_and_needs_them(problem: AnalyticProblem, reference) -> None:
    table = run(problem, reference, "moasha", budget=20, seed=0)
    assert set(table["fidelity"]) == {25, 50, 100}
    assert table.filter(pl.col("fidelity") == 25).height > table.filter(
        pl.col("fidelity") == 100).height
    flat = AnalyticProblem(fidelities=[])
    with pytest.raises(ValueError, match="supernet.snapshots"):
        run(flat, compute_reference(flat, 100_000, 0)[0], "moasha", budget=5, seed=0)


@pytest.mark.parametrize("algorithm", ["nsga2", "morea", "ls"])
def test_three_objective_runs(algorithm: str) -> None:
    problem = AnalyticProblem(metrics=("perplexity", "latency_ms", "memory_peak_mb"))
    reference = compute_reference(problem, 100_000, 0)[0]
    table = run(problem, reference, algorithm, budget=25, seed=0)
    assert table.height == 25 and table["hypervolume"][-1] > 0
    assert set(problem.metrics) <= set(table.columns)


def test_summary_ranks_and_attainment(problem: AnalyticProblem, reference) -> None:
    runs = pl.concat([
        run(problem, reference, algorithm, budget=20, seed=seed).with_columns(
            objectives=pl.lit("ppl-latency"), device=pl.lit("analytic"))
        for algorithm in ("rs", "nsga2") for seed in (0, 1, 2)])
    final = final_runs(runs)
    assert final.height == 6 and set(final["rank"]) <= {1.0, 1.5, 2.0}
    summary = summarize(final)
    assert summary["runs"].to_list() == [3, 3]
    assert summary["rank_mean"].sum() == pytest.approx(3.0)
    document = metrics_document(summary)
    assert set(document["ppl-latency"]["analytic"]) == {"rs", "nsga2"}
    surfaces = attainment(runs, {"ppl-latency": ["perplexity", "latency_ms"]})
    assert set(surfaces["algorithm"]) == {"rs", "nsga2"}
    median = surfaces.filter((pl.col("algorithm") == "rs") & (pl.col("percentile") == 50))
    assert median.height >= 1 and median["x"].is_sorted()


def test_params_name_unknown_objective_sets() -> None:
    from conftest import REPO_ROOT
    from hwgptbench import params

    doc = params.load(REPO_ROOT / "params.yaml")
    doc["search"]["objectives"] = ["ppl-latency", "ppl-flops"]
    with pytest.raises(params.ParamsError, match=r"search.objectives: \['ppl-flops'\]"):
        params.validate(doc)
    doc["search"]["objectives"] = ["ppl-latency"]
    doc["search"]["objective_sets"]["bad"] = ["perplexity"]
    with pytest.raises(params.ParamsError, match="search.objective_sets.bad"):
        params.validate(doc)


def test_iterative_search_beats_random_search_at_equal_budget(problem: AnalyticProblem,
                                                              reference) -> None:
    """The surrogates steer the search: over 8 seeds, its final hypervolume exceeds random
    search's (the analytic problem is smooth in the genes, so a surrogate can learn it; 3
    seeds were within noise of each other)."""
    final = {algorithm: np.mean([run(problem, reference, algorithm, budget=40, seed=seed,
                                     options=AllOptions(iterative=IterativeOptions(
                                         initial=10, per_round=5)))["hypervolume"][-1]
                                 for seed in range(8)])
             for algorithm in ("rs", "iterative")}
    assert final["iterative"] > final["rs"]


def test_stored_runs_carry_the_versions_of_their_libraries(problem: AnalyticProblem, reference,
                                                           tmp_path) -> None:
    from importlib.metadata import version

    from hwgptbench.moo.runner import run_seeds

    run_seeds(problem, reference, "rs", 4, [0], None, tmp_path / "runs",
              labels={"objectives": "ppl-latency"})
    table = pl.read_parquet(tmp_path / "runs" / "0.parquet")
    assert table["objectives"].to_list() == ["ppl-latency"] * 4
    for name in ("torch", "botorch", "syne-tune", "pymoo", "moocore", "lightgbm"):
        column = f"{name.replace('-', '_')}_version"
        assert table[column].unique().to_list() == [version(name)]


def test_nsga2_restarts_when_no_offspring_is_new() -> None:
    """In a space its population covers, pymoo finds no new offspring (``ask`` returns None):
    the run restarts from a new random population and spends its whole budget."""
    small = SearchSpace.from_dict("small", {
        "embed_dim": [64], "n_layer": [1], "n_head": [2, 4], "mlp_ratio": [2, 3],
        "bias": [False], "head_size": 16, "block_size": 128, "rotary_fraction": 0.5})
    problem = AnalyticProblem(space=small, fidelities=[])
    reference = compute_reference(problem, 1_000, seed=0)[0]
    table = run(problem, reference, "nsga2", budget=30, seed=0,
                options=AllOptions(nsga2=NSGA2Options(population_size=4)))
    assert table.height == 30
    assert set(table["arch_id"]) == {a.id for a in small.sample(small.size(), 0)}
