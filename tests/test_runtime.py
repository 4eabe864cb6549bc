"""Runtime dissection: workloads, runtime options, the per-module breakdown, runtime queries."""

from __future__ import annotations

import gc
import shutil
import weakref
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from conftest import REPO_ROOT, surrogate_settings
from hwgptbench.api import Benchmark, QueryError
from hwgptbench.figures.runtime import (
    breakdown_bars,
    parallel_modes,
    parallel_table,
    serving_curves,
    serving_table,
)
from hwgptbench.meters.condition import Condition
from hwgptbench.meters.device import fingerprint
from hwgptbench.meters.host import auto_label
from hwgptbench.meters.latency import measure_latency
from hwgptbench.meters.runner import Settings, build_model
from hwgptbench.params import section_of
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.runtime import stage as runtime
from hwgptbench.runtime.breakdown import MODULE_CLASSES, OTHER, profile_breakdown
from hwgptbench.runtime.rows import memory_pass, runtime_conditions
from hwgptbench.runtime.serving import serving_sweep
from hwgptbench.runtime.workloads import Unsupported, Workload, build_workload
from hwgptbench.settings.sections import RuntimeSettings
from hwgptbench.space import Arch, SearchSpace

SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2, 4], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 48, "rotary_fraction": 0.5})
VOCAB = 97
CPU = torch.device("cpu")
FAST = {"n_archs": 4, "batch_size": 1, "seq_len": 16, "gen_len": 8,
        "workloads": ["prefill", "decode", "train_step"], "dtypes": ["fp32", "bf16"],
        "options": {"attention": ["math", "efficient"], "quant": ["int8"], "compile": [],
                    "recompute": [True]},
        "warmup": 1, "min_repeats": 5, "max_repeats": 10, "target_rel_ci": 0.05,
        "max_seconds": 0.05, "breakdown": {"n_archs": 1, "repeats": 3},
        "serving": {"n_archs": 2, "batch_sizes": [1, 4, 16]},
        "parallel": {"n_archs": 0, "modes": ["none", "ddp", "zero3"], "recompute": [False],
                     "dtypes": ["fp32"], "batch_size": 1, "cpu_ranks": 2, "repeats": 2,
                     "profile_steps": 1}, "seed": 0}


def test_default_ids_are_unchanged_and_every_id_round_trips() -> None:
    assert Condition(1, 128, "fp32").id == "b1-t128-fp32-eager"
    conditions = runtime_conditions(section_of(RuntimeSettings, FAST), CPU)
    assert len({c.id for c in conditions}) == len(conditions) == 6 + 2 * 3 + 2 + 1
    for condition in conditions:
        assert Condition.from_id(condition.id) == condition
    assert Condition.from_id("b2-t64-bf16-eager-decode32-sdpa_math").gen_len == 32
    with pytest.raises(ValueError, match="recompute"):
        Condition(1, 16, "fp32", recompute=True)
    with pytest.raises(ValueError, match="unknown part"):
        Condition.from_id("b1-t16-fp32-eager-turbo")


