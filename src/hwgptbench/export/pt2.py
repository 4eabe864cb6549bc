"""``model.pt2``: the fixed GPT as a ``torch.export`` program, token ids (batch, seq) to logits,
with a dynamic batch and a dynamic sequence length up to the block size; fp32, CPU."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import Tensor
from torch.export import Dim, ExportedProgram

from ..model import GPT
from .check import Logits

FILE = "model.pt2"


def trace(model: GPT) -> ExportedProgram:
    """The ``torch.export`` program of model (CPU, fp32): ids (batch, seq <= block_size) to
    logits."""
    block_size = model.config.block_size
    example = torch.zeros((2, min(8, block_size)), dtype=torch.long)
    dims = {0: Dim("batch", min=1), 1: Dim("seq", min=1, max=block_size)}
    with torch.no_grad():
        return torch.export.export(model.eval(), (example,), dynamic_shapes=(dims,))


def save(program: ExportedProgram, folder: Path) -> list[Path]:
    """Write ``model.pt2``; the files written."""
    path = folder / FILE
    torch.export.save(program, path)
    return [path]


def load(folder: Path) -> Logits:
    """ids -> logits of the ``model.pt2`` in folder (``torch.export.load`` unpickles: load only
    exports written here, docs/security.md)."""
    module = torch.export.load(folder / FILE).module()

    @torch.no_grad()
    def run(ids: Tensor) -> Tensor:
        return module(ids)

    return run
