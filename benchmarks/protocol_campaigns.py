"""Does the measure stage's own protocol repeat? Campaigns of the stage, compared.

Each campaign is the measure stage's ``measure_rows`` on the same sampled archs, with the
params of ``--params`` and its ``--overlay`` files (``params/hwgptbench.yaml``: b1-t128 fp32,
interleaved in memory-budget groups with anchors), ``measure.threads`` and
``measure.min_repeats`` set from the command line. Two quiet campaigns, and with ``--busy``
a third beside a process spinning on one core. Every latency column the rows hold is an
estimator of the same samples: ``latency_ms`` (``measure.estimator``), ``latency_wall_ms``
(wall median), ``latency_min_ms`` (wall minimum) and ``latency_cpu_ms`` (thread CPU time,
median). For each, against the first campaign: the share of archs within ±5% once the
campaigns' median ratio is divided out, Kendall τ, and the largest deviation; and how many
rows each campaign marked contended.

    python benchmarks/protocol_campaigns.py --overlay params/hwgptbench.yaml --archs 100 \\
        --threads 1 --min-repeats 12 --busy --out protocol_campaigns.parquet
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
import time

import polars as pl

from hwgptbench.campaign.shard import measure_rows
from hwgptbench.params import load_overlaid, section_of
from hwgptbench.repeatability import agreement
from hwgptbench.settings.sections import MeasureSettings
from hwgptbench.space import SearchSpace

COLUMNS = ("latency_ms", "latency_wall_ms", "latency_min_ms", "latency_cpu_ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--overlay", action="append", default=[])
    parser.add_argument("--scale", default="s")
    parser.add_argument("--archs", type=int, default=100)
    parser.add_argument("--vocab-size", type=int, default=50304)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--min-repeats", type=int, default=None)
    parser.add_argument("--busy", action="store_true",
                        help="a third campaign beside a process spinning on one core")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", help="every campaign's rows (parquet)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    config = load_overlaid(args.params, args.overlay)
    section = {**config["measure"], "threads": args.threads}
    if args.min_repeats:
        section["min_repeats"] = args.min_repeats
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    archs = space.sample(args.archs, seed=args.seed)
    runs = []
    for index, load in enumerate(["quiet", "quiet"] + (["busy"] if args.busy else [])):
        spinner = (subprocess.Popen([sys.executable, "-c", "while True: pass"])
                   if load == "busy" else None)
        started = time.perf_counter()
        try:
            rows = measure_rows(section_of(MeasureSettings, section), space, archs,
                                args.vocab_size, "auto", desc=f"campaign {index} ({load})")
        finally:
            if spinner is not None:
                spinner.kill()
                spinner.wait()
        table = pl.DataFrame(rows, infer_schema_length=None).sort("arch_id").with_columns(
            campaign=pl.lit(index), load=pl.lit(load))
        seconds = time.perf_counter() - started
        print(f"campaign {index} ({load}): {seconds / len(archs):.2f} s per arch, "
              f"{int(table['latency_contended'].sum())} of {table.height} rows contended, "
              f"median wall/CPU ratio {table['latency_wall_cpu_ratio'].median():.3f}",
              flush=True)
        runs.append(table)
    results = []
    for other in runs[1:]:
        for column in COLUMNS:
            results.append({"campaign": int(other["campaign"][0]), "load": other["load"][0],
                            "estimator": column,
                            **agreement(runs[0][column].to_numpy(), other[column].to_numpy())})
    with pl.Config(tbl_rows=-1, tbl_width_chars=160, float_precision=3):
        print(pl.DataFrame(results))
    if args.out:
        pl.concat(runs, how="diagonal_relaxed").write_parquet(args.out)
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
