"""Benchmark.load on a shipped scale answers for the union of the shipped devices, the devices
measured here and those adapted here: a local table never hides a shipped device of another
label, a label the measure stage measured here and shipped is answered from here (with a
warning), one adapted under a shipped label is not used, perplexity from here where the run
has its surrogates."""

from __future__ import annotations

import logging
import re
import shlex
import shutil
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import REPO_ROOT, surrogate_settings
from hwgptbench import cli, layout, published
from hwgptbench.api import Benchmark
from hwgptbench.params import section_of
from hwgptbench.predictors import fitting
from hwgptbench.predictors.features import analytic_counts
from hwgptbench.settings.sections import TransferSettings
from hwgptbench.space import SearchSpace
from hwgptbench.transfer.adapt import adapt_device

GPU = "cuda-nvidia-h100-80gb-hbm3"  # shipped only
CPU = "cpu-amd-epyc-1t"  # shipped, and measured here too: here wins
NEW = "cpu-test-local-1t"  # measured here only
ADAPTED = "cpu-test-adapted-1t"  # adapted here from a few archs
CONDITION = "b1-t128-fp32-eager"
SECTION = {"metrics": ["latency_ms"], "families": ["lightgbm"], "default_family": "lightgbm",
           "lightgbm": {"num_iterations": 40, "num_leaves": 7, "min_data_in_leaf": 3},
           "coverage": 0.9, "folds": 3, "min_rows": 10, "seed": 0}
LOCAL_PERPLEXITY = 3.0  # the local perplexities: the shipped ones times this
TRANSFER = {"metrics": ["latency_ms"], "method": "feature_ridge", "selection": "random",
            "source_model": {"num_iterations": 20, "num_leaves": 7, "min_data_in_leaf": 3}}


def device_table(space: SearchSpace, label: str, ms_per_gflop: float, n: int = 40,
                 seed: int = 0) -> pl.DataFrame:
    """A measure-stage table of ``label`` at b1-t128 fp32 eager: latency in proportion to the
    FLOPs (2% noise)."""
    archs = space.sample(n, seed=seed)
    vocab = published.vocab_size("s")
    _, flops = analytic_counts(space, space.encode(archs), vocab, 1, 128)
    rng = np.random.default_rng(seed)
    return pl.DataFrame({
        "device": label, "arch_id": [a.id for a in archs], "batch_size": 1, "seq_len": 128,
        "dtype": "fp32", "launch": "eager", "status": "ok",
        "latency_ms": flops / 1e9 * ms_per_gflop * rng.uniform(0.98, 1.02, n),
        "energy_mj": None, "device_name": label, "torch_version": "2.13.0"},
        schema_overrides={"energy_mj": pl.Float64})


def local_results(root: Path, published_s: Path, space: SearchSpace) -> pl.DataFrame:
    """A results folder holding the shipped s surrogates' cache and a run's results of s: two
    devices measured here (NEW, and CPU, also shipped), perplexity and accuracy surrogates of
    its own perplexity table, and ADAPTED; returns its measurements."""
    shutil.copytree(published_s / "published", root / "published")
    vocab = published.vocab_size("s")
    measured = pl.concat([device_table(space, NEW, 50.0), device_table(space, CPU, 5000.0)])
    scale = root / "s"
    scale.mkdir()
    measured.write_parquet(scale / "measurements.parquet")
    settings = surrogate_settings(SECTION)
    for label in (NEW, CPU):
        fitting.fit_device(settings, space, vocab, measured.filter(pl.col("device") == label),
                           Path(layout.device_surrogates("s", label, str(root))))
    perplexity = published.perplexity_table("s").head(120).with_columns(
        pl.col("perplexity") * LOCAL_PERPLEXITY)
    perplexity.write_parquet(layout.perplexity("s", str(root)))
    for metric in ("perplexity", "accuracy"):
        fitting.fit_perplexity(settings, space, vocab, perplexity,
                               Path(layout.surrogates("s", str(root))) / metric, metric=metric)
    base = section_of(TransferSettings, {**_params()["transfer"], **TRANSFER})
    adapt_device(base, space, vocab, measured, device_table(space, ADAPTED, 20.0, 12, seed=1),
                 ADAPTED, 8, layout.adapted("s", str(root)))
    return measured


