"""Latency of one call, repeated until its median is known to a target precision.

On the CPU each call is timed twice: by the wall clock (``time.perf_counter_ns``) and by the
calling thread's CPU time (``time.thread_time_ns``), which leaves out the time the thread
waited for a core; on CUDA with a pair of CUDA events around it, read after one
synchronisation per batch, so a sample is the device time from the start of the call's first
kernel slot to the end of its last (launch gaps included). Samples are taken in batches of
``min_repeats`` until the distribution-free 95% confidence interval of the median (order
statistics at the binomial(n, 1/2) quantile ranks) has a half-width of at most
``target_rel_ci`` times the median, or ``max_repeats`` samples or ``max_seconds`` are reached
(both checked after each batch, so a run takes at least ``min_repeats`` calls).

``latency_ms`` is the estimator's value (:data:`ESTIMATORS`; ``latency_estimator`` names it):
the wall-clock median, the wall-clock minimum, or the median thread CPU time (one intra-op
thread only: with more, the calling thread's CPU time is not the call's). The wall-clock
median (``latency_wall_ms``), minimum (``latency_min_ms``), median CPU time
(``latency_cpu_ms``) and the median ratio of wall to CPU time of the calls
(``latency_wall_cpu_ratio``, 1 when the thread ran undisturbed; above
:data:`CONTENDED_WALL_CPU`, ``latency_contended``) are recorded whatever the estimator.
``latency_runqueue_wait`` is the share of the time this process's threads were runnable during
the timed calls that they spent waiting for a core (the kernel's run-queue wait,
``/proc/self/task/*/schedstat``; None where it is not exposed): 0 on a machine with a core free
for every thread, a third and more beside processes that keep every core busy.
``docs/measure.md`` has the study behind the default.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn as nn

LATENCY_FIELDS = ("latency_ms", "latency_mean_ms", "latency_std_ms", "latency_iqr_ms",
                  "latency_n", "latency_ci95_ms", "latency_ci95_rel", "latency_wall_ms",
                  "latency_min_ms", "latency_cpu_ms", "latency_wall_cpu_ratio",
                  "latency_contended", "latency_estimator", "latency_runqueue_wait")
# latency_ms of a row: the wall-clock median, the wall-clock minimum, or the thread-CPU median
ESTIMATORS = ("median", "min", "cpu_median")
# a median wall/CPU-time ratio above this: the thread waited for a core (latency_contended)
CONTENDED_WALL_CPU = 1.10


def median_ci_ranks(n: int, confidence: float = 0.95) -> tuple[int, int] | None:
    """0-based ranks (lo, hi) of the sorted samples that bound a distribution-free confidence
    interval of the median of n samples; None when n is too small to reach the confidence."""
    alpha = (1 - confidence) / 2
    log_norm = math.lgamma(n + 1) + n * math.log(0.5)
    cdf, lower = 0.0, 0  # lower: 1-based rank l, coverage 1 - 2 P(Binomial(n, 1/2) <= l - 1)
    for k in range(n // 2 + 1):
        cdf += math.exp(log_norm - math.lgamma(k + 1) - math.lgamma(n - k + 1))
        if cdf > alpha:
            break
        lower = k + 1
    return (lower - 1, n - lower) if lower else None


def median_ci_halfwidth(samples: Sequence[float], confidence: float = 0.95) -> float:
    """Half the width of the distribution-free confidence interval of the median; inf when the
    samples are too few for the confidence."""
    ranks = median_ci_ranks(len(samples), confidence)
    if ranks is None:
        return math.inf
    ordered = sorted(samples)
    return (ordered[ranks[1]] - ordered[ranks[0]]) / 2


def runqueue_ns() -> dict[str, tuple[int, int]] | None:
    """Time on a core and time runnable but waiting for one (ns) of each thread of this
    process, by thread id; None where the kernel does not expose them."""
    times = {}
    for path in Path("/proc/self/task").glob("*/schedstat"):
        try:
            on_core, waiting, _ = path.read_text().split()
        except (OSError, ValueError):
            continue  # the thread ended, or a kernel without schedstat
        times[path.parent.name] = (int(on_core), int(waiting))
    return times or None


def runqueue_wait_share(before: dict[str, tuple[int, int]] | None,
                        after: dict[str, tuple[int, int]] | None) -> float | None:
    """Share of the threads' runnable time between two :func:`runqueue_ns` readings that they
    spent waiting for a core (threads started between them count from zero)."""
    if before is None or after is None:
        return None
    on_core = waiting = 0
    for thread, (run, wait) in after.items():
        run0, wait0 = before.get(thread, (0, 0))
        on_core, waiting = on_core + run - run0, waiting + wait - wait0
    return waiting / (on_core + waiting) if on_core + waiting > 0 else None


def check_estimator(estimator: str) -> None:
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator {estimator!r} is not one of {list(ESTIMATORS)}")


def latency_stats(samples_ms: Sequence[float], cpu_ms: Sequence[float] | None = None,
                  estimator: str = "median") -> dict[str, Any]:
    """The estimator's latency and the CI of the median of its series (wall clock, or thread CPU
    time for ``cpu_median``), and the wall clock's mean, sample std, IQR, median and minimum,
    the median CPU time and wall/CPU ratio (None without CPU times), count, in ms.
    ``cpu_median`` without CPU times (CUDA) is the wall-clock median."""
    check_estimator(estimator)
    wall = np.asarray(samples_ms, dtype=np.float64)
    cpu = None if cpu_ms is None else np.asarray(cpu_ms, dtype=np.float64)
    if cpu is not None and (np.isnan(cpu).any() or (cpu <= 0).any()):
        cpu = None  # CUDA events, or a clock too coarse for the call
    used = "median" if estimator == "cpu_median" and cpu is None else estimator
    series = cpu if used == "cpu_median" and cpu is not None else wall
    center = float(np.median(series))
    q25, q75 = np.percentile(wall, [25, 75])
    half = median_ci_halfwidth(series.tolist())
    return {
        "latency_ms": float(series.min()) if used == "min" else center,
        "latency_mean_ms": float(wall.mean()),
        "latency_std_ms": float(wall.std(ddof=1)),
        "latency_iqr_ms": float(q75 - q25),
        "latency_n": len(wall),
        "latency_ci95_ms": half,
        "latency_ci95_rel": half / center if center > 0 else math.inf,
        "latency_wall_ms": float(np.median(wall)),
        "latency_min_ms": float(wall.min()),
        "latency_cpu_ms": None if cpu is None else float(np.median(cpu)),
        "latency_wall_cpu_ratio": None if cpu is None else float(np.median(wall / cpu)),
        "latency_contended": None if cpu is None else bool(
            np.median(wall / cpu) > CONTENDED_WALL_CPU),
        "latency_estimator": used,
        "latency_runqueue_wait": None,  # of the whole timing: set by the timers
    }


def _cpu_times_ms(fn: Callable[[], Any], n: int) -> list[tuple[float, float]]:
    """(wall, thread CPU) time of n calls of fn, one by one."""
    times = []
    for _ in range(n):
        wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
        fn()
        times.append(((time.perf_counter_ns() - wall) / 1e6,
                      (time.thread_time_ns() - cpu) / 1e6))
    return times


def _cuda_times_ms(fn: Callable[[], Any], n: int) -> list[tuple[float, float]]:
    """CUDA-event time of n back-to-back calls of fn, read after one synchronisation (no CPU
    time: NaN)."""
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
              for _ in range(n)]
    for start, end in events:
        start.record()
        fn()
        end.record()
    torch.cuda.synchronize()
    return [(start.elapsed_time(end), math.nan) for start, end in events]


def synchronize(device: torch.device) -> None:
    """Wait for the work queued on a CUDA device; nothing to do on the CPU."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timer(device: torch.device | str, min_repeats: int, max_repeats: int, estimator: str
           ) -> tuple[torch.device, Callable[..., Any]]:
    """The device and its timer, once the repeat bounds and the estimator are checked."""
    if not 2 <= min_repeats <= max_repeats:
        raise ValueError(f"need 2 <= min_repeats <= max_repeats, got {min_repeats}, "
                         f"{max_repeats}")
    check_estimator(estimator)
    device = torch.device(device)
    return device, _cuda_times_ms if device.type == "cuda" else _cpu_times_ms


