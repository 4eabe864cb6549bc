"""Validation perplexity of sampled architectures with weights inherited from the supernet.

Every arch is scored on the same fixed, seeded set of validation windows, loaded once; the
supernet switches sub-network between archs without copying weights. The final supernet and
each of its snapshots (the training-step fidelities) score the archs on the same windows.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import polars as pl
import torch
from tqdm import tqdm

from ..model import SuperGPT
from ..settings.sections import PerplexitySettings
from ..space import Arch
from ..training.train import WindowSampler, load_supernet, step_rng

log = logging.getLogger(__name__)


def validation_batches(shards: Sequence[np.ndarray], block_size: int, batches: int, batch_size: int,
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



def evaluate_supernets(supernets: dict[int, Path], archs: Sequence[Arch],
                       val_shards: Sequence[np.ndarray], section: PerplexitySettings,
                       device: torch.device) -> pl.DataFrame:
    """:func:`evaluate` with the weights of each supernet file (keyed by its training steps),
    on the same validation batches drawn as the ``perplexity`` params ``section`` says.

    Columns arch_id, train_steps, val_loss, perplexity; by ascending train_steps, then archs.
    """
    tables = []
    batches: list[tuple[torch.Tensor, torch.Tensor]] = []
    for steps, path in sorted(supernets.items()):
        model, space = load_supernet(path, device)
        batches = batches or validation_batches(val_shards, space.block_size, section.batches,
                                                section.batch_size, section.seed)
        log.info("scoring %d archs with the supernet after %d steps (%s)", len(archs), steps,
                 path)
        table = evaluate(model, archs, batches, device)
        del model  # before the next file is loaded
        tables.append(table.select("arch_id", pl.lit(steps, dtype=pl.Int64).alias("train_steps"),
                                   "val_loss", "perplexity"))
    return pl.concat(tables)
