"""Few-shot transfer: determinism, the k = all limit, no leakage from the held-out target, clear
errors, `hwgptbench adapt` + queries on the new device, and the rule and figure wiring."""

from __future__ import annotations

import json
from pathlib import Path
from typing import get_args

import numpy as np
import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT, make_project, run
from hwgptbench import Benchmark, cli, params
from hwgptbench.adaptation.methods import METHODS, make_method, method_from_state
from hwgptbench.adaptation.sources import condition_features, cross_fitted
from hwgptbench.adaptation.targets import Profiles, TransferError, long_table
from hwgptbench.figures.transfer import shipped_targets, transfer_quality, transfer_table
from hwgptbench.params import section_of
from hwgptbench.predictors.features import analytic_counts
from hwgptbench.predictors.quality import fold_indices
from hwgptbench.settings.sections import TransferMethod, TransferSettings
from hwgptbench.space import Arch, SearchSpace
from hwgptbench.transfer.adapt import adapt_device
from hwgptbench.transfer.evaluate import (
    Case,
    adapt_predictions,
    evaluate,
    held_out_case,
    report,
    retest,
    scores,
    shipped_per_target,
    shipped_tables,
    source_indices,
    summarize,
)
from hwgptbench.transfer.selection import SelectionError, select

CONFIG = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
SPACE = SearchSpace.from_dict("tiny", CONFIG["spaces"]["tiny"])
VOCAB = 512
# (device, hardware, batch, seq, dtype, per-layer overhead ms, ms per GFLOP, ms per M params)
TARGETS = [("cpu-a-1t", "CPU A", 1, 128, "fp32", 0.10, 8.0, 0.5),
           ("cpu-a-1t", "CPU A", 4, 128, "fp32", 0.10, 7.0, 0.5),
           ("cpu-a-1t", "CPU A", 1, 32, "bf16", 0.20, 5.0, 1.5),
           ("cpu-a-2t", "CPU A", 1, 128, "fp32", 0.15, 4.5, 0.4),
           ("cpu-a-2t", "CPU A", 4, 32, "fp32", 0.15, 4.0, 0.4),
           ("gpu-b", "GPU B", 1, 128, "fp32", 0.30, 0.2, 0.05)]
SECTION = section_of(TransferSettings, {
    **CONFIG["transfer"], "metrics": ["latency_ms"], "ks": [2, 10], "seeds": 2, "min_test": 10,
    "folds": 3, "source_model": {"num_iterations": 60, "num_leaves": 7, "min_data_in_leaf": 3}})


def synthetic_measurements(n: int = 60, targets: list[tuple] = TARGETS) -> pl.DataFrame:
    """Device tables whose latency is a per-layer overhead plus FLOPs and parameter terms,
    weighted per target, with 2% noise."""
    archs = SPACE.sample(n, seed=3)
    encoded = SPACE.encode(archs)
    rng = np.random.default_rng(0)
    tables = []
    for device, hardware, batch, seq, dtype, overhead, per_gflop, per_mparam in targets:
        params_, flops = analytic_counts(SPACE, encoded, VOCAB, batch, seq)
        latency = (overhead * encoded[:, 1] + per_gflop * flops / 1e9
                   + per_mparam * params_ / 1e6) * rng.lognormal(0, 0.02, n)
        tables.append(pl.DataFrame({
            "device": device, "device_name": hardware, "arch_id": [a.id for a in archs],
            "batch_size": batch, "seq_len": seq, "dtype": dtype, "launch": "eager",
            "status": "ok", "latency_ms": latency, "energy_mj": None},
            schema_overrides={"energy_mj": pl.Float64}))
    return pl.concat(tables)


@pytest.fixture(scope="module")
def measurements() -> pl.DataFrame:
    return synthetic_measurements()


@pytest.fixture(scope="module")
def quality(measurements: pl.DataFrame) -> pl.DataFrame:
    return evaluate(measurements, SPACE, VOCAB, SECTION)