def measure_latency(fn: Callable[[], Any], device: torch.device, *, warmup: int,
                    min_repeats: int, max_repeats: int, target_rel_ci: float = 0.02,
                    max_seconds: float, estimator: str = "median") -> dict[str, Any]:
    """Latency statistics of fn on device (see the module docstring for the stopping rule and
    the estimators)."""
    device, times = _timer(device, min_repeats, max_repeats, estimator)
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
        for _ in range(warmup):
            fn()
        synchronize(device)
        samples: list[tuple[float, float]] = []
        start, queue = time.perf_counter(), runqueue_ns()
        while True:
            samples += times(fn, min(min_repeats, max_repeats - len(samples)))
            wall, cpu = zip(*samples, strict=True)
            stats = latency_stats(wall, cpu, estimator)
            done = (stats["latency_ci95_rel"] <= target_rel_ci
                    or time.perf_counter() - start >= max_seconds)
            if len(samples) >= max_repeats or (len(samples) >= min_repeats and done):
                return stats | {"latency_runqueue_wait": runqueue_wait_share(queue,
                                                                             runqueue_ns())}


class PastDeadline(Exception):
    """A timing stopped because its campaign's time bound passed (``deadline``): its samples
    are dropped, and the caller leaves what it was timing to a later run."""


def check_deadline(deadline: float | None, where: str) -> None:
    """Raise :class:`PastDeadline` (saying ``where``) once ``deadline`` (a
    ``time.monotonic()`` value, None: none) has passed."""
    if deadline is not None and time.monotonic() > deadline:
        raise PastDeadline(f"the time bound passed {where}")


