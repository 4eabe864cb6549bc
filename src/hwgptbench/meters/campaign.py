"""A measurement campaign: every (arch, condition) of a params section measured on this
machine, as rows (:func:`measure_rows`). The archs of a condition are timed in groups that fit
the memory budget, each group's rows can be stored as it completes (:class:`ShardParts`), and a
share of the archs is timed again in a separate visit. The measure stage writes the rows as
tables; the transfer stage measures its few archs on a new device with it.
"""

from __future__ import annotations

import functools
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..errors import UserError
from ..io import atomic_write_json, read_json, read_parquet, write_parquet
from ..metrics import further_nulls, measurement_frame
from ..outputs import make_own_dir, remove_own_dir
from ..repeatability import REPEAT_MIN
from ..settings.sections import MeasureSettings
from ..space import Arch, SearchSpace
from ..versions import library_versions
from .budget import (
    GB,
    Group,
    GroupPlan,
    activation_bytes,
    budget_bytes,
    plan_groups,
    weight_bytes,
)
from .condition import Condition
from .device import default_device, fingerprint
from .energy import ENERGY_VALUES, EnergyMeter, calibrate, open_energy_meter
from .groups import group_factors, rescale
from .host import resolve_label
from .latency import LATENCY_FIELDS
from .runner import (
    Settings,
    conditions_from_params,
    cpu_estimator,
    measure_arch,
    measure_latency_of_archs,
)

log = logging.getLogger(__name__)


class MeasurementError(UserError, ValueError):
    """Bad measurement request or inconsistent tables; the message says which."""


def measure_settings(section: MeasureSettings, device: torch.device | None = None
                     ) -> Settings:
    """Measurement settings of the ``measure`` params section; ``measure.estimator`` applies
    to CPU devices (CUDA events: the median)."""
    return Settings(threads=section.threads, warmup=section.warmup,
                    min_repeats=section.min_repeats, max_repeats=section.max_repeats,
                    target_rel_ci=section.target_rel_ci, max_seconds=section.max_seconds,
                    energy_seconds=section.energy_window_s, memory=section.memory,
                    seed=section.seed, estimator=cpu_estimator(section.estimator, device))


def conditions(section: MeasureSettings, space: SearchSpace, device: torch.device
               ) -> list[Condition]:
    """The conditions of the ``measure`` params section that this device runs."""
    too_long = [t for t in section.seq_lens if t > space.block_size]
    if too_long:
        raise MeasurementError(f"measure.seq_lens: {too_long} exceed block_size {space.block_size} "
                         f"of space '{space.name}'")
    return conditions_from_params({"batch_size": list(section.batch_sizes),
                                   "seq_len": list(section.seq_lens),
                                   "dtype": list(section.dtypes),
                                   "launch": list(section.launch)}, device)

def device_label(section: MeasureSettings, threads: int) -> str:
    """This machine's label: ``measure.device`` checked against the hardware, or derived."""
    return resolve_label(section.device, fingerprint(threads, default_device()),
                         section.aliases)


class ResumeStateError(MeasurementError):
    """A file of a shard's resume folder (``{out}.parts/``) that cannot be read back: the
    message names it and how to restart."""


RERUN = "rerun the same `hwgptbench measure` command"
COMMAND = "measure"  # the command whose marker a shard's resume folder carries
GROUP_COLUMNS = {"arch_id": pl.String, "status": pl.String, "latency_ms": pl.Float64,
                 "latency_anchor_only": pl.Boolean}


