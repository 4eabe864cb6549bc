"""`hwgptbench adapt` on a busy machine: what it measures is kept, a condition that cannot be
fitted is reported with its counts and skipped, a time bound stops it, and a rerun resumes
from the kept rows; a label of a shipped device table is refused.

A busy machine is simulated in the timings' run-queue wait alone (:class:`Machine`); everything
else is the real measuring code on this CPU."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import yaml

from conftest import REPO_ROOT
from hwgptbench import cli, layout, published
from hwgptbench.campaign import shard
from hwgptbench.meters.latency import PastDeadline, measure_latency_interleaved
from test_transfer import CONFIG, synthetic_measurements

QUICK = {**CONFIG["measure"], "batch_sizes": [1], "seq_lens": [32], "dtypes": ["fp32", "bf16"],
         "warmup": 0, "min_repeats": 3, "max_repeats": 3, "max_seconds": 0.01,
         "memory": False, "repeat_share": 0.0,
         "contention": {**CONFIG["measure"]["contention"], "max_ci_rel": 100.0,
                        "max_wall_cpu_ratio": 100.0, "max_runqueue_wait": 0.1, "wait_s": 0.0,
                        "retries": 1}}
CONDITIONS = ("b1-t32-fp32-eager", "b1-t32-bf16-eager")


@pytest.fixture
def project(shakespeare: Path, tmp_path: Path) -> tuple[Path, list[str]]:
    """A results folder with the sources and candidates of tiny, and the adapt command's
    arguments (quick measuring: two conditions, a few forwards per arch)."""
    results = tmp_path / "results"
    (results / "tiny").mkdir(parents=True)
    measurements = synthetic_measurements()
    measurements.write_parquet(results / "tiny" / "measurements.parquet")
    pl.DataFrame({"arch_id": measurements["arch_id"].unique(maintain_order=True).head(20)}
                 ).write_parquet(results / "tiny" / "archs.parquet")
    overlay = tmp_path / "quick.yaml"
    overlay.write_text(yaml.safe_dump({"measure": QUICK}))
    return results, ["adapt", "--params", str(REPO_ROOT / "params.yaml"), "--params",
                     str(overlay), "--scale", "tiny", "--results", str(results), "--k", "4",
                     "--validate", "3", "--device", "auto", "--data", str(shakespeare)]


class Machine:
    """The measuring calls of a run, counted (per-arch measurements, timed visits), on a
    machine busy for the dtypes in ``busy``: their timings report that the process waited for
    a core half the time, as the kernel's run-queue statistics do when other processes hold
    the cores; the others, none."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, busy: set[str]) -> None:
        self.archs = 0
        self.visits = 0
        measure_arch, timing = shard.measure_arch, shard.measure_latency_of_archs

        def counted_arch(*args: Any, **kwargs: Any) -> Any:
            self.archs += 1
            return measure_arch(*args, **kwargs)

        def timed(space: Any, archs: Any, vocab: int, condition: Any, *args: Any,
                  **kwargs: Any) -> Any:
            self.visits += 1
            wait = 0.5 if condition.dtype in busy else 0.0
            return [{**row, "latency_runqueue_wait": wait}
                    for row in timing(space, archs, vocab, condition, *args, **kwargs)]

        monkeypatch.setattr(shard, "measure_arch", counted_arch)
        monkeypatch.setattr(shard, "measure_latency_of_archs", timed)


