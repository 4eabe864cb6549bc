"""Prefill timing of a model: the input ids of a timing section, the call that is timed, its
latency with the estimator of the device, and the throughput it implies."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn as nn

from ..meters.latency import measure_latency
from ..meters.runner import cpu_estimator

if TYPE_CHECKING:  # the meters import torch and numpy alone: a timing model is read as values
    from ..settings.compress import TimingSettings


def prefill_ids(timing: TimingSettings, vocab_size: int) -> torch.Tensor:
    """The timed prefill's input: seeded token ids of the timing's (batch_size, seq_len)."""
    generator = torch.Generator().manual_seed(0)
    return torch.randint(vocab_size, (timing.batch_size, timing.seq_len),
                         generator=generator)


def prefill_call(model: nn.Module, timing: TimingSettings, vocab_size: int,
                 device: torch.device) -> Callable[[], torch.Tensor]:
    """One prefill of :func:`prefill_ids`, no autograd."""
    x = prefill_ids(timing, vocab_size).to(device)

    def call() -> torch.Tensor:
        with torch.inference_mode():
            return model(x)

    return call


def speed(latency_ms: float, timing: TimingSettings) -> dict[str, float]:
    """latency_ms and the prefill throughput it gives, tokens_per_s."""
    tokens = timing.batch_size * timing.seq_len
    return {"latency_ms": latency_ms, "tokens_per_s": 1000.0 * tokens / latency_ms}


def timing_kwargs(timing: TimingSettings, device: torch.device) -> dict[str, Any]:
    """The latency timers' keyword arguments of ``compress.timing`` on device: the repeats and
    stopping rule it sets, and its ``estimator`` on a CPU (the measure stage's protocol,
    docs/measure.md; CUDA events: the median)."""
    return {"warmup": timing.warmup, "min_repeats": timing.min_repeats,
            "max_repeats": timing.max_repeats, "target_rel_ci": timing.target_rel_ci,
            "max_seconds": timing.max_seconds,
            "estimator": cpu_estimator(timing.estimator, torch.device(device))}


def time_prefill(model: nn.Module, timing: TimingSettings, vocab_size: int,
                 device: torch.device) -> dict[str, float]:
    """latency_ms (the timing's estimator) and tokens_per_s of one prefill call of model."""
    call = prefill_call(model, timing, vocab_size, device)
    stats = measure_latency(call, device, **timing_kwargs(timing, device))
    return speed(stats["latency_ms"], timing)
