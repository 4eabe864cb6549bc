"""Surrogates of the shipped tables, fitted on first use and cached under the results folder.

The cache folder ``{results}/published/{scale}-{key}/`` has the surrogate stage's layout
(``perplexity/``, ``accuracy/``, ``devices/{label}/``), so :class:`~hwgptbench.api.Benchmark`
reads it like a workflow's surrogates. ``key`` hashes the shipped tables, the fit settings
below and the versions of the fitting code, so a new table or release fits afresh, and an
unchanged one is fitted once. The settings are the surrogate stage's defaults with LightGBM
alone (the MLP ensemble takes about two minutes on 10,000 rows on 2 cores; LightGBM seconds),
with five folds to calibrate the intervals.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

from .. import __version__, layout
from ..io import atomic_dir
from ..predictors.store import FORMAT as SURROGATE_FORMAT
from ..settings.sections import SurrogateSettings
from ..versions import library_versions
from . import FOLDER, device_tables, digest, perplexity_table, space, vocab_size

log = logging.getLogger(__name__)

# The surrogate stage's params section of these fits (params.yaml's defaults, LightGBM only)
FIT = SurrogateSettings(
    metrics=("latency_ms", "energy_mj", "memory_peak_mb"), families=("lightgbm",),
    default_family="lightgbm",
    lightgbm={"num_iterations": 200, "num_leaves": 15, "learning_rate": 0.05,
              "min_data_in_leaf": 5},
    coverage=0.9, folds=5, min_rows=20, workers=1, seed=0)
# device-independent metrics of the perplexity table, each with its own surrogates
TABLE_METRICS = ("perplexity", "accuracy")


def cache_key(scale: str, folder: str | os.PathLike[str] = FOLDER) -> str:
    """What the cached surrogates depend on: the tables, the settings, the fitting code and the
    format of a surrogate folder (a cache of an older format is fitted afresh)."""
    text = json.dumps({"tables": digest(scale, folder), "fit": asdict(FIT),
                       "hwgptbench": __version__, "surrogate_format": SURROGATE_FORMAT,
                       **library_versions("lightgbm", "numpy", "scikit-learn")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir(scale: str, results: str | os.PathLike[str] = layout.RESULTS,
              folder: str | os.PathLike[str] = FOLDER) -> Path:
    """The folder of the scale's fitted surrogates (fitted or not)."""
    return Path(results) / "published" / f"{scale}-{cache_key(scale, folder)}"


def ensure_surrogates(scale: str, results: str | os.PathLike[str] = layout.RESULTS,
                      folder: str | os.PathLike[str] = FOLDER) -> Path:
    """The folder of the scale's surrogates, fitted now if the cache has none (one progress
    bar of the fits; the folder appears whole or not at all)."""
    out = cache_dir(scale, results, folder)
    if out.exists():
        return out
    from ..predictors.fitting import fit_device, fit_perplexity

    started = time.monotonic()
    log.info("first query of the shipped %s tables: fitting their surrogates into %s "
             "(once; later loads read them)", scale, out)
    space_, vocab = space(scale, folder), vocab_size(scale, folder)
    table = perplexity_table(scale, folder)
    with atomic_dir(out) as staging:
        for metric in TABLE_METRICS:
            fit_perplexity(FIT, space_, vocab, table, staging / metric, metric=metric)
        for label, measured in device_tables(scale, folder).items():
            fit_device(FIT, space_, vocab, measured, staging / "devices" / label)
    log.info("fitted the %s surrogates in %.0f s", scale, time.monotonic() - started)
    return out
