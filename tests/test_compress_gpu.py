"""GPU paths of the compression stage: bf16 fine-tuning of an imported llama supernet, prefill
throughput of sub-networks timed with CUDA events, and quantization reported per device.

Marked `gpu`: deselected by default, skipped without CUDA (`pytest -m gpu -s` prints the
numbers)."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
import torch

from hwgptbench.compress.dense import pretrain
from hwgptbench.compress.evaluate import SubnetEvaluator
from hwgptbench.compress.finetune import finetune
from hwgptbench.compress.table import FAIR_REFERENCE, compression_table
from hwgptbench.evaluation.perplexity import validation_batches
from hwgptbench.space import Arch, SearchSpace
from hwgptbench.tokens.shards import TokenShards
from hwgptbench.training.train import LOSS_TABLE, load_supernet
from test_compress import IMPORTANCE, SPACE, TIMING, training

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

CUDA = torch.device("cuda")
# a model big enough for a GPU to be busy: E 512, 8 layers, 8 query heads over 2 kv heads
GPU_SPACE = SPACE | {"embed_dim": [512], "n_layer": [4, 8], "n_head": [4, 8], "head_size": 64,
                     "mlp_ratio": [1.5, 3], "block_size": 256}


def test_bf16_finetune_on_cuda(shakespeare: Path, tmp_path: Path) -> None:
    space = SearchSpace.from_dict("gpu", GPU_SPACE)
    shards = TokenShards.open(shakespeare)
    dense = pretrain(space, training(40, random_subnets=0, lr=1e-3, device="cuda",
                                     batch_size=16), shards, tmp_path / "dense.pt",
                     tmp_path / "wd")
    path = finetune(dense, space, training(20, device="cuda", batch_size=16), shards,
                    IMPORTANCE, tmp_path / "ft", tmp_path / "wf")
    loss = pl.read_parquet(tmp_path / "ft" / LOSS_TABLE)
    largest = loss.filter(pl.col("kind") == "largest")["loss"]
    print(f"\nbf16 fine-tune: largest loss {largest[0]:.3f} -> {largest[-1]:.3f}")
    assert largest.is_finite().all() and largest[-5:].mean() < largest[:5].mean() + 0.5
    supernet, _ = load_supernet(path, CUDA)
    assert next(supernet.parameters()).dtype == torch.float32  # fp32 master weights


def test_subnetwork_throughput_and_quantization_on_cuda(shakespeare: Path) -> None:
    space = SearchSpace.from_dict("gpu", GPU_SPACE)
    torch.manual_seed(0)
    from hwgptbench.model import SuperGPT

    supernet = SuperGPT(space, 4096).to(CUDA).eval()
    val = TokenShards.open(shakespeare).split("val")
    timing = TIMING.model_copy(update={"batch_size": 8, "seq_len": 256, "warmup": 5,
                                       "min_repeats": 20, "max_repeats": 200,
                                       "max_seconds": 1.0})
    evaluator = SubnetEvaluator(supernet, validation_batches(val, 256, 2, 4, 0), None, timing,
                                CUDA)
    small = Arch(512, 4, (4,) * 4, (1.5,) * 4, False)
    fast, slow = evaluator.speed(small), evaluator.speed(space.largest())
    print(f"\nprefill 8x256 on {torch.cuda.get_device_name()}: small "
          f"{fast['tokens_per_s']:.0f} tok/s, largest {slow['tokens_per_s']:.0f} tok/s")
    assert fast["tokens_per_s"] > slow["tokens_per_s"] > 0
    table = compression_table(supernet.extract(space.largest()).eval(), evaluator,
                              [(FAIR_REFERENCE, space.largest().id), ("small", small.id)],
                              ["int8_dynamic"])
    int8 = table.filter(pl.col("quant") == "int8_dynamic")
    assert int8["size_mb"].is_null().all() and (int8["reason"].str.contains("CPU")).all()
    assert table.filter(pl.col("quant") == "none")["throughput_x"].is_not_null().all()
