"""What the shipped GPU tables show: cost vs size per scale, eager vs CUDA graph, energy per
token, Pareto fronts of perplexity vs GPU latency and energy, surrogate quality, and how the
CPU and GPU rank the archs.

    python benchmarks/gpu_tables.py [--device cuda-nvidia-h100-80gb-hbm3] \\
        [--out results/gpu_tables.md] [--figure docs/img/gpu_fronts.png]

Reads the tables shipped in the package (``hwgptbench.published``) and the surrogates a
fresh clone fits on them (``Benchmark.load``, cached under ``results/published/``); prints
markdown tables and writes them to ``--out``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import numpy as np
import polars as pl
from scipy.stats import kendalltau, spearmanr

from hwgptbench import published
from hwgptbench.api import Benchmark
from hwgptbench.io import atomic_write_text
from hwgptbench.published.surrogates import ensure_surrogates

GPU = "cuda-nvidia-h100-80gb-hbm3"
CPU = "cpu-amd-epyc-1t"
DEFAULT = "b8-t1024-bf16-cuda_graph"


def _markdown(table: pl.DataFrame) -> str:
    head = "| " + " | ".join(table.columns) + " |"
    rule = "|" + "---|" * len(table.columns)
    rows = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in table.iter_rows()]
    return "\n".join([head, rule, *rows])


def _cell(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _condition(table: pl.DataFrame) -> pl.DataFrame:
    return table.with_columns(pl.format("b{}-t{}-{}", "batch_size", "seq_len", "launch")
                              .alias("condition"))


def cost_vs_size(device: str) -> pl.DataFrame:
    """Per scale and condition: archs, latency range, Spearman of latency and peak memory with
    the parameter count, and the eager / CUDA-graph latency ratio (median over archs)."""
    rows = []
    for scale in ("s", "m", "l"):
        table = _condition(published.device_tables(scale)[device])
        wide = table.pivot(on="launch", index=["arch_id", "batch_size"], values="latency_ms")
        for (condition,), part in table.group_by("condition", maintain_order=True):
            b = part["batch_size"][0]
            ratio = wide.filter(pl.col("batch_size") == b).select(
                pl.col("eager") / pl.col("cuda_graph"))
            rows.append({
                "scale": scale, "condition": condition, "archs": part.height,
                "latency ms (min–max)": f"{part['latency_ms'].min():.2f}–"
                                        f"{part['latency_ms'].max():.2f}",
                "ρ(latency, params)": spearmanr(part["latency_ms"], part["params"])[0],
                "peak MB (min–max)": f"{part['memory_peak_mb'].min():.0f}–"
                                     f"{part['memory_peak_mb'].max():.0f}",
                "ρ(memory, params)": spearmanr(part["memory_peak_mb"], part["params"])[0],
                "eager/graph": float(ratio.to_series().median())})
    return pl.DataFrame(rows)


NVML_PERIOD_S = 0.1  # the H100's NVML energy counter advances every 100.0 ms (measured)

def energy(device: str) -> pl.DataFrame:
    """Per scale: energy per token at the default condition, the energy window's mean power,
    its time per forward against the latency, and how energy ranks against latency and size."""
    rows = []
    for scale in ("s", "m", "l"):
        part = published.device_tables(scale)[device].filter(pl.col("energy_mj").is_not_null())
        tokens = part["batch_size"] * part["seq_len"]
        per_token = part["energy_mj"] / tokens
        # the window's own mean power over its whole counter periods (NVML: 100 ms each):
        # energy over the time it was drawn in, never energy over the forward's latency
        periods = (part["energy_window_s"] / NVML_PERIOD_S).round().clip(lower_bound=1)
        power = part["energy_mj"] * part["energy_calls"] / (periods * NVML_PERIOD_S) / 1000
        per_forward = periods * NVML_PERIOD_S * 1000 / part["energy_calls"] / part["latency_ms"]
        rows.append({"scale": scale, "archs": part.height,
                     "mJ/token (min–max)": f"{per_token.min():.3f}–{per_token.max():.3f}",
                     "window power W (median)": float(power.median()),
                     "window power W (max)": float(power.max()),
                     "window time per forward / latency (median)": float(per_forward.median()),
                     "window s (median)": float(part["energy_window_s"].median()),
                     "τ(energy, latency)": kendalltau(part["energy_mj"], part["latency_ms"])[0],
                     "ρ(energy, params)": spearmanr(part["energy_mj"], part["params"])[0]})
    return pl.DataFrame(rows)


def pareto(points: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats in both columns (both minimised)."""
    order = np.lexsort((points[:, 1], points[:, 0]))
    mask = np.zeros(len(points), bool)
    best = np.inf
    for i in order:
        if points[i, 1] < best:
            mask[i], best = True, points[i, 1]
    return mask


