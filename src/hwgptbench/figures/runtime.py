"""Figures and table of the runtime stage: where time goes, and what each runtime option costs."""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib
import numpy as np
import polars as pl

from ..plotting.style import DOUBLE_WIDTH, cycle_colors, grid_shape, new_figure, save, styled
from ..schema import MODULE_CLASSES, OTHER, STAGE_CLASSES

PathLike = str | os.PathLike[str]
WORKLOAD_UNITS = {"prefill": "ms per forward", "decode": "ms per token",
                  "train_step": "ms per step"}
OPTIONS = ("attention", "quant", "compile", "recompute")


def _nothing(out_stem: PathLike, text: str) -> list[Path]:
    """A figure that says why it is empty."""
    fig = new_figure(DOUBLE_WIDTH, 1.4)
    ax = fig.subplots()
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", wrap=True)
    return save(fig, out_stem)


def n_layer_of(arch_id: str) -> int:
    """The layer count in an arch id (``e64-l2-...``)."""
    return int(arch_id.split("-")[1][1:])


@styled
def breakdown_bars(breakdown: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Stacked bars of the module-class fractions of each profiled arch, one panel per
    (device, workload); the label under a bar is the arch and its unprofiled latency."""
    if breakdown.is_empty():
        return _nothing(out_stem, "no runtime breakdown measured (runtime.breakdown.n_archs)")
    modules = breakdown.filter(pl.col("view") == "modules")
    if "parallel" in modules.columns:  # the parallel modes' collectives: runtime_parallel
        modules = modules.filter(pl.col("parallel").is_null())
    order = [c for c in (*MODULE_CLASSES, *STAGE_CLASSES, OTHER)
             if c in set(modules["category"])]
    palette = matplotlib.color_sequences["tab20"]  # one colour per class (up to 20)
    colors = {category: palette[i % len(palette)] for i, category in enumerate(order)}
    panels = modules.select("device", "workload").unique().sort("device", "workload")
    rows, cols = grid_shape(panels.height)
    fig = new_figure(DOUBLE_WIDTH, 2.8 * rows + 0.6)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (device, workload) in zip(axes, panels.iter_rows(), strict=False):
        part = modules.filter((pl.col("device") == device) & (pl.col("workload") == workload))
        archs = part.select("arch_id", "latency_ms").unique().sort("arch_id")
        bottom = np.zeros(archs.height)
        for category in order:
            values = archs.join(part.filter(pl.col("category") == category),
                                on="arch_id", how="left").sort("arch_id")["fraction"]
            heights = values.fill_null(0).to_numpy()
            ax.bar(range(archs.height), heights, bottom=bottom, color=colors[category],
                   label=category, width=0.7)
            bottom += heights
        ax.set_xticks(range(archs.height), [f"{a}\n{t:.2g} ms" for a, t in archs.iter_rows()],
                      rotation=30, ha="right", fontsize=5)
        ax.set_ylim(0, 1)
        ax.set_ylabel("fraction of profiled time")
        ax.set_title(f"{device}: {workload}", fontsize=7)
    for ax in axes[panels.height:]:
        ax.axis("off")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(len(labels), 7),
               fontsize=6, frameon=False)
    return save(fig, out_stem)


def option_label(row: dict) -> str:
    """The option a runtime condition varies (``default`` for none), and the dtype."""
    varied = [f"{o}={row[o]}" for o in OPTIONS
              if row[o] not in ("default", "none", False)]
    return f"{row['dtype']} " + (",".join(varied) if varied else "default")


def option_effects(runtime: pl.DataFrame) -> pl.DataFrame:
    """Median latency and throughput per (device, workload, option, n_layer) over the archs
    measured, and the median per-arch ratio of latency to the default condition's in the same
    dtype."""
    ok = runtime.filter(pl.col("status") == "ok")
    if ok.is_empty():
        return pl.DataFrame()
    labelled = ok.with_columns(
        option=pl.struct("dtype", *OPTIONS).map_elements(option_label, return_dtype=pl.String),
        n_layer=pl.col("arch_id").map_elements(n_layer_of, return_dtype=pl.Int64))
    grouped = labelled.group_by("device", "workload", "option", "n_layer").agg(
        pl.col("latency_ms").median(), pl.col("tokens_per_s").median(),
        pl.len().alias("archs"))
    reference = labelled.filter(pl.col("option") == pl.col("dtype") + " default")
    per_arch = labelled.join(reference.select("device", "workload", "dtype", "arch_id",
                                              pl.col("latency_ms").alias("default_ms")),
                             on=["device", "workload", "dtype", "arch_id"])
    ratios = per_arch.group_by("device", "workload", "option", "n_layer").agg(
        (pl.col("latency_ms") / pl.col("default_ms")).median().alias("latency_vs_default"))
    return grouped.join(ratios, on=["device", "workload", "option", "n_layer"], how="left").sort(
        "device", "workload", "option", "n_layer")


@styled
def runtime_options(runtime: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Median latency per option and dtype against layer count, one panel per (device,
    workload): decode per token, prefill per forward, train step per step."""
    effects = option_effects(runtime) if not runtime.is_empty() else pl.DataFrame()
    if effects.is_empty():
        return _nothing(out_stem, "no runtime condition measured (runtime stage)")
    panels = effects.select("device", "workload").unique().sort("device", "workload")
    colors = cycle_colors(sorted(set(effects["option"])))
    rows, cols = grid_shape(panels.height)
    fig = new_figure(DOUBLE_WIDTH, 2.6 * rows + 0.8)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, (device, workload) in zip(axes, panels.iter_rows(), strict=False):
        part = effects.filter((pl.col("device") == device) & (pl.col("workload") == workload))
        for option in sorted(set(part["option"])):
            line = part.filter(pl.col("option") == option).sort("n_layer")
            ax.plot(line["n_layer"], line["latency_ms"], marker="o", color=colors[option],
                    label=option)
        ax.set_yscale("log")
        ax.set_xlabel("layers")
        ax.set_ylabel(f"median latency ({WORKLOAD_UNITS.get(workload, 'ms')})")
        ax.set_title(f"{device}: {workload}", fontsize=7)
        ax.legend(fontsize=5, frameon=False)
    for ax in axes[panels.height:]:
        ax.axis("off")
    return save(fig, out_stem)


def runtime_table(runtime: pl.DataFrame) -> pl.DataFrame:
    """Per device, workload and option: median latency over the archs and relative to the
    default, and how many archs ran or why none did."""
    if runtime.is_empty():
        return pl.DataFrame({"note": ["no runtime condition measured"]})
    effects = option_effects(runtime)
    labelled = runtime.with_columns(
        option=pl.struct("dtype", *OPTIONS).map_elements(option_label, return_dtype=pl.String))
    status = labelled.group_by("device", "workload", "option").agg(
        (pl.col("status") == "ok").sum().alias("archs_ok"),
        pl.col("reason").drop_nulls().first().alias("reason"))
    if effects.is_empty():
        return status.sort("device", "workload", "option")
    summary = effects.group_by("device", "workload", "option").agg(
        pl.col("latency_ms").median().alias("median_latency_ms"),
        pl.col("tokens_per_s").median().alias("median_tokens_per_s"),
        pl.col("latency_vs_default").median())
    return status.join(summary, on=["device", "workload", "option"], how="left").sort(
        "device", "workload", "option")


@styled
def serving_curves(serving: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Decode throughput against time per output token, one line per arch through the batch
    sizes (each point labelled with its batch), one panel per device: the curve a deployer
    reads to pick a batch size under a latency budget."""
    ok = serving.filter(pl.col("status") == "ok") if not serving.is_empty() else serving
    if ok.is_empty():
        return _nothing(out_stem, "no serving sweep measured (runtime.serving.n_archs)")
    devices = sorted(set(ok["device"]))
    colors = cycle_colors(sorted(set(ok["arch_id"])))
    rows, cols = grid_shape(len(devices))
    fig = new_figure(DOUBLE_WIDTH, 2.8 * rows + 0.4)
    axes = np.atleast_1d(fig.subplots(rows, cols, squeeze=False)).ravel()
    for ax, device in zip(axes, devices, strict=False):
        part = ok.filter(pl.col("device") == device)
        for arch in part.sort("params", "arch_id").partition_by("arch_id", maintain_order=True):
            line = arch.sort("batch_size")
            arch_id = line["arch_id"][0]
            ax.plot(line["tpot_ms"], line["throughput_tokens_per_s"], marker="o",
                    color=colors[arch_id], label=f"{arch_id} ({line['params'][0] / 1e6:.2g}M)")
            for tpot, throughput, batch in line.select(
                    "tpot_ms", "throughput_tokens_per_s", "batch_size").iter_rows():
                ax.annotate(f"b{batch}", (tpot, throughput), fontsize=5,
                            textcoords="offset points", xytext=(3, -6))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("time per output token (ms)")
        ax.set_ylabel("decode throughput (tokens/s)")
        ax.set_title(device, fontsize=7)
        ax.legend(fontsize=5, frameon=False)
    for ax in axes[len(devices):]:
        ax.axis("off")
    return save(fig, out_stem)


def serving_table(serving: pl.DataFrame) -> pl.DataFrame:
    """Per device, arch and batch size: TTFT, TPOT, throughput and one request's latency."""
    if serving.is_empty():
        return pl.DataFrame({"note": ["no serving sweep measured"]})
    return serving.select("device", "arch_id", "params", "batch_size", "status", "ttft_ms",
                          "tpot_ms", "throughput_tokens_per_s", "end_to_end_ms",
                          "reason").sort("device", "params", "arch_id", "batch_size")


def parallel_summary(parallel: pl.DataFrame) -> pl.DataFrame:
    """Per device, arch, mode and recompute (ok rows, the mean over ranks): step (unprofiled
    and profiled), compute and communication ms, state per rank (MB) and peak memory."""
    ok = parallel.filter(pl.col("status") == "ok")
    return ok.group_by("device", "arch_id", "mode", "recompute", "dtype").agg(
        pl.col("world_size").first(), pl.col("step_ms").mean(),
        pl.col("profiled_step_ms").mean(), pl.col("compute_ms").mean(), pl.col("comm_ms").mean(),
        pl.col("tokens_per_s").first(),
        (pl.col("param_bytes").mean() / 2**20).alias("param_mb"),
        (pl.col("grad_bytes").mean() / 2**20).alias("grad_mb"),
        (pl.col("optim_bytes").mean() / 2**20).alias("optim_mb"),
        (pl.col("state_bytes").mean() / 2**20).alias("state_mb"),
        pl.col("memory_peak_mb").mean())


@styled
def parallel_modes(parallel: pl.DataFrame, out_stem: PathLike) -> list[Path]:
    """Per parallel mode: the profiled step split into the time no collective was in flight
    (compute) and the rest (mean over ranks), and the training state one rank holds
    (parameters, gradients, optimizer state), for the largest arch run on each device, without
    recomputation where it ran."""
    summary = parallel_summary(parallel) if not parallel.is_empty() else pl.DataFrame()
    if summary.is_empty():
        return _nothing(out_stem, "no parallel train step measured (runtime.parallel.n_archs)")
    devices = sorted(set(summary["device"]))
    fig = new_figure(DOUBLE_WIDTH, 2.6 * len(devices) + 0.4)
    axes = np.atleast_2d(fig.subplots(len(devices), 2, squeeze=False))
    modes = ("none", "ddp", "zero1", "zero2", "zero3")
    for (time_ax, state_ax), device in zip(axes, devices, strict=True):
        part = summary.filter(pl.col("device") == device)
        part = part.filter(pl.col("recompute") == part["recompute"].min())
        largest = part.sort("state_mb", descending=True)["arch_id"][0]
        part = part.filter((pl.col("arch_id") == largest)
                           & (pl.col("dtype") == part["dtype"].min()))
        rows = [r for m in modes for r in part.filter(pl.col("mode") == m).iter_rows(named=True)]
        x = np.arange(len(rows))
        labels = [r["mode"] for r in rows]
        compute = np.array([r["compute_ms"] for r in rows])
        time_ax.bar(x, compute, label="compute", color="tab:blue")
        time_ax.bar(x, [r["profiled_step_ms"] - c for r, c in zip(rows, compute, strict=True)],
                    bottom=compute, label="communication in flight", color="tab:orange")
        time_ax.set_xticks(x, labels)
        time_ax.set_ylabel("ms per step (profiled)")
        world = rows[0]["world_size"] if rows else 1
        time_ax.set_title(f"{device}: {largest}, {world} ranks", fontsize=7)
        time_ax.legend(fontsize=5, frameon=False)
        bottom = np.zeros(len(rows))
        for field, label in (("param_mb", "parameters"), ("grad_mb", "gradients"),
                             ("optim_mb", "optimizer state")):
            heights = np.array([r[field] for r in rows])
            state_ax.bar(x, heights, bottom=bottom, label=label)
            bottom += heights
        state_ax.set_xticks(x, labels)
        state_ax.set_ylabel("training state per rank (MB)")
        state_ax.legend(fontsize=5, frameon=False)
    return save(fig, out_stem)


def parallel_table(parallel: pl.DataFrame) -> pl.DataFrame:
    """The parallel modes per device, arch and recompute: step, compute and communication
    time, throughput, state per rank and peak memory (means over ranks)."""
    if parallel.is_empty():
        return pl.DataFrame({"note": ["no parallel train step measured"]})
    return parallel_summary(parallel).sort("device", "arch_id", "recompute", "dtype", "mode")
