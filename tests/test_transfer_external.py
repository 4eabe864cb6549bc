"""Few-shot transfer on other projects' data: the loaders of HELP's FBNet files and HAT's CSVs (on
small synthetic files in their formats), the package's transfer methods on their feature
vectors (exact recovery, no leakage, every k), the split protocols, the summary's intervals
and the drift flags. The real data is used
only by the ``slow`` test, when HWGPTBENCH_HELP_FBNET names HELP's data/fbnet folder."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from hwgptbench.adaptation.methods import METHODS, make_method
from hwgptbench.transfer import external, external_eval
from hwgptbench.transfer.evaluate import BASELINES, adapt_predictions, baseline_predictions, scores
from hwgptbench.transfer.external import ExternalDataError, Split

N_ARCHS = 80


def _fbnet_folder(tmp_path: Path, devices: int = 5, n: int = N_ARCHS, seed: int = 0) -> Path:
    """HELP's layout: metainfo.pt (archs as op names and indices), latency/{device}.pt (lists).
    Each device's latency is additive over (layer, op) costs: a mix of two base tables."""
    rng = np.random.default_rng(seed)
    ops = rng.integers(0, len(external.FBNET_OPS), size=(n, 22))
    folder = tmp_path / "data" / "fbnet"
    (folder / "latency").mkdir(parents=True)
    torch.save({"dataset": "cifar100", "num_classes": 100, "arch": [
        {"op_idx_list": row.tolist(), "arch_str": [external.FBNET_OPS[o] for o in row]}
        for row in ops]}, folder / "metainfo.pt")
    base = rng.uniform(0.1, 1.0, size=(2, 22, len(external.FBNET_OPS)))
    base[:, :, -1] = 0.0  # skip is free
    for d in range(devices):
        mix = np.array([1.0, d / max(devices - 1, 1)])
        table = np.tensordot(mix, base, axes=1)
        latency = 2.0 + table[np.arange(22), ops].sum(1)
        torch.save(latency.tolist(), folder / "latency" / f"dev{d}.pt")
    return folder


HAT_ROW = {"encoder_embed_dim": 512, "encoder_layer_num": 6, "encoder_ffn_embed_dim_avg": 2048.0,
           "encoder_self_attention_heads_avg": 8.0, "decoder_embed_dim": 512,
           "decoder_layer_num": 3, "decoder_ffn_embed_dim_avg": 1024.0,
           "decoder_self_attention_heads_avg": 4.0, "decoder_ende_attention_heads_avg": 4.0,
           "decoder_arbitrary_ende_attn_avg": 1.0}


def _hat_folder(tmp_path: Path, n: int = 60) -> Path:
    """HAT's layout: {task}_{device}_all.csv, different archs per file; latency linear in the
    per-layer cost terms with device-specific weights."""
    folder = tmp_path / "latency_dataset"
    folder.mkdir()
    weights = {"cpu_raspberrypi": (3.0, 1.0), "cpu_xeon": (1.0, 0.5), "gpu_titanxp": (0.2, 2.0)}
    for t, task in enumerate(("wmt14ende", "wmt14enfr")):
        for d, (device, (per_flop, per_layer)) in enumerate(weights.items()):
            rng = np.random.default_rng(10 * t + d)
            rows = pl.DataFrame({
                "encoder_embed_dim": rng.choice([512, 640], n),
                "encoder_layer_num": np.full(n, 6),
                "encoder_ffn_embed_dim_avg": rng.uniform(1024, 3072, n),
                "encoder_self_attention_heads_avg": rng.uniform(4, 8, n),
                "decoder_embed_dim": rng.choice([512, 640], n),
                "decoder_layer_num": rng.integers(1, 7, n),
                "decoder_ffn_embed_dim_avg": rng.uniform(1024, 3072, n),
                "decoder_self_attention_heads_avg": rng.uniform(4, 8, n),
                "decoder_ende_attention_heads_avg": rng.uniform(4, 8, n),
                "decoder_arbitrary_ende_attn_avg": rng.choice([-1.0, 1.0, 2.0], n)})
            features, _, _ = external.hat_features(rows)
            decoder = per_flop * features[:, 3] / 1e6 + per_layer * features[:, 5]
            rows = rows.with_columns(
                pl.Series("latency_mean_encoder", per_flop * features[:, 0] / 1e6 + 1.0),
                pl.Series("latency_mean_decoder", decoder),
                pl.Series("latency_std_encoder", np.full(n, 0.01)),
                pl.Series("latency_std_decoder", np.full(n, 0.01)))
            rows.write_csv(folder / f"{task}_{device}_all.csv")
    return folder


