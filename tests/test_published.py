"""The tables shipped with the package: provenance, checksums, the importer reproduces them,
and a fresh results folder queries them (surrogates fitted on first use, then cached)."""

from __future__ import annotations

import json
import os
import pickle
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from hwgptbench import published
from hwgptbench.api import Benchmark, QueryError
from hwgptbench.hwgpt_import.convert import convert, locate
from hwgptbench.hwgpt_source import FILES, REV
from hwgptbench.published.surrogates import cache_dir
from hwgptbench.space import Arch, SearchSpace

SOURCE = f"github.com/automl/HW-GPT-Bench@{REV}"
ROWS = {"s": 10_000, "m": 5_245, "l": 429}
GPU = "cuda-nvidia-h100-80gb-hbm3"
CPU = "cpu-amd-epyc-1t"
GPU_ARCHS = {"s": 500, "m": 200, "l": 100}  # the H100 campaign's archs per scale


def test_manifest_names_every_table_with_its_provenance() -> None:
    """s, m and l are shipped whole, each row naming the repository and commit it came from;
    the NOTICE names HW-GPT-Bench's license; all of it stays small."""
    assert published.scales() == ["l", "m", "s"]
    for scale, rows in ROWS.items():
        table = published.perplexity_table(scale)
        assert table.height == rows == table["arch_id"].n_unique()
        assert table["source"].unique().to_list() == [SOURCE]
        assert published.entry(scale)["perplexity"]["source"] == SOURCE
    notice = (published.FOLDER / "NOTICE").read_text()
    assert "Apache License" in notice and "HW-GPT-Bench" in notice
    files = [p for p in published.FOLDER.rglob("*") if p.is_file() and p.suffix != ".py"
             and "__pycache__" not in p.parts]
    assert sum(p.stat().st_size for p in files) < 10 * 2**20


def test_shipped_device_tables_are_measure_stage_tables() -> None:
    """Each shipped device table holds one device's ok rows of the measure stage, with the
    columns that make datasets of many machines merge."""
    assert published.device_tables("s")
    for scale in published.scales():
        for label, table in published.device_tables(scale).items():
            assert table["device"].unique().to_list() == [label]
            assert {"latency_ms", "memory_peak_mb", "energy_mj", "energy_reason", "threads",
                    "torch_version"} <= set(table.columns)
            ok = table.filter(pl.col("status") == "ok")
            assert ok.height >= 100 and ok["latency_ms"].min() > 0
            assert set(ok["arch_id"]) <= set(published.perplexity_table(scale)["arch_id"])
            record = published.entry(scale)["devices"][label]
            assert record["fingerprint"] == published.fingerprint_of(table)
            commits = record["measured_by"].split(", ")  # whose code measured it
            assert commits and all(re.fullmatch("[0-9a-f]{40}", c) for c in commits)
            assert record["default_condition"] == published.default_condition_of(table)


@pytest.mark.parametrize("scale", ["s", "m", "l"])
def test_gpu_tables_hold_latency_energy_and_memory(scale: str) -> None:
    """The H100 table of each scale: every arch under the four conditions, energy read (NVML)
    at the default condition, CUDA graphs faster than eager launches."""
    table = published.device_tables(scale)[GPU]
    assert table["arch_id"].n_unique() == GPU_ARCHS[scale]
    assert table.height == 4 * GPU_ARCHS[scale] and (table["status"] == "ok").all()
    record = published.entry(scale)["devices"][GPU]
    assert record["default_condition"] == "b8-t1024-bf16-cuda_graph"
    assert record["fingerprint"]["device_name"] == "NVIDIA H100 80GB HBM3"
    energy = table.filter(pl.col("energy_mj").is_not_null())
    assert energy.height == GPU_ARCHS[scale] and (energy["energy_source"] == "nvml").all()
    assert (energy["launch"] == "cuda_graph").all() and (energy["batch_size"] == 8).all()
    assert (table["memory_peak_mb"] > table["memory_weights_mb"]).all()
    wide = table.filter(pl.col("batch_size") == 1).pivot(on="launch", index="arch_id",
                                                         values="latency_ms")
    assert (wide["cuda_graph"] < wide["eager"]).mean() > 0.9


@pytest.mark.parametrize("scale", ["s", "m", "l"])
def test_cpu_tables_hold_the_gpu_archs_each_timed_quietly_with_a_repeat_visit(scale: str
                                                                           ) -> None:
    """The CPU table of each scale measured every arch of the H100's (a device matrix over all
    of them), no latency still contended, and a repeat visit of about a tenth of its archs
    (the table's repeatability ceiling)."""
    tables = published.device_tables(scale)
    fp32 = tables[CPU].filter((pl.col("status") == "ok") & (pl.col("dtype") == "fp32"))
    assert set(tables[GPU]["arch_id"]) <= set(fp32["arch_id"])
    assert not fp32["latency_contended"].any()
    repeated = fp32.drop_nulls("latency_repeat_ms")
    assert repeated.height >= 0.09 * fp32.height


