"""One training step of a fixed GPT under PyTorch's native data-parallel modes, per rank.

Every rank of a torchrun job (``python -m torch.distributed.run ... -m
hwgptbench.runtime.parallel``, see :func:`main` and :func:`launch_parallel`) trains the same
fixed model on its own seeded batch (seed + rank, as data parallelism does), in each mode:

- ``none``: no wrapper and no communication; each rank trains its own copy (the
  single-process baseline, run by every rank).
- ``ddp``: :class:`~torch.nn.parallel.DistributedDataParallel` (all-reduced gradients).
- ``zero1``: DDP with :class:`~torch.distributed.optim.ZeroRedundancyOptimizer` wrapping AdamW:
  each rank keeps the Adam state of its share of the parameters and broadcasts them after
  its step.
- ``zero2``: FSDP2 (:func:`torch.distributed.fsdp.fully_shard` on each block, then the root)
  with ``reshard_after_forward=False``: sharded gradients and optimizer state, parameters
  gathered once per step and kept for the backward.
- ``zero3``: the same with ``reshard_after_forward=True`` on the blocks: their parameters
  gathered again for the backward, sharded in between (the root takes FSDP2's default, which
  keeps its own parameters, embedding and final norm, gathered from forward to backward).

Each mode is crossed with activation recomputation and a dtype (``fp32``, or ``bf16``: fp32
weights under ``torch.autocast``, the same way in every mode). The step is that of
:mod:`hwgptbench.runtime.workloads`: the loss, its backward, AdamW (lr 1e-4) and zeroed
gradients.

Per rank and (arch, mode, recompute, dtype) a row holds:

- ``step_ms``: the median of ``repeats`` steps after ``warmup``, each waited for
  (``torch.cuda.synchronize`` on CUDA); ``tokens_per_s``: the tokens of all ranks per step
  (``world_size * batch_size * seq_len``) over it.
- The training state this rank holds, in exact bytes of its own tensors (a DTensor's local
  shard), each where the mode holds the most of it: ``param_bytes`` the module's parameters
  as registered between forward and backward (tied weights once), ``grad_bytes`` the gradients
  after the backward, ``optim_bytes`` the optimizer's state tensors after its step;
  ``state_bytes`` their sum. For fp32 AdamW (P parameters, G = P gradients, O = 2P Adam state
  plus a step counter per tensor, N ranks) that is ZeRO's ordering: ddp P + G + O, zero1
  P + G + O/N, zero2 P + G/N + O/N (FSDP2 keeps the gathered parameters through the backward),
  zero3 ~P/N + G/N + O/N (the root's own parameters, embedding and final norm, stay gathered
  from forward to backward: FSDP2 does not reshard the root after its forward).
- ``memory_peak_mb``: on CUDA the allocator's peak over one step (``max_memory_allocated``
  after ``reset_peak_memory_stats``); on the CPU the process's peak RSS, a high-water mark over
  everything the rank ran before, not this step alone (``memory_reason`` says which).
- Collective time per step from ``profile_steps`` steps under ``torch.profiler``: on CUDA
  the device time of the NCCL kernels (each once: not also its range's projection on the GPU
  timeline), on the CPU the host time of gloo's work items (run on
  gloo's worker threads, so they include waiting for the other ranks). Each collective is
  counted once, by kind: ``comm_all_reduce_ms``, ``comm_all_gather_ms``,
  ``comm_reduce_scatter_ms``, ``comm_broadcast_ms``, ``comm_other_ms`` (barriers, sends, ...)
  and their sum ``comm_ms`` (a sum over collectives: where they run at once, as on
  gloo's two worker threads, it can exceed the step). gloo runs a reduce-scatter as an all-reduce
  (``c10d::_reduce_scatter_base_`` issues ``gloo:all_reduce``): a work item takes the kind of
  the ``c10d::`` call that issued it (paired in order) where the two counts agree.
  ``compute_ms`` is the profiled step time during which no collective was in flight (the
  profiled step minus the union of the collectives' intervals), so a collective overlapping
  compute is not subtracted from it; ``profiled_step_ms`` is that step under the profiler.
- ``status``: ``ok``; ``unsupported`` (the dtype does not run on the device) or ``oom``, with
  ``reason`` and null metrics. A failure on any rank fails the configuration on every rank.

The breakdown rows (:func:`breakdown_rows`) give the same collective times as a
``communication`` class (view ``modules``) and per kind (view ``collectives``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.autograd import DeviceType

from ..io import atomic_write_text
from ..meters.device import (
    DTYPES,
    default_device,
    dtype_unsupported_reason,
    freeze_survivors,
    process_group_backend,
    release,
)
from ..meters.latency import is_out_of_memory
from ..meters.memory import MB, optimizer_bytes, peak_rss_bytes, tensors_bytes
from ..meters.runner import build_model
from ..model import GPT
from ..outputs import make_dirs, temp_dir
from ..schema import COLLECTIVES, COMMUNICATION, OTHER
from ..space import Arch, SearchSpace
from ..training.step import TRAIN_LR, autocast
from .breakdown import profiled_steps

if TYPE_CHECKING:
    import polars as pl

log = logging.getLogger(__name__)

MODES = ("none", "ddp", "zero1", "zero2", "zero3")
PARALLEL_DTYPES = ("fp32", "bf16")
STEP = "parallel_step"  # the profiler range around one step
COLLECTIVE_FIELDS = tuple(f"comm_{kind}_ms" for kind in (*COLLECTIVES, OTHER))
PROCESS_GROUP_TIMEOUT = timedelta(minutes=10)
# a collective's work item as a backend runs it (host side), and the call that issued it
_BACKEND_EVENT = re.compile(r"^(gloo|nccl|mpi|ucc|xccl):")
_ISSUE_EVENT = re.compile(r"^c10d::")


# ---- processes ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Rank:
    """This process's place in the job and its device."""

    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device