class CallFailed(RuntimeError):
    """Callable ``index`` of an interleaved timing raised ``error`` (for example out of
    memory); the caller drops it and times the others again."""

    def __init__(self, index: int, error: BaseException) -> None:
        super().__init__(f"callable {index} failed: {type(error).__name__}: {error}")
        self.index = index
        self.error = error


def is_out_of_memory(error: BaseException) -> bool:
    """Whether error is an allocation failure: CUDA's OutOfMemoryError, Python's MemoryError or
    the CPU allocator's RuntimeError."""
    if isinstance(error, (torch.OutOfMemoryError, MemoryError)):
        return True
    return isinstance(error, RuntimeError) and "can't allocate memory" in str(error)


def _call(fns: Sequence[Callable[[], Any]], i: int, run: Callable[[Callable[[], Any]], Any]
          ) -> Any:
    """run(fns[i]), an allocation failure raised as :class:`CallFailed` naming i."""
    try:
        return run(fns[i])
    except (RuntimeError, MemoryError) as err:
        if is_out_of_memory(err):
            raise CallFailed(i, err) from err
        raise


VISIT_CALLS = 3
MIN_BLOCKED = 5  # fewer callables than this: the cycle's speed cannot be told from theirs


def drift_factors(cycles: np.ndarray) -> np.ndarray:
    """Machine-speed factor of each cycle from samples (cycles, callables, calls): the
    geometric mean over callables of their cycle median relative to their overall median."""
    per_cycle = np.median(cycles, axis=2)  # (cycles, callables)
    relative = np.log(per_cycle / np.median(per_cycle, axis=0))
    return np.exp(relative.mean(axis=1))


def interleaved_stats(cycles: np.ndarray, estimator: str = "median") -> list[dict[str, Any]]:
    """Statistics of each callable from interleaved samples (cycles, callables, calls), or
    (cycles, callables, calls, 2) with the calls' thread CPU times last, each series divided by
    its cycle's drift factor (of that series) when there are enough callables to estimate it;
    ``latency_drift_cv`` is the coefficient of variation of the wall clock's factors."""
    cycles = np.asarray(cycles, dtype=np.float64)
    series = [cycles[..., 0], cycles[..., 1]] if cycles.ndim == 4 else [cycles]
    blocked = cycles.shape[1] >= MIN_BLOCKED
    timed = [s for s in series if not np.isnan(s).any()]
    factors = [drift_factors(s) if blocked else np.ones(len(s)) for s in timed]
    adjusted = [s / f[:, None, None] for s, f in zip(timed, factors, strict=True)]
    drift_cv = float(factors[0].std() / factors[0].mean()) if blocked else None
    return [{**latency_stats(adjusted[0][:, i, :].ravel(),
                             adjusted[1][:, i, :].ravel() if len(adjusted) > 1 else None,
                             estimator),
             "latency_drift_cv": drift_cv}
            for i in range(cycles.shape[1])]


