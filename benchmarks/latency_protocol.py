"""Which CPU timing protocol repeats? Estimators x intra-op threads x load x forwards per arch.

Each campaign times the same sampled archs of a space one at a time, in its own random order:
a model is built, called ``--warmup`` times, then ``--forwards`` times, each call timed by the
wall clock (``time.perf_counter_ns``) and by the calling thread's CPU time
(``time.thread_time_ns``). From those samples every estimator is computed for the first k
forwards (k in ``--ks``): wall median, wall minimum, wall 10th percentile, CPU-time median,
CPU-time minimum. Two quiet campaigns per thread count give the repeatability (share of archs
within ±5% once the campaigns' median ratio is divided out, Kendall τ, largest deviation);
with ``--busy``, one more campaign runs beside a process spinning on one core and is compared
with the first quiet one. Contention is read per campaign: the median wall/CPU-time ratio of
the calls (one thread), the steal share of ``/proc/stat`` and the run queue of
``/proc/loadavg``.

    python benchmarks/latency_protocol.py --scale s --archs 100 --threads 1 2 --busy \\
        --out latency_protocol.parquet

Raw samples go to ``--out`` (parquet: campaign, threads, load, arch, call, wall_ms, cpu_ms), so
other estimators can be scored later without measuring again.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import torch

from hwgptbench import params
from hwgptbench.meters.condition import Condition
from hwgptbench.meters.runner import build_model, inputs
from hwgptbench.repeatability import agreement
from hwgptbench.space import Arch, SearchSpace

ESTIMATORS: dict[str, tuple[str, Callable[[np.ndarray], float]]] = {
    "wall median": ("wall_ms", lambda v: float(np.median(v))),
    "wall min": ("wall_ms", lambda v: float(np.min(v))),
    "wall q10": ("wall_ms", lambda v: float(np.quantile(v, 0.1))),
    "cpu median": ("cpu_ms", lambda v: float(np.median(v))),
    "cpu min": ("cpu_ms", lambda v: float(np.min(v))),
}


def proc_counters() -> tuple[int, int]:
    """(steal ticks, all ticks) of /proc/stat's cpu line; zeros where it is unreadable."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (fields[7] if len(fields) > 7 else 0), sum(fields)


def run_queue() -> int:
    """Runnable scheduling entities now (/proc/loadavg's 4th field, before the slash)."""
    try:
        return int(Path("/proc/loadavg").read_text().split()[3].split("/")[0])
    except (OSError, ValueError, IndexError):
        return -1


def campaign(space: SearchSpace, archs: list[Arch], vocab: int, threads: int, warmup: int,
             forwards: int, seed: int) -> tuple[pl.DataFrame, dict[str, float]]:
    """Samples of every arch (one at a time, in a seeded random order) and the campaign's
    contention readings."""
    torch.set_num_threads(threads)
    condition = Condition(1, 128, "fp32")
    x = inputs(vocab, condition, 0, torch.device("cpu"))
    order = np.random.default_rng(seed).permutation(len(archs))
    rows, queues = [], []
    steal0, total0 = proc_counters()
    started = time.perf_counter()
    with torch.inference_mode():
        for i in order:
            model = build_model(space, archs[i], vocab, 0, torch.device("cpu"), torch.float32)
            for _ in range(warmup):
                model(x)
            for call in range(forwards):
                wall, cpu = time.perf_counter_ns(), time.thread_time_ns()
                model(x)
                rows.append((archs[i].id, call, (time.perf_counter_ns() - wall) / 1e6,
                             (time.thread_time_ns() - cpu) / 1e6))
            queues.append(run_queue())
            del model
    steal1, total1 = proc_counters()
    table = pl.DataFrame(rows, schema=["arch_id", "call", "wall_ms", "cpu_ms"], orient="row")
    ratio = float((table["wall_ms"] / table["cpu_ms"]).median())
    readings = {"seconds_per_arch": (time.perf_counter() - started) / len(archs),
                "wall_cpu_ratio": ratio,
                "steal_share": (steal1 - steal0) / max(total1 - total0, 1),
                "run_queue": float(np.median(queues))}
    return table, readings


def estimates(samples: pl.DataFrame, k: int) -> dict[str, np.ndarray]:
    """Each estimator over the first k forwards of every arch, archs in id order."""
    first = samples.filter(pl.col("call") < k).sort("arch_id", "call")
    groups = first.group_by("arch_id", maintain_order=True).agg("wall_ms", "cpu_ms")
    return {name: np.array([fn(np.asarray(v)) for v in groups[column]])
            for name, (column, fn) in ESTIMATORS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="s")
    parser.add_argument("--archs", type=int, default=100)
    parser.add_argument("--vocab-size", type=int, default=50304)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--forwards", type=int, default=10)
    parser.add_argument("--ks", type=int, nargs="+", default=[3, 5, 10])
    parser.add_argument("--busy", action="store_true",
                        help="also one campaign beside a process spinning on one core")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="raw samples (parquet)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    space = SearchSpace.from_dict(args.scale, params.load(args.params)["spaces"][args.scale])
    archs = space.sample(args.archs, seed=args.seed)
    tables, results = [], []
    for threads in args.threads:
        loads = ["quiet", "quiet"] + (["busy"] if args.busy else [])
        runs: list[tuple[str, pl.DataFrame, dict[str, float]]] = []
        for index, load in enumerate(loads):
            spinner = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
                       if load == "busy" else None)
            try:
                samples, readings = campaign(space, archs, args.vocab_size, threads,
                                             args.warmup, args.forwards, args.seed + index + 1)
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            runs.append((load, samples, readings))
            tables.append(samples.with_columns(campaign=pl.lit(index), threads=pl.lit(threads),
                                               load=pl.lit(load)))
            print(f"threads {threads} campaign {index} ({load}): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in readings.items()), flush=True)
        for k in args.ks:
            base = estimates(runs[0][1], k)
            for load, samples, readings in runs[1:]:
                other = estimates(samples, k)
                for name in ESTIMATORS:
                    forward_s = float(np.median(other["wall median"])) / 1e3
                    results.append({"threads": threads, "load": load, "forwards": k,
                                    "estimator": name, **agreement(base[name], other[name]),
                                    "timing_s_per_arch": (args.warmup + k) * forward_s,
                                    "wall_cpu_ratio": readings["wall_cpu_ratio"]})
    table = pl.DataFrame(results).sort("load", "threads", "forwards", "estimator",
                                       descending=[True, False, False, False])
    with pl.Config(tbl_rows=len(table), tbl_width_chars=160, float_precision=3):
        print(table)
    if args.out:
        pl.concat(tables).write_parquet(args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
