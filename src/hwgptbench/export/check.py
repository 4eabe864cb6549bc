"""Checks of an export: whether a format applies, and whether the exported model computes the
logits of the model it came from."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ..errors import UserError
from ..model import GPT

Logits = Callable[[Tensor], Tensor]
# Largest abs difference of the logits allowed per format (fp32 on CPU): the exported program
# runs the same kernels; ONNX Runtime and transformers run their own.
TOLERANCE = {"pt2": 1e-5, "onnx": 1e-4, "hf": 1e-4}


class FormatUnavailableError(UserError, ValueError):
    """A format asked for that cannot hold the arch, or whose optional libraries are missing."""


def check_inputs(model: GPT, seed: int = 0) -> list[Tensor]:
    """Token ids (batch, seq) of a few shapes: one token, a short batch, the whole context."""
    config = model.config
    generator = torch.Generator().manual_seed(seed)
    shapes = [(1, 1), (2, min(9, config.block_size)), (1, config.block_size)]
    return [torch.randint(config.vocab_size, shape, generator=generator) for shape in shapes]


@torch.no_grad()
def reference_logits(model: GPT, inputs: Sequence[Tensor]) -> list[Tensor]:
    """The model's eager logits of each input."""
    return [model(ids) for ids in inputs]


@torch.no_grad()
def compare(run: Logits, inputs: Sequence[Tensor], expected: Sequence[Tensor],
            tolerance: float) -> dict[str, Any]:
    """The largest abs difference of run's logits from the expected ones, over all inputs."""
    diff = max(float((run(ids).float() - want).abs().max())
               for ids, want in zip(inputs, expected, strict=True))
    return {"max_abs_diff": diff, "tolerance": tolerance, "passed": diff <= tolerance,
            "shapes": [list(ids.shape) for ids in inputs]}
