"""Does timing a shard in memory-budget groups rank archs as well as one full interleave?

Measures the same archs three times with the settings of params.yaml's ``measure`` section
(memory and energy off, the first condition only): a full interleave (every model held at
once), then grouped (``--group-size`` archs per group by a forced budget, ``group_anchors``
archs timed in every group and each group's speed divided out), then a second full interleave.
It prints the Spearman correlation and the median latency ratio of each pair, the grouped run
against the two full runs beside the two full runs against each other: grouping is as good as
the full interleave when it agrees with each full run as well as they agree with each other.
The numbers are also written to ``--out`` (JSON).

    python benchmarks/grouped_timing.py --scale tiny --archs 102 --group-size 20
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from pathlib import Path
from typing import Any

import numpy as np
from scipy import stats

from hwgptbench import params
from hwgptbench.campaign.budget import GB, activation_bytes, weight_bytes
from hwgptbench.campaign.shard import conditions, measure_rows
from hwgptbench.meters.device import default_device
from hwgptbench.params import section_of
from hwgptbench.settings.sections import MeasureSettings
from hwgptbench.space import SearchSpace


def agreement(first: dict[str, float], second: dict[str, float]) -> dict[str, float]:
    """Spearman ρ and the median ratio second/first over the archs both timed."""
    ids = sorted(set(first) & set(second))
    a, b = np.array([first[i] for i in ids]), np.array([second[i] for i in ids])
    return {"spearman": float(stats.spearmanr(a, b).statistic),
            "median_ratio": float(np.median(b / a)),
            "mdape_pct": float(np.median(np.abs(b / a - 1)) * 100)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="tiny")
    parser.add_argument("--archs", type=int, default=102)
    parser.add_argument("--group-size", type=int, default=20)
    parser.add_argument("--anchors", type=int, help="measure.group_anchors (default: params)")
    parser.add_argument("--vocab-size", type=int, default=4096)
    parser.add_argument("--out", default="results/benchmarks/grouped_timing.json")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = params.load(args.params)
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    archs = space.sample(args.archs, seed=0)
    section = {**config["measure"], "memory": False, "energy_window_s": 0.01}
    if args.anchors is not None:
        section["group_anchors"] = args.anchors
    condition = conditions(section_of(MeasureSettings, section), space, default_device())[0]
    section |= {"batch_sizes": [condition.batch_size], "seq_lens": [condition.seq_len],
                "dtypes": [condition.dtype], "launch": [condition.launch]}
    weights = sorted(weight_bytes(space, a, args.vocab_size, condition.dtype) for a in archs)
    activations = max(activation_bytes(space, a, args.vocab_size, condition) for a in archs)
    forced = (np.median(weights) * (args.group_size + section["group_anchors"])
              + activations) / GB
    runs: dict[str, dict[str, float]] = {}
    detail: dict[str, Any] = {}
    for name, budget in (("full_1", None), ("grouped", forced), ("full_2", None)):
        start = time.perf_counter()
        rows = measure_rows(section_of(MeasureSettings, {**section, "memory_budget_gb": budget}),
                            space, archs, args.vocab_size, "auto", desc=name)
        runs[name] = {r["arch_id"]: r["latency_ms"] for r in rows if r["status"] == "ok"}
        detail[name] = {"seconds": time.perf_counter() - start,
                        "groups": len({r["latency_group"] for r in rows}),
                        "median_ci95_rel": float(np.median([r["latency_ci95_rel"]
                                                            for r in rows]))}
    pairs = {"full_2 vs full_1": agreement(runs["full_1"], runs["full_2"]),
             "grouped vs full_1": agreement(runs["full_1"], runs["grouped"]),
             "grouped vs full_2": agreement(runs["full_2"], runs["grouped"])}
    print(f"{args.archs} archs of {args.scale}, {condition.id}, threads {section['threads']}; "
          f"grouped: {detail['grouped']['groups']} groups of ~{args.group_size} + "
          f"{section['group_anchors']} anchors")
    for name, run in detail.items():
        print(f"  {name:>8}: {run['groups']} group(s), median CI {run['median_ci95_rel']:.2%}, "
              f"{run['seconds']:.0f} s")
    print(f"{'pair':>18} {'spearman':>9} {'median ratio':>13} {'MdAPE %':>8}")
    for pair, row in pairs.items():
        print(f"{pair:>18} {row['spearman']:>9.4f} {row['median_ratio']:>13.4f} "
              f"{row['mdape_pct']:>8.2f}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"runs": detail, "pairs": pairs}, indent=2) + "\n")


if __name__ == "__main__":
    main()
