"""Few-shot transfer on other projects' public latency data, with their published numbers beside
ours (docs/transfer.md, "Other projects' data").

    python benchmarks/transfer_external.py --help-fbnet HELP/data/fbnet \\
        --hat hardware-aware-transformers/latency_dataset \\
        --gpt src/hwgptbench/published/s/devices/*.parquet \\
        --ks 1 5 10 20 --seeds 10 --out /tmp/transfer-external.parquet

Each option is one data set and may be left out. The paths are the user's copies of the
public repositories (github.com/HayeonLee/HELP, github.com/mit-han-lab/hardware-aware-
transformers); nothing of them is kept here. First, per data set, the runs of rows that drift
off their table's own model (flagged, still scored). Then every split of
``hwgptbench.transfer.external.SPLITS``, each marked ``choice`` (the default method was chosen
on these: HELP's meta-validation devices, the 11 FBNet devices HELP never uses, HAT's en-fr
files) or ``report`` (scored, never chosen on: HELP's test devices, HAT's en-de files, this
project's tables). For every held-out device, k archs are drawn ``--seeds`` times per k; each
method of ``hwgptbench.transfer.methods`` and each baseline is fitted on them and scored:
Spearman and the share within ±10%, mean over seeds with its 95% t interval. HELP's splits
follow HELP's protocol (its meta-train devices as sources; the k archs from the trimmed
training pool, Spearman on the trimmed query archs), printed beside HELP's published Table 2;
the same scores over every arch outside the k follow.
"""

from __future__ import annotations

import argparse
import logging
import time

import polars as pl

from hwgptbench.io import write_parquet
from hwgptbench.transfer import external, external_eval
from hwgptbench.transfer.evaluate import BASELINES
from hwgptbench.transfer.methods import METHODS

MAIN = (*METHODS, *BASELINES)


def _cell(row: dict, score: str = "spearman") -> str:
    return (f"{row[f'{score}_mean']:.3f} [{row[f'{score}_low']:.3f}, "
            f"{row[f'{score}_high']:.3f}]")


def _per_target(summary: pl.DataFrame, targets: tuple[str, ...], k: int, test: str,
                score: str = "spearman", published: dict | None = None) -> str:
    """A markdown table: one row per method, one column per target, then the mean over
    targets and the worst target."""
    head = ["method", *targets, "mean", "worst"]
    lines = ["| " + " | ".join(head) + " |", "|---" + "|---:" * (len(head) - 1) + "|"]
    for method, numbers in (published or {}).items():
        values = [numbers[t] for t in targets]
        mean = numbers.get("mean", sum(values) / len(values))
        lines.append(f"| {method} (published) | " + " | ".join(f"{v:.3f}" for v in values)
                     + f" | {mean:.3f} | {min(values):.3f} |")
    part = summary.filter((pl.col("k") == k) & (pl.col("test") == test))
    for method in MAIN:
        rows = {r["target"]: r for r in part.filter(pl.col("method") == method).iter_rows(
            named=True)}
        if len(rows) != len(targets):
            continue
        means = [rows[t][f"{score}_mean"] for t in targets]
        lines.append(f"| {method} | " + " | ".join(_cell(rows[t], score) for t in targets)
                     + f" | {sum(means) / len(means):.3f} | {min(means):.3f} |")
    return "\n".join(lines)


