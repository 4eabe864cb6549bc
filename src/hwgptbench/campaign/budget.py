"""The memory a measurement plans on, known before any model is built.

Interleaved timing (:func:`~.latency.measure_latency_interleaved`) holds several models at
once, so the archs of a shard are split into groups whose models fit a memory budget. A
model's cost is its weights (exact: parameter count times the dtype's size, plus the rotary
tables) and, once per group, the transient activations of the largest forward (an upper
estimate: the logits, the widest hidden tensors and a materialised attention matrix). Under
``cuda_graph`` the graphs of a group are captured into one shared memory pool and keep no
output, so they too pay for the largest forward once.

When the shard does not fit one group, ``anchors`` archs (spread over the shard's sizes) are
timed in every group: a group's speed relative to the others is read off them and divided out
(:mod:`~.groups`), so latencies from different groups rank against each other.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..meters.condition import Condition
from ..meters.device import release
from ..space import Arch, SearchSpace

GB = 2**30
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
DEFAULT_FRACTION = 0.6  # of the free memory, when measure.memory_budget_gb is null
ACTIVATION_SAFETY = 2.0  # the estimate is multiplied by this (allocator slack, kernels' workspaces)


def weight_bytes(space: SearchSpace, arch: Arch, vocab_size: int, dtype: str) -> int:
    """Bytes of the fixed model's parameters in dtype, plus its fp32 rotary tables."""
    rotary = 2 * space.block_size * int(space.head_size * space.rotary_fraction) * 4
    return space.n_params(arch, vocab_size) * DTYPE_BYTES[dtype] + rotary


def activation_bytes(space: SearchSpace, arch: Arch, vocab_size: int, condition: Condition
                     ) -> int:
    """Upper estimate of the transient memory of one forward under condition: logits, the
    widest hidden tensors of a block and one attention score matrix, times a safety factor."""
    tokens = condition.batch_size * condition.seq_len
    widest_attention = max(arch.n_head) * space.head_size
    widths = vocab_size + 4 * arch.embed_dim + 3 * widest_attention + max(arch.mlp_hidden)
    scores = condition.batch_size * max(arch.n_head) * condition.seq_len ** 2
    elements = tokens * widths + scores
    return int(ACTIVATION_SAFETY * elements * DTYPE_BYTES[condition.dtype])


def free_memory_bytes(device: torch.device) -> int:
    """Memory free for new models on device: the CUDA driver's free memory, or the kernel's
    MemAvailable (else free physical pages) on the CPU.

    On CUDA the blocks that PyTorch's allocator caches (an earlier group's models, dropped) are
    returned to the driver first: they are free to this process, and ``measure-plan``, in a
    fresh process, counts them free too, so every condition plans the groups it printed."""
    device = torch.device(device)
    if device.type == "cuda":
        release(device)
        return int(torch.cuda.mem_get_info(device)[0])
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def default_budget(free: int) -> int:
    """The budget in bytes when ``measure.memory_budget_gb`` is null: a safe fraction of the
    ``free`` bytes."""
    return int(DEFAULT_FRACTION * free)


def memory_budget(budget_gb: float | None, free: Callable[[], int]) -> int:
    """The budget in bytes: ``measure.memory_budget_gb``, or a safe fraction of the bytes
    ``free()`` gives (the memory free now in a job, the device's memory in a plan made before
    any job starts)."""
    if budget_gb is not None:
        return int(budget_gb * GB)
    return default_budget(free())


def budget_bytes(budget_gb: float | None, device: torch.device) -> int:
    """The budget in bytes on device: ``measure.memory_budget_gb``, or a safe fraction of the
    memory free on it now."""
    return memory_budget(budget_gb, lambda: free_memory_bytes(device))


def shard_costs(space: SearchSpace, archs: Sequence[Arch], vocab_size: int,
                condition: Condition, interleave: bool) -> tuple[list[int], list[int]]:
    """Each arch's weight bytes (0 when archs are timed one at a time, ``measure.interleave``
    false: then all fit one group) and activation bytes under condition."""
    weights = [weight_bytes(space, a, vocab_size, condition.dtype) if interleave else 0
               for a in archs]
    return weights, [activation_bytes(space, a, vocab_size, condition) for a in archs]


@dataclass(frozen=True)
class Group:
    """Indices of the archs timed together: the members (measured here) and the anchors
    (timed in every group of the shard); ``bytes`` is the memory the group plans on."""

    members: tuple[int, ...]
    anchors: tuple[int, ...]
    bytes: int
    over_budget: bool = False


