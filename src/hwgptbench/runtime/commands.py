"""The runtime stage's subcommands: ``runtime`` (this machine) and ``merge-runtime``."""

from __future__ import annotations

import argparse
import logging

from ..options import Add, load, scale_and_vocab, space_of, vocab_size
from ..space import read_archs

log = logging.getLogger("hwgptbench")


def cmd_runtime(args: argparse.Namespace) -> None:
    """Time workloads under runtime options and break their time down by module, here."""
    from ..measure.stage import device_label
    from .stage import measure_runtime, write_runtime

    config = load(args, ["measure", "runtime", "spaces"])
    space, measure = space_of(config, args.scale), config["measure"]
    label = device_label({**measure, "device": args.device or measure["device"]},
                         measure["threads"])
    table, breakdown = measure_runtime(
        config["runtime"], measure["threads"], space, read_archs(args.archs), vocab_size(args),
        label, measure["aliases"])
    write_runtime(table, breakdown, args.out, args.breakdown_out)
    log.info("wrote %s (%d rows) and %s (%d rows) on %s", args.out, table.height,
             args.breakdown_out, breakdown.height, label)


def cmd_merge_runtime(args: argparse.Namespace) -> None:
    """Merge the runtime and breakdown tables of every device of a scale."""
    from .stage import merge_tables

    table = merge_tables(args.runtime, args.out)
    breakdown = merge_tables(args.breakdown, args.breakdown_out)
    log.info("wrote %s (%d rows) and %s (%d rows)", args.out, table.height, args.breakdown_out,
             breakdown.height)


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("runtime", cmd_runtime)
    scale_and_vocab(command)
    command.add_argument("--device", help="device label, or auto (default: measure.device)")
    command.add_argument("--archs", required=True, help="archs table of the sample stage")
    command.add_argument("--out", required=True, help="runtime table (parquet)")
    command.add_argument("--breakdown-out", required=True, help="breakdown table (parquet)")
    command = add("merge-runtime", cmd_merge_runtime, params=False)
    command.add_argument("--runtime", nargs="*", default=[], help="runtime tables")
    command.add_argument("--breakdown", nargs="*", default=[], help="breakdown tables")
    command.add_argument("--out", required=True, help="merged runtime table (parquet)")
    command.add_argument("--breakdown-out", required=True, help="merged breakdown table")
