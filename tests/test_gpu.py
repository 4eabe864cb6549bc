"""GPU paths of the model half: bf16 sandwich training and inherited evaluation on CUDA.

Marked `gpu`: deselected by default, skipped without CUDA (`pytest -m gpu`)."""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from hwgptbench.evaluation import perplexity
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training import train
from test_train import CONFIG, SMALL_SPACE

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]


def test_bf16_training_and_evaluation_on_cuda(shakespeare: Path, tmp_path: Path) -> None:
    shards = TokenShards.open(shakespeare)
    cfg = replace(CONFIG, device="cuda", steps=20, checkpoint_every=10)
    path = train.train(cfg, SMALL_SPACE, shards, tmp_path / "out", tmp_path / "work")
    model, space = train.load_supernet(path, "cuda")
    batches = perplexity.validation_batches(shards.split("val"), space.block_size, 2, 4, seed=0)
    table = perplexity.evaluate(model, [space.smallest(), space.largest()], batches,
                                torch.device("cuda"))
    assert all(math.isfinite(p) and p > 1 for p in table["perplexity"])
    assert torch.cuda.max_memory_allocated() > 0