def _params() -> dict:
    from hwgptbench import params

    return params.load(REPO_ROOT / "params.yaml")


@pytest.fixture(scope="module")
def union(published_s: Path, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, pl.DataFrame]:
    root = tmp_path_factory.mktemp("union") / "results"
    root.mkdir()
    return root, local_results(root, published_s, published.space("s"))


def test_union_of_shipped_local_and_adapted_devices(union: tuple[Path, pl.DataFrame],
                                                    caplog: pytest.LogCaptureFixture) -> None:
    root, measured = union
    with caplog.at_level(logging.INFO, logger="hwgptbench.api"):
        bench = Benchmark.load("s", root)
    assert bench.devices == sorted([GPU, CPU, NEW, ADAPTED])
    assert f"{CPU}: measured here by the measure stage and shipped with the package" in caplog.text
    shipped = Benchmark.from_published("s", root)
    run = Benchmark.load("s", root, source="results")
    assert run.devices == sorted([CPU, NEW, ADAPTED])
    archs = bench.sample(8, seed=2)
    gpu = bench.query(archs, ["latency_ms", "energy_mj"], device=GPU)  # the manifest default
    assert gpu.equals(shipped.query(archs, ["latency_ms", "energy_mj"], device=GPU))
    for device in (CPU, NEW, ADAPTED):
        own = bench.query(archs, "latency_ms", device=device, condition=CONDITION)
        assert own.equals(run.query(archs, "latency_ms", device=device, condition=CONDITION))
    local_cpu = bench.query(archs, "latency_ms", device=CPU)["latency_ms"]
    shipped_cpu = shipped.query(archs, "latency_ms", device=CPU)["latency_ms"]
    assert (local_cpu > 10 * shipped_cpu).all()  # measured here at 100x the shipped speed
    ids = measured.filter(pl.col("device") == CPU)["arch_id"].head(5).to_list()
    exact = bench.query(ids, "latency_ms", device=CPU, mode="measured")["latency_ms"]
    assert exact.to_list() == measured.filter(pl.col("device") == CPU)["latency_ms"].head(5
                                                                                    ).to_list()


def test_perplexity_from_the_run_where_it_has_surrogates(union: tuple[Path, pl.DataFrame]
                                                         ) -> None:
    root, _ = union
    bench = Benchmark.load("s", root)
    table = published.perplexity_table("s").head(5)
    exact = bench.query(table["arch_id"].to_list(), ["perplexity", "accuracy"], mode="measured")
    assert exact["perplexity"].to_list() == (table["perplexity"] * LOCAL_PERPLEXITY).to_list()
    device_free = bench.index.filter(pl.col("metric").is_in(["perplexity", "accuracy"]))
    assert device_free.height == 2
    assert all(Path(folder).is_relative_to(root / "s") for folder in device_free["folder"])


def test_shipped_devices_answer_beside_a_run_without_perplexity(
        union: tuple[Path, pl.DataFrame], tmp_path: Path) -> None:
    """A run with a device of its own but no perplexity surrogates: perplexity, accuracy and
    the shipped devices come from the shipped tables."""
    source, _ = union
    root = tmp_path / "results"
    shutil.copytree(source / "published", root / "published")
    shutil.copytree(source / "s" / "surrogates" / "devices" / NEW,
                    root / "s" / "surrogates" / "devices" / NEW)
    bench = Benchmark.load("s", root)
    assert bench.devices == sorted([GPU, CPU, NEW])
    shipped = Benchmark.from_published("s", root)
    ids = published.perplexity_table("s")["arch_id"].head(4).to_list()
    both = ["perplexity", "accuracy"]
    assert bench.query(ids, both, mode="auto").equals(shipped.query(ids, both, mode="auto"))
    assert bench.query(ids, "latency_ms", device=NEW)["latency_ms"].is_not_null().all()


