"""The ``hwgptbench fetch-hwgptbench`` and ``hwgptbench import-perplexity`` subcommands:
HW-GPT-Bench's perplexity files imported with DVC, then converted to a perplexity table."""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from .. import layout
from ..hwgpt_source import FILES, REV, URL, VOCAB_SIZE
from ..options import Add, load, params_int, space_of

log = logging.getLogger(__name__)

FOLDER = "data/hwgptbench"


def cmd_fetch(args: argparse.Namespace) -> None:
    """Import HW-GPT-Bench's published perplexity files with `dvc import` (one pointer file
    per file, recording the repository and the commit)."""
    from .fetch import fetch

    pointers = fetch(args.scale, args.out, args.url, args.rev)
    folders = sorted({os.path.relpath(p.parent) for p in pointers})
    print(f"imported {len(pointers)} files into {args.out}; to version the pointers: git add "
          + " ".join(f"{folder}/*.dvc {folder}/.gitignore" for folder in folders))


def cmd_import(args: argparse.Namespace) -> None:
    """Convert HW-GPT-Bench's perplexity files of a scale to the perplexity table (one row per
    arch; duplicates and archs outside the space counted in a report)."""
    from .. import io
    from ..io import write_parquet
    from .convert import convert, locate, summary

    space = space_of(load(args, ["spaces"]), args.scale)
    paths, source, rev = locate(args.scale, args.files, args.source_url, args.rev)
    table, report = convert(space, paths, source, rev, args.train_steps, args.vocab_size)
    out = Path(args.out or layout.perplexity(args.scale))
    report_path = Path(args.report or out.with_suffix(".import.json"))
    write_parquet(table, out)
    io.atomic_write_json(report_path, report)
    counted = report["duplicates"]["archs"] or report["outside_space"]["rows"]
    log.log(logging.WARNING if counted else logging.INFO, "%s", summary(report))
    log.info("wrote %s (%d rows) and the report %s", out, table.height, report_path)


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("fetch-hwgptbench", cmd_fetch, params=False)
    command.add_argument("--scale", nargs="+", choices=list(FILES), default=list(FILES),
                         help="scales whose files to import (default: all)")
    command.add_argument("--url", default=URL, help="the repository, or a local clone of it "
                                                    "(default: %(default)s)")
    command.add_argument("--rev", default=REV, help="commit (default: %(default)s, the only "
                                                    "one that holds the files)")
    command.add_argument("--out", default=FOLDER, help="folder inside a DVC project; files "
                                                       "keep their repository paths (default: "
                                                       "%(default)s)")
    command = add("import-perplexity", cmd_import)
    command.add_argument("--scale", required=True, choices=list(FILES), help="search space")
    command.add_argument("--files", default=FOLDER, help="folder of the fetched files "
                                                         "(default: %(default)s)")
    command.add_argument("--source-url", help="repository named in the source column "
                                              "(default: the URL the files' DVC pointers "
                                              "record; needed with --rev where they have none)")
    command.add_argument("--rev", help="commit of the files (default: the one their DVC "
                                       "pointers record)")
    command.add_argument("--train-steps", type=params_int("supernet", "steps"), default=1,
                         help="train_steps of every row: the files do not record how long the "
                              "published supernet trained, so one fidelity (default: "
                              "%(default)s)")
    command.add_argument("--vocab-size", default=VOCAB_SIZE,
                         type=params_int("perplexity", "hwgptbench", "vocab_size"),
                         help="vocabulary size in the params column (default: %(default)s, "
                              "the published supernets' embedding rows)")
    command.add_argument("--out", help="perplexity table (default: "
                                       "results/{scale}/perplexity.parquet)")
    command.add_argument("--report", help="import report, JSON (default: beside --out, "
                                          ".import.json)")
