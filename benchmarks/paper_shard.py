"""One shard of paper-scale archs measured on this machine within its memory budget.

Samples ``--archs`` archs of a paper space (``s`` by default) and measures them as one shard of
the measure stage (``measure_shard``: interleaved timing in memory-budget groups, a part file
per group), at one condition (b1-t128 fp32 by default) with the vocabulary of the paper's
tokenizer. Prints the group plan, the wall time and this process's peak RSS (VmHWM), and keeps
the shard table in ``--out``. Run it again after an interruption and it resumes.

    /usr/bin/time -v python benchmarks/paper_shard.py --scale s --archs 500
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

import polars as pl

from hwgptbench import params
from hwgptbench.campaign.budget import GB
from hwgptbench.measure.stage import measure_shard
from hwgptbench.meters.memory import peak_rss_bytes
from hwgptbench.params import section_of
from hwgptbench.settings.sections import MeasureSettings
from hwgptbench.space import SearchSpace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="s")
    parser.add_argument("--archs", type=int, default=500)
    parser.add_argument("--vocab-size", type=int, default=50304)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--memory", action="store_true", help="also measure peak memory")
    parser.add_argument("--out", default="results/benchmarks/paper_shard.parquet")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    config = params.load(args.params)
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    archs = space.sample(args.archs, seed=0)
    section = section_of(MeasureSettings, {
        **config["measure"], "batch_sizes": [args.batch_size], "seq_lens": [args.seq_len],
        "dtypes": [args.dtype], "launch": ["eager"], "memory": args.memory})
    start = time.perf_counter()
    table = measure_shard(section, space, archs, args.vocab_size, "auto", (0, 1), args.out)
    seconds = time.perf_counter() - start
    ok = table.filter(pl.col("status") == "ok")
    groups = table.group_by("latency_group").agg(pl.len(), pl.col("latency_group_factor").first())
    print(f"{len(archs)} archs of {args.scale} (vocab {args.vocab_size}), "
          f"b{args.batch_size}-t{args.seq_len} {args.dtype}, threads {section.threads}")
    print(f"  measured ok: {ok.height}, other statuses: "
          f"{table.filter(pl.col('status') != 'ok')['status'].value_counts().to_dicts()}")
    print(f"  groups: {groups.height}, archs per group: {sorted(groups['len'].to_list())}")
    print(f"  group speed factors: {sorted(round(f, 4) for f in groups['latency_group_factor'])}")
    latency = ok["latency_ms"]
    print(f"  latency ms: median {latency.median():.1f}, min {latency.min():.1f}, "
          f"max {latency.max():.1f}; median CI {ok['latency_ci95_rel'].median():.2%}")
    print(f"  wall time {seconds / 60:.1f} min, peak RSS {peak_rss_bytes() / GB:.2f} GiB")
    print(f"  table: {Path(args.out).resolve()}")


if __name__ == "__main__":
    main()
