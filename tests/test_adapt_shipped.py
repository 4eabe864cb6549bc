"""`hwgptbench adapt` from a fresh install: on a scale whose tables ship, with no run's
results and no data-stage output, the shipped device tables are the sources, the shipped
vocabulary and space are used, and the adapted device then answers `hwgptbench query`,
`Benchmark.load` and `HWGPT` beside the shipped devices; the estimate of its error
(leave-one-out, and on --validate archs) is printed and written to ``adapted.json``."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT
from hwgptbench import cli, layout, published
from hwgptbench.adaptation.targets import TransferError
from hwgptbench.api import Benchmark, QueryError
from hwgptbench.compat import HWGPT
from hwgptbench.settings.sections import SpaceSettings
from hwgptbench.transfer.adapt import adaptation_space, candidate_archs

SHIPPED_CPU = "cpu-amd-epyc-1t"
CONDITION = "b1-t128-fp32-eager"
PARAMS = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
# source models of the shipped tables fitted with fewer trees: the same path, faster
QUICK = {"transfer": {**PARAMS["transfer"], "source_model": {
    "num_iterations": 40, "num_leaves": 7, "learning_rate": 0.1, "min_data_in_leaf": 5}}}


@pytest.fixture
def fresh(published_s: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder as after `make install` and a first query of s: results/ holds the shipped s
    surrogates' cache and nothing else (no run, no data stage); the working directory."""
    results = tmp_path / "results"
    shutil.copytree(published_s / "published", results / "published")
    (tmp_path / "quick.yaml").write_text(yaml.safe_dump(QUICK))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def new_device(folder: Path, label: str, rows: int) -> Path:
    """A measurements file of a new device: ``rows`` archs spread over the shipped CPU's table
    (sorted by arch id: every size), renamed to ``label`` and 1.6x faster."""
    shipped = published.device_tables("s")[SHIPPED_CPU]
    table = shipped.gather_every(shipped.height // rows).head(rows).with_columns(
        device=pl.lit(label), latency_ms=pl.col("latency_ms") / 1.6)
    path = folder / f"{label}.parquet"
    table.write_parquet(path)
    return path


def adapt(root: Path, label: str, measurements: Path, *extra: str) -> int:
    return cli.main(["adapt", "--params", str(REPO_ROOT / "params.yaml"), "--params",
                     str(root / "quick.yaml"), "--scale", "s", "--results",
                     str(root / "results"), "--device", label, "--k", "10",
                     "--measurements", str(measurements), *extra])


def test_adapt_on_the_shipped_tables_then_query_everywhere(
        fresh: Path, capsys: pytest.CaptureFixture[str]) -> None:
    label = "cpu-test-fresh-2t"
    assert not (fresh / "results" / "data").exists() and not (fresh / "results" / "s").exists()
    assert adapt(fresh, label, new_device(fresh, label, 30)) == 0
    printed = capsys.readouterr().out
    assert "loo_error" in printed and "--validate N" in printed
    folder = Path(layout.adapted("s", str(fresh / "results"))) / label
    summary = json.loads((folder / "adapted.json").read_text())
    assert summary["default_condition"] == CONDITION
    (estimate,) = summary["estimate"]
    assert estimate["metric"] == "latency_ms" and estimate["validation_archs"] == 0
    assert 0 < estimate["loo_error"] < 0.5 and estimate["spearman"] is None
    meta = json.loads((folder / "latency_ms" / CONDITION / "adapted" /
                       "metadata.json").read_text())
    assert meta["feature_args"]["vocab_size"] == published.vocab_size("s")
    assert set(meta["transfer"]["sources"]) >= {f"latency_ms/{SHIPPED_CPU}/{CONDITION}"}
    assert meta["space"] == published.space("s").to_dict()

    bench = Benchmark.load("s", fresh / "results")
    assert label in bench.devices and set(published.device_tables("s")) < set(bench.devices)
    arch = published.perplexity_table("s")["arch_id"][5]
    answer = bench.query([arch], ["latency_ms", "perplexity"], device=label,
                         return_interval=True)  # no condition: the adapted default
    shipped_cpu = bench.query([arch], "latency_ms", device=SHIPPED_CPU)["latency_ms"][0]
    assert answer["latency_ms"][0] == pytest.approx(shipped_cpu / 1.6, rel=0.25)
    assert answer["latency_ms_lo"][0] < answer["latency_ms"][0] < answer["latency_ms_hi"][0]
    out = fresh / "query.csv"
    assert cli.main(["query", "--scale", "s", "--results", str(fresh / "results"), "--source",
                     "auto", "--device", label, "--metric", "latency_ms", "--metric",
                     "perplexity", "--arch", arch, "--interval", "--out", str(out)]) == 0
    row = pl.read_csv(out).row(0, named=True)
    assert row["latency_ms"] == pytest.approx(answer["latency_ms"][0])
    assert row["perplexity"] == pytest.approx(answer["perplexity"][0])

    api = HWGPT(search_space="s", use_supernet_surrogate=False, base_path=fresh)
    assert label in api.device_list
    api.set_arch(api.sample_arch())
    latencies = api.query(device=label)["latencies"]
    assert set(latencies) == {label} and latencies[label] > 0


