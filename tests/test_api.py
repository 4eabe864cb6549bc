"""The surrogate stage and the query API on a small synthetic benchmark."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT, run, surrogate_settings
from hwgptbench import Benchmark
from hwgptbench.api import QueryError, closest_conditions, measured_default
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.predictors.features import analytic_counts
from hwgptbench.space import SearchSpace
from hwgptbench.surrogate.stage import merge_quality

SPACE = SearchSpace.from_dict("tiny", {
    "embed_dim": [64, 96, 128], "n_layer": [2, 3, 4], "n_head": [2, 4], "mlp_ratio": [2, 3, 4],
    "bias": [True, False], "head_size": 16, "block_size": 128, "rotary_fraction": 0.5})
VOCAB = 512
DEVICE = "cpu-test-2t"
SECTION = {"metrics": ["latency_ms", "energy_mj", "memory_peak_mb"], "families": ["lightgbm"],
           "default_family": "lightgbm",
           "lightgbm": {"num_iterations": 50, "num_leaves": 7, "min_data_in_leaf": 3},
           "mlp_ensemble": {}, "coverage": 0.9, "folds": 3, "min_rows": 10, "seed": 0}


FIDELITIES = [50, 100]  # train steps of a snapshot and of the final supernet


def synthetic_tables(n: int = 60) -> tuple[pl.DataFrame, pl.DataFrame]:
    """A perplexity table (a snapshot's perplexity 1.5x the final's) and a device table whose
    metrics follow size, with noise."""
    archs = SPACE.sample(n, seed=0)
    params, flops = analytic_counts(SPACE, SPACE.encode(archs), VOCAB, 1, 128)
    rng = np.random.default_rng(0)
    ids = [a.id for a in archs]
    final = 1e4 / np.log(params) ** 2 * rng.uniform(0.98, 1.02, n)
    perplexity = pl.concat([
        pl.DataFrame({"arch_id": ids, "params": params, "train_steps": steps,
                      "perplexity": final * factor})
        for steps, factor in zip(FIDELITIES, (1.5, 1.0), strict=True)])
    rows = pl.DataFrame({
        "device": DEVICE, "arch_id": ids, "batch_size": 1, "seq_len": 128, "dtype": "fp32",
        "launch": "eager", "status": "ok", "latency_ms": flops / 1e8 * rng.uniform(0.97, 1.03, n),
        "energy_mj": None, "energy_reason": "no RAPL here",
        "memory_peak_mb": params * 4 / 2**20 + 3, "memory_reason": None,
        "device_kind": "cpu", "device_name": "Test CPU", "cpu_model": "Test CPU",
        "gpu_memory_gb": None, "torch_version": "2.13.0"},
        schema_overrides={"energy_mj": pl.Float64, "gpu_memory_gb": pl.Float64,
                          "memory_reason": pl.String})
    return perplexity, rows


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("results")
    perplexity, device_table = synthetic_tables()
    scale = root / "tiny"
    scale.mkdir()
    perplexity.write_parquet(scale / "perplexity.parquet")
    device_table.write_parquet(scale / "measurements.parquet")
    folder = scale / "surrogates"
    q1 = surrogates.fit_perplexity(surrogate_settings(SECTION),
                                   SPACE, VOCAB, perplexity, folder / "perplexity")
    q2 = surrogates.fit_device(surrogate_settings(SECTION), SPACE, VOCAB, device_table,
                               folder / "devices" / DEVICE)
    merge_quality([folder / "perplexity" / "quality.parquet",
                              folder / "devices" / DEVICE / "quality.parquet"], "tiny",
                             folder / "quality.parquet", scale / "surrogate_quality.json")
    assert q1["status"].to_list() == ["ok", "ok"] and q2.height == 3
    return root


def test_quality_table_and_dvc_metrics(results: Path) -> None:
    quality = pl.read_parquet(results / "tiny" / "surrogates" / "quality.parquet")
    fitted = quality.filter(pl.col("status") == "ok")
    assert set(fitted["metric"]) == {"perplexity", "latency_ms", "memory_peak_mb"}
    assert (fitted["kendall_tau"] > 0.6).all() and (fitted["r2"] > 0.5).all()
    skipped = quality.filter(pl.col("metric") == "energy_mj").row(0, named=True)
    assert skipped["status"] == "skipped" and "no RAPL here" in skipped["reason"]
    metrics = json.loads((results / "tiny" / "surrogate_quality.json").read_text())
    assert set(metrics["latency_ms"][DEVICE]["b1-t128-fp32-eager"]["lightgbm"]) == {
        "r2", "mae", "kendall_tau", "spearman_rho", "within_5pct", "within_10pct", "mdape",
        "max_ape", "coverage", "selected"}
    assert set(metrics["perplexity"]["any"]) == {"any", "steps-50"}


def test_benchmark_describes_itself(results: Path) -> None:
    bench = Benchmark.load("tiny", results)
    assert bench.space == SPACE
    assert bench.devices == [DEVICE]
    assert bench.metrics == ["latency_ms", "memory_peak_mb", "perplexity"]
    assert bench.conditions(DEVICE) == ["b1-t128-fp32-eager"]
    assert bench.fidelities == FIDELITIES
    assert bench.sample(5, seed=1) == SPACE.sample(5, seed=1)


def test_batched_query_equals_single_queries(results: Path) -> None:
    bench = Benchmark.load("tiny", results)
    archs = bench.sample(50, seed=3)
    batch = bench.query(archs, ["perplexity", "latency_ms"], device=DEVICE,
                        return_interval=True)
    assert batch.columns == ["arch_id", "perplexity", "perplexity_lo", "perplexity_hi",
                             "latency_ms", "latency_ms_lo", "latency_ms_hi"]
    singles = pl.concat([bench.query([a], ["perplexity", "latency_ms"], device=DEVICE,
                                     return_interval=True) for a in archs])
    assert batch.equals(singles)
    assert (batch["latency_ms_lo"] <= batch["latency_ms"]).all()
    assert (batch["latency_ms"] <= batch["latency_ms_hi"]).all()
    by_id = bench.query([a.id for a in archs[:3]], "latency_ms", device=DEVICE)
    assert by_id.equals(batch.select("arch_id", "latency_ms").head(3))
    repeated = [archs[i] for i in (4, 0, 4, 7, 0, 4)]  # each distinct arch predicted once
    again = bench.query(repeated, ["perplexity", "latency_ms"], device=DEVICE,
                        return_interval=True)
    assert again.equals(batch[[4, 0, 4, 7, 0, 4]])


def test_measured_mode_returns_the_table_values(results: Path) -> None:
    bench = Benchmark.load("tiny", results)
    perplexity, device_table = synthetic_tables()
    unmeasured = next(a for a in SPACE.sample(200, seed=9)
                      if a.id not in set(device_table["arch_id"]))
    ids = device_table["arch_id"].to_list()[:10] + [unmeasured.id]
    table = bench.query(ids, ["latency_ms", "perplexity"], device=DEVICE, mode="measured")
    assert table["latency_ms"].to_list()[:10] == device_table["latency_ms"].to_list()[:10]
    by_steps = perplexity.partition_by("train_steps", as_dict=True)
    assert table["perplexity"].to_list()[:10] == by_steps[(100,)]["perplexity"].to_list()[:10]
    assert table.row(10) == (unmeasured.id, None, None)
    low = bench.query(ids, "perplexity", mode="measured", fidelity=50)
    assert low["perplexity"].to_list()[:10] == by_steps[(50,)]["perplexity"].to_list()[:10]


def test_fidelity_selects_the_perplexity_of_a_snapshot(results: Path) -> None:
    bench = Benchmark.load("tiny", results)
    archs = bench.sample(30, seed=4)
    final = bench.query(archs, ["perplexity", "latency_ms"], device=DEVICE)
    assert final.equals(bench.query(archs, ["perplexity", "latency_ms"], device=DEVICE,
                                    fidelity=100))
    low = bench.query(archs, ["perplexity", "latency_ms"], device=DEVICE, fidelity=50)
    assert low["latency_ms"].equals(final["latency_ms"])  # hardware ignores the fidelity
    ratio = (low["perplexity"] / final["perplexity"]).to_numpy()
    assert np.all((ratio > 1.3) & (ratio < 1.7))
    # the entry cache tells fidelities apart in either order of queries
    assert bench.query(archs, "perplexity").equals(final.select("arch_id", "perplexity"))
    with pytest.raises(QueryError, match=r"unknown fidelity 70; available \(training steps\): "
                                         r"50, 100"):
        bench.query(archs, "perplexity", fidelity=70)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"metrics": "flops_per_watt", "device": DEVICE}, "unknown metric 'flops_per_watt'; "
                                                      "available: latency_ms"),
    ({"metrics": "latency_ms", "device": "gpu-x"}, "unknown device 'gpu-x'; available: " + DEVICE),
    ({"metrics": "latency_ms", "device": DEVICE, "condition": "b8-t128-fp32-eager"},
     "available: b1-t128-fp32-eager"),
    ({"metrics": "latency_ms", "device": DEVICE, "mode": "guess"}, "unknown mode 'guess'"),
])
def test_unknown_names_list_what_is_available(results: Path, kwargs: dict, message: str
                                              ) -> None:
    bench = Benchmark.load("tiny", results)
    with pytest.raises(QueryError, match=message.replace("(", r"\(")):
        bench.query(bench.sample(2), **kwargs)


def test_one_device_and_the_measured_default_condition_need_no_naming(results: Path,
                                                                      tmp_path: Path) -> None:
    bench = Benchmark.load("tiny", results)
    archs = bench.sample(5, seed=2)
    named = bench.query(archs, "latency_ms", device=DEVICE, condition="b1-t128-fp32-eager")
    assert bench.query(archs, "latency_ms").equals(named)  # the only device and condition
    # several conditions: the one the measure params list first is taken ...
    entry = bench.index.filter(pl.col("metric") == "latency_ms")
    others = ["b1-t64-fp32-eager-decode16", "b1-t64-bf16-eager-train", "b4-t128-bf16-eager",
              "b1-t128-bf16-eager", "b1-t64-fp32-eager", "b1-t64-fp32-eager-int8",
              "b1-t64-fp32-eager-sdpa_math"]
    index = pl.concat([bench.index, *(entry.with_columns(condition=pl.lit(c)) for c in others)])
    params = tmp_path / ".params" / "measure.json"
    params.parent.mkdir()
    measure = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["measure"]
    params.write_text(json.dumps({"measure": measure | {
        "batch_sizes": [1, 4], "seq_lens": [128], "dtypes": ["fp32", "bf16"],
        "launch": ["eager", "cuda_graph"]}}))  # as the workflow writes the section
    default = measured_default(params)
    assert default == "b1-t128-fp32-eager"
    several = replace(bench, index=index, default_condition=default, _entries={})
    assert several.query(archs, "latency_ms").equals(named)
    # ... and without measure params the error shows the likeliest few first
    unknown = replace(several, default_condition=None, _entries={})
    with pytest.raises(QueryError, match=r"several conditions for 'latency_ms'; choose one, "
                                         r"e.g. b1-t64-fp32-eager, .* \(\+3 more"):
        unknown.query(archs, "latency_ms")
    assert closest_conditions(others, default)[:3] == [  # 3 of 4 parts alike, then 2
        "b1-t64-fp32-eager", "b1-t128-bf16-eager", "b1-t64-fp32-eager-int8"]


def test_best_family_is_the_one_each_quality_table_selected(tmp_path: Path) -> None:
    perplexity, device_table = synthetic_tables()
    section = {**SECTION, "families": ["lightgbm", "mlp_ensemble"],
               "mlp_ensemble": {"members": 2, "epochs": 60, "hidden": 16}}
    folder = tmp_path / "tiny" / "surrogates"
    surrogates.fit_perplexity(surrogate_settings(section),
                              SPACE, VOCAB, perplexity, folder / "perplexity")
    quality = surrogates.fit_device(surrogate_settings(section), SPACE, VOCAB, device_table,
                                    folder / "devices" / DEVICE)
    fitted = quality.filter(pl.col("status") == "ok")
    assert fitted.group_by("metric", "condition").agg(pl.col("selected").sum())[
        "selected"].to_list() == [1, 1]  # latency and memory: one family each
    best = Benchmark.load("tiny", tmp_path)
    chosen = best.selection.filter(pl.col("device") == DEVICE).select(
        "metric", "condition", "family").sort("metric")
    assert chosen.rows() == fitted.filter("selected").select(
        "metric", "condition", "family").sort("metric").rows()
    archs = SPACE.sample(5, seed=9)
    for metric, _, family in chosen.rows():
        forced = Benchmark.load("tiny", tmp_path, family=family)
        assert best.query(archs, metric, device=DEVICE).equals(
            forced.query(archs, metric, device=DEVICE))
        assert set(forced.used()["family"]) == {family}
    assert set(best.used()["metric"]) == set(chosen["metric"])


def test_missing_surrogates_and_unknown_family(results: Path, tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no surrogates"):
        Benchmark.load("tiny", tmp_path)
    with pytest.raises(QueryError, match="unknown surrogate family 'xgb'; available: best, "
                                         "lightgbm"):
        Benchmark.load("tiny", results, family="xgb")


def test_cli_query(results: Path, tmp_path: Path) -> None:
    bench = Benchmark.load("tiny", results)
    ids = [a.id for a in bench.sample(4, seed=5)]
    (tmp_path / "archs.txt").write_text("\n".join(ids[1:]) + "\n")
    out = tmp_path / "q.csv"
    run(["hwgptbench", "query", "--results", str(results), "--scale", "tiny", "--device", DEVICE,
         "--metric", "latency_ms", "--metric", "perplexity", "--arch", ids[0],
         "--archs-file", "archs.txt", "--out", str(out)], tmp_path)
    table = pl.read_csv(out)
    expected = bench.query(ids, ["latency_ms", "perplexity"], device=DEVICE)
    assert table["arch_id"].to_list() == ids
    assert all(math.isclose(a, b, rel_tol=1e-9)
               for a, b in zip(table["latency_ms"], expected["latency_ms"], strict=True))
    printed = run(["hwgptbench", "query", "--results", str(results), "--metric", "perplexity",
                   "--arch", ids[0]], tmp_path).stdout
    assert ids[0] in printed
    bad = run(["hwgptbench", "query", "--results", str(results), "--metric", "latency_ms",
               "--device", DEVICE, "--arch", "e7-l1-h1-r1-b1"], tmp_path, check=False)
    assert bad.returncode == 2 and "embed_dim" in bad.stderr


def test_out_of_fold_predictions_are_merged(results: Path) -> None:
    predictions = pl.read_parquet(results / "tiny" / "surrogates" / "predictions.parquet")
    latency = predictions.filter(pl.col("metric") == "latency_ms")
    device_table = pl.read_parquet(results / "tiny" / "measurements.parquet")
    assert latency.height == device_table.height
    joined = latency.join(device_table, on="arch_id")
    assert np.allclose(joined["measured"], joined["latency_ms"])
    assert (latency["lower"] <= latency["upper"]).all()
    assert not predictions.filter(pl.col("metric") == "energy_mj").height  # not measured


def test_latency_quality_carries_the_ceiling_of_its_repeat_visit(tmp_path: Path) -> None:
    """A device table with repeat visits: each latency surrogate's quality row holds the
    repeat's agreement and whether the surrogate reaches it; a table without them has none."""
    _, device_table = synthetic_tables()
    rng = np.random.default_rng(1)
    repeat = device_table["latency_ms"] * rng.uniform(0.95, 1.05, device_table.height) * 1.1
    repeated = device_table.with_columns(
        latency_repeat_ms=pl.when(pl.int_range(pl.len()) % 3 == 0).then(repeat))
    quality = surrogates.fit_device(surrogate_settings(SECTION),
                                    SPACE, VOCAB, repeated, tmp_path / "with")
    latency = quality.filter(pl.col("metric") == "latency_ms").row(0, named=True)
    pairs = repeated.filter(pl.col("latency_repeat_ms").is_not_null())
    expected = surrogates.latency_ceiling(repeated)
    assert expected is not None and latency["ceiling_archs"] == pairs.height == 20
    assert latency["ceiling_kendall_tau"] == pytest.approx(expected["kendall_tau"])
    assert 0 < latency["ceiling_within_5pct"] <= 1  # the 10% speed shift is divided out
    assert latency["at_ceiling"] == (latency["kendall_tau"]
                                     >= latency["ceiling_kendall_tau"] - 0.02)
    memory = quality.filter(pl.col("metric") == "memory_peak_mb").row(0, named=True)
    assert memory["ceiling_archs"] is None and memory["at_ceiling"] is None
    plain = surrogates.fit_device(surrogate_settings(SECTION),
                                  SPACE, VOCAB, device_table, tmp_path / "without")
    assert plain["ceiling_kendall_tau"].is_null().all()