def test_help_loader_reads_the_format(tmp_path: Path) -> None:
    folder = _fbnet_folder(tmp_path)
    data = external.load_help_fbnet(tmp_path)  # the repository root works too
    assert sorted(data.tables) == [f"dev{d}" for d in range(5)]
    table = data.table("dev0")
    assert table.features.shape == (N_ARCHS, 22 * len(external.FBNET_OPS))
    np.testing.assert_array_equal(table.features.sum(1), 22)
    assert np.all(table.flops > 0) and np.all(table.params > 0)
    assert data.blocks is not None and data.groups is not None and len(data.blocks) == 198
    only = external.load_help_fbnet(folder, devices=["dev1"])
    assert list(only.tables) == ["dev1"]
    with pytest.raises(ExternalDataError, match="no device"):
        data.table("raspi4")


def test_fbnet_costs_follow_the_ops() -> None:
    skip = np.full((1, 22), external.FBNET_OPS.index("skip"))
    small = np.full((1, 22), external.FBNET_OPS.index("k3_e1"))
    large = np.full((1, 22), external.FBNET_OPS.index("k5_e6"))
    grouped = np.full((1, 22), external.FBNET_OPS.index("k3_e1_g2"))
    flops = [external.fbnet_costs(ops)[0][0] for ops in (skip, grouped, small, large)]
    assert flops == sorted(flops) and flops[0] > 0  # strided skips are 1x1 convs


def test_help_loader_rejects_bad_files(tmp_path: Path) -> None:
    folder = _fbnet_folder(tmp_path)
    torch.save([1.0, 2.0], folder / "latency" / "short.pt")
    with pytest.raises(ExternalDataError, match="latencies for"):
        external.load_help_fbnet(folder, devices=["short"])
    with pytest.raises(ExternalDataError, match="not found"):
        external.load_help_fbnet(folder, devices=["missing"])
    (folder / "latency" / "code.pt").write_bytes(b"not a torch file")
    with pytest.raises(ExternalDataError, match="weights_only"):
        external.load_help_fbnet(folder, devices=["code"])
    meta = torch.load(folder / "metainfo.pt", weights_only=True)
    meta["arch"][0]["arch_str"][0] = "k7_e9"
    torch.save(meta, folder / "metainfo.pt")
    with pytest.raises(ExternalDataError, match="FBNet ops"):
        external.load_help_fbnet(folder)


def test_hat_loader_and_devices(tmp_path: Path) -> None:
    data = external.load_hat(_hat_folder(tmp_path))
    assert len(data.tables) == 6 and data.standardise
    table = data.table("wmt14ende_cpu_xeon")
    assert table.features.shape == (60, len(external.HAT_FEATURES))
    assert external.device_of("wmt14ende_cpu_xeon") == "cpu_xeon"
    assert external.device_of("cpu-x/b1-t128-fp32-eager") == "cpu-x"
    sources = external_eval.sources_of(data, external.SPLITS["hat_wmt14ende"],
                                       "wmt14ende_cpu_xeon")
    assert "wmt14enfr_cpu_xeon" not in sources and len(sources) == 4
    # a choice split never takes a report target as a source
    choice = external_eval.sources_of(data, external.SPLITS["hat_wmt14enfr"],
                                      "wmt14enfr_cpu_xeon")
    assert sorted(choice) == ["wmt14enfr_cpu_raspberrypi", "wmt14enfr_gpu_titanxp"]
    bad = tmp_path / "bad"
    bad.mkdir()
    pl.DataFrame({"encoder_embed_dim": [512]}).write_csv(bad / "x_cpu_xeon_all.csv")
    with pytest.raises(ExternalDataError, match="missing columns"):
        external.load_hat(bad)
    with pytest.raises(ExternalDataError, match="no \\*_all.csv"):
        external.load_hat(tmp_path / "nothing")


