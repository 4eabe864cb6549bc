"""The final reference front of each (objectives, device), and every run scored against it.

The reference stored before the runs (a large sample and a long optimisation on the
surrogates, :mod:`.reference`) is united with every full-fidelity evaluation of every run; the
reference front is the Pareto front of the union, and the box is widened to every value seen.
Each run's archive is part of the union, so its front is weakly dominated by the reference
front in the box it is scored in: ``hv_regret >= 0`` by construction (hypervolumes of
different point sets may differ by rounding, up to :data:`~.reference.TOLERANCE`; that is
clipped to 0, anything more is an error).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

import numpy as np
import polars as pl

from ..moo.hypervolume import hypervolume, pareto_mask
from ..moo.reference import SOURCES, TOLERANCE, Reference, scores, with_front

KEYS = ["objectives", "device"]


def merge_runs(reference: Reference, table: pl.DataFrame, runs: pl.DataFrame
               ) -> tuple[Reference, pl.DataFrame]:
    """reference and its table (of :func:`~.reference.compute_reference`) with the
    full-fidelity evaluations of runs added (source ``runs``): the box widened to their
    values, ``on_front`` marking the union's Pareto front, its hypervolume in the new box."""
    metrics = reference.metrics
    archive = runs.filter(pl.col("full_fidelity")).select("arch_id", *metrics)
    ideal, nadir = np.array(reference.ideal), np.array(reference.nadir)
    if archive.height:
        values = archive.select(metrics).to_numpy().astype(float)
        ideal, nadir = np.minimum(ideal, values.min(axis=0)), np.maximum(nadir, values.max(axis=0))
    widened = replace(reference, ideal=ideal.tolist(), nadir=nadir.tolist(),
                      merged=archive.height)
    union = pl.concat([table.select("arch_id", *metrics, "source"),
                       archive.with_columns(source=pl.lit("runs", dtype=pl.String))],
                      how="vertical_relaxed")
    return with_front(widened, union)


def rescore(runs: pl.DataFrame, reference: Reference) -> pl.DataFrame:
    """runs (of one objective set and device) with ``hypervolume`` and ``hv_regret`` in the box
    of reference, whose front must weakly dominate every run's evaluations."""
    parts = []
    for (algorithm, seed), run in runs.sort("algorithm", "seed", "evaluation").group_by(
            ["algorithm", "seed"], maintain_order=True):
        values = run.select(reference.metrics).to_numpy().astype(float)
        hv, regret = scores(reference, values, run["full_fidelity"].to_numpy())
        if len(regret) and regret.min() < -TOLERANCE:
            raise ValueError(f"{algorithm} seed {seed} beats the reference front by "
                             f"{-regret.min():.3g}: its archive is not part of the front")
        parts.append(run.with_columns(hypervolume=pl.Series(hv),
                                      hv_regret=pl.Series(np.maximum(regret, 0.0))))
    return pl.concat(parts)


def stages(reference: Reference, table: pl.DataFrame) -> pl.DataFrame:
    """How each addition moved the front: per source (sample, optimisation, runs), the
    evaluations it added, the Pareto front of it and the sources before it (its size and
    hypervolume in the final box, and that hypervolume's gap to the final front's), and how
    many archs of the final front it holds."""
    evaluations = {"sample": reference.archs, "optimisation": reference.optimised,
                   "runs": reference.merged}
    rows = []
    for i, source in enumerate(SOURCES):
        part = table.filter(pl.col("source").is_in(SOURCES[:i + 1]))
        values = part.select(reference.metrics).to_numpy().astype(float)
        front = pareto_mask(values)
        hv = hypervolume(reference.normalize(values[front]), reference.point)
        rows.append({"stage": source, "evaluations": evaluations[source],
                     "front_archs": int(front.sum()),
                     "final_front_archs": table.filter(pl.col("on_front")
                                                       & (pl.col("source") == source)).height,
                     "hypervolume": hv, "hv_gap": reference.hypervolume - hv})
    return pl.DataFrame(rows, schema={"stage": pl.String, "evaluations": pl.Int64,
                                      "front_archs": pl.Int64, "final_front_archs": pl.Int64,
                                      "hypervolume": pl.Float64, "hv_gap": pl.Float64})


def final_fronts(runs: pl.DataFrame, references: Sequence[tuple[Reference, pl.DataFrame]],
                 objective_sets: Mapping[str, Sequence[str]]
                 ) -> tuple[pl.DataFrame, pl.DataFrame, pl.DataFrame]:
    """For every (objectives, device) of runs, with its stored reference (matched by metrics
    and device): (the runs rescored in the final box, the :func:`stages` table with the box,
    the final front's archs with their source)."""
    stored = {(tuple(r.metrics), r.device): (r, t) for r, t in references}
    rescored, stage_tables, fronts = [], [], []
    for (objectives, device), group in runs.group_by(KEYS, maintain_order=True):
        key = (tuple(objective_sets[str(objectives)]), device)
        if key not in stored:
            raise ValueError(f"no search reference of {objectives} on {device}")
        reference, table = merge_runs(*stored[key], group)
        labels = [pl.lit(objectives, dtype=pl.String).alias("objectives"),
                  pl.lit(device, dtype=pl.String).alias("device")]
        rescored.append(rescore(group, reference))
        box = {"metrics": [reference.metrics], "ideal": [reference.ideal],
               "nadir": [reference.nadir]}
        stage_tables.append(stages(reference, table).select(*labels, pl.all()).join(
            pl.DataFrame(box), how="cross"))
        fronts.append(table.filter("on_front").drop("on_front").select(*labels, pl.all()))
    return (pl.concat(rescored, how="diagonal_relaxed"), pl.concat(stage_tables),
            pl.concat(fronts, how="diagonal_relaxed"))
