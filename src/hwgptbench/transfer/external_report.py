"""Few-shot transfer on other projects' public latency data, as markdown beside their published
numbers (docs/transfer.md, "Other projects' data"): the drift check of each data set, then per
split the methods' Spearman and share within ±10% per held-out device, over k, and the bound
of a model fitted on all of a device's archs."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import polars as pl

from ..adaptation.methods import METHODS
from . import external, external_eval
from .evaluate import BASELINES

log = logging.getLogger(__name__)

MAIN = (*METHODS, *BASELINES)
SKIPPED = ("Few-shot transfer on other projects' data was skipped: no external data was "
           "given. Set `paper.external.help_fbnet` to the `data/fbnet` folder of a copy of "
           "github.com/HayeonLee/HELP and/or `paper.external.hat` to the `latency_dataset` "
           "folder of a copy of github.com/mit-han-lab/hardware-aware-transformers in "
           "params.yaml, then run `make paper` again (docs/transfer.md).\n")


@dataclass(frozen=True)
class Scored:
    """Every quality row of the splits evaluated, their summary and the markdown report."""

    quality: pl.DataFrame
    summary: pl.DataFrame
    markdown: str


def _cell(row: dict, score: str = "spearman") -> str:
    return (f"{row[f'{score}_mean']:.3f} [{row[f'{score}_low']:.3f}, "
            f"{row[f'{score}_high']:.3f}]")


def _per_target(summary: pl.DataFrame, targets: tuple[str, ...], k: int, test: str,
                score: str = "spearman", published: dict | None = None) -> str:
    """One row per method, one column per target, then the mean over targets and the worst
    target; the published numbers first where given."""
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


def _over_k(summary: pl.DataFrame, targets: tuple[str, ...], ks: Sequence[int],
            test: str) -> str:
    """Mean Spearman and share within ±10% per method and k, each target."""
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
    """The runs of rows that drift off their table's own model, or a line saying none do."""
    if drift.is_empty():
        return "none"
    lines = ["| table | rows | median measured / model | rows beyond ±10% |", "|---|---|---:|---:|"]
    lines += [f"| {r['table']} | {r['first_row']}-{r['last_row']} | {r['ratio']:.2f} | "
              f"{r['beyond_10pct']:.0%} |" for r in drift.iter_rows(named=True)]
    return "\n".join(lines)


def drop_first(table: external.DeviceTable, count: int) -> external.DeviceTable:
    """The table without its first ``count`` archs (a sensitivity check of rows suspected of a
    measurement artefact)."""
    keep = slice(count, None)
    return external.DeviceTable(table.device, table.keys[keep], table.features[keep],
                                table.values[keep], table.flops[keep], table.params[keep])


def _split(data: external.ExternalSet, split: external.Split, ks: Sequence[int], seeds: int,
           report_k: int, methods: Sequence[str] | None) -> tuple[pl.DataFrame, pl.DataFrame,
                                                                   str]:
    """Evaluate one split: its quality rows, summary and markdown."""
    start = time.perf_counter()
    quality = external_eval.evaluate_split(data, split, list(ks), seeds,
                                           list(methods) if methods else None)
    summary = external_eval.summarize(quality)
    tests = summary["test"].unique(maintain_order=True).to_list()
    log.info("%s: %d targets in %.0f s", split.name, len(split.targets),
             time.perf_counter() - start)
    parts = [f"## {split.name} ({split.role} split): k = {report_k}, {seeds} seeds"]
    for test in tests:
        for score in ("spearman", "within_10pct"):
            parts.append(f"{score}, scored on {test} archs (mean over seeds [95% interval]):")
            parts.append(_per_target(summary, split.targets, report_k, test, score,
                                     split.published if score == "spearman"
                                     and test == tests[0] else None))
    parts.append(f"over k (Spearman / share within ±10%, scored on {tests[0]} archs):")
    parts.append(_over_k(summary, split.targets, ks, tests[0]))
    parts.append("upper bound (Spearman / ±10%, all archs):")
    parts.append(_bounds(data, split.targets))
    return quality, summary, "\n\n".join(parts)


def evaluate(runs: Sequence[tuple[external.ExternalSet, Sequence[external.Split]]],
             ks: Sequence[int], seeds: int, report_k: int, only: Sequence[str] = (),
             methods: Sequence[str] | None = None) -> Scored:
    """Every split of every data set (``only``: these split names), with the drift check of
    each data set first."""
    parts, qualities, summaries = [], [], []
    for data, _ in runs:
        drift = pl.concat([external_eval.drifting_blocks(t) for t in data.tables.values()])
        parts.append(f"## {data.name}: runs of rows off their table's own model by > 10% "
                     f"(flagged, still scored)\n\n{_drift(drift)}")
    for data, splits in runs:
        for split in splits:
            if only and split.name not in only:
                continue
            quality, summary, text = _split(data, split, ks, seeds, report_k, methods)
            qualities.append(quality)
            summaries.append(summary)
            parts.append(text)
    return Scored(pl.concat(qualities) if qualities else pl.DataFrame(),
                  pl.concat(summaries) if summaries else pl.DataFrame(),
                  "\n\n".join(parts) + "\n")


def data_sets(help_fbnet: str | None, hat: str | None, gpt: Sequence[str] = ()
              ) -> list[tuple[external.ExternalSet, list[external.Split]]]:
    """The data sets given (HELP's FBNet folder, HAT's latency folder, this project's device
    tables) with the splits of each."""
    runs: list[tuple[external.ExternalSet, list[external.Split]]] = []
    if help_fbnet:
        runs.append((external.load_help_fbnet(help_fbnet),
                     [external.SPLITS[s] for s in ("help_validation", "fbnet_unused",
                                                   "help_fbnet")]))
    if hat:
        runs.append((external.load_hat(hat), [external.SPLITS["hat_wmt14enfr"],
                                              external.SPLITS["hat_wmt14ende"]]))
    if gpt:
        data = external.load_gpt_tables(list(gpt))
        runs.append((data, [external.gpt_split(data)]))
    return runs
