"""Interleaved timing within a memory budget: group plans, the anchors' speed correction, one
arch's out-of-memory error, and shards that resume after an interrupted group."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
import yaml

from conftest import REPO_ROOT, no_contention_wait
from hwgptbench.campaign import budget, groups
from hwgptbench.campaign import shard as campaign
from hwgptbench.campaign.parts import ShardParts
from hwgptbench.campaign.pressure import MemoryWatch
from hwgptbench.measure import stage as measurements
from hwgptbench.meters import runner
from hwgptbench.meters.condition import Condition
from hwgptbench.meters.latency import cuda_graph_callable
from hwgptbench.params import section_of
from hwgptbench.settings.sections import MeasureSettings
from hwgptbench.space import SearchSpace

SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5})
VOCAB = 100
ARCHS = SPACE.sample(12, seed=1)
FAST = {"warmup": 1, "min_repeats": 5, "max_repeats": 10, "target_rel_ci": 0.05,
        "max_seconds": 0.05, "energy_window_s": 0.2, "memory": False, "threads": 1,
        "shards": 1, "seed": 0, "interleave": True, "batch_sizes": [1], "seq_lens": [16],
        "dtypes": ["fp32"], "launch": ["eager"], "group_anchors": 2}


def _section(**overrides: Any) -> MeasureSettings:
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["measure"]
    return section_of(MeasureSettings, doc | FAST | no_contention_wait(doc) | overrides)


def _without_contention_visits(section: MeasureSettings) -> MeasureSettings:
    """No visit times a contended row again: a row timed again carries that visit's samples
    and group factor, not its group's (the visits are tests/test_contention.py's)."""
    return section.model_copy(
        update={"contention": section.contention.model_copy(update={"retries": 0})})


def _budget_for(n_models: int) -> float:
    """A budget (GB) that holds about n models of ARCHS besides the activations."""
    condition = Condition(1, 16, "fp32")
    weights = max(budget.weight_bytes(SPACE, a, VOCAB, "fp32") for a in ARCHS)
    activations = max(budget.activation_bytes(SPACE, a, VOCAB, condition) for a in ARCHS)
    return (n_models * weights + activations) / budget.GB


def test_everything_in_one_group_when_it_fits() -> None:
    plan = budget.plan_groups([10, 20, 30], [5, 5, 5], budget=100, n_anchors=2)
    assert [g.members for g in plan.groups] == [(0, 1, 2)] and plan.anchors == ()
    assert plan.peak_bytes == 65


def test_the_budget_splits_archs_into_groups_as_planned() -> None:
    weights = [10, 40, 20, 30, 10, 50, 20, 10]
    activations = [5] * 8
    plan = budget.plan_groups(weights, activations, budget=100, n_anchors=2)
    # ranks 2 and 5 of the eight sorted costs (10 and 30): the 1/3 and 2/3 quantiles
    assert plan.anchors == budget.choose_anchors(weights, 2) == (3, 7)
    members = [set(g.members) for g in plan.groups]
    assert set().union(*members) == set(range(8))  # every arch measured once ...
    assert sum(len(m) for m in members) == 8
    assert all(set(plan.anchors) <= m for m in members[:1])  # ... anchors with the first group
    for group in plan.groups:  # every group holds the anchors and fits the budget
        held = set(group.members) | set(plan.anchors)
        assert group.anchors == plan.anchors
        assert group.bytes == sum(weights[i] for i in held) + 5 <= 100
        assert not group.over_budget
    # greedy in the given order: the next arch would have overflowed each closed group
    order = [i for g in plan.groups for i in g.members if i not in plan.anchors]
    assert order == [i for i in range(8) if i not in plan.anchors]


def test_an_arch_beyond_the_budget_gets_its_own_group_marked_over_budget() -> None:
    plan = budget.plan_groups([10, 10, 10, 500, 10, 10], [1] * 6, budget=60, n_anchors=1)
    big = [g for g in plan.groups if 3 in g.members]
    assert len(big) == 1 and big[0].over_budget and set(big[0].members) - set(plan.anchors) == {3}


def test_anchors_shrink_to_the_smallest_archs_where_the_largest_would_not_fit() -> None:
    weights = [10, 40, 20, 30, 10, 50, 20, 10]
    spread = budget.plan_groups(weights, [5] * 8, budget=150, n_anchors=2).anchors
    tight = budget.plan_groups(weights, [5] * 8, budget=75, n_anchors=2)
    assert spread == (3, 7) and tight.anchors == (0, 4)  # 30 + 10 + 50 + 5 > 75 >= 10 + 10 + 50 + 5
    assert not any(g.over_budget for g in tight.groups)
    assert budget.plan_groups(weights, [5] * 8, budget=65, n_anchors=2).anchors == (0,)
    assert budget.plan_groups(weights, [5] * 8, budget=64, n_anchors=2).anchors == ()


def test_group_factors_divide_out_a_slower_group() -> None:
    medians = {0: {"a": 1.0, "b": 2.0}, 1: {"a": 1.2, "b": 2.4}, 2: {"a": 1.0, "b": 2.0}}
    factors = groups.group_factors(medians)
    assert factors[1] / factors[0] == pytest.approx(1.2)
    assert np.prod(list(factors.values())) == pytest.approx(1.0)  # relative to the geomean
    row = groups.rescale({"latency_ms": 3.6, "latency_ci95_rel": 0.01}, factors[1])
    assert row["latency_ms"] == pytest.approx(3.6 / factors[1])
    assert row["latency_ci95_rel"] == 0.01
    assert groups.group_factors({0: {"a": 1.0}, 1: {"b": 2.0}}) == {0: 1.0, 1: 1.0}


def test_grouped_shard_measures_every_arch_once_with_group_factors(tmp_path: Path) -> None:
    out = tmp_path / "shard.parquet"
    section = _without_contention_visits(_section(memory_budget_gb=_budget_for(5)))
    table = measurements.measure_shard(section, SPACE, ARCHS, VOCAB, "auto", (0, 1), out)
    assert sorted(table["arch_id"]) == sorted(a.id for a in ARCHS)
    assert (table["status"] == "ok").all() and table["latency_ms"].is_not_null().all()
    assert table["latency_group"].n_unique() > 1
    factors = table.group_by("latency_group").agg(pl.col("latency_group_factor").n_unique())
    assert (factors["latency_group_factor"] == 1).all()  # one factor per group
    assert not (tmp_path / "shard.parquet.parts").exists()  # removed once the table is written


def _fail_for(arch_id: str, where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make one arch run out of memory while its model is built, or while it is called."""
    real = runner.build_model

    def build(space: SearchSpace, arch: Any, *args: Any) -> torch.nn.Module:
        model = real(space, arch, *args)
        if arch.id == arch_id and where == "build":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        if arch.id == arch_id:
            def forward(*_: Any, **__: Any) -> None:
                raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to "
                                   "allocate 99 bytes")
            model.forward = forward  # type: ignore[method-assign]
        return model

    monkeypatch.setattr(runner, "build_model", build)