def test_evaluation_covers_every_target_method_and_baseline(quality: pl.DataFrame) -> None:
    assert set(quality["hold_out"]) == {"target", "device"}
    ok = quality.filter(pl.col("status") == "ok", pl.col("hold_out") == "target")
    assert ok.filter(pl.col("method") == "full_surrogate").height == len(TARGETS)
    per_target = ok.filter(pl.col("k") == 10).group_by("device", "condition").agg(
        pl.col("method").unique().sort())
    assert per_target.height == len(TARGETS)
    expected = sorted([*SECTION.methods, "flops", "params", "nearest_source"])
    assert all(sorted(m) == expected for m in per_target["method"])
    # one designed selection and `seeds` random ones per (target, k, method)
    counts = ok.filter(pl.col("method") == "ensemble").group_by("selection").len()
    assert dict(counts.iter_rows()) == {"designed": len(TARGETS) * 2,
                                        "random": len(TARGETS) * 2 * SECTION.seeds}
    gpu = ok.filter(pl.col("device") == "gpu-b").row(0, named=True)
    assert (gpu["hardware"], gpu["sources"], gpu["sources_same_hardware"]) == ("GPU B", 5, 0)
    # holding out the device: none of cpu-a-1t's conditions is a source of another
    new_device = quality.filter(pl.col("hold_out") == "device", pl.col("device") == "cpu-a-1t")
    assert set(new_device["sources"]) == {3} and set(new_device["sources_same_hardware"]) == {2}
    # the learned transfer beats the proxies on ±10% here, where all targets share a structure
    summary = summarize(quality, [10]).filter(pl.col("selection") != "random",
                                              pl.col("hold_out") == "target")
    within = dict(summary.select("method", "within_10pct_median").iter_rows())
    assert within["ensemble"] > max(within["flops"], within["params"]) + 0.2


def test_adaptation_is_deterministic(measurements: pl.DataFrame, quality: pl.DataFrame) -> None:
    again = evaluate(measurements, SPACE, VOCAB, SECTION)
    assert again.equals(quality)


def test_with_k_all_archs_adaptation_matches_the_full_surrogate(
        measurements: pl.DataFrame) -> None:
    """Adapted from all of a target's archs outside a fold (k = all), a method predicts the
    fold as well as the per-target surrogate cross-validated on the same folds."""
    profiles = Profiles.from_long(long_table(measurements, ["latency_ms"]))
    encoded = SPACE.encode([Arch.from_id(a) for a in profiles.arch_ids])
    oof = cross_fitted(profiles, encoded, SPACE, VOCAB, SECTION.source_model, 3, 0)
    for j in range(len(profiles.targets)):
        _, case = _case(measurements, j)
        full = scores(np.exp(case.z), np.exp(oof[case.rows, j]))
        for name in ("ensemble", "table_prior"):
            method = make_method(name, SECTION.sigma_floor)
            method.prepare(case.reference)
            predicted = np.empty(len(case.z))
            for held_out in fold_indices(len(case.z), 3, 0):
                train = np.setdiff1d(np.arange(len(case.z)), held_out)
                predicted[held_out] = adapt_predictions(case, method, train)[held_out]
            adapted = scores(np.exp(case.z), np.exp(predicted))
            assert adapted["spearman"] >= full["spearman"] - 0.02, (name, j, adapted, full)
            assert adapted["within_10pct"] >= full["within_10pct"] - 0.05, (name, j)


def _case(measurements: pl.DataFrame, j: int) -> tuple[Profiles, Case]:
    """Target j of the table held out, as the evaluation holds it out."""
    profiles = Profiles.from_long(long_table(measurements, ["latency_ms"]))
    encoded = SPACE.encode([Arch.from_id(a) for a in profiles.arch_ids])
    features = condition_features(SPACE, encoded, VOCAB, profiles.targets)
    oof = cross_fitted(profiles, encoded, SPACE, VOCAB, SECTION.source_model, 3, 0)
    return profiles, held_out_case(profiles, oof, features[j], j,
                                   source_indices(profiles, j, "target"))