class ShardParts:
    """The resumable progress of one shard job: its group plans and a part file per measured
    group, in ``{out}.parts/``. The folder belongs to one set of inputs (settings, archs,
    device): a folder left by other inputs is discarded, so a restarted job measures only the
    groups not yet written, with the settings they were planned with. A file of the folder
    that cannot be read back (not JSON or parquet, or not what this class writes) is refused
    with :class:`ResumeStateError`, which says what to delete."""

    def __init__(self, root: str | os.PathLike[str], key: str) -> None:
        self.root = make_own_dir(root, COMMAND)  # a path it did not make is refused
        stamp = self.root / "inputs.json"
        if stamp.is_file() and self._key(stamp) != key:
            log.warning("%s: left by other settings or archs; measuring the shard anew",
                        self.root)
            remove_own_dir(self.root, COMMAND)
            make_own_dir(self.root, COMMAND)
        if not stamp.is_file():
            atomic_write_json(stamp, {"key": key})

    def _damaged(self, path: Path, why: str) -> ResumeStateError:
        """The error for a plan or stamp file (or the folder) that cannot be read back."""
        return ResumeStateError(f"{path}: {why}; the resume state of this shard is damaged: "
                                f"delete the folder {self.root} (the shard is measured anew) "
                                f"and {RERUN}")

    def _json(self, path: Path) -> Any:
        """A JSON file of the folder."""
        return read_json(path, f"delete the folder {self.root} (the shard is measured anew) "
                               f"and {RERUN}")

    def _key(self, stamp: Path) -> str | None:
        """The inputs key the folder was written for (None: no stamp)."""
        if not stamp.is_file():
            return None
        doc = self._json(stamp)
        if not isinstance(doc, dict) or not isinstance(doc.get("key"), str):
            raise self._damaged(stamp, "holds no inputs key")
        return doc["key"]

    def plan(self, condition: Condition, make: Callable[[], GroupPlan], n_archs: int
             ) -> GroupPlan:
        """The condition's group plan of the shard's ``n_archs`` archs: the one saved by an
        earlier run, else make() saved."""
        path = self.root / f"{condition.id}.plan.json"
        if path.is_file():
            return self._saved_plan(path, n_archs)
        plan = make()
        atomic_write_json(path, {"budget": plan.budget, "anchors": list(plan.anchors),
                                 "groups": [asdict(g) for g in plan.groups]})
        return plan

    def _saved_plan(self, path: Path, n_archs: int) -> GroupPlan:
        """A saved plan, checked: each arch a member of one group, every index an arch's."""
        doc = self._json(path)
        try:
            plan = GroupPlan(tuple(Group(_indices(g["members"]), _indices(g["anchors"]),
                                         _whole(g["bytes"]), _flag(g["over_budget"]))
                                   for g in doc["groups"]),
                             _whole(doc["budget"]), _indices(doc["anchors"]))
        except (KeyError, TypeError, ValueError) as err:
            raise self._damaged(path, f"is not a group plan ({type(err).__name__}: {err})"
                                ) from None
        members = sorted(i for g in plan.groups for i in g.members)
        anchors = [*plan.anchors, *(i for g in plan.groups for i in g.anchors)]
        if members != list(range(n_archs)) or any(i >= n_archs for i in anchors):
            raise self._damaged(path, f"does not plan each of the shard's {n_archs} archs "
                                      "once")
        return plan

    def part(self, condition: Condition, group: int) -> Path:
        """The part file of one group."""
        return self.root / f"{condition.id}.group-{group:05d}.parquet"

    def write(self, condition: Condition, group: int, rows: list[dict[str, Any]]) -> None:
        """Store one group's rows (atomically)."""
        write_parquet(measurement_frame(rows), self.part(condition, group))

    def rows(self, condition: Condition, index: int, group: Group, archs: Sequence[Arch]
             ) -> list[dict[str, Any]] | None:
        """The stored rows of group ``index`` (of ``archs``), or None when it was not measured
        yet. Stored rows must be the group's: one per member, and anchors' timing rows."""
        path = self.part(condition, index)
        if not path.is_file():
            return None
        fix = f"delete {path} (its group is measured again) and {RERUN}"
        table = read_parquet(path, fix)
        missing = [c for c, dtype in GROUP_COLUMNS.items()
                   if table.schema.get(c) not in (dtype, pl.Null)]
        if missing:
            raise ResumeStateError(f"{path}: not a group's rows (columns {', '.join(missing)} "
                                   f"missing or of another type); {fix}")
        own = table.filter(~pl.col("latency_anchor_only").fill_null(False))["arch_id"]
        timing = set(table.filter(pl.col("latency_anchor_only"))["arch_id"])
        if (Counter(own.to_list()) != Counter(archs[i].id for i in group.members)
                or not timing <= {archs[i].id for i in group.anchors}):
            raise ResumeStateError(f"{path}: its rows are not those of the group's "
                                   f"{len(group.members)} archs; {fix}")
        return table.to_dicts()

    def remove(self) -> None:
        """Delete the folder (once the shard's table is written)."""
        remove_own_dir(self.root, COMMAND)


def _indices(values: Any) -> tuple[int, ...]:
    """A plan's list of arch indices."""
    if not isinstance(values, list):
        raise TypeError(f"{values!r:.60} is not a list of arch indices")
    return tuple(_whole(v) for v in values)


def _whole(value: Any) -> int:
    """A plan's count or index: a whole number, at least 0."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"{value!r:.60} is not a whole number")
    return value


def _flag(value: Any) -> bool:
    """A plan's boolean."""
    if not isinstance(value, bool):
        raise TypeError(f"{value!r:.60} is not a boolean")
    return value