@dataclass(frozen=True)
class GroupPlan:
    """The groups of a shard under one condition, and the budget they were planned against."""

    groups: tuple[Group, ...]
    budget: int
    anchors: tuple[int, ...] = field(default=())

    @property
    def peak_bytes(self) -> int:
        """The most memory one group plans on."""
        return max((g.bytes for g in self.groups), default=0)

    @property
    def largest_group(self) -> int:
        """Archs timed together in the largest group, anchors included."""
        return max((len(set(g.members) | set(g.anchors)) for g in self.groups), default=0)


def _group_bytes(indices: Sequence[int], weights: Sequence[int], activations: Sequence[int]
                 ) -> int:
    if not indices:
        return 0
    return sum(weights[i] for i in indices) + max(activations[i] for i in indices)


def choose_anchors(weights: Sequence[int], n: int) -> tuple[int, ...]:
    """n indices spread over the quantiles of the costs (neither the smallest nor the
    largest arch), in index order."""
    order = sorted(range(len(weights)), key=lambda i: (weights[i], i))
    if n <= 0 or not order:
        return ()
    picks = {order[min(len(order) - 1, math.floor((j + 1) * len(order) / (n + 1)))]
             for j in range(n)}
    return tuple(sorted(picks))


def _affordable_anchors(weights: Sequence[int], activations: Sequence[int], budget: int,
                        n: int) -> tuple[int, ...]:
    """n anchors spread over the sizes, unless the largest arch would not fit beside them: then
    the smallest archs, as few as needed; none where not even one fits beside the largest (the
    groups' speeds are then not compared, and a warning says so)."""
    anchors = choose_anchors(weights, n)
    largest = max(range(len(weights)), key=lambda i: (weights[i], i))

    def fits(chosen: Sequence[int]) -> bool:
        held = sorted({*chosen, largest})
        return _group_bytes(held, weights, activations) <= budget

    if fits(anchors):
        return anchors
    smallest = sorted((i for i in range(len(weights)) if i != largest),
                      key=lambda i: (weights[i], i))
    for k in range(n, 0, -1):
        if fits(smallest[:k]):
            return tuple(sorted(smallest[:k]))
    return ()


def plan_groups(weights: Sequence[int], activations: Sequence[int], budget: int,
                n_anchors: int) -> GroupPlan:
    """Split archs (by their weight and activation bytes) into groups that fit budget.

    All archs form one group when they fit together. Otherwise ``n_anchors`` archs are timed in
    every group (spread over the sizes, or the smallest ones where the largest arch would not
    fit beside those) and the others fill groups in their given order (the shard's random order, so
    groups are alike); an arch that does not fit even with the anchors alone gets a group of its
    own, marked ``over_budget`` (it is still tried: the budget is a safe fraction, and running
    out of memory costs only that arch)."""
    everything = list(range(len(weights)))
    total = _group_bytes(everything, weights, activations)
    if total <= budget or len(everything) <= 1:
        return GroupPlan((Group(tuple(everything), (), total, total > budget),), budget)
    anchors = _affordable_anchors(weights, activations, budget,
                                  min(n_anchors, len(everything) - 1))
    groups = _fill([i for i in everything if i not in anchors], anchors, weights,
                   activations, budget)
    first = groups[0]  # the anchors' own rows are measured with the first group
    groups[0] = Group(tuple(sorted(first.members + anchors)), anchors, first.bytes,
                      first.over_budget)
    return GroupPlan(tuple(groups), budget, anchors)


def _fill(indices: Sequence[int], anchors: tuple[int, ...], weights: Sequence[int],
          activations: Sequence[int], budget: int) -> list[Group]:
    """Groups of the indices, in order, each with the anchors, that fit budget (an index that
    does not fit beside the anchors alone gets a group of its own, ``over_budget``)."""
    groups: list[Group] = []
    current: list[int] = []

    def close() -> None:
        size = _group_bytes([*current, *anchors], weights, activations)
        groups.append(Group(tuple(current), anchors, size, size > budget))

    for i in indices:
        candidate = [*current, i, *anchors]
        if current and _group_bytes(candidate, weights, activations) > budget:
            close()
            current = []
        current.append(i)
    if current or not groups:
        close()
    return groups


def shrink_plan(plan: GroupPlan, done: int, weights: Sequence[int],
                activations: Sequence[int], budget: int, n_anchors: int) -> GroupPlan:
    """The plan with its groups from ``done`` on split again to fit a smaller budget (other
    processes took memory). Groups before ``done`` are measured and kept; the new groups time
    the same anchors, so every group's speed is still read off them. Before any group is
    measured the condition is simply planned again."""
    if done == 0:
        return plan_groups(weights, activations, budget, n_anchors)
    rest = [i for group in plan.groups[done:] for i in group.members]
    return GroupPlan((*plan.groups[:done],
                      *_fill(rest, plan.anchors, weights, activations, budget)),
                     budget, plan.anchors)