def test_leave_one_target_out_never_sees_the_held_out_values(
        measurements: pl.DataFrame) -> None:
    """Replacing the held-out target's values outside its k measured archs by noise changes no
    prediction of any method; the noise itself cannot be predicted."""
    j, k = 3, 10
    profiles, case = _case(measurements, j)
    target = profiles.targets[j]
    chosen = select("designed", case.features, k)
    keep = {profiles.arch_ids[case.rows[i]] for i in chosen}
    rng = np.random.default_rng(7)
    condition = target.condition
    is_target = ((pl.col("device") == target.device)
                 & (pl.col("batch_size") == condition.batch_size)
                 & (pl.col("seq_len") == condition.seq_len) & (pl.col("dtype") == condition.dtype))
    scrambled = measurements.with_columns(latency_ms=pl.when(
        is_target & ~pl.col("arch_id").is_in(list(keep))).then(
        pl.lit(rng.uniform(1, 100, measurements.height))).otherwise(pl.col("latency_ms")))
    _, noisy = _case(scrambled, j)
    assert not np.allclose(noisy.z, case.z)  # the target's own values did change
    for name in SECTION.methods:
        clean_method, noisy_method = (make_method(name, SECTION.sigma_floor) for _ in range(2))
        clean_method.prepare(case.reference)
        noisy_method.prepare(noisy.reference)
        clean = adapt_predictions(case, clean_method, chosen)
        assert np.array_equal(clean, adapt_predictions(noisy, noisy_method, chosen)), name
        test = np.setdiff1d(np.arange(len(case.z)), chosen)
        leaked = np.corrcoef(clean[test], noisy.z[test])[0, 1]
        assert abs(leaked) < 0.4, (name, leaked)  # a leaking method would track the noise


def test_a_single_target_gives_an_empty_table_with_the_reason() -> None:
    one = synthetic_measurements(30, TARGETS[:1])
    table = evaluate(one, SPACE, VOCAB, SECTION)
    assert table.height == 1 and table["status"][0] == "skipped"
    assert "1 measured target" in table["reason"][0] and "at least 2" in table["reason"][0]
    assert summarize(table).is_empty()
    assert transfer_table(report(table, 10), table)["reason"][0] == table["reason"][0]


def test_runtime_workloads_are_targets_of_their_own(measurements: pl.DataFrame) -> None:
    """Runtime-stage rows (workload and option columns) stack with measure-stage rows: each
    workload is its own target, named by its full condition id; a pair measured twice is an
    error."""
    prefill = measurements.filter(pl.col("device") == "cpu-a-1t", pl.col("batch_size") == 1,
                                  pl.col("seq_len") == 128)
    decode = prefill.with_columns(pl.lit("decode").alias("workload"), pl.lit(16).alias("gen_len"),
                                  pl.lit("none").alias("quant"), pl.col("latency_ms") / 10)
    int8 = prefill.with_columns(pl.lit("prefill").alias("workload"), pl.lit(0).alias("gen_len"),
                                pl.lit("int8").alias("quant"))
    stacked = pl.concat([prefill, decode, int8], how="diagonal_relaxed")
    profiles = Profiles.from_long(long_table(stacked, ["latency_ms"]))
    column = {t.condition.id: j for j, t in enumerate(profiles.targets)}
    assert set(column) == {"b1-t128-fp32-eager", "b1-t128-fp32-eager-int8",
                           "b1-t128-fp32-eager-decode16"}
    np.testing.assert_allclose(profiles.values[:, column["b1-t128-fp32-eager-decode16"]] * 10,
                               profiles.values[:, column["b1-t128-fp32-eager"]])
    with pytest.raises(TransferError, match=r"measure an arch of a target twice.*"
                                            r"latency_ms/cpu-a-1t/b1-t128-fp32-eager-int8"):
        long_table(pl.concat([stacked, int8], how="diagonal_relaxed"), ["latency_ms"])


def test_retest_scores_a_re_measurement_against_the_first(measurements: pl.DataFrame) -> None:
    same = retest(measurements, measurements, ["latency_ms"])
    assert same.height == len(TARGETS) and set(same["n"]) == {60}
    assert same["spearman"].min() == 1.0 and same["mdape"].max() == 0.0
    rng = np.random.default_rng(1)
    again = measurements.with_columns(pl.col("latency_ms") * rng.lognormal(0, 0.05, len(
        measurements))).filter(pl.col("arch_id") != measurements["arch_id"][0])
    noisy = retest(measurements, again, ["latency_ms"])
    assert set(noisy["n"]) == {59}  # archs measured in both only
    assert (noisy["spearman"] < 1).all() and (noisy["within_10pct"] < 1).all()
    assert "b1-t128-fp32-eager" in set(noisy["condition"])


