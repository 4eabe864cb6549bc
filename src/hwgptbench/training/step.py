"""What a timed training step shares with the training loop: the mixed-precision rule and the
learning rate of a timed step."""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from ..meters.device import DTYPES

TRAIN_LR = 1e-4


def autocast(dtype: str, device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Mixed precision of a training step: nothing for fp32, else autocast to ``dtype`` over
    the fp32 weights."""
    if dtype == "fp32":
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=DTYPES[dtype])
