"""How repeatable are latency rankings on this machine? Two campaigns over the same archs.

Measures ``--archs`` sampled archs of a space twice, with the settings of params.yaml's
``measure`` section (memory and energy off), once timing arch after arch and once interleaved
(round-robin), and prints the Kendall τ between the two campaigns' medians, the median
per-row CI, the machine's speed shift between the campaigns (median ratio) and the share of
archs whose two latencies agree within ±5% once that shift is divided out. A surrogate cannot
rank archs better than the measurement repeats itself, nor put more archs within ±5% of a
measurement than a second measurement does, so these bound the latency surrogate's τ and its
share within ±5%.

    python benchmarks/latency_repeatability.py --scale tiny --archs 40
"""

from __future__ import annotations

import argparse
import logging
import time

import numpy as np
from scipy import stats

from hwgptbench import params
from hwgptbench.campaign.shard import measure_rows
from hwgptbench.params import section_of
from hwgptbench.settings.sections import MeasureSettings
from hwgptbench.space import SearchSpace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--archs", type=int, default=30)
    parser.add_argument("--vocab-size", type=int, default=4096)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = params.load(args.params)
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    archs = space.sample(args.archs, seed=0)
    section = {**config["measure"], "memory": False, "energy_window_s": 0.01}
    print(f"{args.archs} archs of {args.scale}; batch {section['batch_sizes']}, seq_len "
          f"{section['seq_lens']}, {section['dtypes']}, threads {section['threads']}")
    print(f"{'timing':>12} {'tau(campaign 1, 2)':>19} {'median CI %':>12} {'median ms':>10} "
          f"{'shift':>6} {'within 5%':>9} {'seconds':>8}")
    for interleave in (False, True):
        start = time.perf_counter()
        measure = section_of(MeasureSettings, {**section, "interleave": interleave})
        campaigns = [measure_rows(measure, space, archs, args.vocab_size, "auto")
                     for _ in range(2)]
        first, second = ([r["latency_ms"] for r in rows] for rows in campaigns)
        ci = np.median([r["latency_ci95_rel"] for rows in campaigns for r in rows]) * 100
        ratio = np.asarray(second) / np.asarray(first)
        shift = float(np.median(ratio))
        agree = float(np.mean(np.abs(ratio / shift - 1) <= 0.05))
        name = "interleaved" if interleave else "one by one"
        print(f"{name:>12} {stats.kendalltau(first, second).statistic:>19.3f} {ci:>12.2f} "
              f"{np.median(first):>10.2f} {shift:>6.3f} {agree:>9.1%} "
              f"{time.perf_counter() - start:>8.1f}")


if __name__ == "__main__":
    main()
