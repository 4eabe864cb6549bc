"""What the surrogate benchmarks share: the arguments and the device table they fit on.

Imported by the scripts beside it (run from the repository root, `python benchmarks/...`).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import polars as pl

from hwgptbench import params
from hwgptbench.space import SearchSpace
from hwgptbench.tokens.shards import TokenShards


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--measurements (a device table), --runtime (its runtime table), --params, --scale."""
    parser.add_argument("--measurements", required=True)
    parser.add_argument("--runtime", default=None)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--scale", default="tiny")


def load(args: argparse.Namespace) -> tuple[dict[str, Any], SearchSpace, int, pl.DataFrame]:
    """The params, the scale's space, the data stage's vocabulary size and the device table
    (with its runtime rows when --runtime is given)."""
    config = params.load(args.params)
    space = SearchSpace.from_dict(args.scale, config["spaces"][args.scale])
    folder = Path("results/data") / config["data"]["name"]
    vocab = TokenShards.open(folder).manifest["tokenizer"]["vocab_size"]
    table = pl.read_parquet(args.measurements)
    if args.runtime:
        table = pl.concat([table, pl.read_parquet(args.runtime)], how="diagonal_relaxed")
    return config, space, vocab, table
