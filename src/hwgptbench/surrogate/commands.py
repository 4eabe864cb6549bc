"""The surrogate stage's subcommands: ``fit-surrogates`` and ``merge-quality``."""

from __future__ import annotations

import argparse
import logging

import polars as pl

from ..options import Add, load, load_settings, scale_and_vocab, space_of, vocab_size
from ..settings.sections import SurrogateSettings

log = logging.getLogger("hwgptbench")


def cmd_fit_surrogates(args: argparse.Namespace) -> None:
    """Fit and cross-validate the surrogates of one device's table, or of perplexity."""
    from ..outputs import check_output_dir
    from ..predictors.fitting import fit_device, fit_perplexity

    check_output_dir(args.out, "fit-surrogates")
    section = load_settings(args, SurrogateSettings)
    space, vocab = space_of(load(args, ["spaces"]), args.scale), vocab_size(args)
    if args.perplexity:
        quality = fit_perplexity(section, space, vocab, pl.read_parquet(args.perplexity),
                                 args.out)
    else:
        tables = [pl.read_parquet(path) for path in [args.measurements, *args.runtime]]
        quality = fit_device(section, space, vocab, pl.concat(tables, how="diagonal_relaxed"),
                             args.out)
    log.info("wrote %s: %d surrogates", args.out, quality.filter(pl.col("status") == "ok").height)


def cmd_merge_quality(args: argparse.Namespace) -> None:
    """Merge surrogate quality tables into one table and a DVC metrics file."""
    from .stage import merge_quality

    quality = merge_quality(args.inputs, args.scale, args.out, args.metrics_out)
    with pl.Config(tbl_rows=100, tbl_cols=12, tbl_width_chars=200):
        print(quality.filter(pl.col("status") == "ok").select(
            "metric", "device", "condition", "family", "rows", "r2", "kendall_tau",
            "within_5pct", "mdape", "max_ape", "coverage", "selected"))


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("fit-surrogates", cmd_fit_surrogates)
    scale_and_vocab(command)
    table = command.add_mutually_exclusive_group(required=True)
    table.add_argument("--measurements", help="a device table (fits hardware metrics)")
    table.add_argument("--perplexity", help="the perplexity table (fits perplexity)")
    command.add_argument("--runtime", nargs="*", default=[],
                         help="the device's runtime tables, fitted with --measurements")
    command.add_argument("--out", required=True, help="output folder")
    command = add("merge-quality", cmd_merge_quality, params=False)
    command.add_argument("--scale", default="tiny", help="search space (default: %(default)s)")
    command.add_argument("--out", required=True, help="quality table (parquet)")
    command.add_argument("--metrics-out", required=True, help="DVC metrics file (JSON)")
    command.add_argument("inputs", nargs="+", help="quality tables to merge")