@contextlib.contextmanager
def process_group() -> Iterator[Rank]:
    """This process's rank in the initialized process group; one is initialized when there is
    none (torchrun's environment: NCCL when the rank's device,
    :func:`~hwgptbench.meters.device.default_device`, is a GPU, else gloo; without it a world
    of 1 over an in-memory store) and destroyed on exit."""
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = default_device(local_rank)
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    created = False
    if not dist.is_initialized():
        backend = process_group_backend(device)
        if "MASTER_ADDR" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend, timeout=PROCESS_GROUP_TIMEOUT,
                                    device_id=device if cuda else None)
        else:  # one process outside torchrun: a world of 1
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                                    timeout=PROCESS_GROUP_TIMEOUT)
        created = True
    try:
        yield Rank(dist.get_rank(), local_rank, dist.get_world_size(), str(dist.get_backend()),
                   device)
    finally:
        if created:
            dist.destroy_process_group()


# ---- state bytes -------------------------------------------------------------------------


def param_bytes(model: nn.Module) -> int:
    """Bytes of the module's parameters as registered now."""
    return tensors_bytes(model.parameters())


def grad_bytes(model: nn.Module) -> int:
    """Bytes of the gradients the module's parameters hold now."""
    return tensors_bytes(p.grad for p in model.parameters() if p.grad is not None)


# ---- collectives -------------------------------------------------------------------------


def collective_kind(name: str) -> str:
    """The kind of a collective's event name (``c10d::_reduce_scatter_base_``,
    ``gloo:all_gather``, ``ncclDevKernel_AllReduce_Sum_f32_RING_LL``, ...); ``other`` when it
    names none of :data:`COLLECTIVES`."""
    flat = re.sub(r"[^a-z]", "", name.lower())
    for kind in ("reduce_scatter", "all_gather", "all_reduce", "broadcast"):
        if kind.replace("_", "") in flat:
            return kind
    return OTHER


def _outermost(events: list[Any], matches: Callable[[Any], bool]) -> list[Any]:
    """The matching events that no matching event encloses (nested records counted once)."""
    chosen = []
    for event in events:
        if not matches(event):
            continue
        parent = event.cpu_parent
        while parent is not None and not matches(parent):
            parent = parent.cpu_parent
        if parent is None:
            chosen.append(event)
    return chosen


def collective_events(events: list[Any], cuda: bool) -> list[tuple[str, float, float]]:
    """(kind, start us, end us) of each collective the profiled events ran: on CUDA the NCCL
    kernels (none where NCCL launched none, as with one rank; not the projection of the
    ``nccl:*`` range that issued a kernel onto the GPU timeline, a ``gpu_user_annotation``
    spanning that same kernel), else the backend's host work items (gloo), each with the kind
    of the ``c10d::`` call that issued it where calls and items pair up one to one."""
    if cuda:
        kernels = [e for e in events if e.device_type == DeviceType.CUDA
                   and not e.is_user_annotation and "nccl" in e.name.lower()]
        return [(collective_kind(e.name), e.time_range.start, e.time_range.end)
                for e in sorted(kernels, key=lambda e: e.time_range.start)]
    cpu = [e for e in events if e.device_type == DeviceType.CPU]
    work = sorted(_outermost(cpu, lambda e: bool(_BACKEND_EVENT.match(e.name))),
                  key=lambda e: e.time_range.start)
    issued = sorted(_outermost(cpu, lambda e: bool(_ISSUE_EVENT.match(e.name))),
                    key=lambda e: e.time_range.start)
    if len(issued) == len(work):
        names = [call.name for call in issued]
    else:
        log.debug("%d c10d calls for %d backend work items: kinds from the items' names",
                  len(issued), len(work))
        names = [item.name for item in work]
    return [(collective_kind(name), e.time_range.start, e.time_range.end)
            for name, e in zip(names, work, strict=True)]


