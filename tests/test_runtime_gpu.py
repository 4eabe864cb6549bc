"""The runtime stage's memory on CUDA: each row is its workload alone on the device, as a fresh
process reads it (`s` archs). The other GPU paths of the runtime stage (flash attention in
bf16, recomputation, the CUDA breakdown, out of memory, int8) are the checks of
benchmarks/gpu_check.py, run as tests by tests/test_gpu_check.py.

Marked `gpu`: deselected by default, skipped without CUDA (`pytest -m gpu -s` prints the
numbers)."""

from __future__ import annotations

import gc
import multiprocessing as mp

import pytest
import torch
import yaml

from conftest import REPO_ROOT
from hwgptbench.meters.condition import Condition
from hwgptbench.meters.runner import Settings
from hwgptbench.runtime.rows import measure_condition
from hwgptbench.runtime.workloads import build_workload, cuda_peak_memory
from hwgptbench.space import Arch, SearchSpace

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

S = SearchSpace.from_dict("s", yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
                          ["spaces"]["s"])
VOCAB = 50304
CUDA = torch.device("cuda")


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
    settings = Settings(threads=1, warmup=1, min_repeats=3, max_repeats=6, target_rel_ci=0.02,
                        max_seconds=0.5, energy_seconds=3.0, memory=True, seed=0,
                        estimator="median")
    rows = measure_condition(S, archs, VOCAB, condition, CUDA, settings)
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
