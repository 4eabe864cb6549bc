"""Data-parallel train steps (hwgptbench.runtime.parallel): 2 gloo ranks under torchrun on the
CPU hold ZeRO's shares of the training state and run the collectives their mode implies; the
NCCL path on a CUDA machine."""

from __future__ import annotations

import logging
import time
from collections import defaultdict
from typing import Any

import polars as pl
import pytest
import torch

from hwgptbench.meters.memory import tensors_bytes
from hwgptbench.meters.runner import build_model
from hwgptbench.runtime import parallel
from hwgptbench.runtime.parallel import (
    COLLECTIVE_FIELDS,
    MODES,
    collective_kind,
    launch_parallel,
    measure_parallel,
)
from hwgptbench.schema import COMMUNICATION
from hwgptbench.space import Arch, SearchSpace

SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2, 4], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 48, "rotary_fraction": 0.5})
VOCAB = 97
ARCHS = [Arch.from_id("e32-l2-h2_2-r2_2-b1"), SPACE.smallest()]
RANKS = 2
FAST = {"batch_size": 1, "seq_len": 8, "warmup": 0, "repeats": 2, "profile_steps": 1}
log = logging.getLogger(__name__)


def _bytes(arch: Arch) -> tuple[int, int]:
    """Exact fp32 bytes of the model's parameters, and of those of the root module itself
    (embedding and final norm, which FSDP2 keeps gathered from forward to backward)."""
    model = build_model(SPACE, arch, VOCAB, 0, torch.device("cpu"), torch.float32)
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    blocks = sum(p.numel() * p.element_size() for p in model.blocks.parameters())
    return total, total - blocks