@dataclass
class _Campaign:
    """What every group of a measurement run shares."""

    section: MeasureSettings
    space: SearchSpace
    archs: Sequence[Arch]
    vocab_size: int
    device: torch.device
    meter: EnergyMeter
    settings: Settings

    def plan(self, condition: Condition) -> GroupPlan:
        """Groups of the archs whose models fit the memory budget under condition."""
        weights = [weight_bytes(self.space, a, self.vocab_size, condition.dtype)
                   for a in self.archs]
        if not self.section.interleave:  # one model at a time: all archs in one group
            weights = [0] * len(weights)
        activations = [activation_bytes(self.space, a, self.vocab_size, condition)
                       for a in self.archs]
        budget = budget_bytes(self.section.memory_budget_gb, self.device)
        plan = plan_groups(weights, activations, budget, self.section.group_anchors)
        if len(plan.groups) > 1 and not plan.anchors:
            log.warning("%s: no anchor fits beside the largest arch in %.2f GiB: the %d groups' "
                        "speeds are not compared", condition.id, budget / GB, len(plan.groups))
        for group in plan.groups:
            if group.over_budget:
                log.warning("%s: a group of %d archs needs %.2f GiB, over the budget of %.2f "
                            "GiB; it is tried anyway", condition.id, len(group.members),
                            group.bytes / GB, budget / GB)
        log.info("%s: %d archs in %d group(s) of up to %d, planned peak %.2f GiB of %.2f GiB",
                 condition.id, len(self.archs), len(plan.groups), plan.largest_group,
                 plan.peak_bytes / GB, budget / GB)
        return plan

    def measure_group(self, condition: Condition, group: Group, index: int
                      ) -> list[dict[str, Any]]:
        """Rows of the group's members, plus timing-only rows of the anchors (flagged
        ``latency_anchor_only``) when they are not members here."""
        per_arch = replace(self.settings, latency=not self.section.interleave)
        members = [self.archs[i] for i in group.members]
        rows = [measure_arch(self.space, arch, self.vocab_size, condition, self.device,
                             self.meter, per_arch) for arch in members]
        for row in rows:
            row |= {"latency_group": index, "latency_anchor_only": False}
        if not self.section.interleave:
            return rows
        timed = [i for i, row in enumerate(rows) if row["status"] == "ok"]
        extra = [a for a in group.anchors if a not in group.members]
        arch_list = [members[i] for i in timed] + [self.archs[a] for a in extra]
        log.info("%s: timing %d archs interleaved (group %d)", condition.id, len(arch_list),
                 index)
        stats = measure_latency_of_archs(self.space, arch_list, self.vocab_size, condition,
                                         self.device, self.settings)
        for i, result in zip(timed, stats[:len(timed)], strict=True):
            if result.get("status") == "oom":
                rows[i] = _unmeasured_oom(rows[i], result["reason"])
            else:
                rows[i].update(result)
        for a, result in zip(extra, stats[len(timed):], strict=True):
            if result.get("status") != "oom":
                rows.append({"arch_id": self.archs[a].id, **asdict(condition), **result,
                             "status": "ok", "latency_group": index,
                             "latency_anchor_only": True})
        return rows

    def contended(self, row: dict[str, Any]) -> bool:
        """Whether a timed row was measured under contention (``measure.contention``): its
        calls waited for a core, or its latency's CI is wider than the bound."""
        if row["status"] != "ok" or not row.get("latency_ms"):
            return False
        bounds = self.section.contention
        ratio, ci = row.get("latency_wall_cpu_ratio"), row.get("latency_ci95_rel")
        # an infinite CI: too few calls for one (the protocol's limit), not contention
        return bool((ratio is not None and ratio > bounds.max_wall_cpu_ratio)
                    or (ci is not None and math.isfinite(ci) and ci > bounds.max_ci_rel))

    def retime_contended(self, condition: Condition, rows: list[dict[str, Any]]
                         ) -> dict[str, Any]:
        """Time the contended rows again in up to ``measure.contention.retries`` later visits
        (each after ``wait_s``), beside up to ``group_anchors`` uncontended rows whose speed in
        the visit rescales the others; a row takes its new timing when that is uncontended or
        less so. Every row gets ``latency_remeasured`` (visits) and ``latency_contended`` (the
        campaign's bounds); the condition's summary is returned and logged."""
        bounds = self.section.contention
        first = sum(self.contended(row) for row in rows)
        visits: dict[str, int] = {}
        for visit in range(1, bounds.retries + 1):
            pending = [row for row in rows if self.contended(row)]
            if not pending:
                break
            time.sleep(bounds.wait_s)
            anchors = [row for row in rows if row["status"] == "ok" and row.get("latency_ms")
                       and not self.contended(row)][:self.section.group_anchors]
            candidates = [*pending, *anchors]
            fits = self._within_budget(condition, [Arch.from_id(r["arch_id"]) for r in candidates],
                                       at_least_one=True)
            timed = [candidates[i] for i in fits]
            archs = [Arch.from_id(row["arch_id"]) for row in timed]
            log.info("%s: timing %d contended archs again (visit %d of %d)", condition.id,
                     sum(i < len(pending) for i in fits), visit, bounds.retries)
            stats = measure_latency_of_archs(self.space, archs, self.vocab_size, condition,
                                             self.device, self.settings)
            new = dict(zip((id(row) for row in timed), stats, strict=True))
            pairs = [(row["latency_ms"], new[id(row)].get("latency_ms")) for row in anchors
                     if id(row) in new and new[id(row)].get("status") != "oom"]
            factor = (float(np.exp(np.mean([np.log(b / a) for a, b in pairs if a and b])))
                      if pairs else 1.0)
            for row in pending:
                result = new.get(id(row))
                if result is None or result.get("status") == "oom":
                    continue
                visits[row["arch_id"]] = visit
                again = rescale({**row, **result}, factor)
                if not self.contended(again) or (again["latency_wall_cpu_ratio"] or 0) < (
                        row["latency_wall_cpu_ratio"] or 0):
                    row.update(again)
        for row in rows:
            row["latency_remeasured"] = visits.get(row["arch_id"], 0)
            if row["status"] == "ok" and row.get("latency_ms"):
                row["latency_contended"] = self.contended(row)
        still = sum(self.contended(row) for row in rows)
        summary = {"condition": condition.id,
                   "ok": sum(row["status"] == "ok" for row in rows),
                   "contended": first, "remeasured": first - still, "still_contended": still}
        log.info("%s: %d rows ok, %d contended, %d re-measured uncontended, %d still "
                 "contended%s", condition.id, summary["ok"], first, first - still, still,
                 " (kept, flagged, left out of fitting; docs/measure.md)" if still else "")
        return summary

    def _within_budget(self, condition: Condition, archs: Sequence[Arch],
                       wanted: int | None = None, at_least_one: bool = False) -> list[int]:
        """Indices of the archs, in order, that fit the memory budget together (at most
        ``wanted``; with ``at_least_one``, the first even where it alone is over budget)."""
        budget = budget_bytes(self.section.memory_budget_gb, self.device)
        chosen: list[int] = []
        used = 0
        for i, arch in enumerate(archs):
            need = (weight_bytes(self.space, arch, self.vocab_size, condition.dtype)
                    + activation_bytes(self.space, arch, self.vocab_size, condition))
            if used + need <= budget or (at_least_one and not chosen):
                chosen.append(i)
                used += need
            if len(chosen) == wanted:
                break
        return chosen

    def repeat_subset(self, condition: Condition, measured: set[str]) -> list[Arch]:
        """The archs timed again: ``measure.repeat_share`` of the measured ones (at least
        REPEAT_MIN), drawn with the seed, as many as fit the memory budget together."""
        share = self.section.repeat_share
        candidates = [a for a in self.archs if a.id in measured]
        if share <= 0 or len(candidates) < 2:
            return []
        wanted = min(len(candidates), max(REPEAT_MIN, math.ceil(share * len(candidates))))
        order = [candidates[i] for i in
                 np.random.default_rng(self.settings.seed).permutation(len(candidates))]
        return [order[i] for i in self._within_budget(condition, order, wanted)]

    def repeat_latencies(self, condition: Condition, rows: Sequence[dict[str, Any]]
                         ) -> dict[str, float]:
        """Latency of the repeat subset of the condition's measured rows, timed again together
        in a separate visit (the ceiling of a latency surrogate: :mod:`..repeatability`)."""
        subset = self.repeat_subset(condition, {r["arch_id"] for r in rows
                                                if r["status"] == "ok" and r["latency_ms"]})
        if len(subset) < 2:
            return {}
        log.info("%s: timing %d archs again (repeat subset)", condition.id, len(subset))
        stats = measure_latency_of_archs(self.space, subset, self.vocab_size, condition,
                                         self.device, self.settings)
        return {arch.id: result["latency_ms"] for arch, result in zip(subset, stats, strict=True)
                if result.get("status") != "oom"}