def test_a_busy_condition_is_skipped_the_others_saved_and_a_rerun_resumes(
        project: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    results, args = project
    with monkeypatch.context() as patch:
        first = Machine(patch, busy={"bf16"})
        assert cli.main(args) == 0
    out = capsys.readouterr().out
    (label,) = [p.name for p in (results / "tiny" / "adapted").iterdir()]
    adapted = results / "tiny" / "adapted" / label
    summary = json.loads((adapted / "adapted.json").read_text())
    assert [e["condition"] for e in summary["estimate"]] == [CONDITIONS[0]]
    # each of the 7 archs measured once per condition; the busy one visited once more
    assert first.archs == 14 and first.visits == 2 + 1
    assert "resume (it measures only what is missing" in out and "--k 4 --validate 3" in out
    kept = Path(layout.adapt_progress("tiny", label, str(results)))
    assert {f"{c}.rows.parquet" for c in CONDITIONS} <= {p.name for p in kept.iterdir()}
    contended = pl.read_parquet(kept / f"{CONDITIONS[1]}.rows.parquet")
    assert contended["latency_contended"].all() and set(contended["latency_remeasured"]) == {1}

    again = Machine(monkeypatch, busy=set())
    assert cli.main(args) == 0
    summary = json.loads((adapted / "adapted.json").read_text())
    assert sorted(e["condition"] for e in summary["estimate"]) == sorted(CONDITIONS)
    # nothing measured anew: only the rows still contended were timed again, in one visit
    assert again.archs == 0 and again.visits == 1
    assert not kept.exists()  # every condition adapted: the kept rows are in the table
    table = pl.read_parquet(adapted / "measurements.parquet")
    assert table.height == 14 and not table["latency_contended"].any()


def test_nothing_fitted_names_each_condition_and_keeps_the_rows(
        project: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    results, args = project
    Machine(monkeypatch, busy={"fp32", "bf16"})
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    for condition in CONDITIONS:
        assert (f"latency_ms at {condition}: 0 of the k = 4 archs to fit usable (7 rows "
                "measured, 7 timed under contention)") in err
    assert "the machine was busy: 14 latencies stayed contended" in err
    assert "the rows measured are kept in" in err and "hwgptbench adapt --scale tiny" in err
    assert not list((results / "tiny").glob("adapted/*/adapted.json"))
    (kept,) = (results / "tiny" / ".adapt").iterdir()
    assert len(list(kept.glob("*.rows.parquet"))) == 2


def test_the_time_bound_stops_before_the_next_group_and_a_rerun_measures_the_rest(
        project: tuple[Path, list[str]], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    results, args = project
    assert cli.main([*args, "--max-minutes", "1e-9"]) == 2
    err = capsys.readouterr().err
    assert "nothing measured on" in err and f"{', '.join(CONDITIONS)}" in err
    assert "--max-minutes 1e-09" in err
    calls = Machine(monkeypatch, busy=set())
    assert cli.main(args) == 0
    assert calls.archs == 14


def test_a_label_of_a_shipped_table_is_refused(measurements_file: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A device adapted here never answers in place of a shipped one: its label must differ."""
    (label, *_) = published.device_labels("s")
    args = ["adapt", "--scale", "s", "--results", str(tmp_path / "results"),
            "--measurements", str(measurements_file), "--k", "4"]
    assert cli.main([*args, "--device", label]) == 2
    err = capsys.readouterr().err
    assert f"the package ships a s table of {label}" in err
    assert f"--device {label}-local" in err
    assert not (tmp_path / "results").exists()


@pytest.fixture
def measurements_file(tmp_path: Path) -> Path:
    path = tmp_path / "new.parquet"
    synthetic_measurements().filter(pl.col("device") == "gpu-b").write_parquet(path)
    return path


def test_auto_files_this_machine_apart_from_a_shipped_table_of_its_label() -> None:
    (label, *_) = published.device_labels("s")
    assert published.unshipped_label("s", label) == f"{label}-local"
    assert published.unshipped_label("s", "cpu-other-1t") == "cpu-other-1t"
    assert published.unshipped_label("tiny", label) == label


def test_an_interleaved_timing_stops_at_the_next_cycle_past_its_deadline() -> None:
    """The hard part of the bound: a group's timing under way does not run to min_repeats."""
    calls: list[int] = []

    def forward() -> None:
        calls.append(1)
        time.sleep(0.01)

    with pytest.raises(PastDeadline, match="the time bound passed (while warming|after)"):
        measure_latency_interleaved([forward, forward], torch.device("cpu"), warmup=0,
                                    min_repeats=1000, max_repeats=2000, max_seconds=60.0,
                                    deadline=time.monotonic() + 0.05)
    assert 0 < len(calls) < 100  # min_repeats would have been 2 x 1,334 calls
