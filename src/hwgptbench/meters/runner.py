"""One measurement row per (arch, condition): FLOPs, parameters, latency, energy and memory.

The main measurement runs the ``prefill`` workload (one forward) under the default runtime options;
a condition (:class:`~.condition.Condition`) here is a batch size, a sequence length, a dtype and a
launch mode (eager, or a captured CUDA graph replayed). The fixed model of an arch is built with
seeded random weights (cost does not depend on the weight values, so measurement needs no trained
supernet and can run on any machine that has the archs table), cast to the dtype and fed seeded
random token ids under ``torch.inference_mode``. What cannot be measured is recorded, not raised: a
dtype the device does not run gives ``status`` 'unsupported_dtype', running out of memory 'oom'
(CUDA's error or the CPU allocator's), each with the metrics None and the reason.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any

import torch

from ..errors import UserError
from ..metrics import Metric, further_metrics, further_nulls
from ..model import GPT, GPTConfig
from ..space import Arch, SearchSpace
from .condition import Condition
from .device import DTYPES, dtype_unsupported_reason
from .energy import ENERGY_VALUES, EnergyMeter, measure_energy
from .flops import forward_flops
from .latency import (
    LATENCY_FIELDS,
    CallFailed,
    check_deadline,
    check_estimator,
    cuda_graph_callable,
    is_out_of_memory,
    measure_latency,
    measure_latency_interleaved,
)
from .memory import cpu_memory, cuda_memory, unmeasured

log = logging.getLogger(__name__)

class SettingsError(UserError, ValueError):
    """Measurement settings that cannot go together."""


def cpu_estimator(estimator: str, device: torch.device | None) -> str:
    """A section's ``estimator`` on a CPU device (or when the device is not known yet);
    ``median`` of CUDA events on a GPU."""
    if device is not None and device.type == "cuda":
        return "median"
    return estimator


@dataclass(frozen=True)
class Settings:
    """How long and how precisely to measure, with how many CPU threads and which input seed:
    the values of a params section (``measure``, ``runtime``, ``compress.timing``), given in
    full, so that the params models hold the only defaults (this module imports torch and
    numpy alone: it runs on measuring machines without the rest)."""

    threads: int
    warmup: int
    min_repeats: int
    max_repeats: int
    target_rel_ci: float
    max_seconds: float
    energy_seconds: float
    memory: bool
    seed: int
    estimator: str  # latency_ms of a row (measure.latency.ESTIMATORS)
    latency: bool = True  # False: the row's latency is timed elsewhere (interleaved)
    deadline: float | None = None  # time.monotonic() past which interleaved timing stops

    def __post_init__(self) -> None:
        check_estimator(self.estimator)
        if self.estimator == "cpu_median" and self.threads != 1:
            raise SettingsError(f"estimator cpu_median times the calling thread: it needs one "
                                f"intra-op thread, not threads: {self.threads} (set threads: "
                                "1, or another estimator)")

    def timing(self) -> dict[str, Any]:
        """The keyword arguments of the latency timers."""
        return {"warmup": self.warmup, "min_repeats": self.min_repeats,
                "max_repeats": self.max_repeats, "target_rel_ci": self.target_rel_ci,
                "max_seconds": self.max_seconds, "estimator": self.estimator}

    def interleaved(self) -> dict[str, Any]:
        """The keyword arguments of the interleaved timer: :meth:`timing` and the deadline."""
        return {**self.timing(), "deadline": self.deadline}


def condition_grid(batch_sizes: Sequence[int], seq_lens: Sequence[int], dtypes: Sequence[str],
                   launches: Sequence[str], device: torch.device) -> list[Condition]:
    """Every combination of the batch sizes, sequence lengths, dtypes and launch modes (of a
    validated params section); cuda_graph is dropped off CUDA."""
    if torch.device(device).type != "cuda" and "cuda_graph" in launches:
        log.info("launch mode cuda_graph skipped on %s", device)
        launches = [launch for launch in launches if launch != "cuda_graph"]
        if not launches:
            raise ValueError(f"measurement conditions: no launch mode runs on {device}")
    return [Condition(*values) for values in itertools.product(batch_sizes, seq_lens, dtypes,
                                                                launches)]


def _unmeasured(row: dict[str, Any], meter: EnergyMeter, status: str,
                reason: str) -> dict[str, Any]:
    """The row with every metric None and the reason."""
    row |= {"status": status, "reason": reason, **dict.fromkeys(LATENCY_FIELDS),
            **dict.fromkeys(ENERGY_VALUES), "energy_source": meter.source,
            "energy_reason": reason, **unmeasured(reason), **further_nulls(reason)}
    return row


def build_model(space: SearchSpace, arch: Arch, vocab_size: int, seed: int,
                device: torch.device, dtype: torch.dtype) -> GPT:
    """The fixed model of arch with weights drawn from seed, on device, in dtype, in eval mode."""
    torch.manual_seed(seed)
    with torch.device(device):
        model = GPT(GPTConfig.from_space(space, arch, vocab_size))
    return model.to(dtype=dtype).eval()


def _memory(model: torch.nn.Module, x: torch.Tensor, settings: Settings) -> dict[str, Any]:
    """Memory fields: allocator statistics on CUDA, allocator events on the CPU."""
    if not settings.memory:
        return unmeasured("memory measurement disabled in the settings")
    if x.device.type == "cuda":
        return cuda_memory(model, x)
    return cpu_memory(model, x)


def forward_callable(model: torch.nn.Module, x: torch.Tensor, condition: Condition,
                     pool: Any = None) -> Any:
    """One forward of model on x, launched as the condition says (a CUDA graph captured into
    ``pool`` when one is given, see :func:`cuda_graph_callable`)."""
    if condition.launch == "cuda_graph":
        return cuda_graph_callable(model, x, pool=pool)
    return partial(model, x)


def inputs(vocab_size: int, condition: Condition, seed: int, device: torch.device
           ) -> torch.Tensor:
    """Seeded random token ids of the condition's shape, on device."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab_size, (condition.batch_size, condition.seq_len), generator=generator)
    return x.to(device)


