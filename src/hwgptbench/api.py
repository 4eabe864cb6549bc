"""The query API: predicted and measured metrics of architectures, per device and condition.

    from hwgptbench import Benchmark
    bench = Benchmark.load("tiny")
    archs = bench.sample(1000, seed=0)
    table = bench.query(archs, ["perplexity", "latency_ms"], device=bench.devices[0],
                        condition="b1-t128-fp32-eager")
    bench.query(archs, "latency_ms", device=bench.devices[0],
                condition={"workload": "decode", "dtype": "bf16"})

A condition is an id or a dict of condition fields (:class:`~hwgptbench.measure.Condition`):
fields left out match any shape (batch, length, dtype, launch, gen_len) and the default of each
runtime option (attention, quant, compile, recompute); it must match exactly one condition.
Left out, the device is the only one there is and the condition the one the measure params of
the run define first (``results/.params/measure.json``: first batch size, sequence length,
dtype and launch mode, e.g. ``b1-t128-fp32-eager``); where neither decides, the error lists the
likeliest conditions first.

One surrogate call per metric for the whole batch of archs; ``mode="measured"`` returns the
measured values where an arch was measured and null elsewhere, ``mode="auto"`` the measured
value where there is one and the surrogate's elsewhere. ``params`` and ``flops`` are computed
exactly for any arch (:data:`COMPUTED`), never predicted.

A scale whose tables ship with the package (``hwgptbench.published``: HW-GPT-Bench's ``s``,
``m``, ``l`` perplexities, measured device tables) answers for the union of its shipped devices,
the devices measured here (``results/{scale}/surrogates/devices/``) and those adapted with
``hwgptbench adapt``; a device measured here and shipped too is answered from here, and
perplexity from here where the run has it. The shipped tables' surrogates are fitted on first
use and cached under ``results/published/`` (outside a project checkout: in the user cache
folder, ``$HWGPTBENCH_CACHE`` or ``~/.cache/hwgptbench/published/`` on Linux).
``fidelity=N`` asks for perplexity as if the supernet had been trained for N steps
(``bench.fidelities``), the cheap low fidelities of multi-fidelity search.
"""

from __future__ import annotations

import json
import logging
import os
import reprlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

from . import layout, published
from .errors import UserError
from .io import read_json, read_parquet
from .meters.condition import (
    CONDITION_KEYS,
    DEFAULTS,
    SHAPE_KEYS,
    Condition,
    with_condition_columns,
)
from .metrics import answer_bounds
from .predictors.base import Surrogate
from .predictors.features import analytic_counts, features_of_encoded
from .predictors.store import METADATA, SurrogateFileError, load_surrogate, read_metadata
from .schema import ANY
from .space import Arch, InvalidArchError, SearchSpace

log = logging.getLogger(__name__)

PERPLEXITY = "perplexity"
# metrics of the arch alone, from the perplexity table: no device, no condition
DEVICE_FREE = (PERPLEXITY, "accuracy")
# metrics computed exactly from the arch: parameters, and FLOPs of one forward
COMPUTED = ("params", "flops")
MODES = ("surrogate", "measured", "auto")
# where Benchmark.load reads: the run's results, the shipped tables, or the first that exists
SOURCES = ("auto", "results", "published")
# the family of the surrogates of devices adapted from a few measured archs (`hwgptbench adapt`,
# stored with those archs' measurements under layout.adapted(scale)/{device}/)
ADAPTED = "adapted"
ADAPTED_SUMMARY = "adapted.json"  # beside an adapted device's surrogates: its default condition
BEST = "best"  # the family that scored best out of fold, per (metric, device, condition)
TARGET_KEYS = ["metric", "device", "condition"]
TABLE_FIX = "delete it and rerun the workflow (`make run`), or pull it again (`make pull`)"
# the measurements an adapted device's folder holds (transfer.adapt.MEASURED), and what to do
# about a folder that is refused
ADAPTED_MEASUREMENTS = "measurements.parquet"
ADAPTED_FIX = "delete the device's folder and adapt it again (`hwgptbench adapt`)"


class QueryError(UserError, ValueError):
    """A query names a device, metric, condition, family or mode the benchmark does not have,
    or passes an argument of the wrong type."""


class NoSurrogatesError(QueryError, FileNotFoundError):
    """A scale has no surrogates to load: neither a run's nor shipped tables."""


class ImplausibleAnswer(QueryError):
    """A query's answer that no device or model can have: not finite, outside the range of
    its metric (:func:`~hwgptbench.metrics.answer_bounds`), or outside its own interval; named
    with the surrogate folder or table it came from, never returned."""


class AdaptedTableError(QueryError):
    """An adapted device's measurement table that holds rows of another device."""


SHOWN_CONDITIONS = 5


def _shown(value: Any) -> str:
    """A short repr of an argument for a message."""
    return reprlib.repr(value)


def scale_name(scale: Any, argument: str = "scale") -> str:
    """``scale`` if it is a scale's name (letters, digits and _, as params.yaml names spaces)."""
    if not isinstance(scale, str) or not layout.SCALE_NAME.fullmatch(scale):
        raise QueryError(f"{argument}: {_shown(scale)} is not a scale name (letters, digits and "
                         "_: a space of params.yaml, e.g. tiny; shipped: "
                         f"{', '.join(published.scales()) or 'none'})")
    return scale


