"""GPU checks: the GPU paths of the measure and runtime stages, on one CUDA device, in minutes.

    PYTHONPATH=src python benchmarks/gpu_check.py [--only NAME ...]

Each check is a function that returns what it measured or raises; one line per check,
``PASS name: detail`` or ``FAIL name: error``, then a summary; the exit status is 1 when any
check failed. Without CUDA every check is ``SKIP`` and the exit status 0. The script needs
torch and numpy (no polars, lightgbm or pytest: a lent GPU machine runs it as it is, with the
package from ``src/``); ``pytest -m gpu tests/test_gpu_check.py`` runs the same checks.

The model is that of the `s` space's largest arch (E 768, 12 layers of 12 heads of 64, MLP
ratio 4, context 1024, GPT-2 vocabulary padded to 50304), or shallower where depth is varied.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import torch
import yaml
from torch.autograd import DeviceType

try:
    import hwgptbench
except ImportError:  # a checkout without the package installed
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
    import hwgptbench

from hwgptbench.campaign.budget import free_memory_bytes
from hwgptbench.meters.condition import Condition
from hwgptbench.meters.device import DEVICE_ENV, default_device, process_group_backend, release
from hwgptbench.meters.energy import open_energy_meter
from hwgptbench.meters.memory import MB
from hwgptbench.meters.runner import Settings, measure_arch
from hwgptbench.params import section_of
from hwgptbench.runtime.breakdown import profile_breakdown, profiled_steps
from hwgptbench.runtime.parallel import (
    STEP,
    build_trainer,
    collective_events,
    process_group,
    ranks_and_threads,
)
from hwgptbench.runtime.rows import measure_condition, runtime_conditions
from hwgptbench.runtime.serving import serving_sweep
from hwgptbench.runtime.workloads import build_workload, cuda_peak_memory, unsupported_reason
from hwgptbench.schema import MODULE_CLASSES, OTHER
from hwgptbench.settings.sections import RuntimeSettings
from hwgptbench.space import Arch, SearchSpace

CUDA = torch.device("cuda", 0)
VOCAB = 50304
GB = 2**30
SPACE = SearchSpace.from_dict("gpu-check", {
    "embed_dim": [768], "n_layer": [2, 8, 12], "n_head": [12], "mlp_ratio": [4], "bias": [True],
    "head_size": 64, "block_size": 1024, "rotary_fraction": 0.5})
LARGEST = SPACE.largest()
SETTINGS = Settings(threads=1, warmup=2, min_repeats=10, max_repeats=50, target_rel_ci=0.02,
                    max_seconds=0.5, energy_seconds=2.0, memory=True, seed=0,
                    estimator="median")
# the runtime section's options as params.yaml sets them
OPTIONS = {"attention": ["math", "flash", "efficient"], "quant": ["int8"], "compile": [],
           "recompute": [True]}


def _layers(n: int) -> Arch:
    return Arch(768, n, (12,) * n, (4,) * n, True)


def _set_env(name: str, value: str | None) -> None:
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value


@contextlib.contextmanager
def _env(name: str, value: str | None) -> Iterator[None]:
    """The environment variable set to value (None: unset) within the block."""
    saved = os.environ.get(name)
    _set_env(name, value)
    try:
        yield
    finally:
        _set_env(name, saved)


@contextlib.contextmanager
def _memory_cap(gb: float) -> Iterator[None]:
    """PyTorch's allocator limited to what it holds now plus ``gb`` GiB within the block."""
    release(CUDA)
    total = torch.cuda.get_device_properties(CUDA).total_memory
    cap = torch.cuda.memory_reserved(CUDA) + gb * GB
    torch.cuda.set_per_process_memory_fraction(cap / total, CUDA)
    try:
        yield
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, CUDA)
        release(CUDA)


def check_device_selection() -> str:
    """The GPU unless HWGPTBENCH_DEVICE says cpu; ranks take NCCL on the GPU, gloo on the CPU."""
    with _env(DEVICE_ENV, None), process_group() as rank:
        auto, gpu = default_device(), (rank.backend, rank.device.type)
    with _env(DEVICE_ENV, "cpu"), process_group() as rank:
        pinned, cpu = default_device(), (rank.backend, rank.device.type)
        cpu_ranks = ranks_and_threads(cpu_ranks=2)[0]
    assert auto == CUDA and gpu == ("nccl", "cuda"), (auto, gpu)
    assert pinned.type == "cpu" and cpu == ("gloo", "cpu") and cpu_ranks == 2, (pinned, cpu)
    assert process_group_backend(torch.device("cpu")) == "gloo"  # supernet training too
    return f"auto {auto} ({gpu[0]}), {DEVICE_ENV}=cpu: {pinned} ({cpu[0]}, {cpu_ranks} ranks)"


