"""Surrogates of the shipped tables, fitted on first use and cached.

A query caches them under its results folder inside a project checkout, and in the user cache
folder elsewhere (:func:`cache_results`). The cache folder ``{results}/published/{scale}-{key}/``
has the surrogate stage's layout
(``perplexity/``, ``accuracy/``, ``devices/{label}/``), so :class:`~hwgptbench.api.Benchmark`
reads it like a workflow's surrogates. ``key`` hashes the shipped tables, the fit settings
below and the versions of the fitting code, so a new table or release fits afresh, and an
unchanged one is fitted once. The folder's ``cache.json``, written with it, binds it to its
scale, search space, vocabulary and key: every load checks it (and the space and vocabulary of
every surrogate in it), so a folder copied or linked under another scale's name is refused,
never queried. The settings are the surrogate stage's defaults with LightGBM alone (the MLP
ensemble takes about two minutes on 10,000 rows on 2 cores; LightGBM seconds), with five folds
to calibrate the intervals.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path
from typing import Any

from .. import __version__, layout
from ..errors import UserError
from ..io import CorruptFileError, canonical_json, read_json
from ..outputs import atomic_dir, user_cache
from ..predictors.store import FORMAT as SURROGATE_FORMAT
from ..predictors.store import METADATA, read_metadata
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
CACHE = "cache.json"  # what a cache folder is for (:func:`binding`)
CACHE_FORMAT = "hwgptbench-published-cache/1"
DELETE = "delete it (the next query fits the surrogates afresh)"
# the files whose presence in the working directory makes it a project checkout's root
CHECKOUT = ("params.yaml", "workflow/Snakefile")


class PublishedCacheError(UserError, ValueError):
    """A cache folder of the shipped tables' surrogates that is not the one of its scale and
    key: a link, a file, a folder written by something else or for another scale."""


def cache_key(scale: str, folder: str | os.PathLike[str] = FOLDER) -> str:
    """What the cached surrogates depend on: the tables, the settings, the fitting code, the
    format of a surrogate folder and of the cache itself (a cache of an older format is
    fitted afresh)."""
    text = json.dumps({"tables": digest(scale, folder), "fit": FIT.model_dump(mode="json"),
                       "hwgptbench": __version__, "surrogate_format": SURROGATE_FORMAT,
                       "cache_format": CACHE_FORMAT,
                       **library_versions("lightgbm", "numpy", "scikit-learn")}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir(scale: str, results: str | os.PathLike[str] = layout.RESULTS,
              folder: str | os.PathLike[str] = FOLDER) -> Path:
    """The folder of the scale's fitted surrogates (fitted or not)."""
    return Path(results) / "published" / f"{scale}-{cache_key(scale, folder)}"


def is_checkout(folder: str | os.PathLike[str]) -> bool:
    """Whether ``folder`` is the root of a project checkout (it holds :data:`CHECKOUT`)."""
    return all((Path(folder) / name).is_file() for name in CHECKOUT)


def cache_results(results: str | os.PathLike[str] = layout.RESULTS) -> Path:
    """The folder under whose ``published/`` a query of the results folder ``results`` caches
    the shipped tables' surrogates: ``results`` itself when it is a project's (any folder
    other than the default ``results`` of the working directory, which is one when it exists
    or when the working directory is a checkout's root, :func:`is_checkout`), else the user
    cache folder (:func:`~hwgptbench.outputs.user_cache`): a query from any other folder
    leaves no ``results/`` there."""
    path = Path(results)
    if path != Path(layout.RESULTS) or path.exists() or path.is_symlink() or is_checkout("."):
        return path
    return user_cache()


def binding(scale: str, folder: str | os.PathLike[str] = FOLDER) -> dict[str, Any]:
    """The ``cache.json`` of the scale's cache folder: its scale, search space, vocabulary
    and key."""
    return {"format": CACHE_FORMAT, "scale": scale, "space": space(scale, folder).to_dict(),
            "vocab_size": vocab_size(scale, folder), "key": cache_key(scale, folder)}


def _cached(out: Path, expected: dict[str, Any]) -> bool:
    """Whether ``out`` holds the cache that ``expected`` binds; False if there is none yet.
    :class:`PublishedCacheError` for a link, a file, or a folder of another binding."""
    if out.is_symlink():
        raise PublishedCacheError(f"{out} is a symbolic link, not a cache folder of the shipped "
                                  f"{expected['scale']} tables: {DELETE}")
    if not out.exists():
        return False
    if not out.is_dir():
        raise PublishedCacheError(f"{out} is not a folder, not a cache of the shipped "
                                  f"{expected['scale']} tables: {DELETE}")
    if not (out / CACHE).is_file():
        raise PublishedCacheError(f"{out} has no {CACHE}: it is not a cache that hwgptbench "
                                  f"wrote; {DELETE}, or move it away if it is yours")
    try:
        found = read_json(out / CACHE, DELETE)
    except CorruptFileError as err:
        raise PublishedCacheError(str(err)) from None
    differ = [key for key in expected if not isinstance(found, dict)
              or found.get(key) != expected[key]]
    if differ:
        raise PublishedCacheError(
            f"{out / CACHE} does not bind the folder to the shipped {expected['scale']} tables "
            f"(its {', '.join(differ)} differ: a cache of another scale or key, copied or "
            f"renamed): {DELETE}")
    for path in sorted(out.glob(f"**/{METADATA}")):
        metadata = read_metadata(path.parent)
        if (metadata["space"], metadata["feature_args"]["vocab_size"]) != (
                expected["space"], expected["vocab_size"]):
            raise PublishedCacheError(f"{path} is a surrogate of another search space or "
                                      f"vocabulary than those of the shipped "
                                      f"{expected['scale']} tables: delete {out} (the next "
                                      "query fits the surrogates afresh)")
    return True


def ensure_surrogates(scale: str, results: str | os.PathLike[str] = layout.RESULTS,
                      folder: str | os.PathLike[str] = FOLDER) -> Path:
    """The folder of the scale's surrogates, checked against its binding (:func:`_cached`), or
    fitted now if the cache has none (one progress bar of the fits; the folder appears whole,
    with its ``cache.json``, or not at all)."""
    out, expected = cache_dir(scale, results, folder), binding(scale, folder)
    if _cached(out, expected):
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
        (staging / CACHE).write_text(canonical_json(expected))
    log.info("fitted the %s surrogates in %.0f s", scale, time.monotonic() - started)
    return out
