"""Full fine-tuning vs LoRA vs LoRA with frozen embeddings of one dense model, here.

The model is the largest arch of a one-arch space (default: a llama of embedding 1024,
8 layers, 16 heads, MLP ratio 3, vocabulary 32000; seeded weights, since cost does not depend
on them). Each method is timed in fp32 and bf16 autocast (bf16 only where the device has it)
with :func:`hwgptbench.compress.finetune_methods.measure_finetune_methods`; prints the table
with each method's ratios to full fine-tuning and writes it as CSV.

    python benchmarks/finetune_methods.py --out /tmp/finetune.csv [--embed 1024 --layers 8]
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import polars as pl
import torch

from hwgptbench.compress.finetune_methods import METHODS, measure_finetune_methods
from hwgptbench.meters.device import default_device
from hwgptbench.meters.runner import build_model
from hwgptbench.space import SearchSpace


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--embed", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--dtypes", nargs="+", default=["fp32", "bf16"])
    args = parser.parse_args()
    space = SearchSpace.from_dict("dense", {
        "embed_dim": [args.embed], "n_layer": [args.layers], "n_head": [args.heads],
        "mlp_ratio": [3], "bias": [False], "head_size": args.embed // args.heads,
        "block_size": args.seq, "rotary_fraction": 1.0, "family": "llama"})
    device = default_device()
    factory = functools.partial(build_model, space, space.largest(), args.vocab, 0, device,
                                torch.float32)
    lora = {"r": args.rank, "alpha": 2 * args.rank, "targets": ["qkv", "proj", "gate", "up"]}
    rows = []
    for dtype in args.dtypes:
        rows += measure_finetune_methods(factory, METHODS, lora, args.vocab, args.batch,
                                         args.seq, dtype, device, warmup=2, repeats=10)
    table = pl.DataFrame(rows, infer_schema_length=None)
    full = table.filter(pl.col("method") == "full").select(
        "dtype", pl.col("step_ms").alias("full_step_ms"),
        pl.col("memory_peak_mb").alias("full_memory_mb"))
    table = table.join(full, on="dtype").with_columns(
        (pl.col("step_ms") / pl.col("full_step_ms")).alias("step_vs_full"),
        (pl.col("memory_peak_mb") / pl.col("full_memory_mb")).alias("memory_vs_full"))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    table.write_csv(args.out)
    with pl.Config(tbl_rows=-1, tbl_cols=-1, tbl_width_chars=200):
        print(f"{device}: " + (torch.cuda.get_device_name(device) if device.type == "cuda"
                               else "cpu"))
        print(table.select("dtype", "method", "trainable_params", "trainable_fraction",
                           "step_ms", "step_vs_full", "memory_peak_mb", "memory_vs_full",
                           "status"))


if __name__ == "__main__":
    main()
