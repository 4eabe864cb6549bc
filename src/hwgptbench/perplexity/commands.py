"""The perplexity stage's subcommand: ``hwgptbench perplexity``."""

from __future__ import annotations

import argparse
import logging

import polars as pl

from ..io import write_parquet
from ..options import Add, load_settings, scale_and_data
from ..schema import fully_trained
from ..settings.sections import PerplexitySettings
from ..space import read_archs

log = logging.getLogger("hwgptbench")


def cmd_perplexity(args: argparse.Namespace) -> None:
    """Validation perplexity of the sampled archs with inherited supernet weights, for the
    final supernet and each of its snapshots (the training-step fidelities)."""
    from ..evaluation.perplexity import evaluate_supernets
    from ..tokens.shards import TokenShards
    from ..training.train import resolve_device, supernet_files

    section = load_settings(args, PerplexitySettings)
    device = resolve_device(section.device)
    supernets = supernet_files(args.supernet)
    shards = TokenShards.open(args.data)
    scores = evaluate_supernets(supernets, read_archs(args.archs), shards.split("val"),
                                section, device)
    table = pl.read_parquet(args.archs).select("arch_id", "kind", "params").join(
        scores, on="arch_id", maintain_order="right")
    write_parquet(table.drop("kind"), args.out)
    final = fully_trained(table)
    ends = dict(zip(final["kind"], final["perplexity"], strict=True))
    log.info("perplexity after %d steps: smallest %.2f, largest %.2f; "
             "Spearman(params, perplexity) = %.3f over %d archs; snapshots at steps %s",
             max(supernets), ends["smallest"], ends["largest"],
             final.select(pl.corr("params", "perplexity", method="spearman")).item(),
             final.height, list(supernets)[:-1] or "none")


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("perplexity", cmd_perplexity)
    scale_and_data(command)
    command.add_argument("--supernet", required=True,
                         help="supernet.pt of the train stage (its snapshots beside it are "
                              "scored too)")
    command.add_argument("--archs", required=True, help="archs table of the sample stage")
    command.add_argument("--out", required=True, help="perplexity table (parquet)")
