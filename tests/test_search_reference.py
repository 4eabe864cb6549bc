"""The reference front bounds every run: sample, optimisation on the surrogates, run archives.

A sample of a few archs of the tiny space plays the part of 10^5 random archs of a paper-scale
space: runs and an optimisation find archs that dominate its front, which the final reference
front (and its box) must take in, so that no run's hypervolume regret is negative.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from hwgptbench.figures.tables import reference_table
from hwgptbench.moo.hypervolume import hypervolume, pareto_mask
from hwgptbench.moo.optimise import optimise
from hwgptbench.moo.reference import compute_reference
from hwgptbench.moo.runner import run
from hwgptbench.plotting.markdown import write_table
from hwgptbench.search.front import final_fronts, merge_runs, rescore
from test_search import SPACE, AnalyticProblem

SETS = {"ppl-latency": ["perplexity", "latency_ms"]}
LABELS = {"objectives": "ppl-latency", "device": "analytic"}


def labelled(table: pl.DataFrame) -> pl.DataFrame:
    return table.with_columns(**{k: pl.lit(v) for k, v in LABELS.items()})


def dominated_by(front: np.ndarray, points: np.ndarray) -> bool:
    """Every point is weakly dominated by some row of front."""
    return all((front <= p).all(axis=1).any() for p in points)


@pytest.fixture(scope="module")
def problem() -> AnalyticProblem:
    return AnalyticProblem(fidelities=[])


def test_optimisation_keeps_its_nondominated_archs(problem: AnalyticProblem) -> None:
    found = optimise(problem, 300, seed=0, population=50)
    assert found.evaluations >= 300 and len(found.archs) == len({a.id for a in found.archs})
    assert np.allclose(problem.values(found.archs), found.values)
    assert pareto_mask(found.values).all()
    assert (found.low <= found.values.min(axis=0)).all()
    assert (found.high >= found.values.max(axis=0)).all()
    again = optimise(problem, 300, seed=0, population=50)
    assert [a.id for a in again.archs] == [a.id for a in found.archs]


def test_optimisation_moves_a_sampled_front(problem: AnalyticProblem) -> None:
    sampled, table = compute_reference(problem, 40, seed=0, evaluations=0)
    assert not sampled.enumerated and sampled.optimised == 0
    assert set(table["source"]) == {"sample"} and table["on_front"].all()
    reference, table = compute_reference(problem, 40, seed=0, evaluations=2_000)
    assert reference.optimised >= 2_000 and set(table["source"]) == {"sample", "optimisation"}
    values = table.select(problem.metrics).to_numpy()
    front = values[table["on_front"].to_numpy()]
    assert (pareto_mask(values) == table["on_front"].to_numpy()).all()
    assert dominated_by(front, values)
    # the box encloses every value seen; the optimisation's front beats the sample's
    assert (np.array(reference.ideal) <= values.min(axis=0)).all()
    sample = values[(table["source"] == "sample").to_numpy()]
    assert reference.hypervolume > hypervolume(
        reference.normalize(sample[pareto_mask(sample)]), reference.point)


def test_enumerated_space_needs_no_optimisation(problem: AnalyticProblem) -> None:
    reference, table = compute_reference(problem, SPACE.size(), seed=0)
    assert reference.enumerated and reference.optimised == 0
    assert set(table["source"]) == {"sample"} and table["on_front"].all()


def test_runs_that_beat_the_sampled_front_get_nonnegative_regret(
        problem: AnalyticProblem) -> None:
    """Against a 10-arch sample, the runs find better archs (negative regret in the box they
    ran in); against the final front, which takes in their archives, none is negative."""
    reference, table = compute_reference(problem, 10, seed=0, evaluations=0)
    runs = pl.concat([labelled(run(problem, reference, algorithm, budget=40, seed=seed))
                      for algorithm in ("rs", "nsga2", "ls") for seed in (0, 1)])
    assert runs["hv_regret"].min() < 0  # the runs beat the sample's front
    rescored, stages, fronts = final_fronts(runs, [(reference, table)], SETS)
    assert rescored.height == runs.height
    assert (rescored["hv_regret"] >= 0).all()
    # every run's evaluation is weakly dominated by the final front, which holds run archs
    front = fronts.select(problem.metrics).to_numpy()
    assert dominated_by(front, runs.select(problem.metrics).to_numpy())
    assert "runs" in set(fronts["source"])
    # each addition can only move the front forward; the last stage is the final front
    assert stages["stage"].to_list() == ["sample", "optimisation", "runs"]
    assert (stages["hypervolume"].diff().drop_nulls() >= 0).all()
    assert stages["hv_gap"][-1] == pytest.approx(0.0, abs=1e-12)
    assert stages["hv_gap"][0] > 0
    assert stages["final_front_archs"].sum() == fronts.height
    assert stages["evaluations"].to_list() == [10, 0, int(runs["full_fidelity"].sum())]


def test_an_archive_beyond_the_box_widens_it_and_is_the_front(
        problem: AnalyticProblem) -> None:
    """A run whose archive dominates the whole reference front, from outside its box: the box
    widens to it, it becomes the front, and its regret is 0, another run's positive."""
    reference, table = compute_reference(problem, 50, seed=0, evaluations=0)
    ideal, nadir = np.array(reference.ideal), np.array(reference.nadir)
    best = ideal - 0.5 * (nadir - ideal)
    inside = table.filter("on_front").row(0, named=True)
    new = next(a.id for a in SPACE.sample(100, 99) if a.id not in set(table["arch_id"]))
    runs = pl.DataFrame({
        "algorithm": ["a", "b"], "seed": [0, 0], "evaluation": [1, 1],
        "arch_id": [new, inside["arch_id"]],
        "full_fidelity": [True, True],
        "perplexity": [best[0], inside["perplexity"]],
        "latency_ms": [best[1], inside["latency_ms"]],
        "hypervolume": [0.0, 0.0], "hv_regret": [0.0, 0.0]}).pipe(labelled)
    final, union = merge_runs(reference, table, runs)
    assert final.ideal == pytest.approx(best.tolist()) and final.merged == 2
    assert union.filter("on_front")["source"].to_list() == ["runs"]
    rescored = rescore(runs, final)
    regret = dict(zip(rescored["algorithm"], rescored["hv_regret"], strict=True))
    assert regret["a"] == pytest.approx(0.0, abs=1e-12) and regret["b"] > 0
    # scored against the reference that lacks the archive, the run would beat it
    with pytest.raises(ValueError, match="beats the reference front"):
        rescore(runs, reference)