def test_collective_names_map_to_their_kind() -> None:
    assert collective_kind("c10d::allreduce_") == "all_reduce"
    assert collective_kind("gloo:all_reduce") == "all_reduce"
    assert collective_kind("c10d::_reduce_scatter_base_") == "reduce_scatter"
    assert collective_kind("c10d::reduce_scatter_tensor_coalesced_") == "reduce_scatter"
    assert collective_kind("c10d::_allgather_base_") == "all_gather"
    assert collective_kind("nccl:all_gather_into_tensor_coalesced") == "all_gather"
    assert collective_kind("ncclDevKernel_ReduceScatter_Sum_f32_RING_LL") == "reduce_scatter"
    assert collective_kind("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "all_reduce"
    assert collective_kind("ncclKernel_Broadcast_RING_LL_Sum_int8_t") == "broadcast"
    assert collective_kind("gloo:barrier") == "other"


def test_tied_and_viewed_tensors_count_once() -> None:
    weight = torch.zeros(4, 8)
    flat = torch.zeros(16)
    # one tensor twice (a tied weight) once; two views of one buffer both
    assert tensors_bytes([weight, weight, flat[:8], flat[8:]]) == 4 * 8 * 4 + 16 * 4


def test_one_process_is_a_world_of_one_and_failures_become_rows(
        monkeypatch: pytest.MonkeyPatch) -> None:
    arch = SPACE.smallest()
    rows = measure_parallel(SPACE, [arch], VOCAB, recompute_values=[True],
                            dtypes=["fp32", "bf16"], **FAST)
    assert [(r["mode"], r["dtype"]) for r in rows] == [(m, d) for m in MODES
                                                      for d in ("fp32", "bf16")]
    assert {(r["status"], r["world_size"], r["backend"]) for r in rows} == {("ok", 1, "gloo")}
    total, _ = _bytes(arch)
    # nothing to shard: every mode holds the whole state, fp32 weights under bf16 autocast
    assert {(r["param_bytes"], r["grad_bytes"]) for r in rows} == {(total, total)}
    assert len({r["state_bytes"] for r in rows}) == 1
    assert not torch.distributed.is_initialized()  # the group it made is gone

    def out_of_memory(*args: Any, **kwargs: Any) -> dict[str, Any]:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(parallel, "measure_config", out_of_memory)
    [row] = measure_parallel(SPACE, [arch], VOCAB, modes=["zero3"], recompute_values=[False],
                             **FAST)
    assert row["status"] == "oom" and row["reason"].startswith("rank 0: CUDA out of memory")
    assert row["step_ms"] is None and row["state_bytes"] is None
    with pytest.raises(ValueError, match="unknown modes or dtypes"):
        measure_parallel(SPACE, [arch], VOCAB, modes=["zero4"])


@pytest.mark.e2e
def test_two_gloo_ranks_hold_zero_shares_and_run_their_collectives() -> None:
    started = time.monotonic()
    tables = launch_parallel(SPACE, ARCHS, VOCAB, cpu_ranks=RANKS, **FAST)
    elapsed = time.monotonic() - started
    rows = tables.runtime
    assert rows.height == len(ARCHS) * len(MODES) * 2 * RANKS
    assert rows.select("arch_id", "mode", "recompute", "rank").n_unique() == rows.height
    assert rows["status"].to_list() == ["ok"] * rows.height, rows.filter(
        pl.col("status") != "ok").select("mode", "reason").to_dicts()
    assert set(rows["world_size"]) == {RANKS} and set(rows["backend"]) == {"gloo"}
    assert set(rows["dtype"]) == {"fp32"} and set(rows["recompute"]) == {False, True}
    assert (rows["step_ms"] > 0).all() and rows["memory_reason"].str.contains("RSS").all()
    tokens = RANKS * FAST["batch_size"] * FAST["seq_len"]
    assert ((rows["tokens_per_s"] * rows["step_ms"] / 1000 - tokens).abs() < 1e-6).all()
    kinds = rows.select(COLLECTIVE_FIELDS).sum_horizontal()
    assert ((rows["comm_ms"] - kinds).abs() < 1e-9).all()
    assert (rows["compute_ms"] <= rows["profiled_step_ms"] + 1e-9).all()

    by: dict[tuple[str, bool, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows.sort("rank").iter_rows(named=True):
        by[row["arch_id"], row["recompute"], row["mode"]].append(row)
    summary = []
    for arch in ARCHS:
        total, root = _bytes(arch)
        for recompute in (False, True):
            mode = {m: by[arch.id, recompute, m] for m in MODES}

            def summed(m: str, field: str, mode: dict[str, list[dict[str, Any]]] = mode
                       ) -> int:
                return sum(r[field] for r in mode[m])

            ddp_optim = mode["ddp"][0]["optim_bytes"]
            counters = ddp_optim - 2 * total  # AdamW's step counter per parameter tensor
            n_tensors = len(list(build_model(SPACE, arch, VOCAB, 0, torch.device("cpu"),
                                             torch.float32).parameters()))
            assert n_tensors * 4 <= counters <= n_tensors * 8
            for r in range(RANKS):
                states = [mode[m][r]["state_bytes"] for m in ("zero3", "zero2", "zero1", "ddp")]
                assert states == sorted(set(states)), states  # zero3 < zero2 < zero1 < ddp
                assert mode["none"][r]["state_bytes"] == mode["ddp"][r]["state_bytes"]
                for m in ("none", "ddp"):
                    assert (mode[m][r]["param_bytes"], mode[m][r]["grad_bytes"],
                            mode[m][r]["optim_bytes"]) == (total, total, ddp_optim)
                for m in ("zero1", "zero2"):
                    assert mode[m][r]["param_bytes"] == total
                assert mode["zero1"][r]["grad_bytes"] == total
            assert summed("zero1", "optim_bytes") == ddp_optim
            for m in ("zero2", "zero3"):  # every rank holds a shard and a counter of each
                assert summed(m, "grad_bytes") == total
                assert summed(m, "optim_bytes") == 2 * total + RANKS * counters
            # the blocks' parameters sharded, the root's gathered on every rank
            assert summed("zero3", "param_bytes") == total - root + RANKS * root

            for r in range(RANKS):
                assert mode["none"][r]["comm_ms"] == 0
                assert mode["ddp"][r]["comm_all_reduce_ms"] > 0
                assert mode["zero1"][r]["comm_broadcast_ms"] > 0  # parameters after the step
                for m in ("zero2", "zero3"):
                    assert mode[m][r]["comm_all_gather_ms"] > 0
                    assert mode[m][r]["comm_reduce_scatter_ms"] > 0
                    assert mode[m][r]["comm_all_reduce_ms"] == 0
            summary.append(f"{arch.id} recompute={recompute}: " + ", ".join(
                f"{m} state {mode[m][0]['state_bytes']} B step {mode[m][0]['step_ms']:.1f} ms "
                f"comm {mode[m][0]['comm_ms']:.1f} ms" for m in MODES))

    breakdown = tables.breakdown
    communication = breakdown.filter(pl.col("category") == COMMUNICATION)
    assert communication.height == rows.height and set(communication["view"]) == {"modules"}
    joined = communication.join(rows, on=["arch_id", "mode", "recompute", "dtype", "rank"])
    assert ((joined["ms"] - joined["comm_ms"]).abs() < 1e-9).all()
    assert set(breakdown.filter(pl.col("view") == "collectives")["category"]) == {
        "all_reduce", "all_gather", "reduce_scatter", "broadcast", "other"}
    log.info("2 gloo ranks, %.1f s:\n%s", elapsed, "\n".join(summary))


@pytest.mark.e2e
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_nccl_ranks_on_the_gpus() -> None:
    arch = SPACE.largest()
    tables = launch_parallel(SPACE, [arch], VOCAB, modes=["none", "ddp", "zero1", "zero3"],
                             recompute_values=[False], dtypes=["fp32", "bf16"], batch_size=2,
                             seq_len=32, warmup=1, repeats=3, profile_steps=2)
    rows = tables.runtime
    world = torch.cuda.device_count()
    assert rows.height == 4 * 2 * world
    assert rows["status"].to_list() == ["ok"] * rows.height, rows["reason"].to_list()
    assert set(rows["backend"]) == {"nccl"} and set(rows["world_size"]) == {world}
    assert rows["memory_reason"].is_null().all() and (rows["memory_peak_mb"] > 0).all()
    total, root = _bytes(arch)
    fp32 = rows.filter(pl.col("dtype") == "fp32")
    ddp = fp32.filter(pl.col("mode") == "ddp")
    assert set(ddp["param_bytes"]) == {total} and set(ddp["grad_bytes"]) == {total}
    zero3 = fp32.filter(pl.col("mode") == "zero3")
    assert zero3["grad_bytes"].sum() == total
    assert zero3["param_bytes"].sum() == total - root + world * root
    assert (fp32.filter(pl.col("mode") == "none")["comm_ms"] == 0).all()
    if world > 1:
        assert (ddp["comm_all_reduce_ms"] > 0).all()
        assert (zero3["comm_all_gather_ms"] > 0).all()
        assert (zero3["comm_reduce_scatter_ms"] > 0).all()
    log.info("%d NCCL rank(s):\n%s", world, rows.select(
        "mode", "dtype", "rank", "state_bytes", "step_ms", "comm_ms", "memory_peak_mb"))
