"""The ``ship-tables`` subcommand: a scale's perplexity table and device tables shipped with
the package (src/hwgptbench/published/), checksummed in its manifest."""

from __future__ import annotations

import argparse
import logging
import subprocess

from ..options import Add, load, params_int, space_of

log = logging.getLogger("hwgptbench")


def head_commit() -> str | None:
    """The commit checked out in the working directory's git repository, if any."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError):
        return None
    return done.stdout.strip()


def cmd_ship(args: argparse.Namespace) -> None:
    """Ship a scale's perplexity table and device tables with the package
    (src/hwgptbench/published/), checksummed in its manifest."""
    from . import FOLDER, ship

    config = load(args, ["spaces", "perplexity"])
    vocab = (args.vocab_size if args.vocab_size is not None
             else config.perplexity.hwgptbench.vocab_size)
    record = ship(args.scale, space_of(config, args.scale), vocab, args.perplexity,
                  args.device or [], args.folder or FOLDER, args.replace_devices,
                  ", ".join(args.measured_by) if args.measured_by else head_commit(), args.union)
    devices = ", ".join(f"{k} ({v['rows']} rows)" for k, v in record["devices"].items())
    log.info("shipped %s: perplexity %d rows; devices: %s", args.scale,
             record["perplexity"]["rows"], devices or "none")


def register(add: Add) -> None:
    """Add the subcommand through the CLI's ``add``."""
    command = add("ship-tables", cmd_ship)
    command.add_argument("--scale", required=True, help="search space of the tables")
    command.add_argument("--perplexity", help="perplexity table to ship, as hwgptbench "
                                              "import-perplexity writes it (default: keep "
                                              "the shipped one)")
    command.add_argument("--device", action="append", help="device table to ship, as the "
                                                           "measure stage writes it "
                                                           "(results/{scale}/measure/{label}"
                                                           ".parquet); repeatable")
    command.add_argument("--replace-devices", action="store_true",
                         help="drop the shipped devices not given with --device")
    command.add_argument("--union", action="store_true",
                         help="add each --device table's rows to its device's shipped table "
                              "(a given row replaces the shipped one of its arch and "
                              "condition) instead of replacing the table")
    command.add_argument("--vocab-size", type=params_int("perplexity", "hwgptbench", "vocab_size"),
                         help="vocabulary of the networks (default: "
                              "perplexity.hwgptbench.vocab_size)")
    command.add_argument("--folder", help="the shipped tables' folder (default: the package's)")
    command.add_argument("--measured-by", action="append",
                         help="commit of the code that measured the device tables; repeat it "
                              "for a table measured in several campaigns (default: the "
                              "checked-out commit)")