def test_k_beyond_the_measured_archs_is_a_clear_error(measurements: pl.DataFrame,
                                                      tmp_path: Path) -> None:
    new = measurements.filter(pl.col("device") == "gpu-b").head(7)
    sources = measurements.filter(pl.col("device") != "gpu-b")
    with pytest.raises(TransferError, match=r"7 measured archs, fewer than k = 10"):
        adapt_device(SECTION, SPACE, VOCAB, sources, new, "gpu-b", 10, tmp_path)
    with pytest.raises(SelectionError, match="12 archs to measure, but only 5 candidates"):
        select("random", np.zeros((5, 19)), 12)


def test_cli_adapt_from_a_file_then_query_the_new_device(
        measurements: pl.DataFrame, shakespeare: Path, tmp_path: Path) -> None:
    table = measurements
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    table.filter(pl.col("device") != "gpu-b").write_parquet(results / "tiny" /
                                                             "measurements.parquet")
    new_file = tmp_path / "new.parquet"
    table.filter(pl.col("device") == "gpu-b").write_parquet(new_file)
    code = cli.main(["adapt", "--params", str(REPO_ROOT / "params.yaml"), "--scale", "tiny",
                     "--results", str(results), "--device", "my-gpu", "--k", "10",
                     "--measurements", str(new_file), "--data", str(shakespeare)])
    assert code == 0
    bench = Benchmark.load("tiny", results)
    assert bench.devices == ["my-gpu"]
    condition = "b1-t128-fp32-eager"
    archs = bench.sample(50, seed=1)
    predicted = bench.query(archs, "latency_ms", device="my-gpu", condition=condition,
                            return_interval=True)
    assert predicted["latency_ms"].is_finite().all() and (predicted["latency_ms"] > 0).all()
    assert (predicted["latency_ms_lo"] < predicted["latency_ms"]).all()
    measured = bench.query(table["arch_id"].head(60).to_list(), "latency_ms", device="my-gpu",
                           condition=condition, mode="measured")
    assert measured["latency_ms"].null_count() == 0  # the rows given are the measured values
    out = tmp_path / "q.csv"
    run(["hwgptbench", "query",
         "--scale", "tiny", "--results", str(results), "--device", "my-gpu", "--metric",
         "latency_ms", "--condition", condition, "--arch", archs[0].id, "--out", str(out)],
        tmp_path)
    assert pl.read_csv(out)["latency_ms"][0] == pytest.approx(predicted["latency_ms"][0])


def test_runtime_tables_join_the_evaluation_and_adaptation(
        measurements: pl.DataFrame, shakespeare: Path, tmp_path: Path) -> None:
    """`hwgptbench transfer --runtime` evaluates runtime workloads as targets; a decode
    condition of a new device is adapted and queried by its condition id."""
    decode = measurements.filter(pl.col("batch_size") == 1, pl.col("seq_len") == 128).with_columns(
        pl.lit("decode").alias("workload"), pl.lit(16).alias("gen_len"),
        (pl.col("latency_ms") / 8).alias("latency_ms"))
    measured, runtime = tmp_path / "measurements.parquet", tmp_path / "runtime.parquet"
    measurements.write_parquet(measured)
    decode.filter(pl.col("device") != "gpu-b").write_parquet(runtime)
    out = tmp_path / "quality.parquet"
    files = ["--params", str(REPO_ROOT / "params.yaml"), "--scale", "tiny", "--data",
             str(shakespeare)]
    assert cli.main(["transfer", *files, "--measurements", str(measured), "--runtime",
                     str(runtime), "--out", str(out), "--summary-out",
                     str(tmp_path / "summary.parquet")]) == 0
    quality = pl.read_parquet(out).filter(pl.col("status") == "ok")
    assert "b1-t128-fp32-eager-decode16" in set(quality["condition"])
    results = tmp_path / "results"
    adapt_device(SECTION, SPACE, VOCAB, pl.concat([measurements, decode], how="diagonal_relaxed")
                 .filter(pl.col("device") != "gpu-b"), decode.filter(pl.col("device") == "gpu-b"),
                 "new-gpu", 10, results / "tiny" / "adapted")
    bench = Benchmark.load("tiny", results)
    predicted = bench.query(bench.sample(20, seed=2), "latency_ms", device="new-gpu",
                            condition="b1-t128-fp32-eager-decode16")
    assert (predicted["latency_ms"] > 0).all()