def check_oom_is_a_status() -> str:
    """Out of memory in a workload's first call (its build) is ``oom``, in serving rows too."""
    with _memory_cap(1.5):
        [train] = measure_condition(SPACE, [LARGEST], VOCAB,
                                    Condition(8, 1024, "bf16", workload="train_step"), CUDA,
                                    SETTINGS)
        served = serving_sweep(
            lambda c: measure_condition(SPACE, [LARGEST], VOCAB, c, CUDA, SETTINGS), [64], 960,
            64, "bf16")
    statuses = [train["status"], *(row["status"] for row in served)]
    assert statuses == ["oom", "oom"], [train["reason"], *(r["reason"] for r in served)]
    return f"train step b8 t1024 and serving b64 under a 1.5 GiB cap: {train['reason'][:60]}"


def check_flash_attention_in_bf16() -> str:
    """Options are varied on bf16 on CUDA; flash runs there (prefill, train step) and beats
    math attention on a long prefill."""
    runtime = yaml.safe_load((Path(__file__).resolve().parents[1] / "params.yaml").read_text(
        encoding="utf-8"))["runtime"]
    section = section_of(RuntimeSettings, runtime | {
        "batch_size": 8, "seq_len": 1024, "dtypes": ["fp32", "bf16"],
        "workloads": ["prefill", "train_step"], "options": OPTIONS})
    attention = [c for c in runtime_conditions(section, CUDA) if c.attention != "default"]
    assert {c.dtype for c in attention} == {"bf16"}, [c.id for c in attention]
    rows = {c.id: measure_condition(SPACE, [LARGEST], VOCAB, c, CUDA, SETTINGS)[0]
            for c in attention if c.attention in ("flash", "math")}
    failed = {k: r["reason"] for k, r in rows.items() if r["status"] != "ok"}
    assert not failed, failed
    flash, math = rows["b8-t1024-bf16-eager-sdpa_flash"], rows["b8-t1024-bf16-eager-sdpa_math"]
    assert flash["latency_ms"] < math["latency_ms"], (flash["latency_ms"], math["latency_ms"])
    return (f"b8 t1024 bf16 prefill: flash {flash['latency_ms']:.2f} ms, math "
            f"{math['latency_ms']:.2f} ms ({math['latency_ms'] / flash['latency_ms']:.2f}x); "
            f"{len(rows)} rows ok")


def _breakdown(condition: Condition) -> tuple[float, dict[str, float], float]:
    built = build_workload(SPACE, LARGEST, VOCAB, condition, CUDA, 0)
    profiled = profile_breakdown(built.model, built.call, 3, CUDA)
    return profiled["step_ms"], profiled["modules"], sum(profiled["operators"].values())


def check_train_step_breakdown() -> str:
    """A CUDA train step's backward (on autograd's device thread) is charged to ``backward``;
    module classes and operators each sum to at most the step."""
    step, modules, operators = _breakdown(Condition(4, 512, "bf16", workload="train_step"))
    named = sum(ms for name, ms in modules.items() if name != OTHER)
    forward = sum(modules.get(name, 0.0) for name in MODULE_CLASSES)
    backward = modules.get("backward", 0.0)
    detail = (f"step {step:.2f} ms of kernels: forward {forward / step:.0%}, backward "
              f"{backward / step:.0%}, classes {named / step:.0%}, operators "
              f"{operators / step:.0%}")
    # backward computes about twice the forward's FLOPs: well over a quarter of the step
    assert backward > 0.25 * step and named <= 1.05 * step, detail
    assert 0.5 * step <= operators <= 1.05 * step, detail
    return detail