def _covered(intervals: list[tuple[float, float]], window: tuple[float, float]) -> float:
    """Length of the union of intervals within window."""
    clipped = sorted((max(a, window[0]), min(b, window[1])) for a, b in intervals
                     if b > window[0] and a < window[1])
    total, end = 0.0, window[0]
    for a, b in clipped:
        if b > end:
            total += b - max(a, end)
            end = b
    return total


def profile_collectives(step: Callable[[], Any], steps: int, device: torch.device
                        ) -> dict[str, float]:
    """Per-step ms of the collectives by kind (``comm_<kind>_ms`` and ``comm_ms``), of the
    profiled step (``profiled_step_ms``) and of its time with no collective in flight
    (``compute_ms``), over ``steps`` profiled steps."""
    cuda = device.type == "cuda"
    events = list(profiled_steps(step, steps, device, STEP).events())
    windows = [(e.time_range.start, e.time_range.end) for e in events
               if e.name == STEP and e.device_type == DeviceType.CPU]
    collectives = collective_events(events, cuda)
    by_kind = dict.fromkeys(COLLECTIVE_FIELDS, 0.0)
    for kind, start, end in collectives:
        by_kind[f"comm_{kind}_ms"] += (end - start) / 1000 / steps
    spans = [(start, end) for _, start, end in collectives]
    stepped = sum(b - a for a, b in windows)
    busy = sum(_covered(spans, window) for window in windows)
    return {**by_kind, "comm_ms": sum(by_kind.values()),
            "profiled_step_ms": stepped / 1000 / steps,
            "compute_ms": (stepped - busy) / 1000 / steps}


# ---- one configuration -------------------------------------------------------------------


class Trainer(NamedTuple):
    """A wrapped model and its optimizer, and the callable running one train step."""

    model: GPT
    optimizer: torch.optim.Optimizer
    step: Callable[..., torch.Tensor]  # step(probe=None)


def wrap(model: GPT, mode: str, device: torch.device) -> tuple[nn.Module, torch.optim.Optimizer]:
    """The module a step calls and the optimizer, for one mode (model is changed in place)."""
    if mode == "none":
        return model, torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    if mode in ("ddp", "zero1"):
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel

        ddp = DistributedDataParallel(model, device_ids=[device] if device.type == "cuda"
                                      else None)
        if mode == "zero1":
            return ddp, ZeroRedundancyOptimizer(ddp.parameters(),
                                                optimizer_class=torch.optim.AdamW, lr=TRAIN_LR)
        return ddp, torch.optim.AdamW(ddp.parameters(), lr=TRAIN_LR)
    if mode in ("zero2", "zero3"):
        from torch.distributed.fsdp import fully_shard

        reshard = mode == "zero3"
        for block in model.blocks:
            fully_shard(block, reshard_after_forward=reshard)
        # the root: zero2 keeps its parameters gathered; zero3 takes FSDP2's default, which
        # keeps the root's gathered too from forward to backward (the backward would gather
        # them again at once); in torch 2.13 an explicit True reshards the root as well
        if reshard:
            fully_shard(model)
        else:
            fully_shard(model, reshard_after_forward=False)
        return model, torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    raise ValueError(f"unknown parallel mode {mode!r}; expected one of {MODES}")