@pytest.fixture(scope="module")
def fbnet(tmp_path_factory: pytest.TempPathFactory) -> external.ExternalSet:
    return external.load_help_fbnet(_fbnet_folder(tmp_path_factory.mktemp("help")))


@pytest.mark.parametrize("k", [1, 3, 10])
def test_every_method_runs_and_leaks_nothing(fbnet: external.ExternalSet, k: int) -> None:
    """Every method and baseline fits any k; changing the target's values outside the k archs
    changes no prediction (nothing of them reaches a method)."""
    case = external_eval.case_of(fbnet, "dev2", ["dev0", "dev1", "dev4"])
    chosen = np.random.default_rng(0).choice(N_ARCHS, k, replace=False)
    outside = np.setdiff1d(np.arange(N_ARCHS), chosen)
    noisy = external_eval.case_of(fbnet, "dev2", ["dev0", "dev1", "dev4"])
    noisy.z = case.z.copy()
    noisy.z[outside] += np.random.default_rng(1).uniform(-0.7, 0.7, len(outside))
    for name in METHODS:
        clean_method, noisy_method = make_method(name), make_method(name)
        clean_method.prepare(case.reference)
        noisy_method.prepare(noisy.reference)
        predicted = adapt_predictions(case, clean_method, chosen)
        assert predicted.shape == (N_ARCHS,) and np.all(np.isfinite(predicted)), name
        assert np.isfinite(clean_method.sigma) and clean_method.sigma > 0, name
        np.testing.assert_allclose(adapt_predictions(noisy, noisy_method, chosen), predicted,
                                   err_msg=name)
    for name in BASELINES:
        np.testing.assert_allclose(baseline_predictions(noisy, name, chosen)[1],
                                   baseline_predictions(case, name, chosen)[1], err_msg=name)


def test_transfer_beats_the_proxies_on_an_additive_device(fbnet: external.ExternalSet) -> None:
    """A target that is a mix of the sources' cost tables is ranked almost exactly from 10
    archs by the learned methods, better than by FLOPs."""
    case = external_eval.case_of(fbnet, "dev2", ["dev0", "dev1", "dev3", "dev4"])
    chosen = np.random.default_rng(3).choice(N_ARCHS, 10, replace=False)
    test = np.setdiff1d(np.arange(N_ARCHS), chosen)
    measured = np.exp(case.z[test])
    found = {}
    for name in ("table_prior", "source_ridge", "ensemble"):
        method = make_method(name)
        method.prepare(case.reference)
        found[name] = scores(measured, np.exp(adapt_predictions(case, method, chosen)[test]))[
            "spearman"]
    ranking, _ = baseline_predictions(case, "flops", chosen)
    found["flops"] = scores(measured, measured, ranking[test])["spearman"]
    assert found["source_ridge"] > 0.99 and found["ensemble"] > 0.97
    assert found["table_prior"] > found["flops"]


def test_drifting_rows_are_flagged(fbnet: external.ExternalSet) -> None:
    """A run of rows measured 1.5x slow is flagged with its ratio; a clean table has none."""
    table = fbnet.table("dev1")
    assert external_eval.drifting_blocks(table, block=20).is_empty()
    slow = table.values.copy()
    slow[20:40] *= 1.5
    drifted = external.DeviceTable(table.device, table.keys, table.features, slow, table.flops,
                                   table.params)
    flagged = external_eval.drifting_blocks(drifted, block=20)
    assert flagged.select("first_row", "last_row").rows() == [(20, 39)]
    assert 1.3 < flagged["ratio"][0] < 1.6 and flagged["beyond_10pct"][0] > 0.8


