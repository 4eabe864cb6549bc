"""GPU paths of the runtime stage on the largest arch of the `s` space: flash vs math attention,
activation recomputation's memory saving, CUDA-time breakdown, int8 unsupported with a reason.

Marked `gpu`: deselected by default, skipped without CUDA (`pytest -m gpu -s` prints the
numbers)."""

from __future__ import annotations

import gc
import multiprocessing as mp

import pytest
import torch
import yaml

from conftest import REPO_ROOT
from hwgptbench.measure.condition import Condition
from hwgptbench.measure.latency import measure_latency
from hwgptbench.measure.runner import Settings
from hwgptbench.runtime import stage as runtime
from hwgptbench.runtime.breakdown import profile_breakdown
from hwgptbench.runtime.workloads import build_workload, cuda_peak_memory, unsupported_reason
from hwgptbench.schema import OTHER
from hwgptbench.space import Arch, SearchSpace

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

S = SearchSpace.from_dict("s", yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
                          ["spaces"]["s"])
VOCAB = 50304
CUDA = torch.device("cuda")
TIMING = {"warmup": 5, "min_repeats": 20, "max_repeats": 200, "max_seconds": 3.0}


def _latency(condition: Condition) -> float:
    built = build_workload(S, S.largest(), VOCAB, condition, CUDA, 0)
    return measure_latency(built.call, CUDA, **TIMING)["latency_ms"]


def test_flash_attention_is_faster_than_math_on_long_prefill() -> None:
    base = {"batch_size": 8, "seq_len": 1024, "dtype": "bf16"}
    math_ms = _latency(Condition(**base, attention="math"))
    flash_ms = _latency(Condition(**base, attention="flash"))
    print(f"s largest, b8 t1024 bf16 prefill: math {math_ms:.2f} ms, flash {flash_ms:.2f} ms, "
          f"speed-up {math_ms / flash_ms:.2f}x")
    assert flash_ms < math_ms


def test_recomputation_saves_activation_memory_in_a_train_step() -> None:
    memory = {}
    for recompute in (False, True):
        condition = Condition(8, 1024, "bf16", workload="train_step", recompute=recompute)
        built = build_workload(S, S.largest(), VOCAB, condition, CUDA, 0)
        memory[recompute] = cuda_peak_memory(built, CUDA)
        del built
        torch.cuda.empty_cache()
    plain, saved = memory[False], memory[True]
    print(f"s largest, b8 t1024 bf16 train step: peak {plain['memory_peak_mb']:.0f} MB -> "
          f"{saved['memory_peak_mb']:.0f} MB with recomputation; activations "
          f"{plain['memory_activations_mb']:.0f} -> {saved['memory_activations_mb']:.0f} MB")
    assert saved["memory_activations_mb"] < 0.7 * plain["memory_activations_mb"]


def test_decode_and_breakdown_on_cuda() -> None:
    condition = Condition(1, 512, "bf16", workload="decode", gen_len=64)
    built = build_workload(S, S.largest(), VOCAB, condition, CUDA, 0)
    per_token = measure_latency(built.call, CUDA, **TIMING)["latency_ms"] / built.per_call
    profiled = profile_breakdown(built.model, built.call, 3, CUDA)
    named = sum(ms for name, ms in profiled["modules"].items() if name != OTHER)
    print(f"s largest decode: {per_token:.3f} ms per token; modules cover "
          f"{named / profiled['step_ms']:.2%} of the profiled step's kernel time")
    assert per_token > 0 and named <= profiled["step_ms"] * 1.05


def test_int8_on_cuda_is_unsupported_with_a_reason() -> None:
    reason = unsupported_reason(Condition(1, 128, "fp32", quant="int8"), CUDA, S.block_size)
    assert reason is not None and "torchao" in reason


def _alone(condition: Condition, arch_id: str, queue: mp.Queue[float]) -> None:
    """Subprocess: the allocator peak of one steady-state call of one workload, alone, over
    the memory allocated once the CUDA libraries are initialised (as the stage reads it: a
    workload of the smallest arch runs first, so the libraries' one-time workspaces exist)."""
    build_workload(S, S.smallest(), VOCAB, condition, CUDA, 0)
    gc.collect()
    torch.cuda.synchronize()
    baseline = torch.cuda.memory_allocated()
    built = build_workload(S, Arch.from_id(arch_id), VOCAB, condition, CUDA, 0)
    queue.put(cuda_peak_memory(built, CUDA, baseline)["memory_peak_mb"])


@pytest.mark.parametrize("workload", ["train_step", "prefill"])
def test_runtime_memory_is_that_of_the_workload_alone(workload: str) -> None:
    archs = [S.largest(), *S.sample(3, seed=0)]
    condition = Condition(4, 512, "bf16", workload=workload)
    settings = Settings(threads=1, warmup=1, min_repeats=3, max_repeats=6, max_seconds=0.5)
    rows = runtime.measure_condition(S, archs, VOCAB, condition, CUDA, settings)
    ctx = mp.get_context("spawn")
    for arch, row in zip(archs, rows, strict=True):  # the first workload of the process too
        queue: mp.Queue[float] = ctx.Queue()
        process = ctx.Process(target=_alone, args=(condition, arch.id, queue))
        process.start()
        alone = queue.get(timeout=300)
        process.join()
        print(f"{workload} {arch.id[:40]}: among {len(archs)} {row['memory_peak_mb']:.1f} MB, "
              f"alone {alone:.1f} MB")
        assert row["status"] == "ok"
        assert row["memory_peak_mb"] == pytest.approx(alone, rel=0.02, abs=8)