def build_trainer(space: SearchSpace, arch: Arch, vocab_size: int, mode: str, recompute: bool,
                  dtype: str, batch_size: int, seq_len: int, seed: int, rank: Rank) -> Trainer:
    """The model of arch (weights from seed, the same on every rank) wrapped for mode, and a
    step on this rank's batch (token ids from seed + rank); a step given a dict records the
    state bytes in it."""
    model = build_model(space, arch, vocab_size, seed, rank.device, torch.float32).train()
    model.recompute = recompute
    runnable, optimizer = wrap(model, mode, rank.device)
    generator = torch.Generator().manual_seed(seed + rank.rank)
    x = torch.randint(vocab_size, (batch_size, seq_len), generator=generator).to(rank.device)
    targets = torch.roll(x, -1, dims=1)

    def step(probe: dict[str, int] | None = None) -> torch.Tensor:
        with autocast(dtype, rank.device):
            _, loss = runnable(x, targets)
        if probe is not None:
            probe["param_bytes"] = param_bytes(model)
        loss.backward()
        if probe is not None:
            probe["grad_bytes"] = grad_bytes(model)
        optimizer.step()
        if probe is not None:
            probe["optim_bytes"] = optimizer_bytes(optimizer)
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Trainer(model, optimizer, step)


def _synchronized(step: Callable[[], Any], device: torch.device) -> Callable[[], None]:
    def call() -> None:
        step()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return call


def _peak_memory(call: Callable[[], None], device: torch.device) -> dict[str, Any]:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
        call()
        return {"memory_peak_mb": torch.cuda.max_memory_allocated(device) / MB,
                "memory_reason": None}
    call()
    return {"memory_peak_mb": peak_rss_bytes() / MB,
            "memory_reason": "CPU: peak RSS of the rank's process so far, a high-water mark over "
                             "everything it ran before, not this step alone"}


def measure_config(space: SearchSpace, arch: Arch, vocab_size: int, mode: str, recompute: bool,
                   dtype: str, batch_size: int, seq_len: int, warmup: int, repeats: int,
                   profile_steps: int, seed: int, rank: Rank) -> dict[str, Any]:
    """The measured fields of one configuration on this rank (every rank must call it)."""
    trainer = build_trainer(space, arch, vocab_size, mode, recompute, dtype, batch_size,
                            seq_len, seed, rank)
    device = rank.device
    probe: dict[str, int] = {}
    _synchronized(lambda: trainer.step(probe), device)()  # the first step, probed
    call = _synchronized(trainer.step, device)
    for _ in range(warmup):
        call()
    memory = _peak_memory(call, device)
    dist.barrier()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    step_s = statistics.median(times)
    dist.barrier()
    comm = profile_collectives(call, profile_steps, device) if profile_steps else {}
    return {**probe, "state_bytes": sum(probe.values()), "step_ms": step_s * 1000,
            "tokens_per_s": rank.world_size * batch_size * seq_len / step_s, **memory, **comm}


_NULL_FIELDS = ("param_bytes", "grad_bytes", "optim_bytes", "state_bytes", "step_ms",
                "tokens_per_s", "memory_peak_mb", "memory_reason", "comm_ms",
                *COLLECTIVE_FIELDS, "compute_ms", "profiled_step_ms")


def _failure(err: BaseException) -> tuple[str, str]:
    message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    if is_out_of_memory(err) or "out of memory" in message.lower():
        return "oom", message
    return "unsupported", message


def measure_parallel(space: SearchSpace, archs: Sequence[Arch], vocab_size: int,
                     modes: Sequence[str] = MODES, recompute_values: Sequence[bool] = (False, True),
                     dtypes: Sequence[str] = ("fp32",), batch_size: int = 1,
                     seq_len: int | None = None, warmup: int = 1, repeats: int = 5,
                     seed: int = 0, profile_steps: int = 2) -> list[dict[str, Any]]:
    """This rank's rows, one per (arch, mode, recompute, dtype) (module doc); every rank of the
    process group calls it (one is initialized if there is none). ``batch_size`` is per rank,
    ``seq_len`` defaults to the space's context."""
    unknown = sorted(set(modes) - set(MODES)) + sorted(set(dtypes) - set(PARALLEL_DTYPES))
    if unknown:
        raise ValueError(f"unknown modes or dtypes {unknown}: modes are {MODES}, dtypes "
                         f"{PARALLEL_DTYPES}")
    seq_len = space.block_size if seq_len is None else seq_len
    rows = []
    with process_group() as rank:
        for arch in archs:
            for mode in modes:
                for recompute in recompute_values:
                    for dtype in dtypes:
                        base = {"arch_id": arch.id, "mode": mode, "recompute": bool(recompute),
                                "dtype": dtype, "rank": rank.rank,
                                "world_size": rank.world_size, "backend": rank.backend,
                                "device": str(rank.device), "batch_size": batch_size,
                                "seq_len": seq_len}
                        rows.append(base | _measure_agreed(
                            space, arch, vocab_size, mode, bool(recompute), dtype, batch_size,
                            seq_len, warmup, repeats, profile_steps, seed, rank))
                        release(rank.device)
    return rows