def test_cli_adapt_measures_k_archs_on_this_machine(
        measurements: pl.DataFrame, shakespeare: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Without --measurements, adapt measures k archs through the measurement stage's code,
    under the label of this machine (a label naming other hardware is refused), and with
    --validate N, N more that the fit does not see and that score it."""
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    measurements.write_parquet(results / "tiny" / "measurements.parquet")
    pl.DataFrame({"arch_id": [a.id for a in SPACE.sample(20, seed=5)]}).write_parquet(
        results / "tiny" / "archs.parquet")
    quick = {**CONFIG["measure"], "batch_sizes": [1], "seq_lens": [32], "dtypes": ["fp32"],
             "warmup": 0, "min_repeats": 3, "max_repeats": 3, "max_seconds": 0.01,
             "memory": False, "contention": {**CONFIG["measure"]["contention"],
                                             "max_ci_rel": 100.0, "max_wall_cpu_ratio": 100.0,
                                             "max_runqueue_wait": 1.0, "wait_s": 0.0}}
    overlay = tmp_path / "quick.yaml"
    overlay.write_text(yaml.safe_dump({"measure": quick}))
    args = ["adapt", "--params", str(REPO_ROOT / "params.yaml"), "--params", str(overlay),
            "--scale", "tiny", "--results", str(results), "--k", "4", "--data",
            str(shakespeare)]
    assert cli.main([*args, "--device", "some-gpu"]) == 2
    assert "does not match the detected hardware" in capsys.readouterr().err
    assert cli.main([*args, "--device", "auto", "--validate", "3"]) == 0
    bench = Benchmark.load("tiny", results)
    (label,) = bench.devices
    folder = results / "tiny" / "adapted" / label
    table = pl.read_parquet(folder / "measurements.parquet")
    assert table.height == 7 and (table["latency_ms"] > 0).all()
    fitted = json.loads((folder / "latency_ms" / "b1-t32-fp32-eager" / "adapted" /
                         "metadata.json").read_text())["transfer"]["measured_archs"]
    assert len(fitted) == 4 and set(fitted) < set(table["arch_id"])
    summary = json.loads((folder / "adapted.json").read_text())
    assert summary["default_condition"] == "b1-t32-fp32-eager"
    assert [e["validation_archs"] for e in summary["estimate"]] == [3]
    assert "on the validation archs, which the fit did not see" in capsys.readouterr().out
    assert bench.query(bench.sample(5), "latency_ms", device=label)["latency_ms"].is_finite().all()


def test_transfer_params_are_checked_across_fields() -> None:
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    doc["transfer"]["report_k"] = 7
    with pytest.raises(params.ParamsError, match=r"transfer.report_k: 7 is not one of "
                                                 r"transfer.ks"):
        params.validate(doc)


def test_figure_and_table_of_a_small_evaluation(quality: pl.DataFrame, tmp_path: Path) -> None:
    summary = report(quality, 10)
    paths = transfer_quality(summary, quality, tmp_path / "transfer_quality")
    assert [p.suffix for p in paths] == [".png", ".svg"] and all(p.stat().st_size for p in paths)
    first = paths[0].read_bytes()
    transfer_quality(summary, quality, tmp_path / "transfer_quality")
    assert paths[0].read_bytes() == first
    table = transfer_table(summary, quality)
    assert {"meta_ridge", "full_surrogate", "flops"} <= set(table["method"])


@pytest.mark.e2e
def test_snakemake_plans_the_transfer_rule(tmp_path: Path) -> None:
    project = make_project(tmp_path)
    out = run(["snakemake", "-n", "results/tiny/transfer/quality.parquet"], project).stdout
    assert "rule transfer:" in out
    out = run(["snakemake", "-n", "results/tiny/figures/transfer_quality.png"], project).stdout
    assert "rule transfer:" in out and "rule figures_of_scale:" in out


def test_every_condition_of_a_metric_is_adapted(measurements: pl.DataFrame,
                                                tmp_path: Path) -> None:
    """A new device measured under two conditions gets an ensemble surrogate for each (the
    second used to receive the first's arch ids in place of the sources' values)."""
    decode = measurements.with_columns(pl.lit("decode").alias("workload"),
                                       pl.lit(16).alias("gen_len"),
                                       (pl.col("latency_ms") / 8).alias("latency_ms"))
    both = pl.concat([measurements, decode], how="diagonal_relaxed")
    new = both.filter(pl.col("device") == "gpu-b")
    written = adapt_device(SECTION, SPACE, VOCAB, both.filter(pl.col("device") != "gpu-b"), new,
                           "new-gpu", 10, tmp_path / "tiny" / "adapted",
                           method="ensemble").written
    conditions = {row["condition"] for row in written}
    assert len(conditions) == new.select("batch_size", "seq_len", "workload").n_unique() >= 2
    bench = Benchmark.load("tiny", tmp_path)
    for condition in conditions:
        predicted = bench.query(bench.sample(20, seed=3), "latency_ms", device="new-gpu",
                                condition=condition)
        assert (predicted["latency_ms"] > 0).all()


def test_only_scales_shipping_two_devices_are_evaluated_across_devices() -> None:
    """The workflow's tiny scale ships no table: nothing to evaluate across devices (the
    stage runs as before); s, m and l ship the CPU and the H100."""
    assert shipped_tables("tiny") == {}
    for scale in ("s", "m", "l"):
        assert set(shipped_tables(scale)) == {"cpu-amd-epyc-1t", "cuda-nvidia-h100-80gb-hbm3"}


def test_cross_device_rows_of_the_shipped_s_tables_reach_the_stage_table(
        tmp_path: Path) -> None:
    """`hwgptbench transfer --scale s` writes, beside the rows of its measurements, the
    transfer across the shipped s tables: the CPU from the H100's conditions, each H100
    condition from the CPU (small k, seeds and models here)."""
    quick = {**CONFIG["transfer"], "metrics": ["latency_ms", "energy_mj"], "ks": [10],
             "report_k": 10, "seeds": 2, "selections": ["random"], "selection": "random",
             "methods": ["feature_ridge", "ensemble"], "method": "ensemble", "folds": 3,
             "source_model": {"num_iterations": 40, "num_leaves": 7, "min_data_in_leaf": 5}}
    overlay = tmp_path / "quick.yaml"
    overlay.write_text(yaml.safe_dump({"transfer": quick}))
    cpu = REPO_ROOT / "src/hwgptbench/published/s/devices/cpu-amd-epyc-1t.parquet"
    out, summary_out = tmp_path / "quality.parquet", tmp_path / "summary.parquet"
    assert cli.main(["transfer", "--params", str(REPO_ROOT / "params.yaml"), "--params",
                     str(overlay), "--scale", "s", "--vocab-size", "50304", "--measurements",
                     str(cpu), "--out", str(out), "--summary-out", str(summary_out)]) == 0
    quality = pl.read_parquet(out)
    # one target in the measurements given: the workflow's own rows say why they are missing
    assert set(quality.filter(pl.col("tables") == "results")["status"]) == {"skipped"}
    shipped = quality.filter(pl.col("tables") == "shipped", pl.col("status") == "ok")
    assert set(shipped["hold_out"]) == {"device"} and set(shipped["metric"]) == {"latency_ms"}
    sources = dict(shipped.select(pl.concat_str("device", pl.lit("/"), "condition"),
                                  "source_devices").unique().iter_rows())
    h100 = "cuda-nvidia-h100-80gb-hbm3"
    assert sources == {"cpu-amd-epyc-1t/b1-t128-fp32-eager": h100,
                       **{f"{h100}/b{b}-t{t}-bf16-{launch}": "cpu-amd-epyc-1t"
                          for b, t in ((1, 128), (8, 1024))
                          for launch in ("eager", "cuda_graph")}}
    per_target = shipped.filter(pl.col("k") == 10).group_by("device", "condition").agg(
        pl.col("method").unique().sort(), pl.len())
    assert per_target.height == 5
    assert all(m.to_list() == ["ensemble", "feature_ridge", "flops", "nearest_source", "params"]
               for m in per_target["method"])
    assert set(per_target["len"]) == {5 * quick["seeds"]}
    # energy: measured on the H100 only, so not transferable across the shipped devices
    energy = quality.filter(pl.col("tables") == "shipped", pl.col("metric") == "energy_mj")
    assert energy.height == 1 and "cross-device transfer needs 2" in energy["reason"][0]
    # CPU -> H100 with CUDA graphs at b8-t1024: the arch's work sets the ranking
    graph = shipped.filter(pl.col("condition") == "b8-t1024-bf16-cuda_graph",
                           pl.col("method") == "ensemble")
    assert graph["spearman"].mean() > 0.9
    summary = pl.read_parquet(summary_out).filter("reported", pl.col("tables") == "shipped")
    assert summary.filter(pl.col("method") == "ensemble")["targets"].to_list() == [5]
    assert shipped_per_target(quality, 10).height == 5


def test_figure_and_table_show_the_shipped_targets(quality: pl.DataFrame,
                                                   tmp_path: Path) -> None:
    """Rows of shipped tables get a panel per target in the transfer figure and their own
    rows in the report's table, beside the workflow's rows or alone."""
    shipped = quality.filter(pl.col("hold_out") == "device").with_columns(
        tables=pl.lit("shipped"))
    for rows in (pl.concat([quality, shipped]), shipped):
        summary = report(rows, 10)
        paths = transfer_quality(summary, rows, tmp_path / "transfer_quality")
        assert all(p.stat().st_size for p in paths)
        assert "shipped" in set(transfer_table(summary, rows)["tables"])
    assert shipped_targets(shipped).select("device", "condition").n_unique() == len(TARGETS)


def test_every_method_predicts_the_same_from_its_saved_state(
        measurements: pl.DataFrame) -> None:
    """A fitted method's JSON state gives back the same predictions and interval scale (what
    an adapted surrogate stores); the ensemble's members and weights included."""
    _, case = _case(measurements, 2)
    chosen = select("designed", case.features, 10)
    for name in METHODS:
        method = make_method(name, SECTION.sigma_floor)
        method.prepare(case.reference)
        predicted = adapt_predictions(case, method, chosen)
        again = method_from_state(name, json.loads(json.dumps(method.state())))
        np.testing.assert_allclose(again.predict(case.design), predicted, err_msg=name)
        assert again.sigma == pytest.approx(method.sigma), name