def _measure(space: SearchSpace, arch: Arch, vocab_size: int, condition: Condition,
             x: torch.Tensor, meter: EnergyMeter, settings: Settings,
             model: GPT | None = None) -> dict[str, Any]:
    """Latency (unless timed elsewhere), energy and memory fields of arch on token ids x; the
    model (unless given) is built only when one of them is measured here."""
    further = further_metrics()
    if not (settings.latency or settings.memory or meter.available or further):
        nothing = measure_energy(lambda: None, meter, x.device)  # the meter's null fields
        return {**dict.fromkeys(LATENCY_FIELDS), **nothing,
                **unmeasured("memory measurement disabled in the settings")}
    if model is None:
        model = build_model(space, arch, vocab_size, settings.seed, x.device,
                            DTYPES[condition.dtype])
    with torch.inference_mode():
        memory = _memory(model, x, settings)
        fn = forward_callable(model, x, condition)
        latency = (measure_latency(fn, x.device, **settings.timing())
                   if settings.latency else dict.fromkeys(LATENCY_FIELDS))
        energy = measure_energy(fn, meter, x.device, settings.energy_seconds)
        others = _further(further, model, fn, x)
    return {**latency, **energy, **memory, **others}


def _further(metrics: Sequence[Metric], model: GPT, fn: Any, x: torch.Tensor
             ) -> dict[str, Any]:
    """The columns of the registered metrics that name their own meter (hwgptbench.metrics),
    each measured on the built model after the built-in meters."""
    out: dict[str, Any] = {}
    for metric in metrics:
        meter_fn = metric.meter()
        assert meter_fn is not None  # further_metrics() name a meter
        out |= {metric.reason_column: None, **meter_fn(model, fn, x)}
    return out