def check_decode_breakdown() -> str:
    """Decode's module classes cover its kernel time, never more."""
    step, modules, operators = _breakdown(Condition(1, 512, "bf16", workload="decode",
                                                    gen_len=64))
    named = sum(ms for name, ms in modules.items() if name != OTHER)
    detail = (f"64 tokens: {step:.2f} ms of kernels, classes {named / step:.0%}, operators "
              f"{operators / step:.0%}")
    assert 0.5 * step <= named <= 1.05 * step and operators <= 1.05 * step, detail
    return detail


def check_collectives_counted_once() -> str:
    """NCCL collectives are their kernels, once each (not also their ranges on the GPU
    timeline): disjoint in time, no more than the collectives issued."""
    with _env(DEVICE_ENV, None), process_group() as rank:
        trainer = build_trainer(SPACE, _layers(2), VOCAB, "ddp", False, "bf16", 2, 128, 0,
                                rank)

        def step() -> None:
            trainer.step()
            torch.cuda.synchronize(CUDA)

        step()
        events = list(profiled_steps(step, 3, CUDA, STEP).events())
    kernels = collective_events(events, cuda=True)
    issued = [e for e in events if e.device_type == DeviceType.CPU and e.name.startswith("nccl:")
              and not (e.cpu_parent is not None and e.cpu_parent.name.startswith("nccl:"))]
    ranges = [e for e in events if e.device_type == DeviceType.CUDA and e.is_user_annotation
              and e.name.startswith("nccl:")]
    spans = sorted((start, end) for _, start, end in kernels)
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:], strict=False)), spans
    assert not issued or len(kernels) <= len(issued), (len(kernels), len(issued))
    return (f"DDP, world of {rank.world_size}: {len(issued)} collectives issued, "
            f"{len(kernels)} NCCL kernels counted, {len(ranges)} nccl ranges on the GPU "
            "timeline left out")


def _first_train_rows() -> list[float]:
    """In a fresh process: the memory peaks of one train step workload, twice."""
    rows = measure_condition(SPACE, [_layers(2)] * 2, VOCAB,
                             Condition(4, 512, "bf16", workload="train_step"), CUDA, SETTINGS)
    return [row["memory_peak_mb"] for row in rows]


