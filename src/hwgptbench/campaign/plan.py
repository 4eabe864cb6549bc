"""The memory the measure jobs of a scale plan on each device, known before any job starts.

A shard is planned as :mod:`~.budget` plans it in the job: a seeded sample of the space stands
in for the sampled archs, with the space's largest arch in the shard (as one shard holds it),
under every condition the device runs. The budget is ``measure.memory_budget_gb``, or 60% of
the device's memory (a job takes 60% of the memory free when it starts, a little less). A
device that cannot hold the largest arch alone, weights and activations at its costliest
condition, is refused: every group holding that arch would run out of memory.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import NamedTuple

from ..errors import UserError
from ..meters.condition import Condition
from ..settings.fields import required
from ..settings.sections import (
    ClusterSettings,
    MeasurePlanSettings,
    MeasureSettings,
    TokenizerSettings,
)
from ..space import Arch, SearchSpace
from .budget import (
    GB,
    GroupPlan,
    activation_bytes,
    memory_budget,
    plan_groups,
    shard_costs,
    weight_bytes,
)

COLUMNS = ("scale", "device", "memory_gb", "budget_gb", "archs/shard", "group size", "groups",
           "planned peak GB", "largest arch GB", "worst condition")
# marks a planned peak over the budget in the table, and the table's note that says what it means
OVER_MARK = "*"
OVER_NOTE = (f"{OVER_MARK} planned peak over budget_gb: those groups are tried anyway (a warning "
             "per scale and device says how many and the fix)")


class MemoryPlanError(UserError, ValueError):
    """A device cannot hold the largest arch of a scale at the largest condition."""


class DeviceMemory(NamedTuple):
    """A device's memory in bytes, and whether it is a GPU (it then runs cuda_graph too)."""

    memory: int
    gpu: bool


@dataclass(frozen=True)
class MemoryPlan:
    """The plan of a scale's shard on one device: the groups of the condition that needs the
    most, and the highest peak of any condition (bytes)."""

    scale: str
    device: str
    memory: int
    budget: int
    archs_per_shard: int
    group_size: int
    groups: int
    peak: int
    largest: int
    condition: str
    # the groups over the budget (one arch each, with the anchors) of the peak_groups planned
    # under peak_condition, the condition of the highest peak; the conditions that have any;
    # the anchors timed in each group of peak_condition
    over_budget: int = 0
    peak_condition: str = ""
    peak_groups: int = 0
    over_conditions: tuple[str, ...] = ()
    anchors: int = 0

    def row(self) -> tuple[str, ...]:
        """The plan's cells in :data:`COLUMNS` order (:data:`OVER_MARK` after a planned peak
        over the budget)."""
        mark = f" {OVER_MARK}" if self.peak > self.budget else ""
        return (self.scale, self.device, f"{self.memory / GB:.1f}", f"{self.budget / GB:.1f}",
                str(self.archs_per_shard), str(self.group_size), str(self.groups),
                f"{self.peak / GB:.1f}{mark}",
                f"{self.largest / GB:.1f}", self.condition)

    def over_budget_warning(self) -> str | None:
        """What a planned peak over the budget means and how to plan within it; None when
        every group fits the budget."""
        if self.peak <= self.budget:
            return None
        others = len(self.over_conditions) - 1
        where = self.peak_condition + (f" (and {others} other condition{'s' * (others > 1)})"
                                       if others > 0 else "")
        smaller = (f"one arch each beside the {self.anchors} anchors: a smaller group needs "
                   "fewer measure.group_anchors" if self.anchors else
                   "one arch each, so no smaller group exists" + (
                       "; and no anchor fits beside the largest arch, so the groups' speeds are "
                       "not compared" if self.peak_groups > 1 else ""))
        return (f"scale {self.scale}, device {self.device}: {self.over_budget} of "
                f"{self.peak_groups} groups at {where} plan more memory than the budget, up to "
                f"{self.peak / GB:.1f} GiB against {self.budget / GB:.1f} GiB ({smaller}). "
                f"They are tried anyway: the budget is a safe fraction of the device's "
                f"{self.memory / GB:.1f} GiB, and an arch that runs out of memory loses only "
                f"its own rows. To plan within it: set measure.memory_budget_gb to at least "
                f"{math.ceil(self.peak / GB * 10) / 10:.1f} (it applies to every device: a "
                "larger one then plans against it too, in more groups), or lower "
                "measure.batch_sizes or measure.seq_lens")