def measure_latency_of_archs(space: SearchSpace, archs: Sequence[Arch], vocab_size: int,
                             condition: Condition, device: torch.device, settings: Settings,
                             before_build: Callable[[int], None] | None = None
                             ) -> list[dict[str, Any]]:
    """Latency statistics of several archs under one condition, timed interleaved (their models
    held at once, CUDA graphs in one shared memory pool; see
    :func:`measure_latency_interleaved`). An arch that runs out of memory
    while built or timed gets ``{"status": "oom", "reason": ...}`` instead, and the others are
    timed without it. ``before_build(i)`` runs before arch i's model is built (the campaign's
    memory watch; what it raises ends the call, the models built so far dropped)."""
    x = inputs(vocab_size, condition, settings.seed, torch.device(device))
    torch.set_num_threads(settings.threads)
    results: dict[int, dict[str, Any]] = {}
    fns: dict[int, Any] = {}
    # the group's CUDA graphs share one memory pool (the largest forward's activations) and
    # replay in the order they were captured
    pool = torch.cuda.graph_pool_handle() if condition.launch == "cuda_graph" else None
    with torch.inference_mode():
        for i, arch in enumerate(archs):
            check_deadline(settings.deadline, f"while building model {i} of {len(archs)}")
            if before_build is not None:
                before_build(i)
            try:
                model = build_model(space, arch, vocab_size, settings.seed, x.device,
                                    DTYPES[condition.dtype])
                fns[i] = forward_callable(model, x, condition, pool)
            except (RuntimeError, MemoryError) as err:
                if not is_out_of_memory(err):
                    raise
                results[i] = _oom(arch, condition, err)
        while fns:
            order = list(fns)
            try:
                stats = measure_latency_interleaved([fns[i] for i in order], x.device,
                                                    **settings.interleaved(), seed=settings.seed,
                                                    shuffle=pool is None)
            except CallFailed as failed:
                i = order[failed.index]
                results[i] = _oom(archs[i], condition, failed.error)
                del fns[i]
                if x.device.type == "cuda":
                    torch.cuda.empty_cache()
                continue
            results |= dict(zip(order, stats, strict=True))
            break
    return [results[i] for i in range(len(archs))]


def _oom(arch: Arch, condition: Condition, error: BaseException) -> dict[str, Any]:
    """The status and reason of an arch that ran out of memory."""
    log.warning("%s %s: out of memory", arch.id, condition)
    return {"status": "oom", "reason": f"out of memory: {error}".splitlines()[0]}


def measure_arch(space: SearchSpace, arch: Arch, vocab_size: int, condition: Condition,
                 device: torch.device, meter: EnergyMeter, settings: Settings,
                 model: GPT | None = None) -> dict[str, Any]:
    """One row: arch_id, the condition, params, flops, threads, status and reason, latency
    statistics (None when ``settings.latency`` is off: timed by the caller), energy and memory
    fields. ``model``: arch's model already built (:func:`build_model`) on device in the
    condition's dtype, reused across conditions; else one is built."""
    device = torch.device(device)
    if condition.launch == "cuda_graph" and device.type != "cuda":
        raise ValueError(f"launch mode cuda_graph needs a CUDA device, got {device}")
    torch.set_num_threads(settings.threads)
    row: dict[str, Any] = {
        "arch_id": arch.id, **asdict(condition),
        "params": space.n_params(arch, vocab_size),
        "flops": forward_flops(arch, space, vocab_size, condition.batch_size, condition.seq_len),
        "threads": torch.get_num_threads(),
    }
    reason = dtype_unsupported_reason(DTYPES[condition.dtype], device)
    if reason is not None:
        return _unmeasured(row, meter, "unsupported_dtype", reason)
    x = inputs(vocab_size, condition, settings.seed, device)
    try:
        measured = _measure(space, arch, vocab_size, condition, x, meter, settings, model)
    except (RuntimeError, MemoryError) as err:
        if not is_out_of_memory(err):
            raise
        return _unmeasured(row, meter, **_oom(arch, condition, err))
    finally:
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return row | {"status": "ok", "reason": None, **measured}
