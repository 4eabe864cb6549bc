"""The normalisation, reference point and best known Pareto front of a search problem.

Defined once per (scale, objectives, device), before any run, from a large seeded sample of
the space (all of it when the space is no larger than the sample) and, where the space is
sampled, a long NSGA-II run on the surrogates (:mod:`.optimise`); stored, so that every run
sees its objectives scaled the same way: to [0, 1] between the best (ideal) and worst (nadir)
value of each metric seen, with the reference point at the nadir (1, ..., 1 after scaling).
The summary stage then adds every run's archive to this front (:mod:`.front`) and scores all
runs in the box of the union, so that no run can beat the reference front.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import polars as pl
from tqdm import tqdm

from ..io import canonical_json
from ..outputs import replace_dir
from ..space import Arch
from .hypervolume import hypervolume, hypervolume_trace, pareto_mask
from .problem import BATCH, Objectives

log = logging.getLogger(__name__)

REFERENCE = "reference.json"
FRONT = "front.parquet"
SOURCES = ("sample", "optimisation", "runs")  # what the reference front is built from, in order
OPTIMISATION_PER_SAMPLE = 10  # NSGA-II evaluations per sampled arch, where the space is sampled
TOLERANCE = 1e-9  # rounding of hypervolumes computed on different point sets


@dataclass(frozen=True)
class Reference:
    """Scaling and reference front of one (objectives, device, condition)."""

    metrics: list[str]
    device: str | None
    condition: str | None
    ideal: list[float]
    nadir: list[float]
    hypervolume: float  # of the reference front, in scaled objectives
    archs: int  # archs sampled (or enumerated)
    enumerated: bool  # True: the whole space; False: a seeded sample
    seed: int
    optimised: int = 0  # evaluations of the optimisation run on the surrogates
    merged: int = 0  # full-fidelity run evaluations added to the front (by :mod:`.front`)

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """values (n, m) scaled so the ideal is 0 and the nadir 1."""
        ideal, nadir = np.array(self.ideal), np.array(self.nadir)
        return (np.asarray(values, dtype=float) - ideal) / np.where(nadir > ideal,
                                                                    nadir - ideal, 1.0)

    @property
    def point(self) -> np.ndarray:
        """The hypervolume reference point in scaled objectives."""
        return np.ones(len(self.metrics))


def compute_reference(problem: Objectives, n_archs: int, seed: int,
                      evaluations: int | None = None) -> tuple[Reference, pl.DataFrame]:
    """Reference of problem from n_archs sampled archs (the whole space if not larger) and an
    NSGA-II run of ``evaluations`` evaluations (default: none for an enumerated space, else
    :data:`OPTIMISATION_PER_SAMPLE` per sampled arch). The table holds the sample's Pareto
    front and the optimisation's (``source``; one row per arch, the first source kept) and
    marks the reference front (``on_front``), the Pareto front of both."""
    space = problem.space
    enumerated = space.size() <= n_archs
    archs = list(space.all_archs()) if enumerated else space.sample(n_archs, seed)
    values = np.vstack([problem.values(archs[i:i + BATCH])
                        for i in tqdm(range(0, len(archs), BATCH), desc="reference",
                                      unit="batch")])
    rows = np.flatnonzero(pareto_mask(values))
    parts = [candidates(problem.metrics, [archs[i] for i in rows], values[rows], "sample")]
    low, high = values.min(axis=0), values.max(axis=0)
    if evaluations is None:
        evaluations = 0 if enumerated else OPTIMISATION_PER_SAMPLE * len(archs)
    optimised = 0
    if evaluations > 0:
        from .optimise import optimise

        found = optimise(problem, evaluations, seed)
        parts.append(candidates(problem.metrics, found.archs, found.values, "optimisation"))
        low, high = np.minimum(low, found.low), np.maximum(high, found.high)
        optimised = found.evaluations
    reference = Reference(list(problem.metrics), getattr(problem, "device", None),
                          getattr(problem, "condition", None), low.tolist(), high.tolist(),
                          0.0, len(archs), enumerated, seed, optimised)
    reference, table = with_front(reference, pl.concat(parts))
    log.info("reference of %s on %s: %d front archs (%d sampled %s, %d optimisation "
             "evaluations), hypervolume %.4f", "/".join(problem.metrics),
             reference.device, int(table["on_front"].sum()), len(archs),
             "(whole space)" if enumerated else "at random", optimised, reference.hypervolume)
    return reference, table


def candidates(metrics: Sequence[str], archs: Sequence[Arch], values: np.ndarray,
               source: str) -> pl.DataFrame:
    """Rows (arch_id, metrics..., source) of archs and their raw values."""
    values = np.asarray(values, dtype=float).reshape(len(archs), len(metrics))
    return pl.DataFrame({"arch_id": pl.Series([a.id for a in archs], dtype=pl.String),
                         **{m: values[:, j] for j, m in enumerate(metrics)},
                         "source": pl.Series([source] * len(archs), dtype=pl.String)})


def with_front(reference: Reference, table: pl.DataFrame) -> tuple[Reference, pl.DataFrame]:
    """The table's rows (one per arch id, the first kept) with ``on_front`` marking their
    Pareto front, and reference with that front's hypervolume in its box."""
    table = table.unique("arch_id", keep="first", maintain_order=True)
    values = table.select(reference.metrics).to_numpy().astype(float)
    front = pareto_mask(values)
    reference = replace(reference, hypervolume=hypervolume(reference.normalize(values[front]),
                                                           reference.point))
    return reference, table.with_columns(on_front=pl.Series(front, dtype=pl.Boolean)).sort(
        reference.metrics, maintain_order=True)


def scores(reference: Reference, values: np.ndarray, full: np.ndarray
           ) -> tuple[np.ndarray, np.ndarray]:
    """Running hypervolume and hypervolume regret of a run's evaluations (raw values (n, m);
    only rows where ``full`` count), in the reference's box."""
    scaled = np.where(np.asarray(full, dtype=bool)[:, None], reference.normalize(values), np.nan)
    trace = hypervolume_trace(scaled, reference.point)
    return trace, reference.hypervolume - trace


def save_reference(reference: Reference, front: pl.DataFrame,
                   folder: str | os.PathLike[str]) -> None:
    """Atomically write reference.json and front.parquet (the table of
    :func:`compute_reference`) into folder (new, empty or an earlier output of
    ``hwgptbench search-reference``)."""
    with replace_dir(folder, "search-reference") as staging:
        (staging / REFERENCE).write_text(canonical_json(asdict(reference)))
        front.write_parquet(staging / FRONT)


def load_reference(folder: str | os.PathLike[str]) -> Reference:
    """The Reference stored in folder."""
    path = Path(folder) / REFERENCE
    if not path.exists():
        raise FileNotFoundError(f"no search reference at {path}; build it with "
                                "`hwgptbench search-reference` (or `snakemake`)")
    return Reference(**json.loads(path.read_text()))


def load_front(folder: str | os.PathLike[str]) -> pl.DataFrame:
    """The table of :func:`compute_reference` stored in folder."""
    return pl.read_parquet(Path(folder) / FRONT)