def test_reference_table_says_how_the_front_was_built(problem: AnalyticProblem,
                                                      tmp_path) -> None:
    reference, table = compute_reference(problem, 20, seed=0, evaluations=200)
    runs = labelled(run(problem, reference, "rs", budget=10, seed=0))
    shown = reference_table(final_fronts(runs, [(reference, table)], SETS)[1])
    assert shown["stage"].to_list() == ["sample", "optimisation", "runs"]
    assert shown.columns == ["objectives", "device", "stage", "evaluations", "front_archs",
                             "final_front_archs", "hypervolume", "hv_gap", "box"]
    assert shown["box"][0].startswith("perplexity ")
    markdown = write_table(shown, tmp_path / "reference_front")[1].read_text()
    assert "optimisation" in markdown and "hv_gap" in markdown


def test_search_summary_scores_stored_runs_against_the_final_front(
        problem: AnalyticProblem, tmp_path) -> None:
    """The CLI as the workflow calls it: run folders, then --references."""
    from conftest import REPO_ROOT
    from hwgptbench import cli
    from hwgptbench.moo.reference import save_reference
    from hwgptbench.moo.runner import run_seeds
    from hwgptbench.moo.summary import read_runs

    reference, table = compute_reference(problem, 10, seed=0, evaluations=0)
    save_reference(reference, table, tmp_path / "reference")
    folders = [str(run_seeds(problem, reference, algorithm, 30, [0, 1], None,
                             tmp_path / algorithm, labels=LABELS))
               for algorithm in ("rs", "nsga2")]
    out = tmp_path / "summary"
    assert cli.main(["search-summary", "--params", str(REPO_ROOT / "params.yaml"),
                     "--out-dir", str(out), "--metrics-out", str(tmp_path / "metrics.json"),
                     *folders, "--references", str(tmp_path / "reference")]) == 0
    assert read_runs(folders)["hv_regret"].min() < 0  # against the sample's front alone
    final = pl.read_parquet(out / "final.parquet")
    assert final.height == 4 and (final["hv_regret"] >= 0).all()
    assert (pl.read_parquet(out / "runs.parquet")["hv_regret"] >= 0).all()
    stages = pl.read_parquet(out / "reference.parquet")
    assert stages["stage"].to_list() == ["sample", "optimisation", "runs"]
    assert set(pl.read_parquet(out / "front.parquet")["source"]) <= {"sample", "runs"}
    friedman = pl.read_parquet(out / "friedman.parquet")
    assert friedman.select("algorithms", "seeds").row(0) == (2, 2)
    assert sorted(pl.read_parquet(out / "ranks.parquet")["algorithm"]) == ["nsga2", "rs"]
    assert pl.read_parquet(out / "pairwise.parquet").height == 1
    eafdiff = pl.read_parquet(out / "eafdiff.parquet")
    assert {*eafdiff["algorithm_a"], *eafdiff["algorithm_b"]} <= {"nsga2", "rs"}