def test_validate_scores_the_rows_beyond_k(fresh: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """--validate N with --measurements: N of the rows the fit did not take are predicted and
    scored; more than there are is refused naming both numbers. A default condition that is
    no condition id is refused when the device is loaded."""
    label = "cpu-test-validated-2t"
    measurements = new_device(fresh, label, 40)
    assert adapt(fresh, label, measurements, "--validate", "31") == 2
    assert "30 measured archs besides the k = 10 to fit, fewer than --validate 31" in (
        capsys.readouterr().err)
    assert adapt(fresh, label, measurements, "--validate", "25") == 0
    assert "on the validation archs, which the fit did not see" in capsys.readouterr().out
    folder = Path(layout.adapted("s", str(fresh / "results"))) / label
    (estimate,) = json.loads((folder / "adapted.json").read_text())["estimate"]
    assert estimate["validation_archs"] == 25
    assert estimate["spearman"] > 0.8 and estimate["within_10pct"] > 0.6
    assert 0 <= estimate["mdape"] < 0.1 and 0 <= estimate["coverage"] <= 1
    fitted = json.loads((folder / "latency_ms" / CONDITION / "adapted" /
                         "metadata.json").read_text())["transfer"]["measured_archs"]
    assert len(fitted) == 10
    measured = pl.read_parquet(folder / "measurements.parquet")
    assert measured.height == 40  # every row given stays the device's measured rows
    (folder / "adapted.json").write_text(json.dumps({"default_condition": "../b1-t128"}))
    with pytest.raises(QueryError, match=r"adapted.json: default_condition '../b1-t128' is "
                                         r"not a condition id: adapt the device again"):
        Benchmark.load("s", fresh / "results")


def test_a_params_space_other_than_the_shipped_one_is_refused() -> None:
    spaces = {name: SpaceSettings.parse(space) for name, space in PARAMS["spaces"].items()}
    assert adaptation_space("s", spaces) == published.space("s")  # same choices, other order
    assert adaptation_space("s", {}) == published.space("s")
    assert adaptation_space("tiny", spaces).name == "tiny"
    narrow = {**spaces, "s": spaces["s"].model_copy(update={"embed_dim": (192, 384)})}
    with pytest.raises(TransferError, match=r"params' spaces.s .* is not the space of the "
                                            r"shipped s tables"):
        adaptation_space("s", narrow)


def test_candidates_are_the_shipped_archs_without_a_run(tmp_path: Path) -> None:
    shipped = published.perplexity_table("s")["arch_id"].to_list()
    assert [a.id for a in candidate_archs("s", str(tmp_path))] == shipped
    own = tmp_path / "s" / "archs.parquet"
    own.parent.mkdir()
    pl.DataFrame({"arch_id": shipped[:3]}).write_parquet(own)
    assert [a.id for a in candidate_archs("s", str(tmp_path))] == shipped[:3]
