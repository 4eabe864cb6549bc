"""The normalisation, reference point and best known Pareto front of a search problem.

Defined once per (scale, objectives, device) from a large seeded sample of the space (all of it
when the space is no larger than the sample), and stored, so that every run and every figure
scores fronts the same way: objectives are scaled to [0, 1] between the best (ideal) and worst
(nadir) values in the sample, the reference point is the nadir (1, ..., 1 after scaling), and
hypervolume regret is the reference front's hypervolume minus a run's.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import polars as pl
from tqdm import tqdm

from ..io import atomic_dir, canonical_json
from .hypervolume import hypervolume, pareto_mask
from .problem import BATCH, Problem

log = logging.getLogger(__name__)

REFERENCE = "reference.json"
FRONT = "front.parquet"


@dataclass(frozen=True)
class Reference:
    """Scaling and reference front of one (objectives, device, condition)."""

    metrics: list[str]
    device: str | None
    condition: str | None
    ideal: list[float]
    nadir: list[float]
    hypervolume: float  # of the reference front, in scaled objectives
    archs: int  # archs the front was taken from
    enumerated: bool  # True: the whole space; False: a seeded sample
    seed: int

    def normalize(self, values: np.ndarray) -> np.ndarray:
        """values (n, m) scaled so the sample's ideal is 0 and its nadir 1."""
        ideal, nadir = np.array(self.ideal), np.array(self.nadir)
        return (np.asarray(values, dtype=float) - ideal) / np.where(nadir > ideal,
                                                                    nadir - ideal, 1.0)

    @property
    def point(self) -> np.ndarray:
        """The hypervolume reference point in scaled objectives."""
        return np.ones(len(self.metrics))


def compute_reference(problem: Problem, n_archs: int, seed: int
                      ) -> tuple[Reference, pl.DataFrame]:
    """Reference of problem from n_archs sampled archs (the whole space if not larger)."""
    space = problem.space
    enumerated = space.size() <= n_archs
    archs = list(space.all_archs()) if enumerated else space.sample(n_archs, seed)
    values = np.vstack([problem.values(archs[i:i + BATCH])
                        for i in tqdm(range(0, len(archs), BATCH), desc="reference",
                                      unit="batch")])
    reference = Reference(list(problem.metrics), problem.device, problem.condition,
                          values.min(axis=0).tolist(), values.max(axis=0).tolist(), 0.0,
                          len(archs), enumerated, seed)
    front_rows = np.flatnonzero(pareto_mask(values))
    scaled = reference.normalize(values[front_rows])
    reference = Reference(**{**asdict(reference),
                             "hypervolume": hypervolume(scaled, reference.point)})
    front = pl.DataFrame({"arch_id": [archs[i].id for i in front_rows],
                          **{m: values[front_rows, j] for j, m in enumerate(problem.metrics)}}
                         ).sort(problem.metrics)
    log.info("reference of %s on %s: %d front archs of %d %s, hypervolume %.4f",
             "/".join(problem.metrics), problem.device, front.height, len(archs),
             "(whole space)" if enumerated else "sampled", reference.hypervolume)
    return reference, front


def save_reference(reference: Reference, front: pl.DataFrame,
                   folder: str | os.PathLike[str]) -> None:
    """Atomically write reference.json and front.parquet into folder."""
    with atomic_dir(folder) as staging:
        (staging / REFERENCE).write_text(canonical_json(asdict(reference)))
        front.write_parquet(staging / FRONT)


def load_reference(folder: str | os.PathLike[str]) -> Reference:
    """The Reference stored in folder."""
    path = Path(folder) / REFERENCE
    if not path.exists():
        raise FileNotFoundError(f"no search reference at {path}; build it with "
                                "`hwgptbench search-reference` (or `snakemake`)")
    return Reference(**json.loads(path.read_text()))
