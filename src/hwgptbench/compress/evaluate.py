"""Sub-networks (and whole models) evaluated for real on this machine: quality, size and speed.

- ``perplexity``: mean validation loss on fixed, seeded batches of held-out windows, exp'd;
- ``accuracy``: the multiple-choice cloze task on held-out text (:mod:`.tasks`);
- ``params``: exact parameter count; ``size_mb``: bytes of the serialized weights;
- ``latency_ms``: median prefill time of one (batch_size, seq_len) call, timed on this machine
  until the median's confidence interval is tight (:func:`hwgptbench.meters.latency`), and
  ``tokens_per_s`` = batch_size * seq_len / latency.

The search's objectives come from :class:`CompressProblem`, which caches every arch's values,
so an arch that several runs visit is evaluated once.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..evaluation.tasks import ClozeItems, score_cloze
from ..meters.prefill import time_prefill
from ..model import SuperGPT
from ..settings.compress import TimingSettings
from ..space import Arch, SearchSpace

OBJECTIVES = ("perplexity", "params", "latency_ms")


@torch.inference_mode()
def mean_loss(model: Callable[..., Any], batches: Sequence[tuple[torch.Tensor, torch.Tensor]],
              device: torch.device) -> float:
    """Mean cross-entropy of model over (x, y) batches."""
    return sum(float(model(x.to(device), y.to(device))[1]) for x, y in batches) / len(batches)


@dataclass
class SubnetEvaluator:
    """Quality, size and speed of the sub-networks of a fine-tuned supernet, cached by arch."""

    supernet: SuperGPT
    batches: list[tuple[torch.Tensor, torch.Tensor]]
    cloze: ClozeItems | None
    timing: TimingSettings
    device: torch.device
    _cache: dict[tuple[str, str], Any] = field(default_factory=dict, repr=False)

    @property
    def space(self) -> SearchSpace:
        return self.supernet.space

    def _cached(self, kind: str, arch: Arch, compute: Callable[[], Any]) -> Any:
        key = (kind, arch.id)
        if key not in self._cache:
            self._cache[key] = compute()
        return self._cache[key]

    def perplexity(self, arch: Arch) -> float:
        def compute() -> float:
            self.supernet.set_arch(arch)
            return math.exp(mean_loss(self.supernet, self.batches, self.device))
        return self._cached("perplexity", arch, compute)

    def accuracy(self, arch: Arch) -> float | None:
        cloze = self.cloze
        if cloze is None:
            return None

        def compute() -> float:
            self.supernet.set_arch(arch)
            return score_cloze(self.supernet, cloze, device=self.device)["accuracy"]
        return self._cached("accuracy", arch, compute)

    def was_timed(self, arch: Arch) -> bool:
        return ("speed", arch.id) in self._cache

    def speed(self, arch: Arch) -> dict[str, float]:
        return self._cached("speed", arch, lambda: time_prefill(
            self.supernet.extract(arch).eval(), self.timing, self.supernet.vocab_size,
            self.device))

    def params(self, arch: Arch) -> int:
        return self.space.n_params(arch, self.supernet.vocab_size)

    def objective(self, name: str, arch: Arch) -> float:
        """One search objective (all minimized) of arch."""
        if name == "perplexity":
            return self.perplexity(arch)
        if name == "params":
            return float(self.params(arch))
        if name == "latency_ms":
            return self.speed(arch)["latency_ms"]
        raise ValueError(f"unknown compression objective {name!r}; known: {OBJECTIVES}")


@dataclass
class CompressProblem:
    """The Problem interface of :class:`hwgptbench.moo.evaluator.Evaluator`: objective
    values of sub-networks, evaluated (and cached) by a :class:`SubnetEvaluator`."""

    evaluator: SubnetEvaluator
    metrics: tuple[str, ...]

    def __post_init__(self) -> None:
        unknown = sorted(set(self.metrics) - set(OBJECTIVES))
        if unknown or len(self.metrics) < 2:
            raise ValueError(f"compression objectives {list(self.metrics)}: need two or more of "
                             f"{list(OBJECTIVES)}")

    @property
    def space(self) -> SearchSpace:
        return self.evaluator.space

    @property
    def fidelities(self) -> list[int]:
        return []

    def values(self, archs: Sequence[Arch], fidelity: int | None = None) -> np.ndarray:
        rows = [[self.evaluator.objective(m, a) for m in self.metrics] for a in archs]
        return np.array(rows, dtype=float).reshape(len(archs), len(self.metrics))