def _over_k(summary: pl.DataFrame, targets: tuple[str, ...], ks: list[int], test: str) -> str:
    """Mean Spearman (and ±10%) per method and k, each target."""
    head = ["method", "k", *targets]
    lines = ["| " + " | ".join(head) + " |", "|---|---:" + "|---:" * len(targets) + "|"]
    part = summary.filter(pl.col("test") == test)
    for method in MAIN:
        for k in ks:
            rows = {r["target"]: r for r in part.filter(
                (pl.col("method") == method) & (pl.col("k") == k)).iter_rows(named=True)}
            if len(rows) != len(targets):
                continue
            cells = [f"{rows[t]['spearman_mean']:.3f} / {rows[t]['within_10pct_mean']:.2f}"
                     for t in targets]
            lines.append(f"| {method} | {k} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _bounds(data: external.ExternalSet, targets: tuple[str, ...]) -> str:
    cells = []
    for target in targets:
        bound = external_eval.own_cv(data, target)
        cells.append(f"{bound['spearman']:.3f} / {bound['within_10pct']:.2f}")
    return "\n".join(["| bound | " + " | ".join(targets) + " |",
                      "|---" + "|---:" * len(targets) + "|",
                      "| own LightGBM, 5-fold over all archs | " + " | ".join(cells) + " |"])


def _drift(drift: pl.DataFrame) -> str:
    """A markdown table of drifting runs of rows, or a line saying there are none."""
    if drift.is_empty():
        return "none"
    lines = ["| table | rows | median measured / model | rows beyond ±10% |", "|---|---|---:|---:|"]
    lines += [f"| {r['table']} | {r['first_row']}-{r['last_row']} | {r['ratio']:.2f} | "
              f"{r['beyond_10pct']:.0%} |" for r in drift.iter_rows(named=True)]
    return "\n".join(lines)


def drop_first(table: external.DeviceTable, count: int) -> external.DeviceTable:
    """The table without its first ``count`` archs."""
    keep = slice(count, None)
    return external.DeviceTable(table.device, table.keys[keep], table.features[keep],
                                table.values[keep], table.flops[keep], table.params[keep])


def run(data: external.ExternalSet, split: external.Split, ks: list[int], seeds: int,
        report_k: int, methods: list[str] | None = None) -> tuple[pl.DataFrame, pl.DataFrame]:
    """Evaluate one split and print its tables."""
    start = time.perf_counter()
    quality = external_eval.evaluate_split(data, split, ks, seeds, methods)
    summary = external_eval.summarize(quality)
    tests = summary["test"].unique(maintain_order=True).to_list()
    print(f"\n## {split.name} ({split.role} split): k = {report_k}, {seeds} seeds "
          f"({time.perf_counter() - start:.0f} s)")
    for test in tests:
        for score in ("spearman", "within_10pct"):
            print(f"\n{score}, scored on {test} archs (mean over seeds [95% interval]):\n")
            print(_per_target(summary, split.targets, report_k, test, score,
                              split.published if score == "spearman" and test == tests[0]
                              else None))
    print(f"\nover k (Spearman / share within ±10%, scored on {tests[0]} archs):\n")
    print(_over_k(summary, split.targets, ks, tests[0]))
    print("\nupper bound (Spearman / ±10%, all archs):\n")
    print(_bounds(data, split.targets))
    return quality, summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--help-fbnet", help="HELP's data/fbnet folder")
    parser.add_argument("--hat", help="HAT's latency_dataset folder (*_all.csv)")
    parser.add_argument("--gpt", nargs="+", default=[],
                        help="this project's measurement tables of several devices")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 5, 10, 20])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--report-k", type=int, default=10)
    parser.add_argument("--drop-first", nargs="+", default=[], metavar="TABLE:N",
                        help="leave out the first N archs of a table (a sensitivity check of "
                             "rows suspected of a measurement artefact)")
    parser.add_argument("--only", nargs="+", default=[], metavar="SPLIT",
                        help="evaluate only these splits (names as printed)")
    parser.add_argument("--methods", nargs="+", default=None, metavar="NAME",
                        help="methods and baselines to score (default: all)")
    parser.add_argument("--out", help="parquet of every quality row (summary beside it)")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    runs = []
    if args.help_fbnet:
        runs.append((external.load_help_fbnet(args.help_fbnet),
                     [external.SPLITS[s] for s in ("help_validation", "fbnet_unused",
                                                   "help_fbnet")]))
    if args.hat:
        runs.append((external.load_hat(args.hat), [external.SPLITS["hat_wmt14enfr"],
                                                   external.SPLITS["hat_wmt14ende"]]))
    if args.gpt:
        data = external.load_gpt_tables(args.gpt)
        runs.append((data, [external.gpt_split(data)]))
    if not runs:
        parser.error("give at least one of --help-fbnet, --hat, --gpt")
    for item in args.drop_first:
        name, _, count = item.rpartition(":")
        for data, _ in runs:
            if name in data.tables:
                data.tables[name] = drop_first(data.tables[name], int(count))
    for data, _ in runs:
        drift = pl.concat([external_eval.drifting_blocks(t) for t in data.tables.values()])
        print(f"\n## {data.name}: runs of rows off their table's own model by > 10% "
              "(flagged, still scored)\n")
        print(_drift(drift))
    qualities, summaries = [], []
    for data, splits in runs:
        for split in splits:
            if args.only and split.name not in args.only:
                continue
            quality, summary = run(data, split, args.ks, args.seeds, args.report_k,
                                   args.methods)
            qualities.append(quality)
            summaries.append(summary)
    if args.out:
        write_parquet(pl.concat(qualities), args.out)
        write_parquet(pl.concat(summaries), args.out.removesuffix(".parquet") +
                      "-summary.parquet")


if __name__ == "__main__":
    main()