@pytest.mark.parametrize("where", ["build", "call"])
def test_one_arch_out_of_memory_costs_only_its_row(where: str, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    section = _section(memory_budget_gb=_budget_for(5))
    cpu = torch.device("cpu")
    plan = campaign._Campaign(section, SPACE, ARCHS, VOCAB, cpu, None,
                              campaign.measure_settings(section), MemoryWatch.on(cpu)
                              ).plan(Condition(1, 16, "fp32"))
    victim = ARCHS[plan.groups[1].members[0]].id  # a member of the second group
    _fail_for(victim, where, monkeypatch)
    table = measurements.measure_shard(section, SPACE, ARCHS, VOCAB, "auto", (0, 1),
                                       tmp_path / "shard.parquet")
    assert table.height == len(ARCHS)
    bad = table.filter(pl.col("arch_id") == victim).row(0, named=True)
    assert bad["status"] == "oom" and bad["reason"].startswith("out of memory")
    assert bad["latency_ms"] is None
    rest = table.filter(pl.col("arch_id") != victim)
    assert (rest["status"] == "ok").all() and rest["latency_ms"].is_not_null().all()


def test_a_shard_resumes_after_an_interrupted_group(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "shard.parquet"
    section = _without_contention_visits(_section(memory_budget_gb=_budget_for(5)))
    real = campaign._Campaign.measure_group
    measured: list[int] = []

    def interrupted(self: Any, condition: Condition, group: Any, index: int
                    ) -> list[dict[str, Any]]:
        if index == 1 and not measured.count(-1):
            measured.append(-1)
            raise KeyboardInterrupt  # the job is killed while timing the second group
        measured.append(index)
        return real(self, condition, group, index)

    monkeypatch.setattr(campaign._Campaign, "measure_group", interrupted)
    with pytest.raises(KeyboardInterrupt):
        measurements.measure_shard(section, SPACE, ARCHS, VOCAB, "auto", (0, 1), out)
    assert not out.exists() and measured == [0, -1]
    first = pl.read_parquet(next((tmp_path / "shard.parquet.parts").glob("*group-00000*")))
    table = measurements.measure_shard(section, SPACE, ARCHS, VOCAB, "auto", (0, 1), out)
    n_groups = table["latency_group"].n_unique()
    assert measured == [0, -1, *range(1, n_groups)]  # group 0 is not measured again
    assert sorted(table["arch_id"]) == sorted(a.id for a in ARCHS)
    kept = table.filter(pl.col("latency_group") == 0).sort("arch_id")
    raw = first.filter(~pl.col("latency_anchor_only")).sort("arch_id")
    assert kept["latency_n"].to_list() == raw["latency_n"].to_list()  # the stored samples
    # other settings do not reuse the parts of an interrupted run
    parts = ShardParts(tmp_path / "p", "key-a")
    condition = Condition(1, 16, "fp32")
    parts.write_arch_rows(condition, [{"arch_id": ARCHS[0].id, "status": "ok"}])
    assert parts.arch_rows(condition, {ARCHS[0].id})
    assert not ShardParts(tmp_path / "p", "key-b").arch_rows(condition, {ARCHS[0].id})


# GPU

S_SPACE = SearchSpace.from_dict("s", yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
                                ["spaces"]["s"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_of_a_group_share_one_memory_pool() -> None:
    """Graphs captured into one pool hold about one forward's activations, not one each, and
    replay the eager forward."""
    cuda = torch.device("cuda")
    archs = S_SPACE.sample(4, seed=0)
    models = [runner.build_model(S_SPACE, a, 50304, 0, cuda, torch.bfloat16) for a in archs]
    x = torch.randint(50304, (4, 512), device=cuda)
    reserved = {}
    with torch.inference_mode():
        eager = [m(x)[:, -1].float().clone() for m in models]
        for shared in (True, False):
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
            start = torch.cuda.memory_reserved()
            pool = torch.cuda.graph_pool_handle() if shared else None
            fns = [cuda_graph_callable(m, x, pool=pool) for m in models]
            for fn in fns:
                fn()
            torch.cuda.synchronize()
            torch.cuda.empty_cache()  # the eager warm-ups' cache; graphs keep their pools
            reserved[shared] = torch.cuda.memory_reserved() - start
            del fns
        alone = [cuda_graph_callable(m, x) for m in models]
        for fn, reference in zip(alone, eager, strict=True):
            torch.testing.assert_close(fn()[:, -1].float(), reference, rtol=0.02, atol=0.02)
    print(f"4 s archs b4-t512 bf16: graphs reserve {reserved[True] / budget.GB:.2f} GiB in one "
          f"pool vs {reserved[False] / budget.GB:.2f} GiB in their own")
    assert reserved[True] < 0.5 * reserved[False]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_grouped_cuda_shard_with_graphs(tmp_path: Path) -> None:
    """A shard of s archs timed on CUDA in several groups, eager and as CUDA graphs."""
    archs = S_SPACE.sample(14, seed=2)
    section = _section(memory_budget_gb=0.6, dtypes=["bf16"], launch=["eager", "cuda_graph"],
                       batch_sizes=[1], seq_lens=[256], group_anchors=3, max_seconds=0.2,
                       min_repeats=10, max_repeats=100, warmup=3)
    table = measurements.measure_shard(section, S_SPACE, archs, 50304, "auto", (0, 1),
                                       tmp_path / "shard.parquet")
    print(table.group_by("launch").agg(pl.col("latency_group").n_unique().alias("groups"),
                                       pl.col("latency_ms").median(),
                                       pl.col("latency_group_factor").min().alias("f_min"),
                                       pl.col("latency_group_factor").max().alias("f_max")))
    assert (table["status"] == "ok").all() and table.height == 2 * len(archs)
    assert table["latency_group"].n_unique() > 1


def test_a_repeat_subset_is_timed_again_in_a_separate_visit(tmp_path: Path) -> None:
    """measure.repeat_share of the archs (at least 5) get latency_repeat_ms, timed after the
    groups; repeat_share 0 times none again."""
    section = _section(repeat_share=0.25, memory_budget_gb=_budget_for(12))
    table = measurements.measure_shard(section, SPACE, ARCHS, VOCAB, "auto", (0, 1),
                                       tmp_path / "repeat.parquet")
    repeated = table.filter(pl.col("latency_repeat_ms").is_not_null())
    assert repeated.height == 5  # max(5, 25% of 12)
    ratio = (repeated["latency_repeat_ms"] / repeated["latency_ms"]).median()
    assert 0.3 < ratio < 3
    none = measurements.measure_shard(_section(repeat_share=0), SPACE, ARCHS[:6], VOCAB, "auto",
                                      (0, 1), tmp_path / "none.parquet")
    assert none["latency_repeat_ms"].is_null().all()