def check_first_train_step_row() -> str:
    """A process's first train-step row equals its second (autograd's cuBLAS workspace is
    created before either is read)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(Path(hwgptbench.__file__).resolve().parents[1]), os.environ.get("PYTHONPATH", "")])}
    child = subprocess.run([sys.executable, __file__, "--child", "first-train-rows"], env=env,
                           capture_output=True, text=True, timeout=240, check=False)
    if child.returncode != 0:
        raise RuntimeError(f"child exited {child.returncode}: {child.stderr[-2000:]}")
    first, second = json.loads(child.stdout.strip().splitlines()[-1])
    assert abs(first - second) <= 1.0, (first, second)
    return f"train step b4 t512 bf16, E768 L2: {first:.1f} MB then {second:.1f} MB"


def check_budget_counts_cached_blocks() -> str:
    """The measure stage's default budget is read with the allocator's cached blocks
    returned: a dropped model does not shrink it."""
    before = free_memory_bytes(CUDA)
    block = torch.empty(2 * GB, dtype=torch.uint8, device=CUDA)
    del block  # cached by the allocator, free to this process
    cached = torch.cuda.memory_reserved(CUDA)
    after = free_memory_bytes(CUDA)
    assert abs(after - before) <= 64 * MB, (before / GB, after / GB)
    return (f"free {before / GB:.2f} GiB, then {after / GB:.2f} GiB after 2 GiB were dropped "
            f"(allocator held {cached / GB:.2f} GiB)")


def check_recompute_saves_per_block() -> str:
    """Recomputation keeps one tensor per block: the activation peak grows per layer by the
    block's fp32 input (B x T x E x 4 bytes, what non-reentrant checkpointing holds), against
    every saved activation of the block without it (~10x that in bf16 autocast: the LayerNorm
    input, QKV, attention inputs and output, the MLP's 4E hidden twice, the bf16 weight
    copies). The logits and the fp32 loss, which dominate the peak and are not checkpointed,
    are the same at every depth and cancel out."""
    batch, seq = 8, 1024
    peak: dict[tuple[int, bool], float] = {}
    for depth in (2, 8):
        for recompute in (False, True):
            condition = Condition(batch, seq, "bf16", workload="train_step", recompute=recompute)
            built = build_workload(SPACE, _layers(depth), VOCAB, condition, CUDA, 0)
            peak[depth, recompute] = cuda_peak_memory(built, CUDA)["memory_activations_mb"] * MB
            del built
            release(CUDA)
    block_input = batch * seq * 768 * 4
    per_layer = {r: (peak[8, r] - peak[2, r]) / 6 / block_input for r in (False, True)}
    detail = (f"b8 t1024 bf16, per layer: {per_layer[False]:.2f}x the block input without, "
              f"{per_layer[True]:.2f}x with recomputation; peak at 8 layers "
              f"{peak[8, False] / MB:.0f} -> {peak[8, True] / MB:.0f} MB")
    assert per_layer[True] <= 1.5 and per_layer[False] >= 4.0, detail
    return detail


def check_int8_is_unsupported_on_cuda() -> str:
    """int8 (torch.ao, CPU kernels only) on CUDA is a row with its reason."""
    reason = unsupported_reason(Condition(1, 128, "fp32", quant="int8"), CUDA, 1024)
    assert reason is not None and "torchao" in reason, reason
    return reason[:80]


def check_measure_rows() -> str:
    """The measure stage's row of the largest arch, eager and as a CUDA graph: latency,
    memory, energy (or its reason)."""
    with open_energy_meter(CUDA) as meter:
        rows = {launch: measure_arch(SPACE, LARGEST, VOCAB, Condition(1, 128, "bf16", launch),
                                     CUDA, meter, SETTINGS) for launch in ("eager", "cuda_graph")}
    eager, graph = rows["eager"], rows["cuda_graph"]
    assert eager["status"] == graph["status"] == "ok", (eager["reason"], graph["reason"])
    assert graph["latency_ms"] < eager["latency_ms"], (graph["latency_ms"], eager["latency_ms"])
    assert eager["memory_peak_mb"] > eager["memory_weights_mb"] > 0
    energy = (f"{eager['energy_mj']:.1f} mJ per forward ({eager['energy_source']})"
              if eager["energy_mj"] is not None else f"no energy: {eager['energy_reason']}")
    return (f"b1 t128 bf16: eager {eager['latency_ms']:.2f} ms, CUDA graph "
            f"{graph['latency_ms']:.2f} ms; peak {eager['memory_peak_mb']:.0f} MB; {energy}")


CHECKS: list[Callable[[], str]] = [
    check_device_selection, check_oom_is_a_status, check_flash_attention_in_bf16,
    check_train_step_breakdown, check_decode_breakdown, check_collectives_counted_once,
    check_first_train_step_row, check_budget_counts_cached_blocks,
    check_recompute_saves_per_block, check_int8_is_unsupported_on_cuda, check_measure_rows,
]
CHILDREN = {"first-train-rows": _first_train_rows}


def check_name(check: Callable[[], str]) -> str:
    """A check's name: its function's, without ``check_``."""
    return check.__name__.removeprefix("check_")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=[check_name(c) for c in CHECKS],
                        help="run these checks only")
    parser.add_argument("--child", choices=sorted(CHILDREN), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child]()))
        return 0
    chosen = [c for c in CHECKS if not args.only or check_name(c) in args.only]
    if not torch.cuda.is_available():
        print(f"no CUDA device (torch {torch.__version__}): every check skipped")
        for check in chosen:
            print(f"SKIP {check_name(check)}: no CUDA device")
        return 0
    print(f"{torch.cuda.get_device_name(CUDA)}, torch {torch.__version__}, CUDA "
          f"{torch.version.cuda}", flush=True)
    started, failed = time.monotonic(), []
    for check in chosen:
        began = time.monotonic()
        try:
            detail = check()
        except Exception as err:  # every failure is a line; the traceback goes to stderr
            failed.append(check_name(check))
            traceback.print_exc()
            message = " ".join(f"{type(err).__name__}: {err}".split())
            print(f"FAIL {check_name(check)}: {message[:400]}", flush=True)
        else:
            print(f"PASS {check_name(check)}: {detail} [{time.monotonic() - began:.1f} s]",
                  flush=True)
        finally:
            release(CUDA)
    print(f"{len(chosen) - len(failed)} of {len(chosen)} checks passed in "
          f"{time.monotonic() - started:.0f} s" + (f"; failed: {', '.join(failed)}"
                                                    if failed else ""))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
