"""CPU memory measurement: a subprocess forked from the forkserver against a spawned one.

Measures the same sampled archs of a space with ``cpu_memory`` both ways, alternating, and
prints the seconds per arch and the measured peaks side by side (their difference is the
allocator's page-level noise; the model's share must agree).

    python benchmarks/memory_subprocess.py --scale s --archs 6
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hwgptbench import params
from hwgptbench.measure.memory import cpu_memory
from hwgptbench.space import SearchSpace

METHODS = ("forkserver", "spawn")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="s")
    parser.add_argument("--archs", type=int, default=6)
    parser.add_argument("--vocab-size", type=int, default=50304)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    config = params.load(args.params)
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    seconds: dict[str, list[float]] = {method: [] for method in METHODS}
    print(f"{'arch':>4} {'weights MB':>10} " + " ".join(
        f"{m + ' peak MB':>18} {m + ' s':>14}" for m in METHODS))
    for index, arch in enumerate(space.sample(args.archs, seed=0)):
        row = {}
        for method in METHODS:
            start = time.perf_counter()
            row[method] = cpu_memory(space, arch, args.vocab_size, torch.float32, 1,
                                     args.seq_len, 0, args.threads, start_method=method)
            seconds[method].append(time.perf_counter() - start)
        print(f"{index:>4} {row['forkserver']['memory_weights_mb']:>10.1f} " + " ".join(
            f"{row[m]['memory_peak_mb']:>18.1f} {seconds[m][-1]:>14.2f}" for m in METHODS))
    # the first forkserver call also starts the server: the median leaves it out
    fork, spawn = (statistics.median(seconds[m]) for m in METHODS)
    print(f"median seconds per arch: forkserver {fork:.2f}, spawn {spawn:.2f}, "
          f"ratio {fork / spawn:.2f}")


if __name__ == "__main__":
    main()