def plan_conditions(section: MeasureSettings, gpu: bool) -> list[Condition]:
    """The conditions of the measure section that a device runs (cuda_graph on GPUs only)."""
    launches = [launch for launch in section.launch if gpu or launch != "cuda_graph"]
    return [Condition(b, t, dtype, launch) for b in section.batch_sizes
            for t in section.seq_lens for dtype in section.dtypes for launch in launches]


def _need(space: SearchSpace, arch: Arch, vocab_size: int, condition: Condition) -> int:
    return (weight_bytes(space, arch, vocab_size, condition.dtype)
            + activation_bytes(space, arch, vocab_size, condition))


def largest_need(space: SearchSpace, section: MeasureSettings, vocab_size: int, gpu: bool
                 ) -> tuple[int, Condition]:
    """Bytes of the largest arch alone (weights and activations) at its costliest condition."""
    arch = space.largest()
    return max((_need(space, arch, vocab_size, c), c) for c in plan_conditions(section, gpu))


def check_fits(space: SearchSpace, section: MeasureSettings, vocab_size: int, device: str,
               device_memory: DeviceMemory) -> int:
    """The largest arch's need in bytes; :class:`MemoryPlanError` when it exceeds the device."""
    need, condition = largest_need(space, section, vocab_size, device_memory.gpu)
    if need > device_memory.memory:
        weights = weight_bytes(space, space.largest(), vocab_size, condition.dtype)
        dtype = " (or drop fp32 from measure.dtypes)" if condition.dtype == "fp32" else ""
        raise MemoryPlanError(
            f"scale {space.name}, device {device}: the largest arch alone needs "
            f"{need / GB:.1f} GiB at {condition.id} (weights {weights / GB:.1f} GiB, activations "
            f"{(need - weights) / GB:.1f} GiB), more than the device's "
            f"{device_memory.memory / GB:.1f} GiB. Lower measure.batch_sizes or measure.seq_lens"
            f"{dtype}, or drop {device} from workflow.devices; if the device has more memory, "
            f"correct cluster.devices.{device}.memory_gb")
    return need


def archs_per_shard(space: SearchSpace, n_archs: int, shards: int) -> int:
    """Archs of the largest shard: n_archs (at most the space's size) split over shards."""
    return math.ceil(min(n_archs, space.size()) / shards)


@cache
def stand_in_shard(space: SearchSpace, size: int, seed: int = 0) -> tuple[Arch, ...]:
    """size archs: the largest arch, then a seeded sample of the others."""
    largest = space.largest()
    others = [a for a in space.sample(min(size, space.size()), seed) if a != largest]
    return (largest, *others[:size - 1])


@cache
def _costs(space: SearchSpace, archs: tuple[Arch, ...], vocab_size: int, condition: Condition,
           interleave: bool) -> tuple[list[int], list[int]]:
    """:func:`shard_costs`, kept for the conditions and devices a plan repeats them for."""
    return shard_costs(space, archs, vocab_size, condition, interleave)


