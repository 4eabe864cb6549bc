"""The measurement stage: shards, device tables, the cross-device table, resume, labels."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT, no_contention_wait, run
from hwgptbench.campaign import shard as campaign
from hwgptbench.errors import MeasurementError
from hwgptbench.measure import merge
from hwgptbench.measure import stage as measurements
from hwgptbench.meters.device import default_device, fingerprint
from hwgptbench.meters.host import auto_label
from hwgptbench.metrics import KEY
from hwgptbench.params import section_of
from hwgptbench.settings.sections import MeasureSettings
from hwgptbench.space import SearchSpace

SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5})
# Quick settings: timing statistics are still complete, just coarse.
FAST = {"warmup": 1, "min_repeats": 5, "max_repeats": 20, "target_rel_ci": 0.02,
        "max_seconds": 0.2, "energy_window_s": 0.2, "memory": False, "threads": 2,
        "shards": 2, "seed": 0, "interleave": True}


def _section(**overrides: object) -> MeasureSettings:
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["measure"]
    doc.update(FAST)
    doc.update(no_contention_wait(doc), batch_sizes=[1, 2], seq_lens=[16], dtypes=["fp32"])
    doc.update(overrides)
    return section_of(MeasureSettings, doc)


def test_parse_shard() -> None:
    assert measurements.parse_shard("1/4") == (1, 4)
    for bad in ("4/4", "x", "1-4", "-1/2"):
        with pytest.raises(MeasurementError, match="--shard"):
            measurements.parse_shard(bad)


def test_seq_len_beyond_block_size_is_rejected() -> None:
    with pytest.raises(MeasurementError, match="measure.seq_lens"):
        campaign.conditions(_section(seq_lens=[64]), SPACE, default_device())


@pytest.fixture(scope="module")
def device_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A device table of 3 archs x 2 conditions, measured in two shards and merged."""
    tmp = tmp_path_factory.mktemp("measure")
    archs = SPACE.sample(3, seed=0)
    shards = [tmp / f"shard-{i}.parquet" for i in range(2)]
    for i, path in enumerate(shards):
        measurements.measure_shard(_section(memory=True), SPACE, archs, 100, "auto", (i, 2),
                                   path)
    table = merge.merge_shards(shards, tmp / "device.parquet")
    assert table.height == 6
    return tmp / "device.parquet"


def test_device_table_rows(device_table: Path) -> None:
    table = pl.read_parquet(device_table)
    label = auto_label(fingerprint(2, default_device()))
    assert set(table["device"]) == {label}
    assert set(table["status"]) == {"ok"}
    assert table["latency_interleaved"].all()
    assert table["latency_n"].min() >= FAST["min_repeats"]
    assert table.select(KEY).is_unique().all()
    for column in ("latency_ms", "latency_ci95_ms", "latency_n", "flops", "params"):
        assert table[column].null_count() == 0 and (table[column] > 0).all()
    assert table["memory_peak_mb"].null_count() == 0
    assert (table["memory_peak_mb"] > 0).all() and (table["memory_weights_mb"] > 0).all()
    if table["energy_mj"].null_count():
        assert table["energy_reason"].null_count() == 0
    assert {"cpu_model", "torch_version", "hostname_hash", "hwgptbench_version"} <= set(
        table.columns)


def test_shard_merge_refuses_duplicates(device_table: Path, tmp_path: Path) -> None:
    with pytest.raises(MeasurementError, match="twice"):
        merge.merge_shards([device_table, device_table], tmp_path / "x.parquet")


