"""The paper's multi-device tables, from the tables shipped in the package: cost against size,
energy, Pareto fronts and the archs on one device's front and not another's, how every two
devices and conditions rank the archs, what a dtype changes in speed and ranking, and the
quality of each table's surrogates beside its repeatability ceiling. Tables in, table out."""

from __future__ import annotations

import itertools

import numpy as np
import polars as pl
from scipy.stats import kendalltau, spearmanr

from ..moo.hypervolume import pareto_mask
from ..schema import fully_trained
from .benchmark import kendall_matrix, measured, metric_columns

# The H100's NVML energy counter advances every 100.0 ms (measured, docs/measure.md): an NVML
# window's energy was drawn over its whole counter periods, so its power divides by those.
NVML_PERIOD_S = 0.1
FRONT_METRICS = ("latency_ms", "energy_mj", "memory_peak_mb")
MIN_SHARED = 5  # archs two columns must share for a Kendall τ


def _rho(a: pl.Series, b: pl.Series) -> float:
    return float(spearmanr(a.to_numpy(), b.to_numpy()).statistic)


def _tau(a: np.ndarray, b: np.ndarray) -> float:
    return float(kendalltau(a, b).statistic)


def cost_vs_size(scale: str, measurements: pl.DataFrame) -> pl.DataFrame:
    """Per device and condition of a scale: archs, latency and peak memory ranges, their
    Spearman ρ with the parameter count, and the eager / CUDA-graph latency ratio (median over
    the archs timed both ways at the same batch, length and dtype; null on a CPU)."""
    ok = measured(measurements)
    shape = ["device", "batch_size", "seq_len", "dtype"]
    launches = ok.pivot(on="launch", index=["arch_id", *shape], values="latency_ms",
                        aggregate_function="first")
    ratio = (launches.group_by(shape).agg(
        (pl.col("eager") / pl.col("cuda_graph")).median().alias("eager_over_graph"))
        if {"eager", "cuda_graph"} <= set(launches.columns)
        else pl.DataFrame(schema={**{c: ok.schema[c] for c in shape},
                                  "eager_over_graph": pl.Float64}))
    rows = []
    for (device, condition), part in ok.group_by("device", "condition", maintain_order=True):
        rows.append({"scale": scale, "device": device, "condition": condition,
                     "archs": part.height,
                     "latency_ms_min": part["latency_ms"].min(),
                     "latency_ms_max": part["latency_ms"].max(),
                     "rho_latency_params": _rho(part["latency_ms"], part["params"]),
                     "memory_mb_min": part["memory_peak_mb"].min(),
                     "memory_mb_max": part["memory_peak_mb"].max(),
                     "rho_memory_params": _rho(part["memory_peak_mb"], part["params"]),
                     **{c: part[c][0] for c in shape[1:]}})
    table = pl.DataFrame(rows).join(ratio, on=shape, how="left")
    return table.drop(shape[1:]).sort("device", "condition")


def window_power(part: pl.DataFrame) -> pl.DataFrame:
    """The energy window's mean power (W) and its time per forward (ms) of each row: energy
    over the time it was drawn in (NVML: whole counter periods), never over the latency."""
    window = pl.col("energy_window_s")
    drawn = pl.when(pl.col("energy_source") == "nvml").then(
        (window / NVML_PERIOD_S).round().clip(lower_bound=1) * NVML_PERIOD_S).otherwise(window)
    return part.with_columns(
        window_power_w=pl.col("energy_mj") * pl.col("energy_calls") / drawn / 1000,
        window_ms_per_forward=drawn * 1000 / pl.col("energy_calls"))


