"""Comparisons of search algorithms across seeds (moo/compare.py): the Friedman test and
critical difference, pairwise Wilcoxon tests with Holm's adjustment, EAF differences, and the
figures and tables drawn from them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import polars as pl
import pytest
from scipy import stats

from hwgptbench import figures
from hwgptbench.moo import compare
from hwgptbench.moo.summary import final_runs

SEEDS = 10


def _runs(shift: dict[str, float], seeds: int = SEEDS, evaluations: int = 12) -> pl.DataFrame:
    """Synthetic runs of a 2-objective problem: each algorithm's points on the front x + y = c
    with c lower (better) by ``shift``; hypervolume rising to 1 - c."""
    rng = np.random.default_rng(0)
    rows = []
    for algorithm, offset in shift.items():
        for seed in range(seeds):
            level = 1.0 - offset + rng.normal(0, 0.02)
            hv = np.maximum.accumulate(rng.uniform(0, 1, evaluations)) * (1.0 - level / 2)
            for k in range(evaluations):
                x = rng.uniform(0, level)
                rows.append({"objectives": "ppl-latency", "device": "cpu", "algorithm": algorithm,
                             "seed": seed, "evaluation": k + 1, "full_fidelity": True,
                             "cumulative_cost": float(k + 1), "elapsed_s": 0.01 * (k + 1) *
                             (1 + offset * 10), "perplexity": x + rng.uniform(0, 0.1),
                             "latency_ms": level - x + rng.uniform(0, 0.1), "hypervolume": hv[k],
                             "hv_regret": 1.0 - hv[k]})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def runs() -> pl.DataFrame:
    return _runs({"ehvi": 0.3, "rsbo": 0.25, "rs": 0.0, "ls": -0.1})


def test_holm_matches_its_definition() -> None:
    p = [0.01, 0.04, 0.03, 0.005]
    # sorted: 0.005*4, 0.01*3, 0.03*2, 0.04*1 -> 0.02, 0.03, 0.06, max(0.06, 0.04)
    assert compare.holm(p).tolist() == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert compare.holm([0.5, 0.9]).max() == 1.0
    assert np.isnan(compare.holm([0.01, np.nan])[1]) and compare.holm([0.01, np.nan])[0] == 0.01


def test_critical_difference_of_demsar() -> None:
    # Demšar (2006), Table 5: q_0.05 = 2.569 for k = 4; CD = q sqrt(k(k+1)/(6N))
    assert compare.critical_difference(4, 10) == pytest.approx(2.569 * np.sqrt(20 / 60),
                                                               abs=2e-3)
    assert compare.critical_difference(4, 40) < compare.critical_difference(4, 10)


def test_rank_tests_find_the_better_algorithms(runs: pl.DataFrame) -> None:
    final = final_runs(runs)
    friedman, ranks, pairwise = compare.rank_tests(final)
    row = friedman.row(0, named=True)
    assert (row["algorithms"], row["seeds"]) == (4, SEEDS)
    matrix = final.pivot(on="algorithm", index="seed", values="hypervolume").sort("seed")
    expected = stats.friedmanchisquare(*(matrix[a] for a in ("ehvi", "ls", "rs", "rsbo")))
    assert row["statistic"] == pytest.approx(expected.statistic)
    assert row["p_value"] < 0.001
    assert ranks["algorithm"].to_list()[-1] == "ls"
    assert ranks["mean_rank"].sum() == pytest.approx(4 * 5 / 2)  # ranks 1..4 per seed
    assert pairwise.height == 6
    worst = pairwise.filter((pl.col("algorithm_a") == "ehvi") & (pl.col("algorithm_b") == "ls"))
    assert worst["wins_a"][0] == SEEDS and worst["holm_different"][0]
    assert worst["p_holm"][0] == pytest.approx(min(1.0, worst["p_value"][0] * 6))
    assert (pairwise["p_holm"] >= pairwise["p_value"]).all()


def test_identical_algorithms_do_not_differ() -> None:
    final = final_runs(_runs({"a": 0.0, "b": 0.0}).with_columns(
        hypervolume=pl.col("seed") / 100, hv_regret=pl.lit(0.0)))
    friedman, _, pairwise = compare.rank_tests(final)
    assert np.isnan(friedman["p_value"][0])  # two algorithms: no Friedman test
    assert pairwise["p_value"][0] == 1.0 and not pairwise["holm_different"][0]


def test_one_seed_ranks_without_tests(tmp_path: Path) -> None:
    """One seed (a smoke run of the workflow): ranks, critical difference and the figures, no
    p-values."""
    runs = _runs({"a": 0.2, "b": 0.0, "c": 0.1}, seeds=1, evaluations=8)
    tables = compare.comparison_tables(runs, final_runs(runs),
                                       {"ppl-latency": ["perplexity", "latency_ms"]})
    assert tables["ranks"]["algorithm"].to_list() == ["a", "c", "b"]
    assert np.isnan(tables["friedman"]["p_value"][0])
    assert tables["pairwise"]["p_holm"].is_nan().all()
    assert not tables["pairwise"]["holm_different"].any()
    assert len(figures.critical_difference(tables["friedman"], tables["ranks"],
                                           tmp_path / "cd")) == 2
    assert len(figures.eaf_difference(tables["eafdiff"], tmp_path / "eaf")) == 2


def test_eaf_difference_of_the_best_two(runs: pl.DataFrame) -> None:
    _, ranks, _ = compare.rank_tests(final_runs(runs))
    eafdiff = compare.eaf_differences(runs, ranks, {"ppl-latency": ["perplexity", "latency_ms"]})
    assert set(eafdiff["algorithm_a"]) == {"ehvi"} and set(eafdiff["algorithm_b"]) == {"rsbo"}
    assert eafdiff.height > 0 and (eafdiff["difference"] != 0).all()
    assert eafdiff["difference"].abs().max() <= 1.0
    assert (eafdiff["x_low"] <= eafdiff["x_high"]).all()
    three = compare.eaf_differences(runs, ranks, {"ppl-latency": ["a", "b", "c"]})
    assert three.is_empty()


def test_comparison_figures_and_tables(tmp_path: Path) -> None:
    runs = _runs({"ehvi": 0.3, "rsbo": 0.25, "rs": 0.0, "ls": -0.1}, seeds=4, evaluations=8)
    tables = compare.comparison_tables(runs, final_runs(runs),
                                       {"ppl-latency": ["perplexity", "latency_ms"]})
    calls = {
        "hypervolume_time": lambda s: figures.hypervolume_time(runs, s),
        "critical_difference": lambda s: figures.critical_difference(
            tables["friedman"], tables["ranks"], s),
        "eaf_difference": lambda s: figures.eaf_difference(tables["eafdiff"], s),
    }
    for name, call in calls.items():
        paths = call(tmp_path / name)
        assert [p.name for p in paths] == [f"{name}.png", f"{name}.svg"]
        first = [p.read_bytes() for p in paths]
        assert len(first[0]) > 1000
        assert call(tmp_path / name) == paths and [p.read_bytes() for p in paths] == first
    assert figures.hypervolume_time(runs.drop("elapsed_s"), tmp_path / "none") == []
    none = figures.eaf_difference(tables["eafdiff"].clear(), tmp_path / "none")
    assert [p.name for p in none] == ["none.png", "none.svg"]  # says there is no difference
    ranked = figures.rank_table(tables["friedman"], tables["ranks"])
    assert ranked["algorithm"].to_list() == tables["ranks"]["algorithm"].to_list()
    assert ranked["critical_difference"].n_unique() == 1
    pairs = figures.pairwise_table(tables["pairwise"])
    assert pairs["p_holm"].is_sorted()



def test_equal_attainment_gives_no_rectangles(runs: pl.DataFrame) -> None:
    """The two best algorithms with the same points (as a tiny run can give) differ nowhere:
    no rectangles, and no error from moocore's empty difference."""
    twin = runs.filter(pl.col("algorithm") == "ehvi").with_columns(algorithm=pl.lit("twin"))
    both = pl.concat([runs.filter(pl.col("algorithm") != "rsbo"), twin])
    _, ranks, _ = compare.rank_tests(final_runs(both))
    assert set(compare.best_two(ranks, "ppl-latency", "cpu")) == {"ehvi", "twin"}
    metrics = {"ppl-latency": ["perplexity", "latency_ms"]}
    assert compare.eaf_differences(both, ranks, metrics).is_empty()