def plan_memory(space: SearchSpace, section: MeasureSettings, n_archs: int, vocab_size: int,
                device: str, device_memory: DeviceMemory, seed: int = 0) -> MemoryPlan:
    """The plan of a shard of ``n_archs`` sampled archs (``sample.n_archs + 2``) on a device;
    :class:`MemoryPlanError` when the largest arch alone, or a group, does not fit the
    device."""
    largest = check_fits(space, section, vocab_size, device, device_memory)
    budget = memory_budget(section.memory_budget_gb, lambda: device_memory.memory)
    size = archs_per_shard(space, n_archs, section.shards)
    archs = stand_in_shard(space, size, seed)
    plans: list[tuple[GroupPlan, Condition]] = []
    for condition in plan_conditions(section, device_memory.gpu):
        weights, activations = _costs(space, archs, vocab_size, condition,
                                      section.interleave)
        plans.append((plan_groups(weights, activations, budget, section.group_anchors),
                      condition))
    worst, condition = max(plans, key=lambda p: (len(p[0].groups), p[0].peak_bytes))
    peak, fullest = max((plan.peak_bytes, c) for plan, c in plans)
    fullest_plan = next(plan for plan, c in plans if c == fullest)
    over = [g for g in fullest_plan.groups if g.over_budget]
    if peak > device_memory.memory:
        raise MemoryPlanError(
            f"scale {space.name}, device {device}: a group of {fullest.id} is planned on "
            f"{peak / GB:.1f} GiB, more than the device's {device_memory.memory / GB:.1f} GiB. "
            f"Lower measure.memory_budget_gb (now {budget / GB:.1f} GiB) below the device's "
            f"memory, or measure.group_anchors")
    return MemoryPlan(space.name, device, device_memory.memory, budget, size,
                      worst.largest_group, len(worst.groups),
                      peak, largest, condition.id, over_budget=len(over),
                      peak_condition=fullest.id, peak_groups=len(fullest_plan.groups),
                      over_conditions=tuple(c.id for plan, c in plans
                                            if any(g.over_budget for g in plan.groups)),
                      anchors=len(fullest_plan.anchors))


def tokenizer_vocab_size(tokenizer: TokenizerSettings) -> int | None:
    """The vocabulary size of ``data.tokenizer``: as set (bpe), or read off its file (None
    when the file is not there)."""
    if tokenizer.kind == "bpe":
        return tokenizer.vocab_size
    from pathlib import Path

    from ..tokens.tokenizer import load_tokenizer_file

    file = required(tokenizer.file, "data.tokenizer.file")
    if not Path(file).is_file():
        return None
    return load_tokenizer_file(file).get_vocab_size()


def cluster_memory(cluster: ClusterSettings, aliases: Mapping[str, str]
                   ) -> dict[str, DeviceMemory]:
    """The devices of ``cluster.devices`` that state a ``memory_gb``: GPUs are those whose
    entry asks for GPUs or whose label (or its ``measure.aliases`` entry) names CUDA hardware."""
    return {label: DeviceMemory(int(entry.memory_gb * GB),
                                entry.gpus > 0 or aliases.get(label, label).startswith("cuda"))
            for label, entry in cluster.devices.items() if entry.memory_gb is not None}


def search_spaces(settings: MeasurePlanSettings) -> dict[str, SearchSpace]:
    """The search spaces of the planned scales, by scale."""
    return {scale: space.space(scale) for scale, space in settings.spaces.items()}


def plan_scales(spaces: Sequence[SearchSpace], measure: MeasureSettings, n_archs: int,
                vocab_size: int, devices: Mapping[str, DeviceMemory]) -> list[MemoryPlan]:
    """The plan of a shard of ``n_archs`` archs (``sample.n_archs + 2``) of every space on
    every device."""
    return [plan_memory(space, measure, n_archs, vocab_size, label, memory)
            for space in spaces for label, memory in devices.items()]


def check_scales(spaces: Mapping[str, SearchSpace], measure: MeasureSettings, vocab_size: int,
                 devices: Mapping[str, Mapping[str, DeviceMemory]]) -> None:
    """Refuse, with :class:`MemoryPlanError`, a scale whose largest arch does not fit one of
    its devices ({scale: {label: memory}}); fast: no shard is planned."""
    for scale, memories in devices.items():
        for label, memory in memories.items():
            check_fits(spaces[scale], measure, vocab_size, label, memory)


def format_table(plans: Sequence[MemoryPlan]) -> str:
    """The plans as an aligned text table; :data:`OVER_NOTE` below it when a planned peak is
    over its budget."""
    rows = [COLUMNS, *(p.row() for p in plans)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip()
             for r in rows]
    if any(p.peak > p.budget for p in plans):
        lines.append(OVER_NOTE)
    return "\n".join(lines)


def this_machine(measure: MeasureSettings) -> dict[str, DeviceMemory]:
    """This machine under its label (``measure.device``, or derived when auto), with the
    memory free on its default device."""
    from ..meters.device import default_device, fingerprint
    from ..meters.host import auto_label
    from .budget import free_memory_bytes

    device = default_device()
    label = measure.device
    if label == "auto":
        label = auto_label(fingerprint(measure.threads, device))
    return {label: DeviceMemory(free_memory_bytes(device), device.type == "cuda")}