def _unmeasured_oom(row: dict[str, Any], reason: str) -> dict[str, Any]:
    """A row whose arch ran out of memory while timed: its other metrics are dropped too, as
    for an arch that ran out of memory anywhere else."""
    nulls = {k: None for k in (*LATENCY_FIELDS, "latency_drift_cv", *ENERGY_VALUES,
                               "memory_weights_mb", "memory_peak_mb", "memory_activations_mb")}
    return row | nulls | further_nulls(reason) | {"status": "oom", "reason": reason,
                                                  "memory_reason": reason,
                                                  "energy_reason": reason}


def assemble(plan: GroupPlan, groups: Sequence[list[dict[str, Any]]], archs: Sequence[Arch]
             ) -> list[dict[str, Any]]:
    """The rows of one condition from its groups' rows: latencies divided by their group's
    speed factor (read off the anchors, :mod:`hwgptbench.measure.groups`), anchors' timing-only
    rows dropped."""
    anchor_ids = {archs[a].id for a in plan.anchors}
    medians: dict[int, dict[str, float]] = {g: {} for g in range(len(groups))}
    for g, rows in enumerate(groups):
        for row in rows:
            if row["arch_id"] in anchor_ids and row["status"] == "ok" and row["latency_ms"]:
                medians[g][row["arch_id"]] = row["latency_ms"]
    factors = group_factors(medians) if len(groups) > 1 else {0: 1.0}
    out = []
    for g, rows in enumerate(groups):
        for row in rows:
            if row.pop("latency_anchor_only"):
                continue
            out.append(rescale(row, factors[g]) if row["status"] == "ok"
                       else row | {"latency_group_factor": None})
    return out


