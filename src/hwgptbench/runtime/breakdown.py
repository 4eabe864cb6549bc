"""Where a workload's time goes: per module class and per operator category, from torch.profiler.

Each leaf step of the fixed model is a module (embedding, QKV projection, attention core,
output projection, MLP up / activation / down, the LayerNorms, the residual sum, the tied LM
head); the workloads record their own steps outside the model (``sampling``: decode's next-token
choice; ``backward`` and ``optimizer`` of a train step). Forward hooks
open a ``torch.profiler.record_function`` range named by the step's class around each of them,
and one range ``step`` encloses the whole call; the profiler's events are then aggregated in
Python (``prof.events()``, never its printed table). A class's time is the sum of its ranges'
durations (host time on the CPU, the kernels' device time on CUDA, those that autograd's
device thread launches during a range included: :func:`attribute`); ``other`` is the step's
time outside every class (the Python between modules, and the hooks' own share).
Operator categories sum the self time of the ATen operators (matmul, attention, normalization,
...). Both are reported in ms per call and as fractions of the profiled step, beside the
unprofiled latency, so the profiler's overhead is visible.

Only forward passes are attributed to modules: a ``train_step``'s backward and optimizer step
are one class each (the operator view splits them further).
"""

from __future__ import annotations

import bisect
import gc
import re
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.nn as nn
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function

from ..model.gpt import GPT, AttentionCore, ParallelResidual, Residual, TiedLMHead
from ..schema import MODULE_CLASSES, OTHER, STAGE_CLASSES

STEP = "step"
# ATen operator name patterns (first match wins) → category
OPERATOR_CATEGORIES = (
    ("attention", re.compile(r"scaled_dot_product|flash_attention|efficient_attention|"
                             r"_cudnn_attention")),
    ("matmul", re.compile(r"addmm|\bmm\b|::mm|bmm|matmul|linear|baddbmm|quantized|"
                          r"dynamic")),
    ("normalization", re.compile(r"layer_norm|rms_norm")),
    ("activation", re.compile(r"gelu|silu|relu")),
    ("softmax", re.compile(r"softmax")),
    ("embedding", re.compile(r"embedding|index_select")),
    ("optimizer", re.compile(r"_foreach|adam|lerp|addcdiv|addcmul")),
    ("copy_layout", re.compile(r"copy_|contiguous|clone|_to_copy|::to$|cat|slice|view|"
                               r"transpose|reshape|permute|expand|chunk|split|select|t$|"
                               r"unsafe|as_strided|empty|zeros|fill")),
    ("elementwise", re.compile(r"add|mul|sub|div|neg|pow|sqrt|exp|tanh|where|argmax|max|"
                               r"roll|mean|sum")),
)


def module_class(name: str, module: nn.Module) -> str | None:
    """The breakdown class of one module of a fixed GPT, by its name and type (None: a
    container, timed through its children)."""
    leaf = name.rsplit(".", 1)[-1]
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, (nn.LayerNorm, nn.RMSNorm)):
        return "norm"
    if isinstance(module, AttentionCore):
        return "attention_core"
    if isinstance(module, TiedLMHead) or name == "lm_head":
        return "lm_head"
    if isinstance(module, (ParallelResidual, Residual)):
        return "residual"
    if isinstance(module, (nn.GELU, nn.SiLU)):
        return "mlp_activation"
    if ".attn." in f".{name}" and leaf == "qkv":
        return "qkv_proj"
    if ".attn." in f".{name}" and leaf == "proj":
        return "out_proj"
    if ".mlp." in f".{name}" and leaf in ("fc", "gate", "up"):
        return "mlp_up"
    if ".mlp." in f".{name}" and leaf == "proj":
        return "mlp_down"
    return None


@contextmanager
def collector_paused() -> Iterator[None]:
    """Collect garbage now and not during the block: a collection inside a profiled step (ms
    in a process holding many objects) would be charged to ``other`` (as ``timeit`` does)."""
    gc.collect()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


@contextmanager
def labelled_modules(model: GPT) -> Iterator[None]:
    """Record a profiler range named by its class around every forward of a labelled module."""
    handles = []
    for name, module in model.named_modules():
        label = module_class(name, module)
        if label is None:
            continue
        ranges: list[record_function] = []

        def enter(_module: nn.Module, _args: Any, label: str = label,
                  ranges: list[record_function] = ranges) -> None:
            ranges.append(record_function(label))
            ranges[-1].__enter__()

        def leave(_module: nn.Module, _args: Any, _out: Any,
                  ranges: list[record_function] = ranges) -> None:
            ranges.pop().__exit__(None, None, None)

        handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def operator_category(name: str) -> str:
    """The category of an ATen operator name."""
    for category, pattern in OPERATOR_CATEGORIES:
        if pattern.search(name):
            return category
    return OTHER