def _measure_agreed(space: SearchSpace, arch: Arch, vocab_size: int, mode: str,
                    recompute: bool, dtype: str, batch_size: int, seq_len: int, warmup: int,
                    repeats: int, profile_steps: int, seed: int, rank: Rank) -> dict[str, Any]:
    """One configuration's fields with its status, the same status on every rank. A rank
    failing inside a collective that the others completed leaves them waiting until the
    process group's timeout (failures such as OOM strike every rank alike in practice)."""
    failure: tuple[str, str] | None = None
    fields: dict[str, Any] = {}
    reason = dtype_unsupported_reason(DTYPES[dtype], rank.device)
    if reason is not None:
        failure = ("unsupported", reason)
    else:
        try:
            fields = measure_config(space, arch, vocab_size, mode, recompute, dtype,
                                    batch_size, seq_len, warmup, repeats, profile_steps, seed,
                                    rank)
        except (RuntimeError, NotImplementedError) as err:  # OutOfMemoryError included
            failure = _failure(err)
            log.warning("%s %s recompute=%s %s failed on rank %d: %s", arch.id, mode,
                        recompute, dtype, rank.rank, failure[1])
    outcomes: list[Any] = [None] * rank.world_size
    dist.all_gather_object(outcomes, failure)
    failed = [(r, outcome) for r, outcome in enumerate(outcomes) if outcome is not None]
    if not failed:
        return {**dict.fromkeys(_NULL_FIELDS), **fields, "status": "ok", "reason": None}
    first, (status, message) = failed[0]
    return {**dict.fromkeys(_NULL_FIELDS), "status": status, "reason": f"rank {first}: {message}"}


def breakdown_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """The collective time of each ok row as breakdown rows: view ``modules`` with the class
    ``communication`` and view ``collectives`` with one row per kind; ``fraction`` is of the
    profiled step."""
    keys = ("arch_id", "mode", "recompute", "dtype", "rank", "world_size", "backend", "device",
            "batch_size", "seq_len")
    parts = []
    for row in rows:
        if row["status"] != "ok" or row["profiled_step_ms"] is None:
            continue
        base = {k: row[k] for k in keys} | {"step_ms": row["profiled_step_ms"],
                                              "latency_ms": row["step_ms"]}
        step = row["profiled_step_ms"]
        views = [("modules", COMMUNICATION, row["comm_ms"])]
        views += [("collectives", kind, row[f"comm_{kind}_ms"]) for kind in (*COLLECTIVES, OTHER)]
        parts += [base | {"view": view, "category": category, "ms": ms,
                          "fraction": ms / step if step > 0 else None}
                  for view, category, ms in views]
    return parts


# ---- torchrun entry point and launcher -----------------------------------------------------


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in ("1", "true", "on", "yes"):
        return True
    if lowered in ("0", "false", "off", "no"):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not a bool (true/false)")


def parser() -> argparse.ArgumentParser:
    """The arguments of :func:`main`."""
    p = argparse.ArgumentParser(prog="python -m hwgptbench.runtime.parallel",
                                description="Data-parallel train steps, one process per rank "
                                            "under torchrun (module doc).")
    p.add_argument("--space-json", required=True, type=Path,
                   help='a JSON file {"name": ..., "space": SearchSpace.to_dict()}')
    p.add_argument("--archs", required=True, nargs="+", help="arch ids")
    p.add_argument("--vocab", required=True, type=int, help="vocabulary size")
    p.add_argument("--out", required=True, type=Path, help="the rows of all ranks (parquet)")
    p.add_argument("--breakdown-out", type=Path, help="the breakdown rows (parquet)")
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    p.add_argument("--recompute", nargs="+", type=_bool, default=[False, True])
    p.add_argument("--dtypes", nargs="+", default=["fp32"], choices=PARALLEL_DTYPES)
    p.add_argument("--batch-size", type=int, default=1, help="per rank")
    p.add_argument("--seq-len", type=int, help="default: the space's context")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--profile-steps", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Measure on this rank; rank 0 gathers every rank's rows and writes the tables."""
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    doc = json.loads(args.space_json.read_text())
    space = SearchSpace.from_dict(doc["name"], doc["space"])
    archs = [Arch.from_id(arch_id) for arch_id in args.archs]
    freeze_survivors()
    with process_group() as rank:
        rows = measure_parallel(space, archs, args.vocab, args.modes, args.recompute,
                                args.dtypes, args.batch_size, args.seq_len, args.warmup,
                                args.repeats, args.seed, args.profile_steps)
        gathered: list[Any] | None = [None] * rank.world_size if rank.rank == 0 else None
        dist.gather_object(rows, gathered, dst=0)
        if gathered is not None:
            every = [row for part in gathered for row in part]
            _write(every, args.out)
            if args.breakdown_out is not None:
                _write(breakdown_rows(every), args.breakdown_out)
            log.info("wrote %d rows of %d ranks to %s", len(every), rank.world_size, args.out)
    return 0


