"""A GPU workstation is a supported machine: the device choices that a CUDA host changes, run on
this CPU with CUDA's availability simulated (no CUDA call is made), and the GPU paths' logic on
events and errors shaped as a GPU run gives them. The same paths on a real GPU:
``tests/test_gpu_check.py`` (``pytest -m gpu``) and ``benchmarks/gpu_check.py``."""

from __future__ import annotations

import logging
import sys
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import torch
from torch.autograd import DeviceType

from conftest import DEVICE_ENV, DEVICE_GIVEN, REPO_ROOT
from hwgptbench import params
from hwgptbench.campaign import budget, plan
from hwgptbench.campaign.shard import device_label
from hwgptbench.errors import UserError
from hwgptbench.meters.condition import Condition
from hwgptbench.meters.device import default_device, process_group_backend
from hwgptbench.meters.runner import Settings
from hwgptbench.model import GPT
from hwgptbench.params import section_of
from hwgptbench.runtime import parallel
from hwgptbench.runtime.breakdown import STEP, attribute
from hwgptbench.runtime.rows import measure_condition, runtime_conditions
from hwgptbench.runtime.serving import serving_sweep
from hwgptbench.settings.sections import MeasureSettings, RuntimeSettings
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training import train
from hwgptbench.versions import library_versions
from test_runtime import FAST, SPACE, VOCAB
from test_train import CONFIG, SMALL_SPACE

CPU = torch.device("cpu")
GB = 2**30


