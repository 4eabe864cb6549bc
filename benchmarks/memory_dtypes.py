"""CPU memory in fp32 against bf16: do the two dtypes rank archs alike?

Builds sampled archs of a space in both dtypes, reads the memory of one forward with
``cpu_memory`` (the allocator's events, docs/measure.md) and prints per arch the weights and
peaks, then the weight ratio (exactly 2), the peak ratio, Spearman's rho of the two peaks
and of parameters against the bf16 peak, and the seconds per measurement.

    python benchmarks/memory_dtypes.py --scale tiny --archs 40
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch
from scipy import stats

from hwgptbench import params
from hwgptbench.meters.memory import cpu_memory
from hwgptbench.meters.runner import build_model
from hwgptbench.space import SearchSpace

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--archs", type=int, default=40)
    parser.add_argument("--vocab-size", type=int, default=2048)
    parser.add_argument("--seq-len", type=int, default=128)
    args = parser.parse_args()
    config = params.load(args.params)
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    archs = space.sample(args.archs, seed=0)
    generator = torch.Generator().manual_seed(0)
    x = torch.randint(args.vocab_size, (1, args.seq_len), generator=generator)
    rows: dict[str, list[dict]] = {name: [] for name in DTYPES}
    seconds: list[float] = []
    for arch in archs:
        for name, dtype in DTYPES.items():
            model = build_model(space, arch, args.vocab_size, 0, torch.device("cpu"), dtype)
            start = time.perf_counter()
            rows[name].append(cpu_memory(model, x))
            seconds.append(time.perf_counter() - start)
    print(f"{'arch':<32} {'fp32 weights':>12} {'fp32 peak':>10} {'bf16 weights':>12} "
          f"{'bf16 peak':>10}  (MB)")
    for arch, f, b in zip(archs, rows["fp32"], rows["bf16"], strict=True):
        print(f"{arch.id:<32} {f['memory_weights_mb']:>12.3f} {f['memory_peak_mb']:>10.3f} "
              f"{b['memory_weights_mb']:>12.3f} {b['memory_peak_mb']:>10.3f}")
    peak = {n: np.array([r["memory_peak_mb"] for r in rows[n]]) for n in DTYPES}
    weights = {n: np.array([r["memory_weights_mb"] for r in rows[n]]) for n in DTYPES}
    n_params = [space.n_params(a, args.vocab_size) for a in archs]
    ratio = peak["fp32"] / peak["bf16"]
    print(f"weights fp32/bf16: min {np.min(weights['fp32'] / weights['bf16']):.4f}, "
          f"max {np.max(weights['fp32'] / weights['bf16']):.4f}")
    print(f"peak fp32/bf16: {ratio.min():.3f} .. {ratio.max():.3f}")
    print(f"Spearman(fp32 peak, bf16 peak) {stats.spearmanr(peak['fp32'], peak['bf16'])[0]:.4f}; "
          f"Spearman(params, bf16 peak) {stats.spearmanr(n_params, peak['bf16'])[0]:.4f}")
    print(f"median seconds per measurement: {statistics.median(seconds):.3f}")


if __name__ == "__main__":
    main()
