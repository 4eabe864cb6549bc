"""Memory that other processes take while a shard is measured: the campaign's watch stops a
group before the machine runs out, splits the rest of the condition into smaller groups or stops
with a message naming memory, and a rerun says why a group did not finish and keeps each arch's
rows measured before. The memory free is simulated (the watch reads it through
``pressure.available_bytes``); the models are built and timed for real."""

from __future__ import annotations

import gc
import json
import logging
import platform
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch

from hwgptbench.campaign import budget, parts, pressure
from hwgptbench.campaign import shard as campaign
from hwgptbench.campaign.budget import GB
from hwgptbench.campaign.parts import ShardParts
from hwgptbench.errors import UserError
from hwgptbench.measure import stage
from hwgptbench.meters import runner
from hwgptbench.meters.condition import Condition
from test_measure_groups import (
    ARCHS,
    SPACE,
    VOCAB,
    _budget_for,
    _section,
    _without_contention_visits,
)

CONDITION = Condition(1, 16, "fp32")


class FreeMemory:
    """The memory free as the watch reads it: ``plenty`` until ``taken_after`` reads, then
    ``left`` (another process took the rest)."""

    def __init__(self, taken_after: int, left: int, plenty: int = 64 * GB) -> None:
        self.reads, self.taken_after, self.left, self.plenty = 0, taken_after, left, plenty

    def __call__(self, device: Any) -> int:
        self.reads += 1
        return self.plenty if self.reads <= self.taken_after else self.left


@pytest.fixture(autouse=True)
def no_reserve_no_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """The watch keeps nothing free beside a group, and a shortage does not wait."""
    monkeypatch.setattr(pressure, "RESERVE_MAX", 0)
    monkeypatch.setattr(campaign, "WAIT_S", 0.0)


def _shard(out: Path, section: Any) -> pl.DataFrame:
    return stage.measure_shard(section, SPACE, ARCHS, VOCAB, "auto", (0, 1), out)


