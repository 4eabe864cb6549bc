"""The data stage's subcommand: ``hwgptbench data``."""

from __future__ import annotations

import argparse
import logging

from .. import layout
from ..options import Add, load_settings
from ..settings.sections import DataSettings

log = logging.getLogger("hwgptbench")


def cmd_data(args: argparse.Namespace) -> None:
    """Tokenize the corpus into token shards."""
    from ..outputs import check_output_dir
    from .build import build

    section = load_settings(args, DataSettings)
    out = check_output_dir(args.out or layout.data(section.name), "data")
    manifest = build(section, out)
    log.info("wrote %s: %d train / %d val tokens", out, manifest["splits"]["train"]["tokens"],
             manifest["splits"]["val"]["tokens"])


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("data", cmd_data)
    command.add_argument("--out", help="output folder (default: results/data/{data.name})")