def results_folder(results_dir: Any, argument: str = "results_dir") -> Path:
    """``results_dir`` as a path: a folder, or one to create inside an existing folder (the
    shipped tables' surrogates are cached in it); a file or a missing parent is refused."""
    if not isinstance(results_dir, (str, os.PathLike)):
        raise QueryError(f"{argument}: {_shown(results_dir)} is not a path; pass the results "
                         "folder (default: results)")
    folder = Path(results_dir)
    if folder.exists() and not folder.is_dir():
        raise QueryError(f"{argument}: {folder} is a file, not a results folder")
    if not folder.exists() and not folder.parent.is_dir():
        raise QueryError(f"{argument}: neither {folder} nor the folder it would be created in "
                         f"({folder.parent}) exists; pass a results folder, or one to create "
                         "inside an existing folder")
    return folder


def _text(value: Any, argument: str, accepted: str) -> str:
    """``value`` if it is a str."""
    if not isinstance(value, str):
        raise QueryError(f"{argument}: {_shown(value)} is not a str; {accepted}")
    return value


def _names(value: Any, argument: str, accepted: str) -> list[str]:
    """A str, or an iterable of str (not a mapping), as a list."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (Mapping, bytes)):
        names = list(value)
        if all(isinstance(name, str) for name in names):
            return names
    raise QueryError(f"{argument}: {_shown(value)} is not a name or a list of names; {accepted}")


def bool_argument(value: Any, argument: str) -> bool:
    """``value`` if it is a bool."""
    if not isinstance(value, bool):
        raise QueryError(f"{argument}: {_shown(value)} is not True or False")
    return value


def _count(value: Any, argument: str) -> int:
    """``value`` if it is an int >= 0 (not a bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise QueryError(f"{argument}: {_shown(value)} is not an integer >= 0")
    return int(value)


def measured_default(params_file: Path) -> str | None:
    """The default condition of the measure params in ``params_file``: the first batch size,
    sequence length, dtype and launch mode (None without the file)."""
    if not params_file.exists():
        return None
    from .params import load_section  # the params models: only with the file
    from .settings.sections import MeasureSettings

    measure = load_section(MeasureSettings, [params_file])
    return Condition(measure.batch_sizes[0], measure.seq_lens[0], measure.dtypes[0],
                     measure.launch[0]).id


def closest_conditions(conditions: Sequence[str], default: str | None) -> list[str]:
    """The few conditions most like ``default`` (most id parts in common), most alike first."""
    parts = set(default.split("-")) if default else set()
    ranked = sorted(conditions, key=lambda c: (-len(parts & set(c.split("-"))), len(c), c))
    return ranked[:SHOWN_CONDITIONS]


def _selected(folder: Path) -> pl.DataFrame:
    """(metric, device, condition, family) of the families selected by the quality tables
    beside the surrogates (perplexity/, accuracy/ and each devices/{device}/)."""
    paths = [*(folder / metric / "quality.parquet" for metric in DEVICE_FREE),
             *sorted(folder.glob("devices/*/quality.parquet"))]
    tables = [read_parquet(p, TABLE_FIX) for p in paths if p.exists()]
    if not tables or any("selected" not in t.columns for t in tables):
        raise QueryError(f"the quality tables under {folder} do not select a family (fitted "
                         "before selection existed): refit the surrogates (`make run`), or "
                         "name a family (family='lightgbm', --family lightgbm)")
    return pl.concat([t.filter(pl.col("selected")).select(*TARGET_KEYS, "family")
                      for t in tables])


def _unfitted(folder: Path) -> dict[tuple[str, str, str], str]:
    """Why targets of the device quality tables under ``folder`` have no surrogate: (metric,
    device, condition) of rows no family was fitted for, with their reason."""
    tables = [read_parquet(p, TABLE_FIX) for p in sorted(folder.glob("devices/*/quality.parquet"))]
    out: dict[tuple[str, str, str], str] = {}
    for table in tables:
        if not {"status", "reason", *TARGET_KEYS} <= set(table.columns):
            continue
        fitted = table.filter(pl.col("status") == "ok").select(TARGET_KEYS)
        skipped = table.filter(pl.col("status") == "skipped").join(fitted, on=TARGET_KEYS,
                                                                    how="anti")
        for row in skipped.unique(TARGET_KEYS, keep="first").iter_rows(named=True):
            out[(row["metric"], row["device"], row["condition"])] = row["reason"] or "skipped"
    return out


def _choose(kind: str, value: Any, available: Sequence[str]) -> str:
    if value not in available:
        raise QueryError(f"unknown {kind} {value!r}; available: {', '.join(available) or 'none'}")
    return value


def _surrogate_rows(folder: Path, adapted: bool = False) -> list[dict[str, Any]]:
    """One index row per surrogate under ``folder``: its target, family, train_steps, folder,
    space and feature args. Each surrogate must sit where its metadata's target sits
    (``store.check_placement``; ``adapted``: the layout of the adapted devices' folder)."""
    rows = []
    for path in sorted(folder.glob(f"**/{METADATA}")):
        meta = read_metadata(path.parent, folder, adapted)
        rows.append({"metric": meta["metric"], "device": meta["device"],
                     "condition": meta["condition"], "family": meta["family"],
                     "train_steps": meta.get("train_steps"), "folder": str(path.parent),
                     "space_name": meta["space_name"],
                     "space": json.dumps(meta["space"], sort_keys=True),
                     **meta["feature_args"]})
    return rows


def adapted_defaults(folder: Path) -> dict[str, str]:
    """The default condition of each device adapted under ``folder`` (``adapted.json`` of
    `hwgptbench adapt`; a device without one has none); a value that is no condition id is
    refused."""
    defaults = {}
    for path in sorted(folder.glob(f"*/{ADAPTED_SUMMARY}")):
        summary = read_json(path, "adapt the device again (`hwgptbench adapt`)")
        condition = summary.get("default_condition") if isinstance(summary, dict) else None
        if not isinstance(condition, str) or not _is_condition_id(condition):
            raise QueryError(f"{path}: default_condition {_shown(condition)} is not a condition "
                             "id: adapt the device again (`hwgptbench adapt`)")
        defaults[path.parent.name] = condition
    return defaults


def adapted_measurements(folder: Path) -> list[pl.DataFrame]:
    """The measurements of each device adapted under ``folder``: the one table `hwgptbench
    adapt` writes beside its surrogates (``{device}/measurements.parquet``, transfer.adapt's
    MEASURED), never any other file; a table holding rows of another device than its folder's
    is refused (:class:`AdaptedTableError`)."""
    tables = []
    for path in sorted(folder.glob(f"*/{ADAPTED_MEASUREMENTS}")):
        table = read_parquet(path, ADAPTED_FIX)
        device = path.parent.name
        if "device" not in table.columns:
            raise AdaptedTableError(f"{path} has no device column: {ADAPTED_FIX}")
        others = table.filter(pl.col("device").is_null() | (pl.col("device") != device))
        if others.height:
            raise AdaptedTableError(
                f"{path}: {others.height} of its {table.height} rows are of device "
                f"{_shown(others['device'][0])}, not {device!r}, the device of its folder (a "
                f"table copied from another device's folder): {ADAPTED_FIX}")
        tables.append(table)
    return tables


def _is_condition_id(text: str) -> bool:
    """Whether ``text`` is a condition's id, as :attr:`Condition.id` writes it."""
    try:
        return Condition.from_id(text).id == text
    except ValueError:
        return False


def _spaces(rows: list[dict[str, Any]]) -> set[tuple[str, str]]:
    """The search spaces (name, definition) that index rows were fitted on."""
    return {(row["space_name"], row["space"]) for row in rows}


def _chosen(index: pl.DataFrame, folder: Path, family: str) -> pl.DataFrame:
    """The rows of one surrogates folder's index that queries use under ``family``: those its
    quality tables selected (``best``), or those of the family."""
    if family == BEST:
        return index.join(_selected(folder), on=[*TARGET_KEYS, "family"], how="semi")
    return index.filter(pl.col("family") == family)


@dataclass(frozen=True)
class RunTables:
    """What a run's results folder holds of one scale: the index rows of its surrogates and
    of its adapted devices, and the tables that queries in measured mode read."""

    surrogates: Path
    rows: list[dict[str, Any]]
    adapted: list[dict[str, Any]]
    measurements: pl.DataFrame | None
    perplexities: pl.DataFrame | None
    default_condition: str | None  # the measure params' first condition
    adapted_defaults: dict[str, str] = field(default_factory=dict)  # of each adapted device

    @classmethod
    def read(cls, scale: str, top: str) -> RunTables:
        """The run's tables of ``scale`` under the results folder ``top`` (none: empty)."""
        surrogates = Path(layout.surrogates(scale, top))
        adapted = Path(layout.adapted(scale, top))
        measured = [read_parquet(p, TABLE_FIX) for p in [
            Path(layout.measurements(scale, top)),
            *sorted(Path(layout.runtime_tables(scale, top)).glob("*.parquet"))] if p.exists()]
        measured += adapted_measurements(adapted)
        perplexity = Path(layout.perplexity(scale, top))
        return cls(surrogates, _surrogate_rows(surrogates), _surrogate_rows(adapted, True),
                   pl.concat(measured, how="diagonal_relaxed") if measured else None,
                   read_parquet(perplexity, TABLE_FIX) if perplexity.exists() else None,
                   measured_default(Path(layout.params_sections(top)) / "measure.json"),
                   adapted_defaults(adapted))

    def without_adapted(self, shipped: set[str]) -> RunTables:
        """These tables less the devices adapted here under a shipped device's label (``adapt``
        refuses such a label: a few measured archs never answer in place of a shipped table),
        with a warning naming each."""
        clash = {row["device"] for row in self.adapted} & shipped
        clash -= {row["device"] for row in self.rows}
        if not clash:
            return self
        for device in sorted(clash):
            log.warning("%s: adapted here under the label of a shipped table; not used, the "
                        "shipped table answers for it (adapt again with --device %s-local)",
                        device, device)
        measurements = self.measurements
        if measurements is not None and "device" in measurements.columns:
            measurements = measurements.filter(~pl.col("device").is_in(sorted(clash)))
        return replace(self, adapted=[row for row in self.adapted if row["device"] not in clash],
                       measurements=measurements,
                       adapted_defaults={device: condition for device, condition
                                         in self.adapted_defaults.items()
                                         if device not in clash})

    def default_conditions(self) -> dict[str, str]:
        """The condition a query of each device here takes when it names none: the measure
        params' first, or for a device only adapted here the one `hwgptbench adapt` chose."""
        own = {row["device"] for row in self.rows if row["metric"] not in DEVICE_FREE}
        defaults = (dict.fromkeys(self.fitted_devices(), self.default_condition)
                    if self.default_condition else {})
        return defaults | {device: condition for device, condition
                           in self.adapted_defaults.items() if device not in own}

    def fitted_devices(self) -> set[str]:
        """The devices with hardware surrogates here (fitted or adapted)."""
        return {row["device"] for row in [*self.rows, *self.adapted]
                if row["metric"] not in DEVICE_FREE}

    def measured_devices(self) -> set[str]:
        """The devices of the measured rows here."""
        if self.measurements is None or "device" not in self.measurements.columns:
            return set()
        return set(self.measurements["device"].drop_nulls())


@dataclass
class Benchmark:
    """Surrogates and measurements of one scale, loaded from a results folder."""

    scale: str
    space: SearchSpace
    index: pl.DataFrame  # metric, device, condition, family, train_steps, folder, feature args
    family: str
    measurements: pl.DataFrame | None
    perplexities: pl.DataFrame | None
    # taken when a query names none: the measure params' first condition, or per device (the
    # shipped tables' manifest)
    default_condition: str | Mapping[str, str] | None = None
    # why a (metric, device, condition) of the quality tables has no surrogate
    unfitted: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    _models: dict[str, Surrogate] = field(default_factory=dict, repr=False)
    _entries: dict[tuple[str, str | None, str | None, int | None], dict[str, Any]] = field(
        default_factory=dict, repr=False)

    @classmethod
    def load(cls, scale: str = "tiny", results_dir: str | os.PathLike[str] = "results",
             family: str = BEST, source: str = "auto") -> Benchmark:
        """The benchmark of ``scale`` from ``results_dir`` (surrogates, measurements, perplexity).

        ``family`` ``best`` queries each (metric, device, condition) with the family its quality
        table selected (``selected``: most out-of-fold predictions within ±5%, then lowest
        MdAPE; the blend of the families is a candidate); a family name (``lightgbm``,
        ``mlp_ensemble``, ``blend``) queries that family everywhere (:attr:`selection` shows
        which).

        Devices adapted with `hwgptbench adapt` (``{scale}/adapted/``) are queried through their
        adapted surrogate wherever ``family`` has no surrogate of their (metric, condition); a
        query of one that names no condition takes the one `adapt` chose (``adapted.json``).

        ``source`` ``results`` reads the run's results only, ``published`` the tables shipped
        with the package (:meth:`from_published`), ``auto`` both where the scale's tables ship:
        the union of the shipped devices and those measured or adapted here (a label in both
        is answered from here, and logged), perplexity from here where the run has its
        surrogates; for another scale ``auto`` reads the results. A results folder whose
        surrogates were fitted on another space than the shipped tables' is read alone (with a
        warning).
        """
        scale = scale_name(scale)
        top = str(results_folder(results_dir))
        _choose("source", source, SOURCES)
        if source == "published":
            return cls.from_published(scale, top, family)
        run = RunTables.read(scale, top)
        if source == "auto" and scale in published.scales():
            return cls._union(scale, top, family, run)
        return cls._of_run(scale, family, run)

    @classmethod
    def from_published(cls, scale: str, results_dir: str | os.PathLike[str] = "results",
                       family: str = BEST) -> Benchmark:
        """The benchmark of the tables shipped with the package (``hwgptbench.published``):
        their surrogates are fitted on the first call and cached under
        ``{results_dir}/published/`` (seconds to a minute), read by later calls; outside a
        project checkout, for the default ``results``, in the user cache folder instead
        (:func:`~hwgptbench.published.surrogates.cache_results`)."""
        from .published.surrogates import cache_results, ensure_surrogates

        scale = scale_name(scale)
        folder = ensure_surrogates(scale, cache_results(results_folder(results_dir)))
        tables = list(published.device_tables(scale).values())
        return cls._assemble(scale, [(folder, _surrogate_rows(folder))], [], family,
                             pl.concat(tables, how="diagonal_relaxed") if tables else None,
                             published.perplexity_table(scale),
                             published.default_conditions(scale))

    @classmethod
    def _of_run(cls, scale: str, family: str, run: RunTables) -> Benchmark:
        """The benchmark of a run's results alone (its surrogates and adapted devices)."""
        return cls._assemble(scale, [(run.surrogates, run.rows)], run.adapted, family,
                             run.measurements, run.perplexities,
                             run.default_conditions() or run.default_condition)

    @classmethod
    def _union(cls, scale: str, top: str, family: str, run: RunTables) -> Benchmark:
        """The shipped tables of ``scale`` and the run's results, devices joined: a device
        (or perplexity) the run has is answered from the run, every other from the shipped
        tables."""
        from .published.surrogates import cache_results, ensure_surrogates

        shipped = ensure_surrogates(scale, cache_results(top))
        shipped_rows = _surrogate_rows(shipped)
        own = [*run.rows, *run.adapted]
        if own and _spaces(own) != _spaces(shipped_rows):
            log.warning("the surrogates under %s are of another %s search space than the "
                        "shipped tables: answering from them alone (source='published', "
                        "--source published, queries the shipped tables)", run.surrogates,
                        scale)
            return cls._of_run(scale, family, run)
        tables = published.device_tables(scale)
        run = run.without_adapted(set(tables))
        fitted = run.fitted_devices()
        here = fitted | run.measured_devices()
        for device in sorted(set(tables) & here):
            log.warning("%s: measured here by the measure stage and shipped with the package; "
                        "its table here answers for it (source='published', --source "
                        "published: the shipped one)", device)
        device_free = any(row["metric"] in DEVICE_FREE for row in run.rows)
        kept = [row for row in shipped_rows
                if row["device"] not in fitted
                and not (device_free and row["metric"] in DEVICE_FREE)]
        measured = [table for label, table in tables.items() if label not in here]
        if run.measurements is not None:
            measured.insert(0, run.measurements)
        defaults = {label: condition for label, condition
                    in published.default_conditions(scale).items() if label not in fitted}
        defaults |= run.default_conditions()
        return cls._assemble(
            scale, [(run.surrogates, run.rows), (shipped, kept)], run.adapted, family,
            pl.concat(measured, how="diagonal_relaxed") if measured else None,
            run.perplexities if device_free else published.perplexity_table(scale), defaults)

    @classmethod
    def _assemble(cls, scale: str, parts: Sequence[tuple[Path, list[dict[str, Any]]]],
                  adapted: list[dict[str, Any]], family: str,
                  measurements: pl.DataFrame | None, perplexities: pl.DataFrame | None,
                  default_condition: str | Mapping[str, str] | None) -> Benchmark:
        """The benchmark of the surrogates of ``parts`` (each a surrogates folder and the index
        rows of its surrogates that it answers for) and of ``adapted`` devices, with the
        tables their queries in measured mode read."""
        where = parts[0][0]
        rows = [{**row, "part": number} for number, (_, part) in enumerate(parts)
                for row in part] + [{**row, "part": len(parts)} for row in adapted]
        if not rows:
            raise NoSurrogatesError(
                f"no surrogates under {where}; build them with `make run` "
                "(or `snakemake`), or fetch them with `make pull`; the tables shipped with the "
                f"package cover the scales {', '.join(published.scales()) or 'none'}")
        index = pl.DataFrame(rows, infer_schema_length=None)  # feature args differ by target
        spaces = index.group_by("space_name", "space", maintain_order=True).agg(
            pl.col("folder").first())
        if spaces.height != 1:
            found = "; ".join(f"{name} {space} (e.g. {folder})"
                              for name, space, folder in spaces.iter_rows())
            raise QueryError(f"surrogates under {where} were fitted on different search "
                             f"spaces: {found}. Refit them all on the current space (`make run`), "
                             "or restore the space they were fitted on")
        fitted = sorted(set(index["family"]) - {ADAPTED})
        if fitted:  # adapted surrogates fill in under any family
            _choose("surrogate family", family, [BEST, *fitted])
        space = SearchSpace.from_dict(spaces["space_name"][0], json.loads(spaces["space"][0]))
        chosen = pl.concat([index.clear(), *(
            _chosen(index.filter(pl.col("part") == number), folder, family)
            for number, (folder, part) in enumerate(parts) if part and fitted)])
        filled = index.filter(pl.col("family") == ADAPTED).join(
            chosen, on=["metric", "device", "condition"], how="anti")
        return cls(scale, space, pl.concat([chosen, filled]).drop("space", "part"), family,
                   with_condition_columns(measurements) if measurements is not None else None,
                   perplexities, default_condition,
                   {key: why for folder, _ in parts for key, why in _unfitted(folder).items()})

    @property
    def selection(self) -> pl.DataFrame:
        """The family queried per (metric, device, condition), with its train_steps."""
        return self.index.select(*TARGET_KEYS, "train_steps", "family").sort(TARGET_KEYS)

    def used(self) -> pl.DataFrame:
        """The surrogates that queries so far went to: metric, device, condition, family."""
        rows = [{k: entry[k] for k in [*TARGET_KEYS, "family"]}
                for entry in self._entries.values()]
        return pl.DataFrame(rows, schema=dict.fromkeys([*TARGET_KEYS, "family"], pl.String))

    @property
    def devices(self) -> list[str]:
        """Device labels with surrogates."""
        return sorted(set(self.index["device"]) - {ANY})

    def devices_of(self, metric: str) -> list[str]:
        """Device labels with a surrogate of ``metric``."""
        _text(metric, "metric", "name a metric, e.g. latency_ms")
        return sorted(set(self.index.filter(pl.col("metric") == metric)["device"]) - {ANY})

    @property
    def metrics(self) -> list[str]:
        """Metric names with surrogates."""
        return sorted(set(self.index["metric"]))

    @property
    def fidelities(self) -> list[int]:
        """Training steps with a perplexity surrogate, ascending; the last is the fully
        trained supernet, the others its snapshots (the fidelities of multi-fidelity search)."""
        return sorted(self.index["train_steps"].drop_nulls().unique())

    def conditions(self, device: str, metric: str = "latency_ms") -> list[str]:
        """Condition ids (``b{batch}-t{seq}-{dtype}-{launch}`` and runtime options) of a
        device and metric."""
        _text(device, "device", f"name a device: {', '.join(self.devices)}")
        _text(metric, "metric", "name a metric, e.g. latency_ms")
        rows = self.index.filter((pl.col("device") == device) & (pl.col("metric") == metric))
        return sorted(rows["condition"])

    def sample(self, n: int, seed: int = 0) -> list[Arch]:
        """n distinct archs drawn uniformly from the space."""
        n, seed = _count(n, "n"), _count(seed, "seed")
        if n > self.space.size():
            raise QueryError(f"n: {n} is more archs than the {self.space.name} space has "
                             f"({self.space.size()})")
        return self.space.sample(n, seed)

    def _archs(self, archs: Any) -> list[Arch]:
        """The archs of a query: one Arch or arch id, or an iterable of them."""
        if isinstance(archs, (str, Arch)):
            archs = [archs]
        elif not isinstance(archs, Iterable) or isinstance(archs, (Mapping, bytes)):
            raise QueryError(f"archs: {_shown(archs)} is not a list of archs; pass Arch objects "
                             "or arch ids (e.g. bench.sample(10)), or one of them")
        parsed = []
        for position, arch in enumerate(archs):
            if isinstance(arch, Arch):
                parsed.append(arch)
                continue
            if not isinstance(arch, str):
                raise QueryError(f"archs[{position}]: {_shown(arch)} is not an Arch or an arch "
                                 f"id (e.g. {self.space.smallest().id})")
            try:
                parsed.append(Arch.from_id(arch))
            except InvalidArchError as err:
                raise QueryError(f"archs[{position}]: {err}") from None
        return parsed

    def _check_space(self, archs: Sequence[Arch]) -> None:
        """QueryError naming the first arch that is not one of the space's."""
        for position, arch in enumerate(archs):
            try:
                self.space.validate(arch)
            except InvalidArchError as err:
                raise QueryError(f"archs[{position}]: {arch.id} is not an arch of this "
                                 f"benchmark: {err}") from None

    def _encode(self, distinct: list[Arch], archs: list[Arch]) -> np.ndarray:
        """The features of the distinct archs (the query's ``archs``, of which an arch out of
        the space is named by its position)."""
        try:
            return self.space.encode(distinct)
        except InvalidArchError:
            self._check_space(archs)
            raise

    def _entry(self, metric: str, device: str | None, condition: str | Mapping[str, Any] | None,
               fidelity: int | None) -> dict[str, Any]:
        if isinstance(condition, Mapping):
            named = (self._condition_matching(condition, device, metric)
                     if metric not in DEVICE_FREE else None)
        else:
            named = condition
        key = (metric, device, named, fidelity if metric in DEVICE_FREE else None)
        if key not in self._entries:
            self._entries[key] = self._find_entry(*key)
        return self._entries[key]

    def _checked_device(self, metric: str, device: str | None) -> str:
        """The device of a hardware metric, which must be one of the benchmark's (the only
        one when none is given)."""
        if device is None and len(self.devices) == 1:
            return self.devices[0]
        if device is None:
            raise QueryError(f"metric {metric!r} needs a device; available: "
                             f"{', '.join(self.devices)}")
        _choose("device", device, self.devices)
        return device

    def _find_entry(self, metric: str, device: str | None, condition: str | None,
                    fidelity: int | None) -> dict[str, Any]:
        unfitted = sorted((key, why) for key, why in self.unfitted.items() if key[0] == metric
                          and device in (None, key[1]) and condition in (None, key[2]))
        if metric not in self.metrics and unfitted:
            (_, where, under), why = unfitted[0]
            raise QueryError(f"no surrogate of {metric!r} (e.g. on {where!r} under {under!r}: "
                             f"{why})")
        _choose("metric", metric, [*self.metrics, *COMPUTED])
        if metric in DEVICE_FREE:
            rows = self.index.filter(pl.col("metric") == metric)
            return rows.filter(pl.col("condition") == ANY if fidelity is None
                               else pl.col("train_steps") == fidelity).row(0, named=True)
        device = self._checked_device(metric, device)
        conditions = self.conditions(device, metric)
        default = (self.default_condition.get(device)
                   if isinstance(self.default_condition, Mapping) else self.default_condition)
        if condition is None and (metric, device, default) in self.unfitted:
            condition = default  # its query says why it has no surrogate
        if condition is None and len(conditions) == 1:
            condition = conditions[0]
        elif condition is None and default in conditions:
            condition = default
        elif condition is None:
            likely = closest_conditions(conditions, default)
            more = f" (+{len(conditions) - len(likely)} more: Benchmark.conditions)" if len(
                conditions) > len(likely) else ""
            raise QueryError(f"device {device!r} has several conditions for {metric!r}; "
                             f"choose one, e.g. {', '.join(likely)}{more}")
        reason = self.unfitted.get((metric, device, condition))
        if reason and condition not in conditions:
            raise QueryError(f"no surrogate of {metric!r} on {device!r} under {condition!r}: "
                             f"{reason}")
        _choose(f"condition of {metric!r} on {device!r}", condition, conditions)
        return self.index.filter((pl.col("metric") == metric) & (pl.col("device") == device)
                                 & (pl.col("condition") == condition)).row(0, named=True)

    def _condition_matching(self, fields: Mapping[str, Any], device: str | None,
                            metric: str) -> str:
        """The one condition id of device and metric that has the given fields (options left
        out take their defaults; shapes left out match any)."""
        unknown = set(fields) - set(CONDITION_KEYS)
        if unknown:
            raise QueryError(f"unknown condition fields {sorted(unknown)}; "
                             f"available: {', '.join(CONDITION_KEYS)}")
        device = self._checked_device(metric, device)
        wanted = {k: v for k, v in DEFAULTS.items() if k not in SHAPE_KEYS and k != "gen_len"}
        wanted |= fields
        ids = self.conditions(device, metric)
        found = [i for i in ids
                 if all(Condition.from_id(i).as_dict()[k] == v for k, v in wanted.items())]
        if len(found) != 1:
            raise QueryError(f"condition {dict(fields)} matches {len(found)} conditions of "
                             f"{metric!r} on {device!r}: {', '.join(found or ids)}; name more "
                             "fields or pass one of these ids")
        return found[0]

    def _model(self, entry: Mapping[str, Any]) -> Surrogate:
        """The surrogate of an index entry, whose metadata must still name the entry's target
        (the index was read from it when the benchmark was loaded)."""
        folder = entry["folder"]
        if folder not in self._models:
            model, metadata = load_surrogate(folder, self.space)
            keys = [*TARGET_KEYS, "family"]
            if [metadata[k] for k in keys] != [entry[k] for k in keys]:
                raise SurrogateFileError(
                    f"{folder}: its {METADATA} names {_target_words(metadata)}, but it was "
                    f"indexed as {_target_words(entry)} when the benchmark was loaded (changed "
                    "since): load the benchmark again, or delete the folder and refit it")
            self._models[folder] = model
        return self._models[folder]

    @property
    def vocab_size(self) -> int:
        """Vocabulary size of the networks (their parameter counts and FLOPs)."""
        rows = self.index.sort(pl.col("metric").is_in(DEVICE_FREE), descending=True)
        return int(rows["vocab_size"][0])

    def _computed(self, metric: str, encoded: np.ndarray,
                  condition: str | Mapping[str, Any] | None) -> np.ndarray:
        """Exact parameter counts or forward FLOPs of encoded archs (shape from condition)."""
        fields = (Condition.from_id(condition).as_dict() if isinstance(condition, str)
                  else dict(condition or {}))
        n_params, flops = analytic_counts(
            self.space, np.asarray(encoded, dtype=np.float32), self.vocab_size,
            fields.get("batch_size", 1), fields.get("seq_len", self.space.block_size))
        return n_params if metric == "params" else flops

    def _measured(self, metric: str, entry: dict[str, Any], ids: list[str]) -> pl.Series:
        source = self.perplexities if metric in DEVICE_FREE else self.measurements
        if source is None or metric not in source.columns:
            return pl.Series(metric, [None] * len(ids), dtype=pl.Float64)
        if metric in DEVICE_FREE:
            source = source.filter(pl.col("train_steps") == entry["train_steps"])
        else:
            matches = Condition.from_id(entry["condition"]).as_dict()
            source = source.filter(pl.col("device") == entry["device"], **matches)
        values = pl.DataFrame({"arch_id": ids}).join(
            source.select("arch_id", metric), on="arch_id", how="left", maintain_order="left")
        return values[metric].cast(pl.Float64)

    def query(self, archs: Arch | str | Iterable[Arch | str], metrics: str | Sequence[str],
              device: str | None = None, condition: str | Mapping[str, Any] | None = None,
              mode: str = "surrogate", return_interval: bool = False,
              fidelity: int | None = None) -> pl.DataFrame:
        """One row per arch: ``arch_id`` and a column per metric (with ``{metric}_lo`` /
        ``{metric}_hi`` for the surrogate's interval when ``return_interval``).

        ``archs``: Arch objects or arch ids (one of them alone stands for a list of one);
        ``metrics``: a metric name or a list of them; a wrong type is a :class:`QueryError`
        naming the argument.

        ``fidelity``: perplexity of the supernet after that many training steps, one of
        :attr:`fidelities` (None: fully trained). Hardware metrics do not depend on it: they
        are properties of the arch, whatever its weights.

        ``params`` and ``flops`` (:data:`COMPUTED`) are exact in every mode: the parameters of
        the sub-network, and the FLOPs of one forward at the batch size and sequence length of
        ``condition`` (batch 1 and the space's block size where it names none).
        """
        _choose("mode", mode, MODES)
        return_interval = bool_argument(return_interval, "return_interval")
        if fidelity is not None and (isinstance(fidelity, bool)
                                     or fidelity not in self.fidelities):
            raise QueryError(f"unknown fidelity {_shown(fidelity)}; available (training steps): "
                             f"{', '.join(map(str, self.fidelities)) or 'none'}")
        if device is not None:
            _text(device, "device", f"name a device: {', '.join(self.devices)}")
        if condition is not None and not isinstance(condition, (str, Mapping)):
            raise QueryError(f"condition: {_shown(condition)} is not a condition id (e.g. "
                             "b1-t128-fp32-eager) or a dict of condition fields "
                             f"({', '.join(CONDITION_KEYS)})")
        metrics = _names(metrics, "metrics", "available: "
                         f"{', '.join([*self.metrics, *COMPUTED])}")
        parsed = self._archs(archs)
        if mode == "measured":  # in surrogate mode the feature encoding validates each arch
            self._check_space(parsed)
        ids = [a.id for a in parsed]
        columns: dict[str, Any] = {"arch_id": ids}
        # each distinct arch is predicted once (searches re-query, small spaces repeat)
        position: dict[str, int] = {}
        inverse = np.fromiter((position.setdefault(i, len(position)) for i in ids),
                              dtype=np.intp, count=len(ids))
        distinct = list(dict(zip(ids, parsed, strict=True)).values())
        encoded: np.ndarray | None = None  # one encoding, features per feature key
        features: dict[tuple[int, int, int], np.ndarray] = {}
        origins: dict[str, Origin] = {}  # where each answered metric's values came from
        for metric in metrics:
            if metric in COMPUTED:
                if encoded is None:
                    encoded = self._encode(distinct, parsed)
                columns[metric] = self._computed(metric, encoded, condition)[inverse]
                continue
            entry = self._entry(metric, device, condition, fidelity)
            if mode == "measured":
                columns[metric] = self._measured(metric, entry, ids)
                origins[metric] = Origin(entry, None, np.ones(len(ids), dtype=bool))
                continue
            key = (entry["vocab_size"], entry["batch_size"], entry["seq_len"])
            if key not in features:
                if encoded is None:
                    encoded = self._encode(distinct, parsed)
                features[key] = features_of_encoded(self.space, encoded, *key)
            model = self._model(entry)
            point = model.predict(features[key])
            columns[metric] = point[inverse]
            measured = np.zeros(len(ids), dtype=bool)
            if mode == "auto":
                known = self._measured(metric, entry, ids)
                measured = known.is_not_null().to_numpy()  # a NaN measured is checked below
                columns[metric] = np.where(measured, known.to_numpy(), columns[metric])
            origins[metric] = Origin(entry, entry["folder"], measured)
            if return_interval:
                # no interval around a point that is not a number: refused below with it
                low, high = (model.predict_interval(features[key]) if np.isfinite(point).all()
                             else (np.full(len(point), np.nan),) * 2)
                columns[f"{metric}_lo"], columns[f"{metric}_hi"] = low[inverse], high[inverse]
        return checked_answers(pl.DataFrame(columns), origins)


@dataclass(frozen=True)
class Origin:
    """Where a query's values of one metric came from: the index entry of its target, the
    surrogate folder that predicted (None in measured mode) and which rows are measured."""

    entry: Mapping[str, Any]
    folder: str | None
    measured: np.ndarray  # bool per row: the value is the measured table's


def _target_words(entry: Mapping[str, Any]) -> str:
    """``the lightgbm surrogate of latency_ms on {device} under {condition}`` (of perplexity:
    its fidelity's condition only where it is one)."""
    where = ("" if entry["metric"] in DEVICE_FREE and entry["condition"] == ANY
             else f" under {entry['condition']}" if entry["metric"] in DEVICE_FREE
             else f" on {entry['device']} under {entry['condition']}")
    return f"the {entry['family']} surrogate of {entry['metric']}{where}"


def checked_answers(table: pl.DataFrame, origins: Mapping[str, Origin]) -> pl.DataFrame:
    """``table``, the answer of a query, if every value of each metric of ``origins`` is
    plausible: finite and within the metric's range (:func:`metrics.answer_bounds`; a null
    is a value not measured), and a predicted value within its interval (``{metric}_lo`` <=
    value <= ``{metric}_hi``, both finite) where the table has one. Else
    :class:`ImplausibleAnswer` naming the surrogate folder (or the measured table), the
    metric, the first such arch and its value, and the fix: no query returns garbage."""
    for metric, origin in origins.items():
        values = table[metric].cast(pl.Float64).to_numpy()  # a null: NaN, skipped if measured
        null = table[metric].is_null().to_numpy()
        bounds = answer_bounds(metric)
        bad = ~null & ~np.isfinite(values)
        why = np.full(len(values), "is not a finite number", dtype=object)
        if bounds is not None:
            outside = ~null & np.isfinite(values) & ((values < bounds.low)
                                                     | (values > bounds.high))
            why[outside] = f"is outside [{bounds.low:g}, {bounds.high:g}] ({bounds.words})"
            bad |= outside
        if f"{metric}_lo" in table.columns:
            low = table[f"{metric}_lo"].cast(pl.Float64).to_numpy()
            high = table[f"{metric}_hi"].cast(pl.Float64).to_numpy()
            loose = ~bad & ~(np.isfinite(low) & np.isfinite(high))
            why[loose] = "has an interval end that is not a finite number"
            predicted = ~bad & ~loose & ~origin.measured
            crossed = predicted & ((low > values) | (values > high))
            why[crossed] = "is outside its own interval"
            bad |= loose | crossed
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ImplausibleAnswer(_implausible(table, metric, origin, row, str(why[row])))
    return table


def _implausible(table: pl.DataFrame, metric: str, origin: Origin, row: int, why: str) -> str:
    """The message of an implausible answer: where it came from, what, and the fix."""
    arch, value = table["arch_id"][row], table[metric][row]
    interval = (f" (interval [{table[f'{metric}_lo'][row]!r}, {table[f'{metric}_hi'][row]!r}])"
                if f"{metric}_lo" in table.columns else "")
    entry = origin.entry
    if origin.measured[row]:
        source = ("the perplexity table" if metric in DEVICE_FREE
                  else f"the measured table of {entry['device']} under {entry['condition']}")
        return (f"{source} holds {metric} {value!r} for arch {arch}, which {why}: no device "
                "measures it; drop the row or measure it again (`hwgptbench measure`), or "
                f"delete the table and rerun the workflow (`make run`) or pull it (`make pull`)")
    adapted = entry["family"] == ADAPTED
    fix = ("delete the folder and adapt the device again (`hwgptbench adapt`)" if adapted
           else "delete the folder and refit the surrogates (`make run`), or pull them again "
           "(`make pull`); a cache of the shipped tables (published/{scale}-{key}/, under "
           "results/ or the user cache folder) is refitted once deleted")
    return (f"{origin.folder}: {_target_words(entry)} answered {value!r} for arch {arch}"
            f"{interval}, which {why}: the folder is corrupt or was fitted on bad values; "
            f"{fix}")