class Machine:
    """The memory free as the watch reads it: ``capacity`` less the weights of the models alive
    (built through ``runner.build_model``) and, once ``taken_after`` models were built, what
    another process took."""

    def __init__(self, capacity: int, taken: int, taken_after: int) -> None:
        self.capacity, self.taken, self.taken_after = capacity, taken, taken_after
        self.held = self.builds = 0

    def building(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def build(*args: Any, **kwargs: Any) -> Any:
            model = real(*args, **kwargs)
            size = sum(p.numel() * p.element_size() for p in model.parameters())
            self.held += size
            self.builds += 1
            weakref.finalize(model, self._drop, size)
            return model
        return build

    def _drop(self, size: int) -> None:
        self.held -= size

    def __call__(self, device: Any) -> int:
        other = self.taken if self.builds >= self.taken_after else 0
        return self.capacity - self.held - other


def test_memory_taken_mid_group_splits_the_rest_into_smaller_groups(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # one group of all 12 archs fits the machine; after 10 of the group's models are built
    # (each arch's own rows build none: no memory pass, no energy meter here), another
    # process takes half the weights' worth: the 11th
    # model does not fit, and the archs are planned again in what is left
    weights = sum(budget.weight_bytes(SPACE, a, VOCAB, "fp32") for a in ARCHS)
    capacity = weights + max(budget.activation_bytes(SPACE, a, VOCAB, CONDITION) for a in ARCHS)
    machine = Machine(capacity, taken=weights // 2, taken_after=10)
    monkeypatch.setattr(pressure, "available_bytes", machine)
    monkeypatch.setattr(runner, "build_model", machine.building(runner.build_model))
    out = tmp_path / "shard.parquet"
    section = _without_contention_visits(_section(memory_budget_gb=capacity / GB))
    real_shrink = campaign._Campaign.shrink
    saved: list[int] = []

    def shrink(self: Any, *args: Any) -> Any:
        plan = real_shrink(self, *args)
        saved.append(len(json.loads(next(out.parent.glob("*.parts/*.plan.json")).read_text())
                         ["groups"]))
        return plan

    monkeypatch.setattr(campaign._Campaign, "shrink", shrink)
    with caplog.at_level(logging.WARNING, logger="hwgptbench.campaign.shard"):
        table = _shard(out, section)
    assert "group 0 stopped before it was timed" in caplog.text
    assert "planned again" in caplog.text
    assert saved and saved[0] > 1  # the smaller plan is the shard's resume state
    assert sorted(table["arch_id"]) == sorted(a.id for a in ARCHS)
    assert (table["status"] == "ok").all() and table["latency_ms"].is_not_null().all()
    assert table["latency_group"].n_unique() == saved[0]
    factors = table["latency_group_factor"].unique().to_list()
    assert len(factors) > 1  # the groups' speeds are compared through the anchors


def test_memory_that_stays_taken_stops_with_a_message_naming_memory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the first group (of two) is measured; then less is free than one model needs
    free = FreeMemory(taken_after=0, left=0)
    section = _section(memory_budget_gb=_budget_for(7))
    out = tmp_path / "shard.parquet"
    real_group = campaign._Campaign.measure_group

    def first_free(self: Any, condition: Any, group: Any, index: int) -> Any:
        rows = real_group(self, condition, group, index)
        monkeypatch.setattr(pressure, "available_bytes", free)  # from the second group on
        return rows

    monkeypatch.setattr(campaign._Campaign, "measure_group", first_free)
    with pytest.raises(pressure.MemoryPressure) as raised:
        _shard(out, section)
    message = str(raised.value)
    assert isinstance(raised.value, UserError)
    assert "group 1" in message and "other processes hold the memory" in message
    assert "measure.memory_budget_gb" in message and "rerun the same command" in message
    assert free.reads == 2 * (pressure.SHRINKS + 1)  # a check and a smaller plan per try
    kept = list(Path(f"{out}.parts").glob(f"{CONDITION.id}.group-00000.parquet"))
    assert kept  # the measured group stays for the rerun


def test_a_rerun_says_why_a_group_did_not_finish(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    folder = ShardParts(tmp_path / "p", "key")
    assert folder.unfinished(CONDITION, 0) is None
    monkeypatch.setattr(parts, "oom_kills", lambda: 7)
    folder.started(CONDITION, 0, planned=3 * GB, free=4 * GB)
    ended = folder.unfinished(CONDITION, 0)
    assert ended and "3.0 GiB with 4.0 GiB free" in ended and "OOM killer did not run" in ended
    monkeypatch.setattr(parts, "oom_kills", lambda: 9)  # the kernel killed twice since
    assert "OOM killer ran (2 kill(s) since): out of memory" in str(folder.unfinished(CONDITION, 0))
    folder.failed(CONDITION, 0, RuntimeError("CUDA error: an illegal memory access"))
    assert "it failed: RuntimeError: CUDA error" in str(folder.unfinished(CONDITION, 0))
    folder.write(CONDITION, 0, [{"arch_id": ARCHS[0].id, "status": "ok", "latency_ms": 1.0,
                                 "latency_anchor_only": False}])
    assert folder.unfinished(CONDITION, 0) is None  # a stored group is finished


def _count_calls(monkeypatch: pytest.MonkeyPatch, module: Any, name: str) -> list[str]:
    """Arch ids of the calls of module.name from now on."""
    calls: list[str] = []
    real: Callable[..., Any] = getattr(module, name)

    def counted(space: Any, arch: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(arch.id)
        return real(space, arch, *args, **kwargs)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_a_rerun_keeps_the_per_arch_rows_of_a_group_killed_while_timed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    section = _section(memory_budget_gb=_budget_for(5))
    out = tmp_path / "shard.parquet"
    real_timing = campaign.measure_latency_of_archs
    timings: list[int] = []

    def killed_in_second(*args: Any, **kwargs: Any) -> Any:
        timings.append(1)
        if len(timings) == 2:
            raise KeyboardInterrupt  # the job is killed while group 1 is timed
        return real_timing(*args, **kwargs)

    monkeypatch.setattr(campaign, "measure_latency_of_archs", killed_in_second)
    first = _count_calls(monkeypatch, campaign, "measure_arch")
    with pytest.raises(KeyboardInterrupt):
        _shard(out, section)
    folder = Path(f"{out}.parts")
    stored = pl.read_parquet(folder / f"{CONDITION.id}.archs.parquet")
    assert sorted(stored["arch_id"]) == sorted(first)  # groups 0 and 1, one row per arch
    monkeypatch.setattr(campaign, "measure_latency_of_archs", real_timing)
    again = _count_calls(monkeypatch, campaign, "measure_arch")
    with caplog.at_level(logging.WARNING, logger="hwgptbench.campaign.shard"):
        table = _shard(out, section)
    assert "group 1 did not finish in an earlier run" in caplog.text
    assert "it failed: KeyboardInterrupt" in caplog.text
    assert not set(again) & set(first)  # no arch's energy, memory or FLOPs measured twice
    assert sorted([*first, *again]) == sorted(a.id for a in ARCHS)
    assert table.height == len(ARCHS) and (table["status"] == "ok").all()



class _Cycle:
    """Weights held by an object that refers to itself: freed only by the garbage collector."""

    def __init__(self) -> None:
        self.me = self
        self.weights = torch.ones(16 << 20)  # 64 MB


def test_the_watch_reads_the_memory_free_once_this_process_returned_its_garbage() -> None:
    """A group's models that only the garbage collector frees (and, on glibc, heap pages that
    only malloc_trim returns) are this process's, not other processes': the watch returns them
    before it reads the memory free."""
    gc.disable()
    try:
        held = weakref.ref(_Cycle())
        assert held() is not None  # unreachable, not yet collected
        pressure.MemoryWatch.on(torch.device("cpu")).free()
        assert held() is None
    finally:
        gc.enable()
    if sys.platform == "linux" and "glibc" in " ".join(platform.libc_ver()):
        assert pressure._malloc_trim() is not None
