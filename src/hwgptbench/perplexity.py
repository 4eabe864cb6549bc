"""Validation perplexity of sampled architectures with weights inherited from the supernet.

Every arch is scored on the same fixed, seeded set of validation windows, loaded once; the
supernet switches sub-network between archs without copying weights.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from .model import SuperGPT
from .space import Arch
from .train import WindowSampler, step_rng

log = logging.getLogger(__name__)


def validation_batches(shards: list[np.ndarray], block_size: int, batches: int, batch_size: int,
                       seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` fixed (x, y) batches of validation windows, drawn from ``seed``."""
    sampler = WindowSampler(shards, block_size)
    rng = step_rng(seed)
    return [sampler.sample(rng, batch_size) for _ in range(batches)]


@torch.inference_mode()
def evaluate(model: SuperGPT, archs: Sequence[Arch],
             batches: list[tuple[torch.Tensor, torch.Tensor]], device: torch.device
             ) -> pl.DataFrame:
    """Mean validation loss and perplexity of each arch: arch_id, val_loss, perplexity."""
    model.eval()
    on_device = [(x.to(device), y.to(device)) for x, y in batches]
    losses = []
    for arch in tqdm(archs, desc="perplexity", unit="arch", mininterval=2.0):
        model.set_arch(arch)
        total = sum(float(model(x, y)[1]) for x, y in on_device)
        losses.append(total / len(on_device))
    model.reset_arch()
    return pl.DataFrame({"arch_id": [a.id for a in archs], "val_loss": losses,
                         "perplexity": [math.exp(v) for v in losses]})