def _pad(values: tuple[Any, ...], depth: int) -> list[Any]:
    return [*values, *[values[-1]] * (depth - len(values))]


def _as_published(table: pl.DataFrame, space: SearchSpace) -> list[dict[str, Any]]:
    """The rows of a perplexity table as HW-GPT-Bench pickled them."""
    rows = []
    for arch_id, ppl, accuracy in table.select("arch_id", "perplexity", "accuracy").iter_rows():
        arch = Arch.from_id(arch_id)
        rows.append({"perplexity": ppl, "accuracy": accuracy, "arch": {
            "sample_embed_dim": arch.embed_dim, "sample_n_layer": arch.n_layer,
            "sample_layer_indices": list(range(arch.n_layer)),
            "sample_n_head": _pad(arch.n_head, space.max_n_layer),
            "sample_mlp_ratio": _pad(arch.mlp_ratio, space.max_n_layer),
            "sample_bias": arch.bias}})
    return rows


@pytest.mark.parametrize("scale", ["s", "m", "l"])
def test_importer_reproduces_the_shipped_table(scale: str, tmp_path: Path) -> None:
    """The shipped table, written back as HW-GPT-Bench's files in its repository's layout
    (s in one file, m and l in tracker files of 1,000 sampled archs), converts to itself."""
    shipped = published.perplexity_table(scale)
    space = published.space(scale)
    rows = _as_published(shipped, space)
    paths = FILES[scale]
    per_file = -(-len(rows) // len(paths))
    for i, path in enumerate(paths):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        with open(tmp_path / path, "wb") as handle:
            pickle.dump(rows[i * per_file:(i + 1) * per_file], handle)
    located, source, rev = locate(scale, tmp_path, "https://github.com/automl/HW-GPT-Bench", REV)
    table, report = convert(space, located, source, rev, vocab_size=published.vocab_size(scale))
    assert report["outside_space"]["rows"] == 0 and report["duplicates"]["archs"] == 0
    assert table.equals(shipped)


@pytest.mark.skipif(not os.environ.get("HWGPTBENCH_REPO"),
                    reason="HWGPTBENCH_REPO (a clone of github.com/automl/HW-GPT-Bench) not set")
def test_shipped_tables_equal_the_published_files(tmp_path: Path) -> None:
    """With a clone of HW-GPT-Bench at hand, its files at the commit convert to the shipped
    tables exactly."""
    repo = os.environ["HWGPTBENCH_REPO"]
    for scale, paths in FILES.items():
        for path in paths:
            (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
            blob = subprocess.run(["git", "--git-dir", repo, "show", f"{REV}:{path}"],
                                  check=True, capture_output=True).stdout
            (tmp_path / path).write_bytes(blob)
        located, source, rev = locate(scale, tmp_path, "https://github.com/automl/HW-GPT-Bench",
                                      REV)
        table, _ = convert(published.space(scale), located, source, rev,
                           vocab_size=published.vocab_size(scale))
        assert table.equals(published.perplexity_table(scale))


def test_edited_table_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "published"
    shutil.copytree(published.FOLDER, folder)
    target = folder / published.entry("l", folder)["perplexity"]["file"]
    target.write_bytes(target.read_bytes()[:-10] + b"0123456789")
    with pytest.raises(published.PublishedTablesError, match="does not match its manifest"):
        published.perplexity_table("l", folder)
    (folder / published.MANIFEST).write_text("{not json")
    with pytest.raises(published.PublishedTablesError, match="not valid JSON"):
        published.scales(folder)


def test_ship_writes_tables_and_manifest(tmp_path: Path) -> None:
    """ship() copies a table in, checksums it, keeps what it is not given, and refuses a
    space other than the shipped one unless every table is shipped anew."""
    folder = tmp_path / "published"
    source = tmp_path / "l.parquet"
    published.perplexity_table("l").head(50).write_parquet(source)
    space = published.space("l")
    record = published.ship("l", space, 50304, source, folder=folder)
    assert record["perplexity"]["rows"] == 50
    assert published.perplexity_table("l", folder).equals(pl.read_parquet(source))
    kept = published.ship("l", space, 50304, None, folder=folder)
    assert kept["perplexity"] == record["perplexity"]
    other = SearchSpace.from_dict("l", {**space.to_dict(), "n_layer": [34, 35]})
    with pytest.raises(published.PublishedTablesError, match="ship every table"):
        published.ship("l", other, 50304, None, folder=folder)
    two = tmp_path / "two.parquet"
    pl.DataFrame({"device": ["a", "b"]}).write_parquet(two)
    with pytest.raises(published.PublishedTablesError, match="one device table per device"):
        published.ship("l", space, 50304, None, [two], folder=folder)


def test_fresh_results_folder_queries_the_shipped_scale(published_s: Path) -> None:
    """No run, no network: every metric of any s arch; published perplexities come back
    exactly in auto mode; params and FLOPs are computed, not predicted."""
    bench = Benchmark.load("s", published_s)
    shipped = published.perplexity_table("s").head(20)
    ids = shipped["arch_id"].to_list()
    device = bench.devices[0]
    table = bench.query(ids, ["perplexity", "accuracy", "latency_ms", "memory_peak_mb",
                              "params", "flops"], device=device, return_interval=True)
    assert table["params"].to_list() == shipped["params"].to_list()
    space = bench.space
    from hwgptbench.meters.flops import forward_flops
    assert table["flops"].to_list() == [
        forward_flops(Arch.from_id(i), space, 50304, 1, space.block_size) for i in ids]
    assert (table["perplexity_lo"] <= table["perplexity_hi"]).all()
    assert ((table["perplexity"] / shipped["perplexity"] - 1).abs() < 0.05).all()
    exact = bench.query(ids, ["perplexity", "accuracy"], mode="auto")
    assert exact["perplexity"].to_list() == shipped["perplexity"].to_list()
    assert exact["accuracy"].to_list() == shipped["accuracy"].to_list()
    unpublished = [a for a in bench.sample(50, seed=3) if a.id not in set(ids)][:5]
    assert bench.query(unpublished, "perplexity", mode="auto")["perplexity"].is_not_null().all()
    with pytest.raises(QueryError, match="unknown metric 'energy'"):
        bench.query(ids, "energy", device=device)


def test_gpu_latency_and_energy_are_queried_at_the_default_condition(published_s: Path
                                                                     ) -> None:
    """A fresh folder queries the shipped H100 latency and energy with no condition named (the
    manifest's default), measured values exactly, and any other condition by its id."""
    bench = Benchmark.load("s", published_s)
    shipped = (published.device_tables("s")[GPU]
               .filter(pl.col("energy_mj").is_not_null()).sort("arch_id").head(10))
    ids = shipped["arch_id"].to_list()
    measured = bench.query(ids, ["latency_ms", "energy_mj"], device=GPU, mode="measured")
    assert measured["latency_ms"].to_list() == shipped["latency_ms"].to_list()
    assert measured["energy_mj"].to_list() == shipped["energy_mj"].to_list()
    predicted = bench.query(ids, ["latency_ms", "energy_mj"], device=GPU)
    for metric in ("latency_ms", "energy_mj"):
        assert ((predicted[metric] / shipped[metric] - 1).abs() < 0.1).mean() >= 0.9
    eager = bench.query(ids, "latency_ms", device=GPU, condition="b1-t128-bf16-eager")
    assert eager["latency_ms"].is_not_null().all()


def test_cached_surrogates_are_reused(published_s: Path) -> None:
    """A second load reads the cache: nothing is fitted again."""
    folder = cache_dir("s", published_s)
    before = {p: p.stat().st_mtime_ns for p in folder.rglob("*")}
    Benchmark.load("s", published_s).query(["e192-l10-h4_4_4_4_4_4_4_4_4_4-"
                                            "r2_2_2_2_2_2_2_2_2_2-b0"], "perplexity")
    assert {p: p.stat().st_mtime_ns for p in folder.rglob("*")} == before


def test_cli_queries_a_fresh_folder(published_s: Path, tmp_path: Path) -> None:
    """`hwgptbench query --scale s` from a folder with no results or params.yaml."""
    arch = published.perplexity_table("s")["arch_id"][0]
    out = tmp_path / "q.csv"
    result = subprocess.run(
        [sys.executable, "-m", "hwgptbench.cli", "query", "--scale", "s", "--results",
         str(published_s), "--metric", "perplexity", "--metric", "latency_ms", "--metric",
         "params", "--device", "cpu-amd-epyc-1t", "--arch", arch, "--mode", "auto", "--out",
         str(out)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    row = pl.read_csv(out).row(0, named=True)
    shipped = published.perplexity_table("s").row(0, named=True)
    assert row["perplexity"] == pytest.approx(shipped["perplexity"], rel=1e-12)
    assert row["params"] == shipped["params"] and row["latency_ms"] > 0
    l_arch = published.perplexity_table("l")["arch_id"][0]
    for metrics, code in ((["perplexity"], 0), (["latencies"], 2)):
        result = subprocess.run(
            [sys.executable, "-m", "hwgptbench.cli", "query", "--scale", "l", "--results",
             str(published_s), *[f"--metric={m}" for m in metrics], "--arch", l_arch],
            cwd=tmp_path, capture_output=True, text=True, timeout=120)
        assert result.returncode == code, result.stderr
        assert "Traceback" not in result.stderr
    assert "unknown metric 'latencies'; available: accuracy, " in result.stderr


def test_published_cache_layout_matches_the_stage(published_s: Path) -> None:
    """The cache holds the surrogate stage's layout, quality tables included."""
    folder = cache_dir("s", published_s)
    quality = pl.read_parquet(folder / "perplexity" / "quality.parquet")
    assert quality.filter(pl.col("selected"))["kendall_tau"][0] > 0.9
    meta = json.loads((folder / "accuracy" / "lightgbm" / "metadata.json").read_text())
    assert meta["metric"] == "accuracy" and meta["space_name"] == "s"
