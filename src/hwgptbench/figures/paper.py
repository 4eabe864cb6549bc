"""`make paper`'s figures and tables: every multi-device table of docs/paper_scale.md from the
tables shipped in the package (``hwgptbench.published``) and the surrogates fitted on them,
the search at the paper's budget from its summary tables, and the transfer on other projects'
data where it ran. Nothing is trained or measured here.

Writes, under the paper folder (``results/paper/``): ``tables/{name}.md`` with a CSV copy and
``figures/{name}.png`` with an SVG copy, named in :mod:`hwgptbench.figures.catalog`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path

import polars as pl

from .. import layout, published
from ..api import Benchmark
from ..io import atomic_write_text
from ..outputs import make_dirs
from ..plotting.markdown import write_table
from . import benchmark, paper_plots, search, tables
from .catalog import PAPER_DEVICE_TABLES
from .paper_tables import (
    cost_vs_size,
    dtype_speed,
    energy,
    front_disagreement,
    front_rows,
    kendall_pairs,
    measured_tau,
    surrogate_quality,
)

log = logging.getLogger(__name__)


def _measurements(scale: str) -> pl.DataFrame:
    return pl.concat(list(published.device_tables(scale).values()), how="diagonal_relaxed")


def predicted_tau(scale: str, bench: Benchmark, measurements: pl.DataFrame) -> pl.DataFrame:
    """Kendall τ of latency between every two shipped (device, condition) columns of a scale,
    each predicted by its surrogate for every arch of the scale's perplexity table."""
    ids = published.perplexity_table(scale)["arch_id"].to_list()
    columns = {"arch_id": ids}
    for device, condition in (benchmark.measured(measurements)
                              .select("device", "condition").unique()
                              .sort("device", "condition").iter_rows()):
        columns[f"{device} {condition}"] = bench.query(
            ids, "latency_ms", device=device, condition=condition)["latency_ms"].to_list()
    return kendall_pairs(scale, pl.DataFrame(columns), "latency_ms", "predicted")


def _scale_tables(scale: str, results: str) -> dict[str, pl.DataFrame]:
    """The device tables of one scale, each with its ``scale`` column."""
    bench = Benchmark.from_published(scale, layout.paper(results))
    measurements = _measurements(scale)
    perplexity = published.perplexity_table(scale)
    conditions = published.default_conditions(scale)
    quality = pl.concat([pl.read_parquet(path) for path in sorted(
        _surrogate_folder(scale, results).glob("devices/*/quality.parquet"))],
        how="diagonal_relaxed")
    devices = tables.device_summary(measurements)
    return {
        "devices": devices.select(pl.lit(scale).alias("scale"), pl.all()),
        "cost_vs_size": cost_vs_size(scale, measurements),
        "energy": energy(scale, measurements),
        "fronts": front_rows(scale, perplexity, measurements, conditions),
        "front_disagreement": front_disagreement(scale, perplexity, measurements, conditions),
        "dtype_speed": dtype_speed(scale, measurements),
        "kendall_tau": pl.concat([measured_tau(scale, measurements),
                                  predicted_tau(scale, bench, measurements)]),
        "surrogate_quality": surrogate_quality(scale, quality),
    }


def _surrogate_folder(scale: str, results: str) -> Path:
    from ..published.surrogates import ensure_surrogates

    return ensure_surrogates(scale, layout.paper(results))


def _scale_figures(scale: str, figures: Path) -> list[Path]:
    perplexity, measurements = published.perplexity_table(scale), _measurements(scale)
    return [
        *benchmark.pareto_fronts(perplexity, measurements, figures / f"{scale}_pareto_latency",
                                 metric="latency_ms"),
        *benchmark.pareto_fronts(perplexity, measurements, figures / f"{scale}_pareto_energy",
                                 metric="energy_mj"),
        *benchmark.pareto_fronts(perplexity, measurements, figures / f"{scale}_pareto_memory",
                                 metric="memory_peak_mb"),
        *benchmark.device_correlation(measurements, figures / f"{scale}_kendall_latency"),
        *paper_plots.cost_vs_size(measurements, figures / f"{scale}_cost_vs_size"),
    ]


def _search(search_dir: Path, table_dir: Path, figures: Path) -> list[Path]:
    """The search's tables and figures from the summary tables of `hwgptbench search-summary`."""
    def read(name: str) -> pl.DataFrame:
        return pl.read_parquet(search_dir / f"{name}.parquet")

    runs, friedman, ranks = read("runs"), read("friedman"), read("ranks")
    return [
        *write_table(tables.reference_table(read("reference")), table_dir / "search_reference"),
        *write_table(tables.hypervolume_table(read("final")), table_dir / "search_hypervolume"),
        *write_table(tables.rank_table(friedman, ranks), table_dir / "search_rank_tests"),
        *write_table(tables.pairwise_table(read("pairwise")), table_dir / "search_pairwise"),
        *search.hypervolume_curves(runs, figures / "search_hypervolume"),
        *search.hypervolume_time(runs, figures / "search_hypervolume_time"),
        *search.critical_difference(friedman, ranks, figures / "search_critical_difference"),
        *search.eaf_difference(read("eafdiff"), figures / "search_eaf_difference"),
    ]


def render(scales: Sequence[str], results: str | os.PathLike[str], search_dir: Path,
           external: Path) -> list[Path]:
    """Every table and figure of the paper for these shipped scales; ``external``: the
    markdown of the transfer on other projects' data (or the note that it was skipped),
    copied as ``tables/external.md``. Returns the paths written."""
    top = str(results)
    table_dir, figures = Path(layout.paper_tables(top)), Path(layout.paper_figures(top))
    for folder in (table_dir, figures):
        make_dirs(folder)
    per_scale = [_scale_tables(scale, top) for scale in scales]
    written = []
    for name in PAPER_DEVICE_TABLES:
        parts = [part[name] for part in per_scale if not part[name].is_empty()]
        table = pl.concat(parts, how="diagonal_relaxed") if parts else pl.DataFrame(
            {"scale": [], "note": []}, schema={"scale": pl.String, "note": pl.String})
        written += write_table(table, table_dir / name)
    for scale in scales:
        written += _scale_figures(scale, figures)
    written += _search(search_dir, table_dir, figures)
    atomic_write_text(table_dir / "external.md", external.read_text(encoding="utf-8"))
    written.append(table_dir / "external.md")
    log.info("wrote %d files under %s", len(written), layout.paper(top))
    return written