def measure_rows(section: MeasureSettings, space: SearchSpace, archs: Sequence[Arch],
                 vocab_size: int, label: str, desc: str = "measure",
                 parts: ShardParts | None = None) -> list[dict[str, Any]]:
    """Rows of every (arch, condition) on this machine, labelled ``label``.

    With ``measure.interleave`` the latency of the archs of a condition is timed round-robin
    (one forward of each per cycle), so a machine whose speed drifts over time (shared or
    virtual CPUs) biases no arch against another; energy and memory are then measured arch by
    arch. The archs timed together are a group whose models fit ``measure.memory_budget_gb``
    (:mod:`hwgptbench.measure.budget`); with ``parts``, each group's rows are stored as it
    completes and groups stored by an earlier run are not measured again. Once a condition's
    groups are measured, ``measure.repeat_share`` of its archs are timed again in a separate
    visit (``latency_repeat_ms``; null on the other rows): the repeatability a latency
    surrogate is judged against.
    """
    device = default_device()
    settings = measure_settings(section, device)
    identity = fingerprint(settings.threads, device)
    resolved = resolve_label(label, identity, section.aliases)
    versions = library_versions()
    rows: list[dict[str, Any]] = []
    with open_energy_meter(device) as meter:
        if not meter.available:
            log.info("energy not measured: %s", meter.reason)
        else:
            calibrate(meter)
            log.info("idle power of %s: %s W (subtracted in energy_above_idle_mj)", resolved,
                     "unmeasured" if meter.idle_w is None else f"{meter.idle_w:.1f}")
        campaign = _Campaign(section, space, archs, vocab_size, device, meter, settings)
        for condition in conditions(section, space, device):
            plan = (parts.plan(condition, functools.partial(campaign.plan, condition), len(archs))
                    if parts else campaign.plan(condition))
            groups = []
            for g, group in enumerate(tqdm(plan.groups, desc=f"{desc} {condition.id}",
                                           unit="group", disable=len(plan.groups) == 1)):
                stored = parts.rows(condition, g, group, archs) if parts else None
                if stored is None:
                    stored = campaign.measure_group(condition, group, g)
                    if parts:
                        parts.write(condition, g, stored)
                groups.append(stored)
            measured = assemble(plan, groups, archs)
            campaign.retime_contended(condition, measured)
            repeats = campaign.repeat_latencies(condition, measured)
            rows += [{"device": resolved, "scale": space.name, **row,
                      "latency_repeat_ms": repeats.get(row["arch_id"]),
                      "latency_interleaved": section.interleave, "energy_idle_w": meter.idle_w,
                      **identity, **versions}
                     for row in measured]
    return rows
