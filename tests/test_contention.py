"""Rows timed while the machine was busy: timed again in later visits, flagged when they stay
contended, and left out of surrogate fitting and transfer targets (campaign/shard.py)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT, surrogate_settings
from hwgptbench import Benchmark, params
from hwgptbench.adaptation.targets import long_table
from hwgptbench.api import QueryError
from hwgptbench.campaign import shard as campaign
from hwgptbench.measure import merge
from hwgptbench.meters.latency import latency_stats, runqueue_ns, runqueue_wait_share
from hwgptbench.metrics import measurement_frame
from hwgptbench.predictors import fitting
from hwgptbench.space import SearchSpace
from hwgptbench.surrogate.stage import merge_quality
from test_measurements import SPACE, _section


def _measured(timing: dict[str, Any] | None = None, **contention: Any) -> list[dict[str, Any]]:
    section = _section(shards=1, batch_sizes=[1], repeat_share=0.0, **(timing or {}), contention={
        "max_wall_cpu_ratio": 1.10, "max_ci_rel": 0.25, "max_runqueue_wait": 0.10, "retries": 2,
        "wait_s": 0.0})
    # set unvalidated (model_copy): the infinite bounds below, which params refuse, stand for
    # bounds no timing can exceed
    section = section.model_copy(
        update={"contention": section.contention.model_copy(update=contention)})
    return campaign.measure_rows(section, SPACE, SPACE.sample(3, seed=1), 100, "auto")


def test_rows_beyond_the_bounds_are_timed_again_then_flagged(tmp_path: Path) -> None:
    """With a CI bound no timing meets, every row is timed in every later visit and stays
    contended; with bounds no timing can exceed (infinite; a wait share is at most 1), none is
    timed again, however busy the machine (a finite bound such as a CI of 100x the median is
    met by one call descheduled for a few hundred ms on a loaded CI machine)."""
    strict = _measured(max_ci_rel=1e-12, retries=2)
    assert {r["latency_remeasured"] for r in strict} == {2}
    assert all(r["latency_contended"] for r in strict)
    assert all(r["latency_ms"] > 0 for r in strict)
    loose = _measured(max_ci_rel=math.inf, max_wall_cpu_ratio=math.inf, max_runqueue_wait=1.0)
    assert {r["latency_remeasured"] for r in loose} == {0}
    assert not any(r["latency_contended"] for r in loose)
    # the merged table's dvc metrics count them per device and condition
    table = tmp_path / "device.parquet"
    measurement_frame(strict).write_parquet(table)
    merge.merge_devices([table], tmp_path / "all.parquet", tmp_path / "contention.json")
    (counts,) = (c for conditions in json.loads((tmp_path / "contention.json").read_text())
                 .values() for c in conditions.values())
    assert counts == {"ok": 3, "contended": 3, "remeasured": 0, "still_contended": 3}


def test_the_runqueue_wait_share_counts_each_thread_once() -> None:
    before = {"1": (100, 0), "2": (50, 10)}
    after = {"1": (300, 100), "2": (50, 10), "3": (40, 60)}  # thread 3 started in between
    assert runqueue_wait_share(before, after) == pytest.approx(160 / (240 + 160))
    assert runqueue_wait_share(None, after) is None
    assert runqueue_wait_share(before, before) is None  # no thread ran


@pytest.mark.skipif(runqueue_ns() is None, reason="the kernel exposes no schedstat")
def test_rows_timed_beside_processes_that_busy_every_core_are_flagged_and_timed_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A real background load: a spinning process per core while the rows are timed, stopped
    before the visit that times them again (its wait)."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"])
                for _ in range(os.cpu_count() or 1)]

    def stop_then_wait(seconds: float) -> None:
        for spinner in spinners:
            spinner.kill()
            spinner.wait()
        time.sleep(seconds)

    monkeypatch.setattr(campaign, "time", SimpleNamespace(sleep=stop_then_wait))
    try:
        time.sleep(0.5)  # the spinners are running
        rows = _measured(max_ci_rel=100.0, max_wall_cpu_ratio=100.0, retries=1, timing={
            "threads": 1, "min_repeats": 30, "max_repeats": 10**5, "target_rel_ci": 1e-9,
            "max_seconds": 0.3})  # 0.3 s of timing per arch, however slow the machine
    finally:
        stop_then_wait(0)
    waits = [r["latency_runqueue_wait"] for r in rows]
    assert all(w is not None and 0 <= w <= 1 for w in waits)
    # every row waited for a core beside the spinners, so every row was timed again
    assert {r["latency_remeasured"] for r in rows} == {1}


def _stats(ms: float, ratio: float) -> dict[str, Any]:
    wall = list(np.full(9, ms) * np.linspace(0.99, 1.01, 9))
    return latency_stats(wall, [w / ratio for w in wall])


def test_a_visit_on_a_slower_machine_is_rescaled_by_its_anchors(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The first timing of one arch waited for a core (wall/CPU 2.0); the next visit finds the
    machine twice as slow for everyone but uncontended: the arch takes the new timing, divided
    by the anchors' slowdown."""
    visits: list[list[str]] = []
    true_ms = {}

    def timed(space: SearchSpace, archs: list[Any], *args: Any) -> list[dict[str, Any]]:
        visits.append([a.id for a in archs])
        for a in archs:
            true_ms.setdefault(a.id, 1.0 + len(true_ms))
        first = len(visits) == 1
        return [_stats(true_ms[a.id] * (1 if first else 2),
                       2.0 if first and i == 0 else 1.0) for i, a in enumerate(archs)]

    monkeypatch.setattr(campaign, "measure_latency_of_archs", timed)
    rows = _measured()
    assert len(visits) == 2 and len(visits[1]) == 3  # the contended arch and two anchors
    again = next(r for r in rows if r["arch_id"] == visits[0][0])
    assert again["latency_remeasured"] == 1 and not again["latency_contended"]
    assert again["latency_ms"] == pytest.approx(true_ms[again["arch_id"]], rel=0.02)
    assert [r["latency_remeasured"] for r in rows].count(0) == 2


