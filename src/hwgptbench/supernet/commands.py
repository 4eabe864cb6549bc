"""The supernet stage's subcommands: ``hwgptbench sample`` and ``hwgptbench train``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import polars as pl

from .. import layout
from ..errors import UserError
from ..io import write_parquet
from ..options import (
    Add,
    load,
    load_settings,
    scale_and_data,
    scale_and_vocab,
    space_of,
    vocab_size,
)
from ..settings.sections import SampleSettings, SupernetSettings

log = logging.getLogger("hwgptbench")


def cmd_train(args: argparse.Namespace) -> None:
    """Train the weight-sharing supernet of one scale (sandwich rule; resumes)."""
    from ..tokens.shards import TokenShards
    from ..training import train

    settings = load_settings(args, SupernetSettings)
    space = space_of(load(args, ["spaces"]), args.scale)
    shards = TokenShards.open(args.data, verify=True)
    out = Path(args.out or layout.supernet_dir(args.scale))
    work = Path(args.work_dir or layout.train_work(args.scale))
    train.train(settings, space, shards, out, work)


def cmd_sample(args: argparse.Namespace) -> None:
    """Sample the architectures that later stages evaluate and measure."""
    from . import archs

    section = load_settings(args, SampleSettings)
    space = space_of(load(args, ["spaces"]), args.scale)
    vocab = vocab_size(args)
    pools = [(f"archs of {table}", pl.read_parquet(table, columns=["arch_id"])["arch_id"])
             for table in args.from_table or []]
    if section.archs_of:
        pools.append((f"archs the shipped table of {section.archs_of} measured",
                      shipped_archs(args.scale, section.archs_of)))
    if pools:
        others = [set(ids) for _, ids in pools[1:]]
        candidates = [i for i in pools[0][1].unique(maintain_order=True)
                      if all(i in ids for ids in others)]
        table = archs.sample_from(space, candidates, section.n_archs, section.seed, vocab)
        pool = f"{len(candidates)} " + " and ".join(what for what, _ in pools)
    else:
        table = archs.sample_table(space, section.n_archs, section.seed, vocab)
        pool = f"{space.size()} archs of the {args.scale} space"
    write_parquet(table, args.out or layout.archs(args.scale))
    log.info("sampled %d archs of the %s space (from %s)", len(table), args.scale, pool)


def shipped_archs(scale: str, label: str) -> pl.Series:
    """The archs of a device's table shipped in the package (``sample.archs_of``)."""
    from .. import published

    tables = published.device_tables(scale) if scale in published.scales() else {}
    if label not in tables:
        raise UserError(f"sample.archs_of: {label!r} has no table shipped at scale {scale!r} "
                        f"(shipped: {', '.join(sorted(tables)) or 'none'}); name one of them, "
                        "or null to sample from the space")
    return tables[label]["arch_id"]


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("train", cmd_train)
    scale_and_data(command)
    command.add_argument("--out", help="output folder (default: results/{scale}/supernet)")
    command.add_argument("--work-dir", help="resumable checkpoints (default: "
                                            "results/{scale}/.train)")
    command = add("sample", cmd_sample)
    scale_and_vocab(command)
    command.add_argument("--from-table", action="append",
                         help="sample among the archs of this table (e.g. imported "
                              "perplexities) instead of the space; repeated: those of all")
    command.add_argument("--out", help="archs table (default: results/{scale}/archs.parquet)")