def test_decode_with_a_kv_cache_gives_the_full_forward_logits() -> None:
    model = build_model(SPACE, SPACE.largest(), VOCAB, 0, CPU, torch.float32)
    x = torch.randint(VOCAB, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(x)
        cache = model.new_cache(2, 20)
        steps = [model(x[:, :12], cache=cache)]
        steps += [model(x[:, i:i + 1], cache=cache) for i in range(12, 20)]
    torch.testing.assert_close(torch.cat(steps, dim=1), full, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="KV cache full"):
        model(x[:, :1], cache=cache)


def test_recomputation_leaves_the_gradients_unchanged() -> None:
    grads = []
    for recompute in (False, True):
        model = build_model(SPACE, SPACE.largest(), VOCAB, 0, CPU, torch.float32).train()
        model.recompute = recompute
        x = torch.randint(VOCAB, (2, 16), generator=torch.Generator().manual_seed(1))
        model(x, torch.roll(x, -1, 1))[1].backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    torch.testing.assert_close(grads[0], grads[1])


@pytest.mark.parametrize("condition", [
    Condition(1, 16, "fp32"), Condition(2, 16, "bf16", workload="decode", gen_len=4),
    Condition(1, 16, "bf16", workload="train_step"),
    Condition(1, 16, "fp32", workload="train_step", recompute=True),
    Condition(1, 16, "fp32", quant="int8"), Condition(1, 16, "fp32", attention="math"),
    Condition(1, 16, "fp32", workload="decode", gen_len=4, attention="flash"),
], ids=lambda c: c.id)
def test_every_cpu_workload_and_option_runs(condition: Condition) -> None:
    workload = build_workload(SPACE, SPACE.largest(), VOCAB, condition, CPU, 0)
    out = workload.call()
    assert torch.isfinite(out.float()).all()
    expected = condition.batch_size * (condition.gen_len or condition.seq_len)
    assert workload.tokens == expected


def test_int8_weights_shrink_the_linears_and_keep_the_output_close() -> None:
    plain = build_workload(SPACE, SPACE.largest(), VOCAB, Condition(1, 16, "fp32"), CPU, 0)
    quant = build_workload(SPACE, SPACE.largest(), VOCAB, Condition(1, 16, "fp32", quant="int8"),
                           CPU, 0)
    reference, quantized = plain.call(), quant.call()
    assert not torch.equal(reference, quantized)
    assert (quantized - reference).abs().max() < 0.05 * reference.abs().max()


def test_a_backend_without_a_cpu_kernel_is_unsupported_not_a_crash() -> None:
    with pytest.raises(Unsupported, match="sdpa_efficient does not run on cpu"):
        build_workload(SPACE, SPACE.largest(), VOCAB,
                       Condition(1, 16, "fp32", attention="efficient"), CPU, 0)


@pytest.mark.slow  # torch.compile: 13 s on 2 cores; compile is opt-in (runtime.options.compile)
def test_compiled_prefill_gives_the_eager_output() -> None:
    eager = build_workload(SPACE, SPACE.smallest(), VOCAB, Condition(1, 16, "fp32"), CPU, 0)
    compiled = build_workload(SPACE, SPACE.smallest(), VOCAB,
                              Condition(1, 16, "fp32", compile=True), CPU, 0)
    torch.testing.assert_close(compiled.call(), eager.call(), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("workload", ["prefill", "decode"])
def test_breakdown_attributes_the_profiled_step_to_modules(workload: str) -> None:
    arch = Arch.from_id("e48-l2-h3_3-r4_4-b1")
    condition = Condition(1, 32, "fp32", workload=workload,
                          gen_len=8 if workload == "decode" else 0)
    built = build_workload(SPACE, arch, VOCAB, condition, CPU, 0)
    covered = []
    for _ in range(3):  # a stall of the machine lands in "other": the best of 3 profiles
        profiled = profile_breakdown(built.model, built.call, 5, CPU)
        modules, step = profiled["modules"], profiled["step_ms"]
        assert set(MODULE_CLASSES) - {"embedding"} <= set(modules)
        named = sum(ms for name, ms in modules.items() if name != OTHER)
        # disjoint ranges: the classes never add up to more than the step they sit in
        assert named <= step * 1.05
        assert sum(profiled["operators"].values()) <= step * 1.05
        covered.append(named / step)
        if covered[-1] >= 0.5:
            break
    assert max(covered) >= 0.5, (covered, modules)  # 0.85-0.94 on a quiet 2-core CPU


def test_decode_latency_per_token_grows_with_layers() -> None:
    settings = Settings(threads=2, warmup=2, min_repeats=10, max_repeats=40, target_rel_ci=0.02,
                        max_seconds=0.5, energy_seconds=3.0, memory=True, seed=0,
                        estimator="median")
    condition = Condition(1, 16, "fp32", workload="decode", gen_len=8)
    built = {n: build_workload(SPACE, Arch(48, n, (3,) * n, (4,) * n, True), VOCAB, condition,
                               CPU, 0) for n in (1, 4)}
    # interleaved rounds, best of each: the other test worker's load lands on one arch only
    per_token: dict[int, float] = {}
    for _ in range(3):
        for n_layer, workload in built.items():
            stats = measure_latency(workload.call, CPU, **settings.timing())
            ms = stats["latency_ms"] / workload.per_call
            per_token[n_layer] = min(per_token.get(n_layer, ms), ms)
    assert per_token[4] > 1.5 * per_token[1], per_token  # 3.2x on a quiet 2-core CPU


@pytest.fixture(scope="module")
def measured() -> runtime.RuntimeTables:
    archs = SPACE.sample(12, seed=3)
    aliases = {"cpu-test": auto_label(fingerprint(1, CPU))}
    return runtime.measure_runtime(section_of(RuntimeSettings, FAST), 1, SPACE, archs, VOCAB,
                                   "cpu-test", aliases)


def test_runtime_table_has_every_condition_with_reasons(
        measured: runtime.RuntimeTables) -> None:
    table = measured.runtime
    conditions = {c.id for c in runtime_conditions(section_of(RuntimeSettings, FAST), CPU)}
    assert set(table["condition"]) == conditions
    assert table.group_by("condition").len()["len"].unique().to_list() == [FAST["n_archs"]]
    unsupported = table.filter(pl.col("status") != "ok")
    assert set(unsupported["attention"]) == {"efficient"}
    assert unsupported["latency_ms"].null_count() == unsupported.height
    assert unsupported["reason"].str.contains("efficient").all()
    ok = table.filter(pl.col("status") == "ok")
    assert (ok["latency_ms"] > 0).all() and (ok["tokens_per_s"] > 0).all()
    assert ok["memory_reason"].str.contains("not measured on the CPU").all()


def test_breakdown_table_has_both_views_per_workload(
        measured: runtime.RuntimeTables) -> None:
    breakdown = measured.breakdown
    assert set(breakdown["workload"]) == set(FAST["workloads"])
    assert set(breakdown["view"]) == {"modules", "operators"}
    totals = breakdown.filter(pl.col("view") == "modules").group_by("condition").agg(
        pl.col("ms").sum(), pl.col("step_ms").first())
    for ms, step in totals.select("ms", "step_ms").iter_rows():
        assert ms == pytest.approx(step, rel=0.05)
    train = breakdown.filter((pl.col("workload") == "train_step") & (pl.col("view") == "modules"))
    assert {"backward", "optimizer"} <= set(train["category"])


def test_serving_tpot_grows_slower_than_the_batch(measured: runtime.RuntimeTables) -> None:
    serving = measured.serving
    assert serving.height == 2 * 3 and (serving["status"] == "ok").all()
    for arch in serving.partition_by("arch_id"):
        by_batch = {row["batch_size"]: row for row in arch.iter_rows(named=True)}
        # 16 sequences decoded together cost far less than 16 one at a time, so throughput grows
        assert by_batch[16]["tpot_ms"] < 16 * by_batch[1]["tpot_ms"] / 2, by_batch
        assert by_batch[16]["throughput_tokens_per_s"] > 2 * by_batch[1][
            "throughput_tokens_per_s"]
        for row in by_batch.values():
            assert row["throughput_tokens_per_s"] == pytest.approx(
                row["batch_size"] * 1000 / row["tpot_ms"], rel=1e-9)
            assert row["end_to_end_ms"] == pytest.approx(
                row["ttft_ms"] + (row["gen_len"] - 1) * row["tpot_ms"])


def test_without_parallel_archs_the_parallel_table_is_empty(
        measured: runtime.RuntimeTables, tmp_path: Path) -> None:
    assert measured.parallel.is_empty()
    assert "parallel" not in measured.breakdown.columns
    assert parallel_modes(measured.parallel, tmp_path / "parallel")[0].exists()


@pytest.mark.e2e
def test_parallel_rows_and_collectives_join_the_runtime_tables(tmp_path: Path) -> None:
    section = FAST | {"n_archs": 2, "workloads": ["train_step"], "dtypes": ["fp32"],
                      "options": {"attention": [], "quant": [], "compile": [], "recompute": []},
                      "serving": {"n_archs": 0, "batch_sizes": [1]},
                      "parallel": FAST["parallel"] | {"n_archs": 1}}
    aliases = {"cpu-test": auto_label(fingerprint(2, CPU))}
    tables = runtime.measure_runtime(section_of(RuntimeSettings, section), 2, SPACE,
                                     SPACE.sample(4, seed=3), VOCAB, "cpu-test", aliases)
    parallel, breakdown = tables.parallel, tables.breakdown
    assert tables.serving.is_empty()
    assert parallel.height == 3 * 2 and set(parallel["device"]) == {"cpu-test"}
    assert (parallel["status"] == "ok").all() and set(parallel["world_size"]) == {2}
    communication = breakdown.filter(pl.col("category") == "communication")
    assert set(communication["parallel"]) == {"none", "ddp", "zero3"}
    assert set(communication["workload"]) == {"train_step"}
    ddp = communication.filter(pl.col("parallel") == "ddp")["ms"]
    alone = communication.filter(pl.col("parallel") == "none")["ms"]
    assert (ddp > 0).all() and (alone == 0).all()
    assert set(breakdown["view"]) == {"modules", "operators", "collectives"}
    assert breakdown.filter(pl.col("parallel").is_null())["category"].is_in(
        ["backward", "optimizer"]).any()  # the single-process train step's rows stay
    paths = parallel_modes(parallel, tmp_path / "parallel")
    assert paths[0].read_bytes().startswith(b"\x89PNG")
    summary = parallel_table(parallel)
    state = dict(summary.select("mode", "state_mb").iter_rows())
    assert state["zero3"] < state["ddp"] == pytest.approx(state["none"])
    # the module breakdown figure keeps to the single-process rows
    assert breakdown_bars(breakdown, tmp_path / "bars")[0].exists()


def test_serving_figure_and_table(measured: runtime.RuntimeTables, tmp_path: Path) -> None:
    serving = measured.serving
    paths = serving_curves(serving, tmp_path / "serving")
    assert [p.name for p in paths] == ["serving.png", "serving.svg"]
    assert paths[0].read_bytes().startswith(b"\x89PNG")
    assert serving_table(serving).height == serving.height
    empty = serving_curves(pl.DataFrame(), tmp_path / "empty")
    assert empty[0].exists()


def test_serving_row_carries_the_failure_of_either_phase() -> None:
    def measure(condition: Condition) -> list[dict]:
        ok = condition.workload == "prefill" or condition.batch_size == 1
        return [{"arch_id": "a", "params": 1, **condition.as_dict(), "threads": 1,
                 "status": "ok" if ok else "oom", "reason": None if ok else "out of memory",
                 "latency_ms": 2.0 if ok else None, "tokens_per_s": 5.0 if ok else None,
                 "latency_ci95_ms": 0.1, "memory_peak_mb": None, "memory_reason": "cpu"}]

    rows = serving_sweep(measure, [1, 8], 16, 4, "fp32")
    assert [r["status"] for r in rows] == ["ok", "oom"]
    assert rows[1]["reason"] == "out of memory" and rows[1]["tpot_ms"] is None
    assert rows[0]["end_to_end_ms"] == 2.0 + 3 * 2.0


def test_conditions_are_queried_by_their_fields(measured: runtime.RuntimeTables,
                                                tmp_path: Path) -> None:
    table = measured.runtime
    section = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["surrogate"]
    section |= {"families": ["lightgbm"], "min_rows": 4, "folds": 2,
                "metrics": ["latency_ms"]}
    out = tmp_path / "results" / "small" / "surrogates" / "devices" / "cpu-test"
    quality = surrogates.fit_device(surrogate_settings(section), SPACE, VOCAB, table, out)
    assert quality.filter(pl.col("status") == "ok").height == table.filter(
        pl.col("status") == "ok")["condition"].n_unique()
    bench = Benchmark.load("small", tmp_path / "results")
    archs = SPACE.sample(5, seed=9)
    decode = bench.query(archs, "latency_ms", device="cpu-test",
                         condition={"workload": "decode", "dtype": "bf16"})
    by_id = bench.query(archs, "latency_ms", device="cpu-test",
                        condition="b1-t16-bf16-eager-decode8")
    assert decode.equals(by_id)
    with pytest.raises(QueryError, match="matches 2 conditions"):
        bench.query(archs, "latency_ms", device="cpu-test", condition={"workload": "decode"})
    with pytest.raises(QueryError, match="unknown condition fields"):
        bench.query(archs, "latency_ms", device="cpu-test", condition={"kernel": "x"})
    shutil.rmtree(out)


def test_the_memory_pass_holds_one_workload_at_a_time() -> None:
    alive: weakref.WeakSet[torch.nn.Module] = weakref.WeakSet()
    condition = Condition(1, 16, "fp32", workload="train_step")
    archs = [SPACE.smallest(), SPACE.largest(), *SPACE.sample(2, seed=3)]

    def build(arch: Arch) -> Workload:
        workload = build_workload(SPACE, arch, VOCAB, condition, CPU, 0)
        alive.add(workload.model)
        return workload

    def read(workload: Workload) -> dict[str, float]:
        gc.collect()
        return {"alive": len(alive),
                "weights": sum(p.numel() for p in workload.model.parameters())}

    def oom(arch: Arch) -> Workload:
        if arch == archs[2]:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return build(arch)

    rows = memory_pass(archs, lambda arch: read(oom(arch)))
    assert [row.get("alive") for row in rows] == [1, 1, None, 1]  # one workload at each read
    assert rows[2]["status"] == "oom" and rows[2]["reason"].startswith("out of memory")
    assert rows[1]["weights"] > rows[0]["weights"]