def energy(scale: str, measurements: pl.DataFrame) -> pl.DataFrame:
    """Per device and condition with energy: archs, energy per token, the window's mean power
    (median and largest), its time per forward against the latency (median ratio), the median
    window, and how energy ranks against latency (Kendall τ) and size (Spearman ρ)."""
    ok = measured(measurements).filter(pl.col("energy_mj").is_not_null())
    rows = []
    for (device, condition), part in ok.group_by("device", "condition", maintain_order=True):
        part = window_power(part)
        per_token = part["energy_mj"] / (part["batch_size"] * part["seq_len"])
        rows.append({"scale": scale, "device": device, "condition": condition,
                     "archs": part.height, "source": part["energy_source"][0],
                     "mj_per_token_min": per_token.min(), "mj_per_token_max": per_token.max(),
                     "window_power_w_median": part["window_power_w"].median(),
                     "window_power_w_max": part["window_power_w"].max(),
                     "window_per_forward_over_latency": (
                         part["window_ms_per_forward"] / part["latency_ms"]).median(),
                     "window_s_median": part["energy_window_s"].median(),
                     "tau_energy_latency": _tau(part["energy_mj"].to_numpy(),
                                                part["latency_ms"].to_numpy()),
                     "rho_energy_params": _rho(part["energy_mj"], part["params"])})
    if not rows:
        return pl.DataFrame()
    return pl.DataFrame(rows, infer_schema_length=None).sort("device", "condition")


def front_rows(scale: str, perplexity: pl.DataFrame, measurements: pl.DataFrame,
               conditions: dict[str, str]) -> pl.DataFrame:
    """Per device (at its default condition) and hardware metric: the measured archs, how many
    are on the Pareto front of perplexity against the metric, and its two ends."""
    ppl = fully_trained(perplexity).select("arch_id", "perplexity")
    ok = measured(measurements).join(ppl, on="arch_id")
    rows = []
    for device, condition in sorted(conditions.items()):
        part = ok.filter((pl.col("device") == device) & (pl.col("condition") == condition))
        for metric in FRONT_METRICS:
            values = part.drop_nulls(metric)
            if values.is_empty():
                continue
            mask = pareto_mask(values.select("perplexity", metric).to_numpy().astype(float))
            front = values.filter(pl.Series(mask)).sort(metric)
            rows.append({"scale": scale, "device": device, "condition": condition,
                         "metric": metric, "archs": values.height, "on_front": front.height,
                         "cheapest_value": front[metric][0],
                         "cheapest_perplexity": front["perplexity"][0],
                         "best_perplexity": front["perplexity"][-1],
                         "best_perplexity_value": front[metric][-1]})
    return pl.DataFrame(rows)


def kendall_pairs(scale: str, wide: pl.DataFrame, metric: str, basis: str) -> pl.DataFrame:
    """Kendall τ between every two columns of ``wide`` (one row per arch) over the archs both
    hold (at least :data:`MIN_SHARED`); ``basis`` says what the values are."""
    labels, tau, shared = kendall_matrix(wide)
    rows = [{"scale": scale, "metric": metric, "basis": basis, "a": labels[i], "b": labels[j],
             "archs": int(shared[i, j]), "kendall_tau": float(tau[i, j])}
            for i, j in itertools.combinations(range(len(labels)), 2)
            if shared[i, j] >= MIN_SHARED]
    return pl.DataFrame(rows, schema={"scale": pl.String, "metric": pl.String,
                                      "basis": pl.String, "a": pl.String, "b": pl.String,
                                      "archs": pl.Int64, "kendall_tau": pl.Float64})


def measured_tau(scale: str, measurements: pl.DataFrame) -> pl.DataFrame:
    """Kendall τ of latency and of energy between every two shipped (device, condition)
    columns of a scale, over the archs measured in both."""
    ok = measured(measurements)
    return pl.concat([kendall_pairs(scale, metric_columns(ok, metric, " "), metric, "measured")
                      for metric in ("latency_ms", "energy_mj")
                      if metric in ok.columns and ok[metric].is_not_null().any()])


