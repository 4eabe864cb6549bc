"""A measurement campaign: every (arch, condition) of a params section measured on this
machine, as rows (:func:`measure_rows`). The archs of a condition are timed in groups that fit
the memory budget, each group's rows can be stored as it completes (:class:`ShardParts`), and a
share of the archs is timed again in a separate visit. The measure stage writes the rows as
tables; the transfer stage measures its few archs on a new device with it.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..errors import UserError
from ..io import atomic_write_json, write_parquet
from ..metrics import further_nulls, measurement_frame
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
from .energy import EnergyMeter, open_energy_meter
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


class ShardParts:
    """The resumable progress of one shard job: its group plans and a part file per measured
    group, in ``{out}.parts/``. The folder belongs to one set of inputs (settings, archs,
    device): a folder left by other inputs is discarded, so a restarted job measures only the
    groups not yet written, with the settings they were planned with."""

    def __init__(self, root: str | os.PathLike[str], key: str) -> None:
        self.root = Path(root)
        stamp = self.root / "inputs.json"
        if self.root.exists() and (not stamp.is_file()
                                   or json.loads(stamp.read_text()).get("key") != key):
            log.warning("%s: left by other settings or archs; measuring the shard anew",
                        self.root)
            shutil.rmtree(self.root)
        if not stamp.is_file():
            atomic_write_json(stamp, {"key": key})

    def plan(self, condition: Condition, make: Callable[[], GroupPlan]) -> GroupPlan:
        """The condition's group plan: the one saved by an earlier run, else make() saved."""
        path = self.root / f"{condition.id}.plan.json"
        if path.is_file():
            doc = json.loads(path.read_text())
            return GroupPlan(tuple(Group(tuple(g["members"]), tuple(g["anchors"]), g["bytes"],
                                         g["over_budget"]) for g in doc["groups"]),
                             doc["budget"], tuple(doc["anchors"]))
        plan = make()
        atomic_write_json(path, {"budget": plan.budget, "anchors": list(plan.anchors),
                                 "groups": [asdict(g) for g in plan.groups]})
        return plan

    def part(self, condition: Condition, group: int) -> Path:
        """The part file of one group."""
        return self.root / f"{condition.id}.group-{group:05d}.parquet"

    def write(self, condition: Condition, group: int, rows: list[dict[str, Any]]) -> None:
        """Store one group's rows (atomically)."""
        write_parquet(measurement_frame(rows), self.part(condition, group))

    def rows(self, condition: Condition, group: int) -> list[dict[str, Any]] | None:
        """One group's stored rows, or None when it was not measured yet."""
        path = self.part(condition, group)
        return pl.read_parquet(path).to_dicts() if path.is_file() else None

    def remove(self) -> None:
        """Delete the folder (once the shard's table is written)."""
        shutil.rmtree(self.root, ignore_errors=True)


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

    def repeat_subset(self, condition: Condition, measured: set[str]) -> list[Arch]:
        """The archs timed again: ``measure.repeat_share`` of the measured ones (at least
        REPEAT_MIN), drawn with the seed, as many as fit the memory budget together."""
        share = self.section.repeat_share
        candidates = [a for a in self.archs if a.id in measured]
        if share <= 0 or len(candidates) < 2:
            return []
        wanted = min(len(candidates), max(REPEAT_MIN, math.ceil(share * len(candidates))))
        budget = budget_bytes(self.section.memory_budget_gb, self.device)
        chosen: list[Arch] = []
        used = 0
        for i in np.random.default_rng(self.settings.seed).permutation(len(candidates)):
            arch = candidates[i]
            need = (weight_bytes(self.space, arch, self.vocab_size, condition.dtype)
                    + activation_bytes(self.space, arch, self.vocab_size, condition))
            if used + need <= budget:
                chosen.append(arch)
                used += need
            if len(chosen) == wanted:
                break
        return chosen

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
    nulls = {k: None for k in (*LATENCY_FIELDS, "latency_drift_cv", "energy_mj",
                               "energy_window_s", "energy_calls", "memory_weights_mb",
                               "memory_peak_mb", "memory_activations_mb")}
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
    rows = []
    with open_energy_meter(device) as meter:
        if not meter.available:
            log.info("energy not measured: %s", meter.reason)
        campaign = _Campaign(section, space, archs, vocab_size, device, meter, settings)
        for condition in conditions(section, space, device):
            plan = (parts.plan(condition, functools.partial(campaign.plan, condition)) if parts
                    else campaign.plan(condition))
            groups = []
            for g, group in enumerate(tqdm(plan.groups, desc=f"{desc} {condition.id}",
                                           unit="group", disable=len(plan.groups) == 1)):
                stored = parts.rows(condition, g) if parts else None
                if stored is None:
                    stored = campaign.measure_group(condition, group, g)
                    if parts:
                        parts.write(condition, g, stored)
                groups.append(stored)
            measured = assemble(plan, groups, archs)
            repeats = campaign.repeat_latencies(condition, measured)
            rows += [{"device": resolved, "scale": space.name, **row,
                      "latency_repeat_ms": repeats.get(row["arch_id"]),
                      "latency_interleaved": section.interleave, **identity, **versions}
                     for row in measured]
    return rows