def _duration_ms(event: Any, cuda: bool) -> float:
    """An event's time in ms: its kernels' device time on CUDA, its host time on the CPU."""
    return (event.device_time_total if cuda else event.cpu_time_total) / 1000


def _self_ms(event: Any, cuda: bool) -> float:
    return (event.self_device_time_total if cuda else event.self_cpu_time_total) / 1000


def profiled_steps(call: Callable[[], Any], repeats: int, device: torch.device, name: str
                   ) -> profile:
    """The profiler after ``repeats`` calls, each in a range ``name`` that waits for the call's
    kernels on CUDA (which the profiler then records too)."""
    cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for _ in range(repeats):
            with record_function(name):
                call()
                if cuda:  # inside the range: its host time spans the kernels too
                    torch.cuda.synchronize(device)
    return prof


def profile_breakdown(model: GPT, call: Callable[[], Any], repeats: int,
                      device: torch.device) -> dict[str, Any]:
    """Per-call ms of each module class and operator category over ``repeats`` profiled
    calls, with the profiled step time; the model must be the eager module ``call`` runs."""
    cuda = torch.device(device).type == "cuda"
    with labelled_modules(model), collector_paused():
        call()  # warm the hooks and the profiler-free path once
        prof = profiled_steps(call, repeats, torch.device(device), STEP)
    step, modules, operators = attribute(list(prof.events()), cuda)
    if step <= 0:
        raise RuntimeError("the profiler recorded no step time")
    modules[OTHER] = max(step - sum(modules.values()), 0.0)
    return {"step_ms": step / repeats,
            "modules": {k: v / repeats for k, v in modules.items()},
            "operators": {k: v / repeats for k, v in operators.items()}}


def _enclosing(ranges: list[Any], starts: list[float], at: float) -> Any | None:
    """The range (of ``ranges``, sorted by their ``starts``) that started last before ``at``,
    if it has not ended by then: the innermost one holding ``at``, ranges being disjoint or
    nested."""
    i = bisect.bisect_right(starts, at) - 1
    return ranges[i] if i >= 0 and ranges[i].time_range.end >= at else None


def attribute(events: list[Any], cuda: bool
              ) -> tuple[float, dict[str, float], dict[str, float]]:
    """The profiled steps' total ms, and the ms of each module class and operator category in
    them, from the profiler's events.

    Ranges are read on the CPU side (a range's projection on the GPU timeline,
    ``gpu_user_annotation``, spans from its first kernel to its last, idle gaps and other
    ranges' kernels included: decode's queued launches overlap them), where on CUDA
    ``device_time_total`` sums the kernels that the range's own thread launched. A CUDA
    backward runs on autograd's device thread, not on the thread that opened the ``step`` and
    ``backward`` ranges: there, each outermost event (an autograd node with its operators)
    is charged by time to the step and to the range of the step's thread that holds its start.
    Operator categories sum the ATen operators' self time on every thread."""
    cpu = [e for e in events if e.device_type == DeviceType.CPU and not e.is_async]
    steps = sorted((e for e in cpu if e.name == STEP), key=lambda e: e.time_range.start)
    own = {e.thread for e in steps}
    classes = sorted((e for e in cpu if e.thread in own
                      and (e.name in MODULE_CLASSES or e.name in STAGE_CLASSES)),
                     key=lambda e: e.time_range.start)
    modules: dict[str, float] = defaultdict(float)
    operators: dict[str, float] = defaultdict(float)
    step = sum(_duration_ms(e, cuda) for e in steps)
    for event in classes:
        modules[event.name] += _duration_ms(event, cuda)
    for event in cpu:
        if event.name.startswith("aten::") and (not cuda or event.self_device_time_total):
            operators[operator_category(event.name)] += _self_ms(event, cuda)
    if cuda:  # host time of other threads overlaps the step's own: only kernels are added
        step_starts = [e.time_range.start for e in steps]
        class_starts = [e.time_range.start for e in classes]
        for event in cpu:
            if event.thread in own or event.cpu_parent is not None:
                continue
            at, ms = event.time_range.start, _duration_ms(event, cuda)
            if ms <= 0 or _enclosing(steps, step_starts, at) is None:
                continue
            step += ms
            holder = _enclosing(classes, class_starts, at)
            if holder is not None:
                modules[holder.name] += ms
    return step, modules, operators