def measure_latency_interleaved(fns: Sequence[Callable[[], Any]], device: torch.device, *,
                                warmup: int, min_repeats: int, max_repeats: int,
                                target_rel_ci: float = 0.02, max_seconds: float,
                                seed: int = 0, shuffle: bool = True, estimator: str = "median",
                                deadline: float | None = None) -> list[dict[str, Any]]:
    """Latency statistics of several callables timed round-robin, visiting each once per cycle
    in a seeded random order (in their given order without ``shuffle``: CUDA graphs that share
    a memory pool replay in the order they were captured), so that every one sees the same
    states of the machine. A visit is
    one untimed call (the previous visit's model evicted this one's weights from the caches)
    and ``VISIT_CALLS`` timed ones, so the samples are warm-cache latencies as in one-by-one
    timing.

    A machine whose speed drifts (shared or virtual CPUs: the same forward's median can move by
    15% from one minute to the next) biases one-by-one timing by when each callable ran.
    Interleaving makes each cycle a block that every callable sees; with at least
    ``MIN_BLOCKED`` callables the block effect (the cycle's common speed factor) is estimated
    and divided out (:func:`interleaved_stats`), so the statistics and their CI describe the
    callables at the campaign's typical speed, free of the drift. Cycles go on until every
    callable has at least ``min_repeats`` samples and its median CI is within
    ``target_rel_ci``, or ``max_repeats`` samples, or ``max_seconds`` per callable in total;
    all callables get the same count, and the run-queue wait of the whole timing. A callable
    that runs out of memory raises :class:`CallFailed` with its index. Past ``deadline`` (a
    ``time.monotonic()`` value), the next warm-up or cycle raises :class:`PastDeadline`.
    """
    device, times = _timer(device, min_repeats, max_repeats, estimator)
    rng = np.random.default_rng(seed)
    cycles: list[list[list[tuple[float, float]]]] = []
    with torch.cuda.device(device) if device.type == "cuda" else nullcontext():
        for i in range(len(fns)):
            check_deadline(deadline, f"while warming up callable {i} of {len(fns)}")
            for _ in range(warmup):
                _call(fns, i, lambda fn: fn())
        synchronize(device)
        start, queue = time.perf_counter(), runqueue_ns()
        while True:
            check_deadline(deadline, f"after {len(cycles)} cycles")
            cycle: list[list[tuple[float, float]]] = [[] for _ in fns]
            for i in rng.permutation(len(fns)) if shuffle else range(len(fns)):
                _call(fns, i, lambda fn: fn())  # re-warm caches the previous visit evicted
                cycle[i] = _call(fns, i, lambda fn: times(fn, VISIT_CALLS))
            cycles.append(cycle)
            n = len(cycles) * VISIT_CALLS
            if n < min_repeats:
                continue
            stats = interleaved_stats(np.asarray(cycles), estimator)
            converged = all(row["latency_ci95_rel"] <= target_rel_ci for row in stats)
            out_of_time = time.perf_counter() - start >= max_seconds * len(fns)
            if converged or out_of_time or n >= max_repeats:
                wait = runqueue_wait_share(queue, runqueue_ns())
                return [row | {"latency_runqueue_wait": wait} for row in stats]


class GraphReplay:
    """A captured CUDA-graph forward, replayed by calling it. It holds the model: the graph
    reads the model's weights at the addresses they had when it was captured."""

    def __init__(self, model: nn.Module, graph: torch.cuda.CUDAGraph,
                 out: torch.Tensor | None) -> None:
        self.model, self.graph, self.out = model, graph, out

    def __call__(self) -> torch.Tensor | None:
        self.graph.replay()
        return self.out


def cuda_graph_callable(model: nn.Module, x: torch.Tensor, warmup: int = 3,
                        pool: Any = None) -> GraphReplay:
    """A callable replaying one captured CUDA-graph forward of model on x.

    Alone it returns the graph's static output (the same tensor every call). Captured into a
    memory ``pool`` shared with other graphs (``torch.cuda.graph_pool_handle()``), it keeps no
    output and returns None: its activations and output go back to the pool, so graphs replayed
    one at a time, in the order they were captured (PyTorch's condition for sharing a pool;
    nothing reads their outputs), share one pool of the largest graph's size instead of each
    holding its own."""
    stream = torch.cuda.Stream(device=x.device)
    stream.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            model(x)
    torch.cuda.current_stream(x.device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = model(x)
    return GraphReplay(model, graph, None if pool is not None else out)