def test_the_help_protocol_and_the_summary(fbnet: external.ExternalSet) -> None:
    split = Split("toy", targets=("dev2",), sources=("dev0", "dev4", "dev2"), protocol="help",
                  train=50, query=30)
    pool, tests = external_eval.pools(split, fbnet.table("dev2").values)
    assert len(pool) == 40 and len(tests["query"]) == 24 and tests["all"] is None
    assert pool.max() < 50 and tests["query"].min() >= 50
    quality = external_eval.evaluate_split(fbnet, split, [1, 5], 3, ["table_prior", "flops"])
    assert quality.height == 2 * 3 * 2 * 2  # k x seeds x methods x test sets
    assert set(quality["n_test"].unique()) <= {N_ARCHS - 1, N_ARCHS - 5, 23, 24}
    assert quality.filter(pl.col("test") == "all")["n_test"].min() == N_ARCHS - 5
    again = external_eval.evaluate_split(fbnet, split, [1, 5], 3, ["table_prior", "flops"])
    assert quality.equals(again)  # seeded draws
    summary = external_eval.summarize(quality)
    assert summary.height == 2 * 2 * 2 and (summary["seeds"] == 3).all()
    assert (summary["spearman_low"] <= summary["spearman_mean"]).all()
    assert (summary["spearman_mean"] <= summary["spearman_high"]).all()
    worst = external_eval.worst(summary)
    assert worst.height == 2 * 2 * 2
    with pytest.raises(ValueError, match="unknown methods"):
        external_eval.evaluate_split(fbnet, split, [5], 1, ["maml"])
    with pytest.raises(ValueError, match="other than itself"):
        external_eval.case_of(fbnet, "dev2", ["dev2"])


def test_hat_split_and_upper_bound(tmp_path: Path) -> None:
    data = external.load_hat(_hat_folder(tmp_path))
    split = Split("toy", targets=("wmt14ende_cpu_raspberrypi",))
    summary = external_eval.summarize(external_eval.evaluate_split(
        data, split, [10], 2, ["table_prior", "nearest_source"]))
    assert set(summary["test"]) == {"all"}
    best = summary.filter(pl.col("method") == "table_prior")["spearman_mean"][0]
    assert best > 0.95  # latency is linear in the cost terms
    assert external_eval.own_cv(data, "wmt14ende_cpu_xeon")["spearman"] > 0.5


def test_gpt_tables_as_devices(tmp_path: Path) -> None:
    ids = ["e64-l2-h2_2-r2_2-b1", "e64-l3-h2_2_2-r2_2_4-b1", "e96-l2-h4_4-r4_4-b0",
           "e96-l3-h2_4_2-r2_4_2-b1", "e128-l2-h4_2-r2_2-b1", "e128-l3-h4_4_4-r4_4_4-b0"]
    for device, speed in (("cpu-a", 1.0), ("cuda-b", 0.1)):
        flops = np.arange(1, 7) * 1e6
        pl.DataFrame({"arch_id": ids, "device": device, "batch_size": 1, "seq_len": 128,
                      "dtype": "fp32", "launch": "eager", "status": "ok", "flops": flops,
                      "params": flops / 10, "latency_ms": speed * flops / 1e5}).write_parquet(
            tmp_path / f"{device}.parquet")
    data = external.load_gpt_tables(sorted(tmp_path.glob("*.parquet")))
    assert sorted(data.tables) == ["cpu-a/b1-t128-fp32-eager", "cuda-b/b1-t128-fp32-eager"]
    split = external.gpt_split(data)
    assert external_eval.sources_of(data, split, "cpu-a/b1-t128-fp32-eager") == \
        ["cuda-b/b1-t128-fp32-eager"]


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("HWGPTBENCH_HELP_FBNET"),
                    reason="HWGPTBENCH_HELP_FBNET names no copy of HELP's data/fbnet")
def test_help_fbnet_split_beats_help() -> None:
    """On HELP's own split, k = 10, 10 seeds: the ensemble's mean Spearman is above HELP's
    published one on each held-out device."""
    data = external.load_help_fbnet(os.environ["HWGPTBENCH_HELP_FBNET"])
    split = external.SPLITS["help_fbnet"]
    summary = external_eval.summarize(external_eval.evaluate_split(data, split, [10], 10,
                                                                   ["ensemble"]))
    found = {r["target"]: r["spearman_mean"] for r in summary.filter(
        pl.col("test") == "query").iter_rows(named=True)}
    for target in split.targets:
        published = split.published["HELP"][target]
        assert found[target] > published, (target, found[target], published)
