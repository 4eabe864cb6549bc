"""What a fine-tuning method costs on a fixed model: trainable parameters, step time, memory.

Each method starts from a fresh copy of the same weights (a model factory called once per
method: ``functools.partial(load_dense, path, device)`` for the compression stage's dense model,
:func:`hwgptbench.meters.runner.build_model` with a fixed seed in tests) and is timed on the
training step of the ``train_step`` workload (:mod:`hwgptbench.runtime.workloads`): forward
with the loss, backward, AdamW step over the trainable parameters, gradients set to None. The
weights stay fp32; ``bf16`` runs the forward under autocast (mixed precision, as training runs).

Methods (one row each):

- ``full``: every parameter trainable.
- ``lora``: LoRA adapters (``lora.r``, ``lora.alpha``, ``lora.targets``) on the targeted
  Linears, trained together with the vocabulary matrices (the token embedding and, in the
  llama family, the untied LM head; the gpt_neox head is tied to the embedding): what
  adapting to a new domain or vocabulary trains. Every other base weight is frozen.
- ``lora_frozen_embeddings``: the adapters alone, the whole base frozen (embeddings included):
  the plain LoRA of the paper (Hu et al., 2021) and peft's default. The two LoRA rows differ in
  exactly the embeddings, so their gap is the cost of training them; norms are frozen in both.

LoRA is peft's (``peft.LoraConfig`` and ``peft.inject_adapter_in_model``): it wraps any
``nn.Linear`` of a plain module in place, so the GPT's forward is unchanged, and it is the
implementation fine-tuning users run. Its ``B`` matrices start at zero, so a fresh LoRA model
computes the base model's logits exactly. Targets are Linear names matched as peft matches them
(the name or its dotted suffix): ``qkv`` and ``proj`` of attention, ``fc`` (gpt_neox) or ``gate``
and ``up`` (llama) and ``proj`` of the MLP; ``proj`` names both projections, ``attn.proj`` one.
peft is imported only when a LoRA method is measured (the ``finetune`` extra).

Memory (``memory_peak_mb``, MB = 2**20 bytes) is the peak of one step after a first step made
AdamW's state: the exact bytes held before the step (weights, buffers, optimizer state) plus the
peak growth of PyTorch's allocator during it (activations, gradients, optimizer temporaries):
on CUDA ``max_memory_allocated`` over ``memory_allocated`` before the step, on the CPU the
allocator's events (:func:`hwgptbench.meters.memory.cpu_allocation_peak`). Counting from the
step rather than from before the model was built leaves out cuBLAS's workspaces (64 MiB on an
H200, allocated through PyTorch's allocator by the first method's first step, so a baseline
before it charged them to that method alone), as the CPU count leaves out library scratch.
``optim_bytes`` is the exact size of AdamW's state tensors and ``grad_bytes`` that of the
gradients of the trainable parameters.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn as nn

from ..meters.device import DTYPES, dtype_unsupported_reason, release
from ..meters.latency import is_out_of_memory, measure_latency
from ..meters.memory import MB, cpu_allocation_peak, optimizer_bytes, tensor_bytes, tensors_bytes
from ..model import GPT
from ..settings.compress import LoraSettings
from ..training.step import TRAIN_LR, autocast

log = logging.getLogger(__name__)

METHODS = ("full", "lora", "lora_frozen_embeddings")
FINETUNE_DTYPES = ("fp32", "bf16")  # fp16 would need loss scaling
MISSING_PEFT = "LoRA fine-tuning needs the peft library: pip install 'hwgptbench[finetune]'"
COLUMNS = ("method", "rank", "alpha", "targets", "trainable_params", "total_params",
           "trainable_fraction", "step_ms", "tokens_per_s", "memory_peak_mb", "optim_bytes",
           "grad_bytes", "memory_reason", "dtype", "batch_size", "seq_len", "status", "reason")
METRICS = ("trainable_params", "total_params", "trainable_fraction", "step_ms", "tokens_per_s",
           "memory_peak_mb", "optim_bytes", "grad_bytes")


def _peft() -> Any:
    """The peft module, or an ImportError naming the extra that installs it."""
    try:
        import peft
    except ImportError as err:
        raise ImportError(MISSING_PEFT) from err
    return peft


def vocabulary_parameters(model: GPT) -> list[torch.Tensor]:
    """The token embedding's weight and, when untied (llama), the LM head's."""
    params = [model.wte.weight]
    if isinstance(model.lm_head, nn.Linear):
        params.append(model.lm_head.weight)
    return params


def prepare_model(model: GPT, method: str, lora: LoraSettings, seed: int) -> GPT:
    """model set up for method in place (see the module doc): adapters injected by peft for
    the LoRA methods (their ``A`` drawn from seed) and ``requires_grad`` set."""
    if method not in METHODS:
        raise ValueError(f"unknown fine-tuning method {method!r}, expected one of {METHODS}")
    if method == "full":
        return model.requires_grad_(True)
    peft = _peft()
    vocabulary = vocabulary_parameters(model)  # the same Parameters once peft wraps a Linear
    model.requires_grad_(False)  # the base frozen; the adapters peft adds are trainable
    config = peft.LoraConfig(r=lora.r, lora_alpha=lora.alpha, target_modules=list(lora.targets),
                             lora_dropout=0.0, bias="none")
    torch.manual_seed(seed)
    model = peft.inject_adapter_in_model(config, model)
    if method == "lora":
        for param in vocabulary:
            param.requires_grad_(True)
    return model


def trainable_parameters(model: nn.Module) -> list[torch.Tensor]:
    return [p for p in model.parameters() if p.requires_grad]


def _held_bytes(model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Bytes held between steps: weights, buffers, gradients left set and optimizer state."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    return tensor_bytes(model) + tensors_bytes(grads) + optimizer_bytes(optimizer)


def training_step(model: nn.Module, x: torch.Tensor, dtype: str
                  ) -> tuple[Callable[[], torch.Tensor], torch.optim.AdamW]:
    """One training step of model on token ids x (next-token targets), and its AdamW over the
    trainable parameters."""
    params = trainable_parameters(model)
    if not params:
        raise ValueError("the model has no trainable parameters")
    optimizer = torch.optim.AdamW(params, lr=TRAIN_LR)
    targets = torch.roll(x, -1, dims=1)

    def step() -> torch.Tensor:
        with autocast(dtype, x.device):
            _, loss = model(x, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss.detach()

    return step, optimizer


def _memory(step: Callable[[], Any], model: nn.Module, optimizer: torch.optim.Optimizer,
            device: torch.device) -> tuple[float | None, str | None]:
    """memory_peak_mb of one step and memory_reason (see the module doc)."""
    held = _held_bytes(model, optimizer)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        step()
        torch.cuda.synchronize(device)
        return (held + torch.cuda.max_memory_allocated(device) - before) / MB, None
    if device.type == "cpu":
        return (held + cpu_allocation_peak(step)) / MB, None
    return None, f"memory is measured on CPU and CUDA devices only, not {device.type}"


def _measure_method(model_factory: Callable[[], GPT], method: str, lora: LoraSettings,
                    x: torch.Tensor, dtype: str, warmup: int, repeats: int, seed: int
                    ) -> dict[str, Any]:
    """The metric fields of one method."""
    device = x.device
    model = model_factory().to(device=device, dtype=torch.float32)
    model = prepare_model(model, method, lora, seed).train()
    step, optimizer = training_step(model, x, dtype)
    step()  # AdamW's state exists from here on, as in any later step
    memory_peak_mb, memory_reason = _memory(step, model, optimizer, device)
    stats = measure_latency(step, device, warmup=warmup, min_repeats=repeats,
                            max_repeats=repeats, target_rel_ci=0.0, max_seconds=math.inf)
    trainable = trainable_parameters(model)
    n_trainable = sum(p.numel() for p in trainable)
    total = sum(p.numel() for p in model.parameters())
    step_ms = stats["latency_ms"]
    return {"trainable_params": n_trainable, "total_params": total,
            "trainable_fraction": n_trainable / total, "step_ms": step_ms,
            "tokens_per_s": x.numel() / (step_ms / 1000) if step_ms > 0 else None,
            "memory_peak_mb": memory_peak_mb, "optim_bytes": optimizer_bytes(optimizer),
            "grad_bytes": tensors_bytes(trainable), "memory_reason": memory_reason,
            "status": "ok", "reason": None}


def _failed(status: str, reason: str) -> dict[str, Any]:
    return {**dict.fromkeys(METRICS), "memory_reason": reason, "status": status,
            "reason": reason}


def measure_finetune_methods(model_factory: Callable[[], GPT], methods: Sequence[str],
                             lora: LoraSettings, vocab_size: int, batch_size: int,
                             seq_len: int, dtype: str = "fp32",
                             device: str | torch.device = "cpu", warmup: int = 2,
                             repeats: int = 5, seed: int = 0) -> list[dict[str, Any]]:
    """One row (:data:`COLUMNS`) per method: each method trains a fresh model from
    ``model_factory`` (which must return the same weights on every call) on seeded random
    token ids of shape (batch_size, seq_len); ``step_ms`` is the median of ``repeats`` steps
    after ``warmup`` more. A method the device cannot run gets status ``unsupported`` (or
    ``oom``) and null metrics."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown fine-tuning methods {unknown}, expected some of {METHODS}")
    if dtype not in FINETUNE_DTYPES:
        raise ValueError(f"fine-tuning dtype must be one of {FINETUNE_DTYPES}, got {dtype!r}")
    if repeats < 2 or warmup < 0:
        raise ValueError(f"need repeats >= 2 and warmup >= 0, got {repeats}, {warmup}")
    device = torch.device(device)
    if any(m != "full" for m in methods):
        _peft()  # fail before any measurement when peft is missing
    generator = torch.Generator().manual_seed(seed)
    x = torch.randint(vocab_size, (batch_size, seq_len), generator=generator).to(device)
    unsupported = dtype_unsupported_reason(DTYPES[dtype], device)
    rows = []
    for method in methods:
        lora_fields = ({"rank": None, "alpha": None, "targets": None} if method == "full" else
                       {"rank": lora.r, "alpha": lora.alpha, "targets": ",".join(lora.targets)})
        row = {"method": method, **lora_fields, "dtype": dtype, "batch_size": batch_size,
               "seq_len": seq_len}
        if unsupported is not None:
            rows.append({**row, **_failed("unsupported", unsupported)})
            continue
        try:
            row |= _measure_method(model_factory, method, lora, x, dtype, warmup, repeats, seed)
        except (RuntimeError, MemoryError) as err:
            if not is_out_of_memory(err):
                raise
            log.warning("fine-tuning %s: out of memory", method)
            row |= _failed("oom", f"out of memory: {err}".splitlines()[0])
        release(device)
        log.info("fine-tuning %s: %s trainable of %s parameters, step %s ms, peak %s MB", method,
                 row["trainable_params"], row["total_params"], row["step_ms"],
                 row["memory_peak_mb"])
        rows.append({column: row[column] for column in COLUMNS})
    return rows