@pytest.fixture
def gpu_host(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """This machine as a workstation with 4 CUDA GPUs, to the code that chooses devices."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    return monkeypatch


@pytest.mark.skipif(DEVICE_GIVEN, reason=f"{DEVICE_ENV} was set before the tests started")
def test_the_suite_runs_on_the_cpu_of_a_gpu_host(gpu_host: pytest.MonkeyPatch) -> None:
    assert default_device() == CPU  # tests/conftest.py sets HWGPTBENCH_DEVICE=cpu


def test_the_device_env_picks_the_device(gpu_host: pytest.MonkeyPatch) -> None:
    gpu_host.delenv(DEVICE_ENV)
    assert default_device() == torch.device("cuda", 0)
    assert default_device(2) == torch.device("cuda", 2)  # a rank's own GPU
    for named, device in [("auto", torch.device("cuda", 0)), ("cpu", CPU),
                          ("cuda", torch.device("cuda", 0)), ("cuda:1", torch.device("cuda", 1))]:
        gpu_host.setenv(DEVICE_ENV, named)
        assert default_device() == device, named
    gpu_host.setenv(DEVICE_ENV, "tpu")
    with pytest.raises(UserError, match="expected cpu, cuda"):
        default_device()
    gpu_host.setattr(torch.cuda, "is_available", lambda: False)
    gpu_host.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(UserError, match="sees no CUDA device"):
        default_device()


class _Started(Exception):
    """Raised in place of starting a process group: the test stops there."""


def _backend_of_training(device: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The backend that rank 0 of 2 training on ``device`` initializes its process group with."""
    chosen = []

    def init_process_group(backend: str, *args: Any, **kwargs: Any) -> None:
        chosen.append(backend)
        raise _Started

    monkeypatch.setattr(torch.distributed, "init_process_group", init_process_group)
    for name, value in {"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    cfg = replace(CONFIG, device=device, processes=2)
    with pytest.raises(_Started):
        train.train(cfg, SMALL_SPACE, cast(TokenShards, None), Path("unused"), Path("unused"))
    return chosen[0]


def test_training_on_the_cpu_of_a_gpu_host_takes_gloo(gpu_host: pytest.MonkeyPatch,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        assert _backend_of_training("cpu", gpu_host) == "gloo"
        assert _backend_of_training("auto", gpu_host) == "gloo"  # HWGPTBENCH_DEVICE=cpu
        gpu_host.delenv(DEVICE_ENV)
        assert _backend_of_training("auto", gpu_host) == "nccl"
        assert _backend_of_training("cpu", gpu_host) == "gloo"
    assert process_group_backend(torch.device("cuda", 3)) == "nccl"


def test_parallel_ranks_follow_the_device(gpu_host: pytest.MonkeyPatch) -> None:
    gpu_host.setenv(DEVICE_ENV, "cpu")
    assert parallel.ranks_and_threads(cpu_ranks=2)[0] == 2
    with parallel.process_group() as rank:  # a real world of 1
        assert (rank.backend, rank.device) == ("gloo", CPU)
    gpu_host.delenv(DEVICE_ENV)
    assert parallel.ranks_and_threads(cpu_ranks=2)[0] == 4  # one per GPU


def test_measure_labels_and_plans_name_the_chosen_device(gpu_host: pytest.MonkeyPatch) -> None:
    gpu_host.setenv(DEVICE_ENV, "cpu")
    section = section_of(MeasureSettings, params.load(REPO_ROOT / "params.yaml")["measure"])
    auto = section.model_copy(update={"device": "auto", "aliases": {}})
    assert device_label(auto, 2).startswith("cpu-")
    machine = plan.this_machine(section.model_copy(update={"device": "auto", "threads": 2}))
    [(label, memory)] = machine.items()
    assert label.startswith("cpu-") and not memory.gpu


def test_the_budget_counts_the_allocators_cached_blocks_free(
        gpu_host: pytest.MonkeyPatch) -> None:
    driver = {"total": 40 * GB, "cached": 0}  # what the driver sees this process hold

    def empty_cache() -> None:
        driver["cached"] = 0

    gpu_host.setattr(torch.cuda, "empty_cache", empty_cache)
    gpu_host.setattr(torch.cuda, "mem_get_info",
                     lambda device=None: (driver["total"] - driver["cached"], driver["total"]))
    cuda = torch.device("cuda", 0)
    first = budget.budget_bytes(None, cuda)
    driver["cached"] = 12 * GB  # the first condition's groups, dropped, their blocks cached
    assert budget.budget_bytes(None, cuda) == first == int(0.6 * 40 * GB)  # as measure-plan


def _out_of_memory_from(batch: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Forwards of ``batch`` sequences or more run out of memory (as a CUDA device does)."""
    forward = GPT.forward

    def limited(self: GPT, idx: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if idx.size(0) >= batch:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(self, idx, *args, **kwargs)

    monkeypatch.setattr(GPT, "forward", limited)


def test_out_of_memory_in_the_first_call_is_oom_not_unsupported(
        monkeypatch: pytest.MonkeyPatch) -> None:
    _out_of_memory_from(4, monkeypatch)
    settings = Settings(threads=1, warmup=1, min_repeats=3, max_repeats=5, target_rel_ci=0.02,
                        max_seconds=0.05, energy_seconds=3.0, memory=True, seed=0,
                        estimator="median")
    archs = [SPACE.smallest(), SPACE.largest()]
    for workload in ("prefill", "decode", "train_step"):
        condition = Condition(4, 16, "fp32", workload=workload,
                              gen_len=8 if workload == "decode" else 0)
        rows = measure_condition(SPACE, archs, VOCAB, condition, CPU, settings)
        assert {r["status"] for r in rows} == {"oom"}, [r["reason"] for r in rows]
        assert all(r["reason"].startswith("out of memory") and r["latency_ms"] is None
                   for r in rows)
    served = serving_sweep(
        lambda condition: measure_condition(SPACE, archs, VOCAB, condition, CPU, settings),
        [1, 4], 16, 8, "fp32")
    assert [(r["batch_size"], r["status"]) for r in served] == [
        (1, "ok"), (1, "ok"), (4, "oom"), (4, "oom")]
    assert all(r["reason"].startswith("out of memory") for r in served if r["status"] == "oom")


def test_options_are_varied_on_bf16_on_cuda() -> None:
    cuda = torch.device("cuda", 0)
    fast = section_of(RuntimeSettings, FAST)
    varied = {c.dtype for c in runtime_conditions(fast, cuda)
              if c.attention != "default" or c.recompute or c.quant != "none"}
    assert varied == {"bf16"}  # flash attention has no fp32 CUDA kernel
    assert {c.dtype for c in runtime_conditions(fast, CPU) if c.attention != "default"} == {
        "fp32"}
    fp32_only = fast.model_copy(update={"dtypes": ("fp32",)})
    assert {c.dtype for c in runtime_conditions(fp32_only, cuda)} == {"fp32"}


def _event(name: str, thread: int, start: float, end: float, device_ms: float = 0.0,
           parent: Any = None, kind: DeviceType = DeviceType.CPU,
           annotation: bool = False) -> SimpleNamespace:
    """A profiler event as ``prof.events()`` gives it (times in us; ``device_ms`` of kernels,
    its children's included)."""
    return SimpleNamespace(name=name, thread=thread, device_type=kind, is_async=False,
                           is_user_annotation=annotation, cpu_parent=parent,
                           time_range=SimpleNamespace(start=start, end=end),
                           cpu_time_total=end - start, self_cpu_time_total=end - start,
                           device_time_total=device_ms * 1000,
                           self_device_time_total=device_ms * 1000)


def test_a_cuda_backward_on_autograd_s_thread_is_charged_to_its_range() -> None:
    main, autograd = 1, 2
    step = _event(STEP, main, 0, 100, device_ms=30.5)  # kernels its own thread launched
    mlp = _event("mlp_up", main, 5, 20, 18, step)
    backward = _event("backward", main, 20, 80, 0.5, step)  # the loss's seed gradient
    optimizer = _event("optimizer", main, 80, 95, 12, step)
    nodes = [_event("autograd::engine::evaluate_function: MmBackward0", autograd, a, b, ms)
             for a, b, ms in [(25, 40, 25), (45, 70, 15)]]
    kernels = [_event("aten::addmm", main, 6, 19, 18, mlp),
               *(_event("aten::mm", autograd, n.time_range.start + 1, n.time_range.end - 1,
                        n.device_time_total / 1000, n) for n in nodes),
               _event("aten::_foreach_add_", main, 81, 94, 12, optimizer)]
    outside = _event("autograd::engine::evaluate_function: AddBackward0", autograd, 150, 160, 5)
    projection = _event("backward", 0, 22, 78, 56, kind=DeviceType.CUDA, annotation=True)
    events = [step, mlp, backward, optimizer, *nodes, *kernels, outside, projection]

    total, modules, operators = attribute(events, cuda=True)
    assert total == pytest.approx(30.5 + 25 + 15)
    assert modules["backward"] == pytest.approx(0.5 + 25 + 15)
    assert modules["mlp_up"] == pytest.approx(18) and modules["optimizer"] == pytest.approx(12)
    assert sum(modules.values()) <= total + 1e-9
    assert operators == pytest.approx({"matmul": 58, "optimizer": 12})
    assert sum(operators.values()) <= total + 1e-9
    total_cpu, modules_cpu, _ = attribute(events, cuda=False)  # host time, one thread
    assert (total_cpu, modules_cpu["backward"]) == pytest.approx((0.1, 0.06))  # ms


def test_a_collective_kernel_is_counted_once() -> None:
    issued = _event("nccl:all_reduce", 1, 9.0, 9.2)
    kernel = _event("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 7, 10, 12, 2,
                    kind=DeviceType.CUDA)
    projection = _event("nccl:all_reduce", 7, 9.5, 12.5, 3, kind=DeviceType.CUDA,
                        annotation=True)
    assert parallel.collective_events([issued, projection, kernel], cuda=True) == [
        ("all_reduce", 10, 12)]


def test_versions_name_the_build_that_ran(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CUDA build's metadata can say 2.11.0 where the module says 2.11.0+cu130: the loaded
    module's version is recorded (a manifest's torch_version equals torch.__version__)."""
    monkeypatch.setitem(sys.modules, "some_build", SimpleNamespace(__version__="2.11.0+cu130"))
    versions = library_versions("torch", "some-build", "no-such-distribution")
    assert versions["torch_version"] == torch.__version__
    assert versions["some_build_version"] == "2.11.0+cu130"
    assert versions["no_such_distribution_version"] == "not installed"
