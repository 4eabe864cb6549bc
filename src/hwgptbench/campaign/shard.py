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
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from ..errors import MeasurementError
from ..meters.condition import Condition
from ..meters.device import default_device, fingerprint, release
from ..meters.energy import ENERGY_VALUES, EnergyMeter, calibrate, open_energy_meter
from ..meters.host import resolve_label
from ..meters.latency import LATENCY_FIELDS, PastDeadline
from ..meters.runner import (
    Settings,
    condition_grid,
    cpu_estimator,
    measure_arch,
    measure_latency_of_archs,
)
from ..metrics import further_nulls
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
    default_budget,
    plan_groups,
    shard_costs,
    shrink_plan,
    weight_bytes,
)
from .groups import group_factors, rescale
from .parts import ShardParts
from .pressure import SHRINKS, WAIT_S, MemoryPressure, MemoryWatch, Shortage, Shortfall

log = logging.getLogger(__name__)


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
    return condition_grid(section.batch_sizes, section.seq_lens, section.dtypes, section.launch,
                          device)

def device_label(section: MeasureSettings, threads: int) -> str:
    """This machine's label: ``measure.device`` checked against the hardware, or derived."""
    return resolve_label(section.device, fingerprint(threads, default_device()),
                         section.aliases)


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
    watch: MemoryWatch
    parts: ShardParts | None = None
    deadline: float | None = None  # time.monotonic() after which no group or visit starts

    def out_of_time(self) -> bool:
        """Whether the campaign's time bound has passed (never, without one)."""
        return self.deadline is not None and time.monotonic() > self.deadline

    def costs(self, condition: Condition) -> tuple[list[int], list[int]]:
        """The shard's weight and activation bytes under condition (:func:`shard_costs`)."""
        return shard_costs(self.space, self.archs, self.vocab_size, condition,
                           self.section.interleave)

    def plan(self, condition: Condition) -> GroupPlan:
        """Groups of the archs whose models fit the memory budget under condition."""
        budget = budget_bytes(self.section.memory_budget_gb, self.device)
        plan = plan_groups(*self.costs(condition), budget, self.section.group_anchors)
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

    def measure_condition(self, condition: Condition, desc: str
                          ) -> list[dict[str, Any]] | None:
        """The condition's rows from its groups (those stored by an earlier run reused), or
        None where the time bound passed before a group to measure (the groups measured are
        stored). Before a group starts and before each of its models is built, the memory free
        is checked (:class:`~.pressure.MemoryWatch`); when other processes took it, the rest of
        the condition is split into smaller groups (:meth:`shrink`)."""
        parts = self.parts
        plan = (parts.plan(condition, functools.partial(self.plan, condition), len(self.archs))
                if parts else self.plan(condition))
        groups: list[list[dict[str, Any]]] = []
        shortages = 0  # in a row, at the group now tried
        progress = tqdm(total=len(plan.groups), desc=f"{desc} {condition.id}", unit="group",
                        disable=len(plan.groups) == 1)
        while len(groups) < len(plan.groups):
            g = len(groups)
            stored = parts.rows(condition, g, plan.groups[g], self.archs) if parts else None
            if stored is None and parts and not shortages:
                why = parts.unfinished(condition, g)
                if why:
                    log.warning("%s: group %d did not finish in an earlier run (%s); measuring "
                                "it again", condition.id, g, why)
            shortfall = None
            if stored is None and self.out_of_time():
                progress.close()
                log.warning("%s: the time bound passed with %d of %d groups measured; the "
                            "rest is measured by a rerun", condition.id, g, len(plan.groups))
                return None
            if stored is None:
                try:
                    stored, shortfall = self._measure_watched(condition, plan.groups[g], g)
                except PastDeadline as late:
                    progress.close()
                    log.warning("%s: group %d stopped: %s; a rerun measures it (the archs' "
                                "rows measured so far are kept)", condition.id, g, late)
                    return None
            if shortfall is not None:
                shortages += 1
                plan = self.shrink(condition, plan, g, shortfall, shortages)
                progress.total = len(plan.groups)
                continue
            assert stored is not None
            shortages = 0
            groups.append(stored)
            progress.update()
        progress.close()
        return assemble(plan, groups, self.archs)

    def _measure_watched(self, condition: Condition, group: Group, index: int
                         ) -> tuple[list[dict[str, Any]] | None, Shortfall | None]:
        """measure_group of a group, stored, or the shortfall of memory that stopped it (the
        models it built are dropped with the exception). Its marker in the resume folder
        (started, then failed or gone) says a rerun what became of it."""
        try:
            self.watch.check(group.bytes)
            if self.parts:
                self.parts.started(condition, index, group.bytes, self.watch.free())
            rows = self.measure_group(condition, group, index)
        except Shortage as short:
            shortfall = short.shortfall
        except BaseException as err:
            if self.parts:
                self.parts.failed(condition, index, err)
            raise
        else:
            if self.parts:
                self.parts.write(condition, index, rows)
            return rows, None
        log.warning("%s: group %d stopped before it was timed: %s (other processes took "
                    "memory)", condition.id, index, shortfall)
        return None, shortfall

    def shrink(self, condition: Condition, plan: GroupPlan, done: int, shortfall: Shortfall,
               shortages: int) -> GroupPlan:
        """The plan with groups ``done`` on split to fit the memory free now (the default
        budget's share of it, at most the plan's budget), saved; after :data:`SHRINKS`
        shortages in a row (each a wait of :data:`WAIT_S`), :class:`MemoryPressure`, also
        recorded on the group's marker."""
        if shortages > SHRINKS:
            error = MemoryPressure(
                f"{condition.id}: group {done} needs {shortfall.needed / GB:.2f} GiB and "
                f"{shortfall.reserve / GB:.2f} GiB kept free, more than this machine's free "
                f"memory ({self.watch.free() / GB:.2f} GiB) after {SHRINKS} smaller plans "
                f"{WAIT_S:.0f} s apart: other processes hold the memory. The groups measured "
                "so far are kept: rerun the same command once memory is free, or set "
                "measure.memory_budget_gb lower")
            if self.parts:
                self.parts.failed(condition, done, error)
            raise error
        if shortages > 1:
            time.sleep(WAIT_S)
        release(self.device)
        budget = min(plan.budget, default_budget(self.watch.free()))
        smaller = shrink_plan(plan, done, *self.costs(condition), budget,
                              self.section.group_anchors)
        rest = smaller.groups[done:]
        log.warning("%s: the %d archs not yet measured are planned again in %.2f GiB: %d "
                    "group(s) of up to %d", condition.id, sum(len(g.members) for g in rest),
                    budget / GB, len(rest), max(len({*g.members, *g.anchors}) for g in rest))
        if self.parts:
            self.parts.save_plan(condition, smaller)
        return smaller

    def measure_group(self, condition: Condition, group: Group, index: int
                      ) -> list[dict[str, Any]]:
        """Rows of the group's members, plus timing-only rows of the anchors (flagged
        ``latency_anchor_only``) when they are not members here. A member's per-arch row
        (energy, memory, FLOPs) stored by an earlier run is reused."""
        per_arch = replace(self.settings, latency=not self.section.interleave)
        members = [self.archs[i] for i in group.members]
        stored = (self.parts.arch_rows(condition, {a.id for a in self.archs})
                  if self.parts else {})
        rows = []
        for arch in members:
            if arch.id not in stored and self.out_of_time():
                raise PastDeadline(f"the time bound passed with {len(stored)} of the "
                                   f"{len(members)} archs' rows measured")
            if arch.id not in stored:
                stored[arch.id] = measure_arch(self.space, arch, self.vocab_size, condition,
                                               self.device, self.meter, per_arch)
                if self.parts:
                    self.parts.write_arch_rows(condition, list(stored.values()))
            rows.append({**stored[arch.id], "latency_group": index,
                         "latency_anchor_only": False})
        if not self.section.interleave:
            return rows
        timed = [i for i, row in enumerate(rows) if row["status"] == "ok"]
        extra = [a for a in group.anchors if a not in group.members]
        arch_list = [members[i] for i in timed] + [self.archs[a] for a in extra]
        log.info("%s: timing %d archs interleaved (group %d)", condition.id, len(arch_list),
                 index)
        activations = max((activation_bytes(self.space, a, self.vocab_size, condition)
                           for a in arch_list), default=0)

        def before_build(i: int) -> None:
            self.watch.check(weight_bytes(self.space, arch_list[i], self.vocab_size,
                                          condition.dtype) + activations)

        stats = measure_latency_of_archs(self.space, arch_list, self.vocab_size, condition,
                                         self.device, self.settings, before_build)
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
        calls, or the process's threads while it was timed (CPU rows), waited for a core, or its
        latency's CI is wider than the bound."""
        if row["status"] != "ok" or not row.get("latency_ms"):
            return False
        bounds = self.section.contention
        ratio, ci = row.get("latency_wall_cpu_ratio"), row.get("latency_ci95_rel")
        wait = row.get("latency_runqueue_wait") if self.device.type == "cpu" else None
        # an infinite CI: too few calls for one (the protocol's limit), not contention
        return bool((ratio is not None and ratio > bounds.max_wall_cpu_ratio)
                    or (wait is not None and wait > bounds.max_runqueue_wait)
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
            if self.out_of_time():
                log.warning("%s: %d rows still contended are not timed again: the time bound "
                            "passed (a rerun times them again)", condition.id, len(pending))
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
            try:
                stats = measure_latency_of_archs(self.space, archs, self.vocab_size, condition,
                                                 self.device, self.settings)
            except PastDeadline:
                log.warning("%s: visit %d stopped: the time bound passed (a rerun times the "
                            "contended rows again)", condition.id, visit)
                break
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
        for row in rows:  # a row stored by an earlier run keeps the visits it had
            row["latency_remeasured"] = visits.get(row["arch_id"],
                                                   row.get("latency_remeasured") or 0)
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
        if share <= 0 or len(candidates) < 2 or self.out_of_time():
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
        try:
            stats = measure_latency_of_archs(self.space, subset, self.vocab_size, condition,
                                             self.device, self.settings)
        except PastDeadline:
            log.warning("%s: repeat subset not timed: the time bound passed", condition.id)
            return {}
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
                 parts: ShardParts | None = None, deadline: float | None = None
                 ) -> list[dict[str, Any]]:
    """Rows of every (arch, condition) on this machine, labelled ``label``.

    With ``measure.interleave`` the latency of the archs of a condition is timed round-robin
    (one forward of each per cycle), so a machine whose speed drifts over time (shared or
    virtual CPUs) biases no arch against another; energy and memory are then measured arch by
    arch. The archs timed together are a group whose models fit ``measure.memory_budget_gb``
    (:mod:`hwgptbench.measure.budget`), checked against the memory free before each model is
    built (:mod:`.pressure`: groups are split when other processes took memory); with
    ``parts``, each group's rows (and each arch's) are stored as they complete and what an
    earlier run stored is not measured again. Once a condition's groups are measured, its
    contended rows are timed again (:meth:`_Campaign.retime_contended`) and
    ``measure.repeat_share`` of its archs are timed again in a separate visit
    (``latency_repeat_ms``; null on the other rows): the repeatability a latency surrogate is
    judged against. With ``parts``, the finished condition's rows are stored; a rerun reads
    them and times again only those still contended.

    ``deadline`` (a ``time.monotonic()`` value) bounds the campaign: past it, no arch, group,
    visit or repeat subset starts and an interleaved timing stops at its next cycle (its
    samples dropped), and the conditions not finished are left out of the rows returned (what
    was measured so far stored in ``parts``).
    """
    device = default_device()
    settings = replace(measure_settings(section, device), deadline=deadline)
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
        campaign = _Campaign(section, space, archs, vocab_size, device, meter, settings,
                             MemoryWatch.on(device), parts, deadline)
        for condition in conditions(section, space, device):
            finished = parts.finished(condition, archs) if parts else None
            if finished is not None:
                log.info("%s: %d rows stored by an earlier run; their contended ones are timed "
                         "again", condition.id, len(finished))
                campaign.retime_contended(condition, finished)
            else:
                measured = campaign.measure_condition(condition, desc)
                if measured is None:
                    continue
                campaign.retime_contended(condition, measured)
                repeats = campaign.repeat_latencies(condition, measured)
                finished = [{"device": resolved, "scale": space.name, **row,
                             "latency_repeat_ms": repeats.get(row["arch_id"]),
                             "latency_interleaved": section.interleave,
                             "energy_idle_w": meter.idle_w, **identity, **versions}
                            for row in measured]
            if parts:
                parts.write_finished(condition, finished)
            rows += finished
    return rows
