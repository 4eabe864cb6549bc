"""One timed call of a workload on the fixed model of an arch, under a condition's options.

- ``prefill``: one forward over the (batch, seq_len) prompt, under ``torch.inference_mode``.
- ``decode``: ``gen_len`` greedy tokens, one forward each, after the prompt's keys and values
  were cached (the prompt is run once when the callable is built; each call truncates the cache
  back to it). Its latency is divided by ``gen_len``: per generated token.
- ``train_step``: forward with the loss, backward, AdamW step and zeroed gradients, fp32
  weights with autocast to bf16/fp16 (mixed precision, as training runs), activation
  recomputation of every block when ``recompute``.

Options: ``attention`` runs every call inside ``torch.nn.attention.sdpa_kernel`` of that
backend; ``quant: int8`` quantizes every Linear to int8 weights with int8 activations computed
per call (``torch.ao`` dynamic quantization on the CPU, :mod:`hwgptbench.meters.quantize`;
the tied LM head is a functional product and stays fp32);
``compile`` wraps the model in ``torch.compile``. An option the device cannot run is reported
by :func:`unsupported_reason` or, where only running tells, by the first call raising
:class:`Unsupported`: the row then holds null metrics and the reason. Running out of memory in
that call is not a missing kernel: the allocation error itself is raised (status ``oom``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.profiler import record_function

from ..meters.condition import Condition
from ..meters.device import DTYPES, dtype_unsupported_reason
from ..meters.latency import is_out_of_memory
from ..meters.memory import MB, tensor_bytes
from ..meters.quantize import QuantizationUnsupported, quantize
from ..meters.quantize import unsupported_reason as quant_unsupported_reason
from ..meters.runner import build_model, inputs
from ..model import GPT
from ..space import Arch, SearchSpace
from ..training.step import TRAIN_LR, autocast

BACKENDS = {"math": SDPBackend.MATH, "flash": SDPBackend.FLASH_ATTENTION,
            "efficient": SDPBackend.EFFICIENT_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
QUANT_METHODS = {"int8": "int8_dynamic"}  # Condition.quant -> hwgptbench.meters.quantize method


class Unsupported(RuntimeError):
    """The device cannot run this condition (the message says why)."""


@dataclass
class Workload:
    """A callable running the workload once, and what one call amounts to."""

    call: Callable[[], Any]
    tokens: int  # tokens processed per call: throughput is tokens / call time
    per_call: int  # latency divisor: decode's generated tokens per call, else 1
    model: GPT  # the eager module (under any compile or quantization wrapper)


def unsupported_reason(condition: Condition, device: torch.device, block_size: int
                       ) -> str | None:
    """Why device cannot run condition at all, or None (SDPA backends tell only when run)."""
    device = torch.device(device)
    reason = dtype_unsupported_reason(DTYPES[condition.dtype], device)
    if reason is not None:
        return reason
    if condition.launch == "cuda_graph" and device.type != "cuda":
        return "launch mode cuda_graph needs a CUDA device"
    if condition.quant != "none":
        reason = quant_unsupported_reason(QUANT_METHODS[condition.quant], device,
                                          DTYPES[condition.dtype])
        if reason is not None:
            return reason
    if condition.workload == "decode" and condition.seq_len + condition.gen_len > block_size:
        return (f"prompt {condition.seq_len} + {condition.gen_len} generated tokens exceed "
                f"the context of {block_size}")
    return None


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """Restrict SDPA to one backend (``default``: PyTorch's choice)."""
    if name == "default":
        yield
        return
    with sdpa_kernel(BACKENDS[name]):
        yield


def build_workload(space: SearchSpace, arch: Arch, vocab_size: int, condition: Condition,
                   device: torch.device, seed: int) -> Workload:
    """The model of arch (seeded weights) and a callable running condition's workload on
    seeded random token ids; the first call is made here, so an unsupported option raises
    :class:`Unsupported` now rather than while timing."""
    device = torch.device(device)
    training = condition.workload == "train_step"
    weights = torch.float32 if training else DTYPES[condition.dtype]
    model = build_model(space, arch, vocab_size, seed, device, weights)
    runnable: Callable[..., Any] = model
    if condition.quant != "none":
        try:
            runnable = quantize(model, QUANT_METHODS[condition.quant])
        except QuantizationUnsupported as err:
            raise Unsupported(f"{condition.id} does not run on {device}: {err}") from err
    if condition.compile:
        runnable = torch.compile(runnable)
    x = inputs(vocab_size, condition, seed, device)
    try:
        if training:
            workload = _train_step(model, runnable, x, condition, device)
        elif condition.workload == "decode":
            workload = _decode(model, runnable, x, condition)  # runs the prompt
        else:
            workload = _prefill(model, runnable, x, condition)
        workload.call()
    except (RuntimeError, NotImplementedError) as err:  # no SDPA kernel, compiler missing
        if is_out_of_memory(err):  # the device lacks memory, not a kernel: the caller's oom
            raise
        message = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise Unsupported(f"{condition.id} does not run on {device}: {message}") from err
    return workload


def _prefill(model: GPT, runnable: Callable[..., Any], x: torch.Tensor, condition: Condition
             ) -> Workload:
    def call() -> torch.Tensor:
        with torch.inference_mode(), attention_backend(condition.attention):
            return runnable(x)

    return Workload(call, x.numel(), 1, model)


def _decode(model: GPT, runnable: Callable[..., Any], x: torch.Tensor, condition: Condition
            ) -> Workload:
    prompt = x.size(1)
    cache = model.new_cache(x.size(0), prompt + condition.gen_len)
    with torch.inference_mode(), attention_backend(condition.attention):
        first = runnable(x, cache=cache)[:, -1:].argmax(-1)  # (B, 1)

    def call() -> torch.Tensor:
        cache.truncate(prompt)
        token = first
        with torch.inference_mode(), attention_backend(condition.attention):
            for _ in range(condition.gen_len):
                logits = runnable(token, cache=cache)
                with record_function("sampling"):  # a range only while profiled
                    token = logits[:, -1:].argmax(-1)
        return token

    return Workload(call, x.size(0) * condition.gen_len, condition.gen_len, model)


def _train_step(model: GPT, runnable: Callable[..., Any], x: torch.Tensor, condition: Condition,
                device: torch.device) -> Workload:
    model.train()
    model.recompute = condition.recompute
    optimizer = torch.optim.AdamW(model.parameters(), lr=TRAIN_LR)
    targets = torch.roll(x, -1, dims=1)

    def call() -> torch.Tensor:
        with attention_backend(condition.attention):
            with autocast(condition.dtype, device):
                _, loss = runnable(x, targets)
            with record_function("backward"):  # ranges only while profiled
                loss.backward()
        with record_function("optimizer"):
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return Workload(call, x.numel(), 1, model)


def cuda_peak_memory(workload: Workload, device: torch.device, baseline: int = 0
                     ) -> dict[str, Any]:
    """Memory fields of one call on CUDA: the allocator's peak (weights, optimizer state and
    activations) over ``baseline`` (what was allocated before the workload was built), and its
    growth over what was allocated right before the call."""
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    workload.call()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device)
    return {"memory_weights_mb": tensor_bytes(workload.model) / MB,
            "memory_peak_mb": (peak - baseline) / MB,
            "memory_activations_mb": (peak - before) / MB, "memory_reason": None}