def fronts(device: str) -> tuple[pl.DataFrame, dict[tuple[str, str], pl.DataFrame]]:
    """Per scale and GPU metric: how many measured archs are on the front of perplexity vs
    that metric, and its two ends."""
    rows, joined = [], {}
    for scale in ("s", "m", "l"):
        ppl = published.perplexity_table(scale).select("arch_id", "perplexity")
        part = (published.device_tables(scale)[device]
                .filter(pl.col("energy_mj").is_not_null()).join(ppl, on="arch_id"))
        for metric in ("latency_ms", "energy_mj"):
            mask = pareto(part.select("perplexity", metric).to_numpy())
            front = part.filter(pl.Series(mask)).sort(metric)
            joined[(scale, metric)] = part.with_columns(pl.Series("front", mask))
            rows.append({"scale": scale, "metric": metric, "archs": part.height,
                         "on the front": front.height,
                         "fastest/cheapest (ppl, value)":
                             f"{front['perplexity'][0]:.1f}, {front[metric][0]:.4g}",
                         "best perplexity (ppl, value)":
                             f"{front['perplexity'][-1]:.1f}, {front[metric][-1]:.4g}"})
    return pl.DataFrame(rows), joined


def surrogate_quality(device: str) -> pl.DataFrame:
    """The selected surrogate of each (scale, metric, condition) on the device: 5-fold
    out-of-fold quality, as the surrogate stage writes it."""
    frames = []
    for scale in ("s", "m", "l"):
        folder = ensure_surrogates(scale) / "devices" / device
        quality = pl.read_parquet(folder / "quality.parquet").filter(pl.col("selected"))
        frames.append(quality.select(pl.lit(scale).alias("scale"), "metric", "condition",
                                     "rows", "r2", "kendall_tau", "within_5pct",
                                     "coverage"))
    return pl.concat(frames)


def cpu_vs_gpu() -> pl.DataFrame:
    """How the CPU (1 thread, fp32, b1-t128) and the GPU rank `s` archs: on the archs both
    measured, and over every published `s` arch through each device's surrogate."""
    tables = published.device_tables("s")
    cpu = tables[CPU].select("arch_id", pl.col("latency_ms").alias("cpu"))
    bench = Benchmark.load("s", source="published")
    ids = published.perplexity_table("s")["arch_id"].to_list()
    cpu_all = bench.query(ids, "latency_ms", device=CPU)["latency_ms"]
    rows = []
    for condition in ("b1-t128-bf16-cuda_graph", DEFAULT, "b1-t128-bf16-eager"):
        b, t, _, launch = condition.split("-")
        gpu = _condition(tables[GPU]).filter(pl.col("condition") == f"{b}-{t}-{launch}")
        both = cpu.join(gpu.select("arch_id", pl.col("latency_ms").alias("gpu")), on="arch_id")
        gpu_all = bench.query(ids, "latency_ms", device=GPU, condition=condition)["latency_ms"]
        rows.append({"GPU condition": condition, "archs measured on both": both.height,
                     "τ measured": kendalltau(both["cpu"], both["gpu"])[0],
                     "τ predicted (10,000 archs)": kendalltau(cpu_all, gpu_all)[0]})
    return pl.DataFrame(rows)


def figure(joined: dict[tuple[str, str], pl.DataFrame], path: Path) -> None:
    """Perplexity vs GPU latency and energy per scale, the measured front drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(12, 6.5), constrained_layout=True)
    labels = {"latency_ms": "latency (ms), b8×1024 bf16 CUDA graph",
              "energy_mj": "energy per forward (mJ), same"}
    for row, metric in enumerate(("latency_ms", "energy_mj")):
        for col, scale in enumerate(("s", "m", "l")):
            ax, part = axes[row, col], joined[(scale, metric)]
            ax.scatter(part[metric], part["perplexity"], s=6, alpha=0.4, color="0.5")
            front = part.filter(pl.col("front")).sort(metric)
            ax.step(front[metric], front["perplexity"], where="post", color="C3", lw=1.5)
            ax.scatter(front[metric], front["perplexity"], s=12, color="C3")
            ax.set_title(f"{scale}: {part.height} archs, {front.height} on the front")
            ax.set_xlabel(labels[metric])
            ax.set_ylabel("perplexity (HW-GPT-Bench)")
    fig.suptitle("HW-GPT-Bench spaces on an NVIDIA H100 80GB HBM3")
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default=GPU)
    parser.add_argument("--out", type=Path, default=Path("results/gpu_tables.md"))
    parser.add_argument("--figure", type=Path, default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING)
    front_table, joined = fronts(args.device)
    sections = {"Cost vs size": cost_vs_size(args.device),
                "Energy at " + DEFAULT: energy(args.device),
                "Pareto fronts of perplexity (measured archs)": front_table,
                "Surrogate quality (5-fold out of fold)": surrogate_quality(args.device),
                "CPU vs GPU ranking of s archs (Kendall τ of latency)": cpu_vs_gpu()}
    text = "\n\n".join(f"### {title}\n\n{_markdown(table)}" for title, table in sections.items())
    print(text)
    atomic_write_text(args.out, text + "\n")
    if args.figure:
        figure(joined, args.figure)


if __name__ == "__main__":
    main()