def test_the_params_name_exactly_the_package_methods() -> None:
    """The params schema's transfer.method and transfer.methods and TransferSettings' Literal
    list METHODS."""
    assert params.schema_at(["transfer", "method"])["enum"] == list(METHODS)
    assert params.schema_at(["transfer", "methods", 0])["enum"] == list(METHODS)
    assert get_args(TransferMethod) == METHODS


def test_a_target_with_fewer_archs_than_folds_is_skipped_with_the_reason(
        measurements: pl.DataFrame) -> None:
    """A target left with 2 archs (e.g. the rest timed under contention) gets a skipped row
    naming it; the other targets are evaluated as before."""
    device, batch, seq = TARGETS[0][0], TARGETS[0][2], TARGETS[0][3]
    is_target = ((pl.col("device") == device) & (pl.col("batch_size") == batch)
                 & (pl.col("seq_len") == seq) & (pl.col("dtype") == "fp32"))
    keep = measurements.filter(is_target)["arch_id"].head(2).to_list()
    thin = measurements.filter(~is_target | pl.col("arch_id").is_in(keep))
    section = SECTION.model_copy(update={"ks": (2,), "hold_out": ("target",)})
    quality = evaluate(thin, SPACE, VOCAB, section)
    skipped = quality.filter(pl.col("status") == "skipped")
    assert skipped.height == 1 and "2 measured archs, fewer than transfer.folds 3" in \
        skipped["reason"][0]
    assert set(quality.filter(pl.col("status") == "ok")["device"]) == {d for d, *_ in TARGETS}