def test_a_run_on_another_space_is_read_alone(published_s: Path, tmp_path: Path,
                                              caplog: pytest.LogCaptureFixture) -> None:
    """Surrogates fitted on an s space other than the shipped one cannot join the shipped
    tables: the run answers alone, with a warning that names the way to the shipped ones."""
    root = tmp_path / "results"
    shutil.copytree(published_s / "published", root / "published")
    narrow = published.space("s").to_dict() | {"embed_dim": [192, 384]}
    space = SearchSpace.from_dict("s", narrow)
    fitting.fit_device(surrogate_settings(SECTION), space, published.vocab_size("s"),
                       device_table(space, NEW, 50.0),
                       Path(layout.device_surrogates("s", NEW, str(root))))
    with caplog.at_level(logging.WARNING, logger="hwgptbench.api"):
        bench = Benchmark.load("s", root)
    assert bench.devices == [NEW]
    assert "another s search space than the shipped tables" in caplog.text
    assert "source='published'" in caplog.text


def readme_query() -> list[str]:
    """The README's first query, as its arguments after `hwgptbench`."""
    text = (REPO_ROOT / "README.md").read_text()
    found = re.search(r"^hwgptbench (query --scale s [^\n]*\\\n[^\n]*)$", text, re.MULTILINE)
    assert found, "the README's first query"
    return shlex.split(found.group(1).replace("\\\n", " "))


@pytest.mark.parametrize("state", ["fresh", "with a run"])
def test_readme_query_answers(state: str, union: tuple[Path, pl.DataFrame],
                              published_s: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The README's first query, on a folder with no run (the shipped tables' surrogates
    fitted, as its first call fits them) and on one with a run of s on another device."""
    root = published_s if state == "fresh" else union[0]
    assert cli.main([*readme_query(), "--results", str(root)]) == 0
    printed = capsys.readouterr().out
    assert all(name in printed for name in ("perplexity", "latency_ms", "energy_mj"))


def test_cli_queries_a_local_and_a_shipped_device(union: tuple[Path, pl.DataFrame],
                                                  tmp_path: Path) -> None:
    root, _ = union
    arch = published.perplexity_table("s")["arch_id"][0]
    bench = Benchmark.load("s", root)
    for device in (NEW, GPU, ADAPTED):
        out = tmp_path / f"{device}.csv"
        code = cli.main(["query", "--scale", "s", "--results", str(root), "--device", device,
                         "--metric", "latency_ms", "--condition", CONDITION if device != GPU
                         else "b1-t128-bf16-eager", "--arch", arch, "--out", str(out)])
        assert code == 0
        expected = bench.query([arch], "latency_ms", device=device,
                               condition=CONDITION if device != GPU else "b1-t128-bf16-eager")
        assert pl.read_csv(out)["latency_ms"][0] == pytest.approx(expected["latency_ms"][0])


def test_a_device_adapted_under_a_shipped_label_never_answers_for_it(
        published_s: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Rows adapted under the shipped CPU's label (written before `adapt` refused it) are set
    aside with a warning: the shipped table keeps answering, its measured archs with their
    measured values in --mode auto."""
    root = tmp_path / "results"
    shutil.copytree(published_s / "published", root / "published")
    space = published.space("s")
    base = section_of(TransferSettings, {**_params()["transfer"], **TRANSFER})
    shipped_cpu = published.device_tables("s")[CPU]
    adapt_device(base, space, published.vocab_size("s"), device_table(space, GPU, 1.0),
                 device_table(space, CPU, 20_000.0, 12, seed=1), CPU, 8,
                 layout.adapted("s", str(root)))
    with caplog.at_level(logging.WARNING, logger="hwgptbench.api"):
        bench = Benchmark.load("s", root)
    assert f"{CPU}: adapted here under the label of a shipped table; not used" in caplog.text
    shipped = Benchmark.from_published("s", root)
    ids = shipped_cpu["arch_id"].head(3).to_list()
    for mode in ("auto", "surrogate"):
        assert bench.query(ids, "latency_ms", device=CPU, mode=mode).equals(
            shipped.query(ids, "latency_ms", device=CPU, mode=mode))
    measured = bench.query(ids, "latency_ms", device=CPU, condition=CONDITION, mode="auto")
    assert measured["latency_ms"].to_list() == shipped_cpu["latency_ms"].head(3).to_list()