def test_contended_latencies_are_not_fitted_nor_transferred(tmp_path: Any) -> None:
    from test_api import SECTION, VOCAB, synthetic_tables
    from test_api import SPACE as API_SPACE

    _, table = synthetic_tables()
    flags = np.zeros(table.height, dtype=bool)
    flags[:7] = True
    table = table.with_columns(latency_contended=pl.Series(flags),
                               latency_remeasured=pl.Series(flags.astype(int) * 2))
    quality = fitting.fit_device(surrogate_settings(SECTION), API_SPACE, VOCAB, table,
                                 tmp_path / "surrogates")
    latency = quality.filter(pl.col("metric") == "latency_ms").row(0, named=True)
    assert latency["left_out_contended"] == 7 and latency["rows"] == table.height - 7
    memory = quality.filter(pl.col("metric") == "memory_peak_mb").row(0, named=True)
    assert memory["left_out_contended"] == 0 and memory["rows"] == table.height
    long = long_table(table, ["latency_ms", "memory_peak_mb"])
    assert long.filter(pl.col("metric") == "latency_ms").height == table.height - 7
    assert long.filter(pl.col("metric") == "memory_peak_mb").height == table.height


def test_a_condition_whose_latencies_are_all_contended_says_so_when_queried(
        tmp_path: Path) -> None:
    """No surrogate is fitted on contended latencies: a condition with no other latency has
    none, its quality row says why and how to re-measure, and a query of it says the same."""
    from test_api import DEVICE, SECTION, VOCAB, synthetic_tables
    from test_api import SPACE as API_SPACE

    perplexity, table = synthetic_tables()
    table = table.with_columns(latency_contended=pl.lit(True), latency_remeasured=pl.lit(2))
    scale = tmp_path / "tiny"
    folder = scale / "surrogates"
    fitting.fit_perplexity(surrogate_settings(SECTION), API_SPACE, VOCAB, perplexity,
                           folder / "perplexity")
    quality = fitting.fit_device(surrogate_settings(SECTION), API_SPACE, VOCAB, table,
                                 folder / "devices" / DEVICE)
    merge_quality([folder / "perplexity" / "quality.parquet",
                   folder / "devices" / DEVICE / "quality.parquet"], "tiny",
                  folder / "quality.parquet", scale / "surrogate_quality.json")
    latency = quality.filter(pl.col("metric") == "latency_ms")
    assert set(latency["status"]) == {"skipped"}
    why = latency["reason"][0]
    assert f"all {table.height} latencies were timed under contention" in why
    assert "snakemake --forcerun measure" in why
    table.write_parquet(scale / "measurements.parquet")
    perplexity.write_parquet(scale / "perplexity.parquet")
    bench = Benchmark.load("tiny", tmp_path, source="results")
    arch = API_SPACE.sample(1, seed=5)[0]
    assert bench.query([arch], ["memory_peak_mb"], device=DEVICE).height == 1  # others answer
    for condition in (None, "b1-t128-fp32-eager"):
        with pytest.raises(QueryError, match="timed under contention"):
            bench.query([arch], ["latency_ms"], device=DEVICE, condition=condition)


def test_the_bounds_are_validated() -> None:
    """The params name a bound that is out of range before any job starts; a bound left out
    is params.yaml's."""
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    wait_s = doc["measure"]["contention"]["wait_s"]
    doc["measure"]["contention"] = {**doc["measure"]["contention"], "retries": -1}
    with pytest.raises(params.ParamsError, match="measure.contention.retries"):
        params.validate(doc)
    doc["measure"]["contention"]["retries"] = 2
    del doc["measure"]["contention"]["wait_s"]
    assert params.typed(doc).measure.contention.wait_s == wait_s
    doc["measure"]["contention"]["wait_s"] = -1.0
    with pytest.raises(params.ParamsError, match="measure.contention.wait_s"):
        params.validate(doc)
