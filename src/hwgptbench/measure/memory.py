"""Memory of one forward pass: the model's weights, its peak and the activations' share of it.

All three are per model: ``memory_weights_mb`` is the exact bytes of its parameters and buffers,
``memory_peak_mb`` the peak growth of memory during the forward over the state before the model
existed, ``memory_activations_mb`` the peak growth over the state with the model built. MB are
2**20 bytes.

CUDA: allocator statistics in this process (``reset_peak_memory_stats``, ``memory_allocated``
before the forward, ``max_memory_allocated`` after it).

CPU: there is no allocator counter, so the peak resident set size of a fresh process is read:
one subprocess per (arch, dtype, batch, length), forked from a 'forkserver' process that has
imported torch and this module but never built a model or run an op (so no thread pool is
forked); a 'spawn' subprocess, where there is no forkserver, spends about 2 s importing torch.
A process cannot measure a second model: the peak is a high-water mark, and memory freed by the
first model largely stays mapped in the allocator, so the second would grow into it unseen. The
peak is the memory map's high-water mark ``VmHWM`` of /proc/self/status rather than
``ru_maxrss``: on Linux ``ru_maxrss`` also keeps the RSS of the forking parent from before the
exec, so a large parent hides a small child. The subprocess runs a tiny forward in the same
dtype first (paging in the kernels' code and thread pools), resets the high-water mark to the
current RSS (``/proc/self/clear_refs``; where that is refused the baseline is the peak so far,
which can understate a model smaller than the import's transient), then reads the peak before
the model is built (the baseline), after it is built (directly in the dtype and initialised, so
every page is resident) and after one forward. RSS counts whole pages, allocator slack and
one-time workspaces of the kernels, so small models read a few pages high; weights that fit in
memory the allocator kept from the warm-up read a little low.
"""

from __future__ import annotations

import gc
import logging
import multiprocessing as mp
import resource
import signal
import sys
from functools import cache
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import torch
import torch.nn as nn

from ..model import GPT, GPTConfig
from ..space import Arch, SearchSpace
from .latency import is_out_of_memory, synchronize

log = logging.getLogger(__name__)

MB = 2**20
OUT_OF_MEMORY = "out of memory"  # how a memory_reason of an arch that ran out of memory starts


def tensor_bytes(model: nn.Module) -> int:
    """Exact bytes of a model's parameters and buffers."""
    tensors = [*model.parameters(), *model.buffers()]
    return sum(t.numel() * t.element_size() for t in tensors)


def memory_row(weights: int, peak: int, activations: int) -> dict[str, Any]:
    """The memory fields of a row, from byte counts."""
    return {"memory_weights_mb": weights / MB, "memory_peak_mb": peak / MB,
            "memory_activations_mb": activations / MB, "memory_reason": None}


def unmeasured(reason: str) -> dict[str, Any]:
    """The memory fields of a row whose memory was not measured."""
    return {"memory_weights_mb": None, "memory_peak_mb": None, "memory_activations_mb": None,
            "memory_reason": reason}


def cuda_memory(model: nn.Module, x: torch.Tensor) -> dict[str, Any]:
    """Memory of one forward of model on token ids x, on x's CUDA device."""
    device = x.device
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    with torch.inference_mode():
        model(x)
    synchronize(device)
    activations = torch.cuda.max_memory_allocated(device) - before
    weights = tensor_bytes(model)
    return memory_row(weights, weights + activations, activations)


def peak_rss_bytes() -> int:
    """Peak RSS of this process's memory in bytes: VmHWM where /proc has it, else ru_maxrss."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    scale = 1 if sys.platform == "darwin" else 1024  # ru_maxrss: KB on Linux, bytes on macOS
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale


def _reset_peak_rss() -> bool:
    """Reset the RSS high-water mark to the current RSS; False where that is refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def _build(config: GPTConfig, dtype: torch.dtype) -> GPT:
    """A model built directly in dtype (no transient float32 copy of the weights)."""
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        model = GPT(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(dtype).eval()


@torch.inference_mode()
def _measure_rss(space: SearchSpace, arch: Arch, vocab_size: int, dtype: torch.dtype,
                 batch_size: int, seq_len: int, seed: int) -> dict[str, Any]:
    """RSS growth of building one model and running one forward, in this fresh process."""
    tiny = GPTConfig(Arch(8, 1, (1,), (1,), arch.bias), 16, 4, space.head_size,
                     space.rotary_fraction)
    _build(tiny, dtype)(torch.zeros(1, 4, dtype=torch.long))
    gc.collect()
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab_size, (batch_size, seq_len), generator=generator)
    if not _reset_peak_rss():
        log.warning("cannot reset the RSS high-water mark; the memory baseline is the peak so far")
    baseline = peak_rss_bytes()
    torch.manual_seed(seed)
    model = _build(GPTConfig.from_space(space, arch, vocab_size), dtype)
    built = peak_rss_bytes()
    model(x)
    peak = peak_rss_bytes()
    return memory_row(tensor_bytes(model), peak - baseline, peak - built)


def _child(conn: Connection, threads: int, args: tuple[Any, ...]) -> None:
    """Subprocess entry: measure, send the fields (or the error) and exit."""
    torch.set_num_threads(threads)
    try:
        conn.send(_measure_rss(*args))
    except Exception as err:  # reported to the parent as the row's memory_reason
        what = OUT_OF_MEMORY if is_out_of_memory(err) else "memory measurement failed"
        conn.send(unmeasured(f"{what}: {type(err).__name__}: {err}".splitlines()[0]))
    finally:
        conn.close()


@cache
def _fresh_processes(method: str) -> Any:
    """The multiprocessing context of the memory subprocesses: forkserver with torch and this
    module preloaded (spawn where there is no forkserver, or when asked; see module doc)."""
    if method != "forkserver" or method not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([__name__])
    return ctx


def cpu_memory(space: SearchSpace, arch: Arch, vocab_size: int, dtype: torch.dtype,
               batch_size: int, seq_len: int, seed: int, threads: int,
               start_method: str = "forkserver") -> dict[str, Any]:
    """Memory of one CPU forward of arch, measured in a fresh subprocess (see module doc);
    ``start_method`` spawn starts it from scratch (benchmarks/memory_subprocess.py)."""
    ctx = _fresh_processes(start_method)
    receiver, sender = ctx.Pipe(duplex=False)
    args = (space, arch, vocab_size, dtype, batch_size, seq_len, seed)
    process = ctx.Process(target=_child, args=(sender, threads, args), daemon=True)
    process.start()
    sender.close()
    try:
        result: dict[str, Any] = receiver.recv()
    except EOFError:
        result = unmeasured("memory subprocess died before reporting")
    finally:
        receiver.close()
        process.join()
    if process.exitcode == -signal.SIGKILL:
        result = unmeasured(f"{OUT_OF_MEMORY}: the memory subprocess was killed (SIGKILL: the "
                            "kernel's out-of-memory killer)")
    elif process.exitcode:
        result = unmeasured(f"memory subprocess exited with code {process.exitcode}")
    return result
