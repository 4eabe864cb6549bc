"""Archs per second of Benchmark.query: one batched call vs a loop of single-arch calls.

    python benchmarks/query_throughput.py --scale tiny --results results --archs 100000
    python benchmarks/query_throughput.py --metric all   # every metric of one device+condition

Uses the surrogates under results/{scale}/surrogates (run `make run` first), with the family
each target selected (``best``; ``--family`` forces one). The tiny space has 9 288 archs, so a
batch of 10^5 repeats them, and a query predicts each distinct arch once; the ``distinct`` line
times a batch without repeats (the whole space where it is smaller than ``--archs``), which is
what a query of 10^5 archs of a large space costs per arch. ``--metric all`` queries perplexity
and every hardware metric of the first device's first condition in one call.
"""

from __future__ import annotations

import argparse
import time

import torch

from hwgptbench import Benchmark


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--results", default="results")
    parser.add_argument("--archs", type=int, default=100_000)
    parser.add_argument("--singles", type=int, default=200, help="archs in the single loop")
    parser.add_argument("--metric", default="latency_ms")
    parser.add_argument("--family", default="best")
    args = parser.parse_args()
    bench = Benchmark.load(args.scale, args.results, family=args.family)
    device = None if args.metric == "perplexity" else bench.devices[0]
    first = "latency_ms" if args.metric == "all" else args.metric
    condition = None if device is None else bench.conditions(device, first)[0]
    metrics = args.metric
    if args.metric == "all":
        metrics = [m for m in bench.metrics if m == "perplexity" or condition in
                   bench.conditions(device, m)]
    pool = bench.sample(min(args.archs, bench.space.size()), seed=0)
    archs = (pool * (args.archs // len(pool) + 1))[:args.archs]
    bench.query(archs[:10], metrics, device=device, condition=condition)  # load once
    start = time.perf_counter()
    bench.query(archs, metrics, device=device, condition=condition)
    batched = time.perf_counter() - start
    start = time.perf_counter()
    bench.query(pool, metrics, device=device, condition=condition)
    distinct = time.perf_counter() - start
    start = time.perf_counter()
    for arch in archs[:args.singles]:
        bench.query([arch], metrics, device=device, condition=condition)
    single = (time.perf_counter() - start) / args.singles
    families = ", ".join(f"{r['metric']}: {r['family']}" for r in bench.used().iter_rows(
        named=True))
    print(f"{metrics} on {device or 'any device'} {condition or ''} ({families}), "
          f"{torch.get_num_threads()} threads")
    print(f"batched: {args.archs} archs in {batched:.2f} s = {args.archs / batched:,.0f} archs/s")
    print(f"distinct: {len(pool)} archs in {distinct:.2f} s = {len(pool) / distinct:,.0f} "
          f"archs/s ({distinct * 1e5 / len(pool):.2f} s per 10^5 distinct archs)")
    print(f"single:  {single * 1e3:.2f} ms per arch = {1 / single:,.0f} archs/s "
          f"(mean of {args.singles})")
    print(f"speed-up per arch: {single * args.archs / batched:,.0f}x")


if __name__ == "__main__":
    main()