def _write(rows: list[dict[str, Any]], path: Path) -> None:
    import polars as pl

    from ..io import write_parquet

    write_parquet(pl.DataFrame(rows, infer_schema_length=None), path)


class ParallelTables(NamedTuple):
    """The rows of every rank (:func:`measure_parallel`) and their breakdown rows."""

    runtime: pl.DataFrame
    breakdown: pl.DataFrame


def ranks_and_threads(cpu_ranks: int = 2) -> tuple[int, int]:
    """Processes to launch (one per CUDA GPU where the ranks train on GPUs, see
    :func:`~hwgptbench.meters.device.default_device`, else ``cpu_ranks``) and the threads of
    each (the machine's cores shared out, at least 1). With one GPU the world is 1: ddp and the
    ZeRO modes then have nothing to shard or reduce."""
    gpus = default_device().type == "cuda"
    nproc = torch.cuda.device_count() if gpus else cpu_ranks
    if nproc < 1:
        raise ValueError(f"cannot launch {nproc} ranks")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return nproc, max((cores or 1) // nproc, 1)


def launch_parallel(space: SearchSpace, archs: Sequence[Arch], vocab_size: int, *,
                    modes: Sequence[str] = MODES, recompute_values: Sequence[bool] = (False, True),
                    dtypes: Sequence[str] = ("fp32",), batch_size: int = 1,
                    seq_len: int | None = None, warmup: int = 1, repeats: int = 5,
                    seed: int = 0, profile_steps: int = 2, cpu_ranks: int = 2,
                    work_dir: str | os.PathLike[str] | None = None,
                    timeout: float | None = None) -> ParallelTables:
    """Run :func:`main` under torchrun from this (ordinary) process and read its tables back
    (kept in ``work_dir`` when given, else in a temporary folder)."""
    import polars as pl

    nproc, threads = ranks_and_threads(cpu_ranks)
    if nproc == 1 and default_device().type == "cuda":
        log.info("one CUDA GPU: world size 1, the parallel modes have nothing to shard")
    with contextlib.ExitStack() as stack:
        folder = make_dirs(work_dir) if work_dir is not None else stack.enter_context(
            temp_dir(prefix="hwgptbench-parallel-"))
        space_json = folder / "space.json"
        atomic_write_text(space_json, json.dumps({"name": space.name, "space": space.to_dict()}))
        out, breakdown = folder / "parallel.parquet", folder / "parallel_breakdown.parquet"
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   "--nproc_per_node", str(nproc), "-m", "hwgptbench.runtime.parallel",
                   "--space-json", str(space_json), "--archs", *(a.id for a in archs),
                   "--vocab", str(vocab_size), "--out", str(out), "--breakdown-out",
                   str(breakdown), "--modes", *modes,
                   "--recompute", *(str(bool(r)).lower() for r in recompute_values),
                   "--dtypes", *dtypes, "--batch-size", str(batch_size), "--warmup",
                   str(warmup), "--repeats", str(repeats), "--profile-steps",
                   str(profile_steps), "--seed", str(seed)]
        if seq_len is not None:
            command += ["--seq-len", str(seq_len)]
        env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
        log.info("launching %d ranks x %d threads: %s", nproc, threads, " ".join(command))
        try:
            result = subprocess.run(command, env=env, capture_output=True, text=True,
                                    check=True, timeout=timeout)
        except subprocess.CalledProcessError as err:
            raise RuntimeError(f"{' '.join(command)} exited {err.returncode}\n--- stdout\n"
                               f"{err.stdout[-4000:]}\n--- stderr\n{err.stderr[-8000:]}"
                               ) from err
        log.debug("torchrun output:\n%s\n%s", result.stdout, result.stderr)
        return ParallelTables(pl.read_parquet(out), pl.read_parquet(breakdown))


if __name__ == "__main__":
    sys.exit(main())
