"""The runtime stage's subcommands: ``runtime`` (this machine) and ``merge-runtime``."""

from __future__ import annotations

import argparse
import logging

from ..options import Add, load, load_settings, scale_and_vocab, space_of, vocab_size
from ..settings.sections import MeasureSettings, RuntimeSettings
from ..space import read_archs

log = logging.getLogger("hwgptbench")


def cmd_runtime(args: argparse.Namespace) -> None:
    """Time workloads under runtime options and break their time down by module, here."""
    from ..campaign.shard import device_label
    from ..meters.device import freeze_survivors
    from .stage import RuntimeTables, measure_runtime, write_runtime

    freeze_survivors()
    measure = load_settings(args, MeasureSettings)
    space = space_of(load(args, ["spaces"]), args.scale)
    label = device_label(measure.model_copy(update={"device": args.device or measure.device}),
                         measure.threads)
    tables = measure_runtime(
        load_settings(args, RuntimeSettings), measure.threads, space, read_archs(args.archs),
        vocab_size(args), label, measure.aliases)
    paths = RuntimeTables(args.out, args.breakdown_out, args.serving_out, args.parallel_out)
    write_runtime(tables, paths)
    for table, path in zip(tables, paths, strict=True):
        log.info("wrote %s (%d rows) on %s", path, table.height, label)


def cmd_merge_runtime(args: argparse.Namespace) -> None:
    """Merge the runtime and breakdown tables of every device of a scale."""
    from .merge import merge_tables

    for tables, out in ((args.runtime, args.out), (args.breakdown, args.breakdown_out),
                        (args.serving, args.serving_out), (args.parallel, args.parallel_out)):
        log.info("wrote %s (%d rows)", out, merge_tables(tables, out).height)


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("runtime", cmd_runtime)
    scale_and_vocab(command)
    command.add_argument("--device", help="device label, or auto (default: measure.device)")
    command.add_argument("--archs", required=True, help="archs table of the sample stage")
    command.add_argument("--out", required=True, help="runtime table (parquet)")
    command.add_argument("--breakdown-out", required=True, help="breakdown table (parquet)")
    command.add_argument("--serving-out", required=True, help="serving sweep table (parquet)")
    command.add_argument("--parallel-out", required=True,
                         help="parallel train step table, one row per rank (parquet)")
    command = add("merge-runtime", cmd_merge_runtime, params=False)
    command.add_argument("--runtime", nargs="*", default=[], help="runtime tables")
    command.add_argument("--breakdown", nargs="*", default=[], help="breakdown tables")
    command.add_argument("--serving", nargs="*", default=[], help="serving sweep tables")
    command.add_argument("--parallel", nargs="*", default=[], help="parallel train step tables")
    command.add_argument("--out", required=True, help="merged runtime table (parquet)")
    command.add_argument("--breakdown-out", required=True, help="merged breakdown table")
    command.add_argument("--serving-out", required=True, help="merged serving sweep table")
    command.add_argument("--parallel-out", required=True, help="merged parallel table")
