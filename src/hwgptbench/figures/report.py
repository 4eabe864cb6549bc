"""The figures stage: every figure, table and DVC plot file of a scale, from result tables
only.

Reads ``results/{scale}/``: perplexity.parquet, measurements.parquet,
surrogates/{quality,predictions}.parquet, supernet/loss.parquet (where a supernet was
trained), search/{runs,reference,final,attainment,friedman,ranks,pairwise,eafdiff}.parquet
(the runs as scored against the final reference fronts, and the rank tests),
transfer/{quality,summary}.parquet, runtime.parquet, breakdown.parquet, serving.parquet and
parallel.parquet. Writes ``figures/`` (PNG + SVG), ``tables/`` (CSV + Markdown) and
``plots/`` (CSV for ``dvc plots``). Nothing is trained, measured or predicted here, so after
``dvc pull`` the figures regenerate in seconds.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import polars as pl

from .. import layout
from ..outputs import atomic_path, make_dirs
from ..plotting.markdown import write_table
from ..schema import fully_trained
from . import benchmark, runtime, search, surrogate, tables, transfer

log = logging.getLogger(__name__)

THIRD_OBJECTIVES = ("energy_mj", "memory_peak_mb", "params")


def _three_objectives(perplexity: pl.DataFrame, measurements: pl.DataFrame
                      ) -> tuple[pl.DataFrame, list[str]]:
    """Perplexity, latency and the first measured of energy, memory and params, per measured
    arch of the first device and condition."""
    ok = benchmark.measured(measurements)
    head = ok.row(0, named=True)
    first = ok.filter((pl.col("device") == head["device"])
                      & (pl.col("condition") == head["condition"]))
    third = next(m for m in THIRD_OBJECTIVES
                 if m in first.columns and first[m].is_not_null().any())
    table = fully_trained(perplexity).select("arch_id", "perplexity").join(
        first.select("arch_id", "latency_ms", third), on="arch_id").drop_nulls()
    return table, ["perplexity", "latency_ms", third]


def hypervolume_plot_data(runs: pl.DataFrame) -> pl.DataFrame:
    """Mean hypervolume per algorithm at each whole evaluation of cost, wide (one column per
    algorithm), of the first objective set and device: the data of `dvc plots`."""
    first = runs.sort("objectives", "device").row(0, named=True)
    group = runs.filter((pl.col("objectives") == first["objectives"])
                        & (pl.col("device") == first["device"]))
    at_cost = group.with_columns(evaluation=pl.col("cumulative_cost").ceil().cast(pl.Int64)
                                 ).group_by("algorithm", "seed", "evaluation").agg(
        pl.col("hypervolume").max())
    return at_cost.group_by("algorithm", "evaluation").agg(pl.col("hypervolume").mean()).pivot(
        on="algorithm", index="evaluation", values="hypervolume", sort_columns=True
    ).sort("evaluation").fill_null(strategy="forward")


def render(scale: str, results: str | os.PathLike[str]) -> list[Path]:
    """Every figure, table and plot file of one scale of the results folder ``results``;
    returns the paths written."""
    top = str(results)
    figures, table_dir = Path(layout.figures(scale, top)), Path(layout.tables(scale, top))
    plots = Path(layout.plots(scale, top))
    for folder in (figures, table_dir, plots):
        make_dirs(folder)
    perplexity = pl.read_parquet(layout.perplexity(scale, top))
    measurements = pl.read_parquet(layout.measurements(scale, top))
    quality = pl.read_parquet(layout.quality(scale, top))
    predictions = pl.read_parquet(layout.predictions(scale, top))
    loss_path = Path(layout.loss_table(scale, top))  # absent where perplexities were imported
    loss = pl.read_parquet(loss_path) if loss_path.exists() else None
    runs = pl.read_parquet(layout.search_table(scale, "runs", top))
    reference = pl.read_parquet(layout.search_table(scale, "reference", top))
    final = pl.read_parquet(layout.search_table(scale, "final", top))
    attainment = pl.read_parquet(layout.search_table(scale, "attainment", top))
    friedman = pl.read_parquet(layout.search_table(scale, "friedman", top))
    ranks = pl.read_parquet(layout.search_table(scale, "ranks", top))
    pairwise = pl.read_parquet(layout.search_table(scale, "pairwise", top))
    eafdiff = pl.read_parquet(layout.search_table(scale, "eafdiff", top))
    transfer_quality = pl.read_parquet(layout.transfer_quality(scale, top))
    transfer_summary = pl.read_parquet(layout.transfer_summary(scale, top))
    runtime_rows = pl.read_parquet(layout.runtime(scale, top))
    breakdown = pl.read_parquet(layout.breakdown(scale, top))
    serving = pl.read_parquet(layout.serving(scale, top))
    parallel = pl.read_parquet(layout.parallel(scale, top))
    three, metrics = _three_objectives(perplexity, measurements)

    written = [
        *benchmark.pareto_fronts(perplexity, measurements, figures / "pareto_latency",
                                 metric="latency_ms"),
        *benchmark.pareto_fronts(perplexity, measurements, figures / "pareto_energy",
                                 metric="energy_mj"),
        *benchmark.device_correlation(measurements, figures / "device_correlation"),
        *benchmark.device_correlation(measurements, figures / "device_correlation_energy",
                                      metric="energy_mj"),
        *surrogate.surrogate_scatter(predictions, figures / "surrogate_scatter"),
        *surrogate.surrogate_calibration(quality, figures / "surrogate_calibration"),
        *search.hypervolume_curves(runs, figures / "hypervolume"),
        *search.hypervolume_time(runs, figures / "hypervolume_time"),
        *search.critical_difference(friedman, ranks, figures / "critical_difference"),
        *search.eaf_difference(eafdiff, figures / "eaf_difference"),
        *search.attainment_surfaces(attainment, figures / "attainment"),
        *benchmark.pareto_3d(three, metrics, figures / "pareto_3d"),
        *benchmark.dimension_effects(measurements, figures / "dimension_effects"),
        *(benchmark.loss_curve(loss, figures / "supernet_loss") if loss is not None else []),
        *transfer.transfer_quality(transfer_summary, transfer_quality,
                                  figures / "transfer_quality"),
        *runtime.breakdown_bars(breakdown, figures / "runtime_breakdown"),
        *runtime.runtime_options(runtime_rows, figures / "runtime_options"),
        *runtime.serving_curves(serving, figures / "serving"),
        *runtime.parallel_modes(parallel, figures / "runtime_parallel"),
        *write_table(tables.quality_table(quality), table_dir / "surrogate_quality"),
        *write_table(tables.hypervolume_table(final), table_dir / "hypervolume"),
        *write_table(tables.rank_table(friedman, ranks), table_dir / "rank_tests"),
        *write_table(tables.pairwise_table(pairwise), table_dir / "pairwise_tests"),
        *write_table(tables.reference_table(reference), table_dir / "reference_front"),
        *write_table(tables.device_summary(measurements), table_dir / "devices"),
        *write_table(transfer.transfer_table(transfer_summary, transfer_quality),
                            table_dir / "transfer"),
        *write_table(runtime.runtime_table(runtime_rows), table_dir / "runtime"),
        *write_table(runtime.serving_table(serving), table_dir / "serving"),
        *write_table(runtime.parallel_table(parallel), table_dir / "parallel"),
    ]
    plot_data = {
        "hypervolume": hypervolume_plot_data(runs),
        "surrogate_predictions": predictions,
    }
    if loss is not None:
        plot_data["supernet_loss"] = loss.select("step", "kind", "loss").pivot(
            on="kind", index="step", values="loss", aggregate_function="mean").sort("step")
    for name, table in plot_data.items():
        with atomic_path(plots / f"{name}.csv") as tmp:
            table.write_csv(tmp, float_precision=6)
        written.append(plots / f"{name}.csv")
    log.info("wrote %d files under %s", len(written), layout.scale_dir(scale, top))
    return written