def test_two_devices_merge_and_a_label_clash_is_refused(device_table: Path,
                                                        tmp_path: Path) -> None:
    other = pl.read_parquet(device_table).with_columns(
        device=pl.lit("cuda-other-gpu"), device_kind=pl.lit("cuda"),
        device_name=pl.lit("Other GPU"), gpu_memory_gb=pl.lit(80.0))
    other.write_parquet(tmp_path / "cuda-other-gpu.parquet")
    merged = merge.merge_devices([device_table, tmp_path / "cuda-other-gpu.parquet"],
                                        tmp_path / "all.parquet")
    assert merged.height == 12 and merged["device"].n_unique() == 2
    assert pl.read_parquet(tmp_path / "all.parquet").equals(merged)
    clash = other.with_columns(device=pl.lit(merged["device"][0]))
    clash.write_parquet(tmp_path / "clash.parquet")
    with pytest.raises(MeasurementError, match="different hardware"):
        merge.merge_devices([device_table, tmp_path / "clash.parquet"],
                                   tmp_path / "bad.parquet")


def test_merge_commands_and_their_old_name(device_table: Path, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    """merge-devices merges device tables; merge-measurements --devices (the old name) does
    the same and says what it is now called."""
    from hwgptbench import cli

    other = pl.read_parquet(device_table).with_columns(
        device=pl.lit("cuda-other-gpu"), device_kind=pl.lit("cuda"),
        device_name=pl.lit("Other GPU"), gpu_memory_gb=pl.lit(80.0))
    other.write_parquet(tmp_path / "cuda-other-gpu.parquet")
    tables = [str(device_table), str(tmp_path / "cuda-other-gpu.parquet")]
    assert cli.main(["merge-devices", "--out", str(tmp_path / "new.parquet"), *tables]) == 0
    assert cli.main(["merge-measurements", "--devices", "--out", str(tmp_path / "old.parquet"),
                     *tables]) == 0
    assert pl.read_parquet(tmp_path / "new.parquet").equals(
        pl.read_parquet(tmp_path / "old.parquet"))
    assert "merge-measurements is now merge-devices" in caplog.text
    assert cli.main(["merge-shards", "--out", str(tmp_path / "one.parquet"),
                     str(device_table)]) == 0
    assert pl.read_parquet(tmp_path / "one.parquet").equals(pl.read_parquet(device_table))


def test_label_of_other_hardware_is_an_error(shakespeare: Path, tmp_path: Path) -> None:
    archs = tmp_path / "archs.parquet"
    pl.DataFrame({"arch_id": [SPACE.smallest().id]}).write_parquet(archs)
    result = run(["hwgptbench", "measure", "--params", str(REPO_ROOT / "params.yaml"),
                  "--scale", "tiny", "--device", "cuda-nvidia-h100", "--archs", str(archs),
                  "--data", str(shakespeare), "--out", "x.parquet"], tmp_path, check=False)
    assert result.returncode == 2
    assert "cuda-nvidia-h100" in result.stderr
    assert not (tmp_path / "x.parquet").exists()


@pytest.mark.e2e
@pytest.mark.slow  # 40 s: a shard's own resume is test_resume_state's and test_gpu_campaign's
def test_killed_campaign_resumes_with_the_missing_shards_only(project: Path) -> None:
    doc = yaml.safe_load((project / "params.yaml").read_text())
    doc["measure"].update(FAST, dtypes=["fp32"])
    doc["sample"]["n_archs"] = 2
    (project / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    label = auto_label(fingerprint(2, default_device()))
    first = f"results/tiny/.measure/{label}/shard-0-of-2.parquet"
    run(["snakemake", "--cores", "2", first], project)  # as if killed after one shard
    mtime = (project / first).stat().st_mtime_ns
    plan = run(["snakemake", "-n", "results/tiny/measurements.parquet"], project).stdout
    table = plan.split("Job stats:")[1].strip().split("\n\n")[0].splitlines()[2:]
    jobs = {rule: int(count) for rule, count in (line.split() for line in table)}
    assert jobs["measure"] == 1
    assert f"output: {first}" not in plan and "output: " + first.replace("0-of", "1-of") in plan
    run(["snakemake", "--cores", "2", "results/tiny/measurements.parquet"], project)
    assert (project / first).stat().st_mtime_ns == mtime
    table = pl.read_parquet(project / "results" / "tiny" / "measurements.parquet")
    assert table.height == 4 and table.select(KEY).is_unique().all()