def surrogate_quality(scale: str, quality: pl.DataFrame) -> pl.DataFrame:
    """The selected surrogate of each (device, metric, condition) of a scale: its 5-fold
    out-of-fold quality beside the table's repeatability ceiling (the agreement of the archs
    timed twice; null where the table has no repeat visit)."""
    columns = ["device", "metric", "condition", "rows", "r2", "kendall_tau", "within_5pct",
               "coverage", "ceiling_archs", "ceiling_kendall_tau", "ceiling_within_5pct",
               "at_ceiling"]
    return (quality.filter(pl.col("selected")).select(columns)
            .select(pl.lit(scale).alias("scale"), pl.all()).sort("device", "metric", "condition"))


def _front_ids(table: pl.DataFrame, metric: str) -> list[str]:
    """The archs of ``table`` on its Pareto front of perplexity against ``metric``, best
    perplexity first."""
    mask = pareto_mask(table.select("perplexity", metric).to_numpy().astype(float))
    return table.filter(pl.Series(mask)).sort("perplexity")["arch_id"].to_list()


def front_disagreement(scale: str, perplexity: pl.DataFrame, measurements: pl.DataFrame,
                       conditions: dict[str, str], metric: str = "latency_ms",
                       examples: int = 3) -> pl.DataFrame:
    """Per two devices (each at its default condition): the archs both measured, the size of
    each one's Pareto front of perplexity against ``metric`` over those archs, how many archs
    are on both, on the first's only and on the second's only, with up to ``examples`` of each
    (best perplexity first)."""
    ppl = fully_trained(perplexity).select("arch_id", "perplexity")
    ok = measured(measurements).drop_nulls(metric).join(ppl, on="arch_id")
    columns = {device: ok.filter((pl.col("device") == device)
                                 & (pl.col("condition") == condition))
               .select("arch_id", "perplexity", metric)
               for device, condition in sorted(conditions.items())}
    rows = []
    for (a, table_a), (b, table_b) in itertools.combinations(columns.items(), 2):
        shared = table_a.join(table_b.select("arch_id"), on="arch_id")
        if shared.height < MIN_SHARED:
            continue
        front_a = _front_ids(shared, metric)
        front_b = _front_ids(table_b.join(shared.select("arch_id"), on="arch_id"), metric)
        in_a, in_b = set(front_a), set(front_b)
        only_a = [i for i in front_a if i not in in_b]
        only_b = [i for i in front_b if i not in in_a]
        rows.append({"scale": scale, "metric": metric, "a": a, "a_condition": conditions[a],
                     "b": b, "b_condition": conditions[b], "shared": shared.height,
                     "front_a": len(front_a), "front_b": len(front_b),
                     "on_both": len(front_a) - len(only_a), "only_a": len(only_a),
                     "only_b": len(only_b),
                     "only_a_examples": ", ".join(only_a[:examples]),
                     "only_b_examples": ", ".join(only_b[:examples])})
    return pl.DataFrame(rows)


def dtype_speed(scale: str, measurements: pl.DataFrame, base: str = "fp32") -> pl.DataFrame:
    """Per device and condition measured at ``base`` and at another dtype (same batch, length
    and launch): the archs timed at both, the latency ratio of the other dtype to ``base``
    (median and range: below 1 is faster) and how both rank the archs (Kendall τ)."""
    ok = measured(measurements)
    shape = ["device", "batch_size", "seq_len", "launch"]
    rows = []
    for key, part in ok.group_by(shape, maintain_order=True):
        wide = part.pivot(on="dtype", index="arch_id", values="latency_ms",
                          aggregate_function="first")
        if base not in wide.columns:
            continue
        for other in sorted(set(wide.columns) - {"arch_id", base}):
            both = wide.drop_nulls([base, other])
            if both.height < MIN_SHARED:
                continue
            ratio = both[other] / both[base]
            device, batch, seq, launch = key
            rows.append({"scale": scale, "device": device,
                         "condition": f"b{batch}-t{seq}-{launch}", "dtype": other,
                         "base": base, "archs": both.height, "ratio_median": ratio.median(),
                         "ratio_min": ratio.min(), "ratio_max": ratio.max(),
                         "kendall_tau": _tau(both[base].to_numpy(), both[other].to_numpy())})
    return pl.DataFrame(rows)
