"""params/hwgptbench.yaml: the workflow on HW-GPT-Bench's s space with its published
perplexities imported (no data or supernet stage) and the archs sampled from them."""

from __future__ import annotations

import json
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import MARGIN, REPO_ROOT, make_project, run
from hwgptbench import params
from hwgptbench.hwgpt_source import FILES
from hwgptbench.space import Arch, SearchSpace
from hwgptbench.supernet import archs
from test_hwgpt_import import _commit, _row
from test_paper_scale import job_counts

OVERLAY = yaml.safe_load((REPO_ROOT / "params" / "hwgptbench.yaml").read_text())
S_SPACE = SearchSpace.from_dict("s", params.load(REPO_ROOT / "params.yaml")["spaces"]["s"])
# the make target's commands (Makefile, hwgptbench:), with a small overlay after the shipped one
SNAKEMAKE = ["snakemake", "--configfile", "params/hwgptbench.yaml", "small.yaml",
             "--resources", "dvc=1"]


@pytest.mark.e2e
def test_overlay_dag_imports_perplexity_and_samples_from_it(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    out = run(["snakemake", "--configfile", "params/hwgptbench.yaml", "-n"], project).stdout
    counts = job_counts(out)
    assert not {"data", "supernet", "compress", "compress_dense"} & set(counts)
    assert counts["perplexity"] == counts["sample_archs"] == counts["measure"] == 1
    searches = len(OVERLAY["search"]["objectives"]) * len(OVERLAY["search"]["algorithms"])
    assert counts["search"] == searches == 14
    assert "hwgptbench fetch-hwgptbench --scale s" in out
    assert "--rev 795cba8124826acc600df1bd2bb516b22f207671" in out
    assert "--from-table results/s/perplexity.parquet" in out
    assert "--vocab-size 50304" in out and "--data " not in out


@pytest.mark.e2e
def test_overlay_selects_m_and_l(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    (project / "ml.yaml").write_text(yaml.safe_dump({"workflow": {"scales": ["m", "l"]}}))
    out = run(["snakemake", "--configfile", "params/hwgptbench.yaml", "ml.yaml", "-n"],
              project).stdout
    counts = job_counts(out)
    assert counts["perplexity"] == counts["measure"] == counts["figures_of_scale"] == 2
    assert "fetch-hwgptbench --scale m" in out and "fetch-hwgptbench --scale l" in out


def test_overlay_names_unpublished_scales_and_single_fidelity_algorithms(tmp_path: Path
                                                                         ) -> None:
    extra = tmp_path / "extra.yaml"
    extra.write_text(yaml.safe_dump({"workflow": {"scales": ["tiny", "s"]},
                                     "search": {"algorithms": ["rs", "moasha"]}}))
    with pytest.raises(params.ParamsError) as error:
        params.load_overlaid(REPO_ROOT / "params.yaml",
                             [REPO_ROOT / "params/hwgptbench.yaml", extra])
    message = str(error.value)
    assert "workflow.scales: ['tiny'] have no published perplexities" in message
    assert "search.algorithms: moasha needs perplexities at several training steps" in message


def test_sample_from_keeps_the_extremes_and_draws_the_rest_from_the_candidates() -> None:
    candidates = [a.id for a in S_SPACE.sample(40, seed=3)]
    table = archs.sample_from(S_SPACE, candidates, 10, seed=1, vocab_size=50304)
    assert table.height == 12 and table["arch_id"].n_unique() == 12
    assert set(table["arch_id"]) <= set(candidates)
    counts = {i: S_SPACE.n_params(Arch.from_id(i), 50304) for i in candidates}
    ends = dict(zip(table["kind"][:2], table["arch_id"][:2], strict=True))
    assert counts[ends["smallest"]] == min(counts.values())
    assert counts[ends["largest"]] == max(counts.values())
    again = archs.sample_from(S_SPACE, candidates, 10, seed=1, vocab_size=50304)
    assert again["arch_id"].to_list() == table["arch_id"].to_list()
    assert archs.sample_from(S_SPACE, candidates, 100, seed=1, vocab_size=50304).height == 40


def test_sample_archs_of_a_shipped_device_takes_the_archs_it_measured(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from hwgptbench import published
    from hwgptbench.cli import main

    def sample(label: str) -> int:
        overlay = tmp_path / f"{label}.yaml"
        overlay.write_text(yaml.safe_dump({"sample": {"n_archs": 500, "archs_of": label}}))
        return main(["sample", "--scale", "l", "--params", str(REPO_ROOT / "params.yaml"),
                     "--params", str(overlay), "--vocab-size", "50304", "--from-table",
                     str(published.FOLDER / published.perplexity_file("l")),
                     "--out", str(tmp_path / "archs.parquet")])

    h100 = "cuda-nvidia-h100-80gb-hbm3"
    assert sample(h100) == 0
    measured = set(published.device_tables("l")[h100]["arch_id"])
    assert set(pl.read_parquet(tmp_path / "archs.parquet")["arch_id"]) == measured
    assert len(measured) == 100
    assert sample("cpu-elsewhere") == 2
    err = capsys.readouterr().err
    assert "sample.archs_of: 'cpu-elsewhere' has no table shipped at scale 'l'" in err
    assert h100 in err and "null to sample from the space" in err


def _upstream(path: Path, n: int) -> str:
    """A git repository laid out as HW-GPT-Bench's: ``n`` s archs whose perplexity falls with
    their size; every other published file empty. Returns the commit."""
    path.mkdir()
    run(["git", "init", "-q", "-b", "main"], path)
    s_archs = S_SPACE.sample(n, seed=5)
    counts = [S_SPACE.n_params(a, 50304) for a in s_archs]
    rows = {p: [] for paths in FILES.values() for p in paths}
    rows["arch_ppl_bench_s/ppl.pkl"] = [_row("s", a, 60.0 - c / 4e6)
                                        for a, c in zip(s_archs, counts, strict=True)]
    return _commit(path, rows, "published")


@pytest.mark.e2e
@pytest.mark.slow
def test_make_hwgptbench_runs_import_measure_surrogates_search_figures_and_resumes(
        tmp_path: Path) -> None:
    project = make_project(tmp_path)
    commit = _upstream(tmp_path / "upstream", 30)
    small = {
        "perplexity": {"hwgptbench": {"url": str(tmp_path / "upstream"), "rev": commit,
                                      "source_url": "https://github.com/automl/HW-GPT-Bench"}},
        "sample": {"n_archs": 6},
        "measure": {"warmup": 1, "min_repeats": 3, "max_repeats": 5, "max_seconds": 0.1,
                    "energy_window_s": 0.2},
        "runtime": {"n_archs": 2, "warmup": 1, "min_repeats": 3, "max_repeats": 4,
                    "max_seconds": 0.05, "options": {"quant": []},
                    "breakdown": {"n_archs": 1, "repeats": 2}},
        "surrogate": {"families": ["lightgbm"], "min_rows": 4, "folds": 2},
        "search": {"budget": 6, "seeds": 1, "reference_archs": 500,
                   "algorithms": ["rs", "nsga2", "rsbo"],
                   "options": {"bo": {"initial": 3, "candidates": 20}}},
    }
    (project / "small.yaml").write_text(yaml.safe_dump(small))
    run(SNAKEMAKE, project, baseline_s=1800 / MARGIN)  # its former fixed limit: a slow test
    results = project / "results" / "s"
    perplexity = pl.read_parquet(results / "perplexity.parquet")
    assert perplexity.height == 30
    assert set(perplexity["source"]) == {f"github.com/automl/HW-GPT-Bench@{commit}"}
    report = json.loads((results / "perplexity.import.json").read_text())
    assert report["rows"] == 30
    sampled = pl.read_parquet(results / "archs.parquet")
    assert sampled.height == 8 and set(sampled["arch_id"]) <= set(perplexity["arch_id"])
    measured = pl.read_parquet(results / "measurements.parquet")
    assert set(measured["arch_id"]) == set(sampled["arch_id"])
    assert (measured.filter(pl.col("status") == "ok")["latency_ms"] > 0).all()
    quality = pl.read_parquet(results / "surrogates" / "quality.parquet")
    ppl = quality.filter(pl.col("metric") == "perplexity", pl.col("status") == "ok")
    assert ppl["rows"].to_list() == [30]
    final = pl.read_parquet(results / "search" / "final.parquet")
    assert set(final["objectives"]) == {"ppl-latency", "ppl-memory"}
    assert (results / "figures" / "pareto_latency.png").exists()
    assert not (results / "figures" / "supernet_loss.png").exists()
    assert not (project / "results" / "data").exists()
    pointer = yaml.safe_load((project / "data/hwgptbench/arch_ppl_bench_s/ppl.pkl.dvc")
                             .read_text())
    assert pointer["deps"][0]["repo"]["rev_lock"] == commit
    assert "up to date" in run(["dvc", "status", "data/hwgptbench/arch_ppl_bench_s/ppl.pkl.dvc"],
                               project).stdout
    # interrupted or not, a rerun does what is left: here nothing
    assert "Nothing to be done" in run([*SNAKEMAKE, "-n"], project).stdout
