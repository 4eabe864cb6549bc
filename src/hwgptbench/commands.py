"""The ``query`` subcommand: predicted (or measured) metrics of archs on a device, through
:class:`~hwgptbench.api.Benchmark`, printed or written as a table."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import polars as pl

from .options import Add, scale_and_results
from .outputs import TABLE_SUFFIXES, check_output_file, write_table
from .space import Arch, InvalidArchError

log = logging.getLogger("hwgptbench")


def cmd_query(args: argparse.Namespace) -> None:
    """Predicted (or measured) metrics of archs on a device."""
    from .api import Benchmark, QueryError

    if args.out:
        check_output_file(args.out, "query", TABLE_SUFFIXES)
    ids = [Arch.from_id(arch_id).id for arch_id in args.arch or []]
    if args.archs_file:
        ids += archs_of_file(Path(args.archs_file))
    if not ids:
        raise QueryError("give archs with --arch ID (repeatable) or --archs-file FILE")
    bench = Benchmark.load(args.scale, args.results, family=args.family, source=args.source)
    table = bench.query(ids, args.metric, device=args.device, condition=args.condition,
                        mode=args.mode, return_interval=args.interval,
                        fidelity=args.fidelity)
    if args.mode == "surrogate":
        for row in bench.used().iter_rows(named=True):
            log.info("%s on %s, %s: %s surrogate", row["metric"], row["device"],
                     row["condition"], row["family"])
    if args.out:
        out = write_table(table, args.out, "query")
        log.info("wrote %s: %d rows", out, table.height)
    else:
        with pl.Config(tbl_rows=len(table), fmt_str_lengths=60, tbl_width_chars=160):
            print(table)


def archs_of_file(path: Path) -> list[str]:
    """The arch ids of a text file, one a line (blank lines skipped); a line that is no arch
    id is refused naming the file and the line."""
    from .io import read_outside_text

    try:
        lines = read_outside_text(path, "give a UTF-8 text file of arch ids, one a line",
                                  error=InvalidArchError).splitlines()
    except InvalidArchError as err:
        raise InvalidArchError(f"--archs-file {err}") from None
    ids = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                ids.append(Arch.from_id(line.strip()).id)
            except InvalidArchError as err:
                raise InvalidArchError(f"--archs-file {path}, line {number}: {err} (the file "
                                       "holds arch ids, one a line, no header)") from None
    return ids


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("query", cmd_query, params=False)
    scale_and_results(command)
    command.add_argument("--device", help="device label (see the quality table; default: the "
                                          "only device)")
    command.add_argument("--metric", action="append", required=True,
                         help="metric, repeatable: perplexity, latency_ms, energy_mj, ...")
    command.add_argument("--condition", help="condition id, e.g. b1-t128-fp32-eager (default: "
                                             "the first the measure params define)")
    command.add_argument("--arch", action="append", help="arch id, repeatable")
    command.add_argument("--archs-file", help="file of arch ids, one per line")
    command.add_argument("--mode", choices=["surrogate", "measured", "auto"],
                         default="surrogate", help="surrogate: predicted; measured: the "
                         "measured (or published) value, null where none; auto: measured "
                         "where there is one, else predicted (default: %(default)s)")
    command.add_argument("--source", choices=["auto", "results", "published"], default="auto",
                         help="results: the run's results; published: the tables shipped with "
                              "the package; auto: both for a shipped scale (its shipped devices "
                              "and those measured or adapted here; here wins for a label in "
                              "both), else the results (default: %(default)s)")
    command.add_argument("--interval", action="store_true", help="add the surrogate's interval")
    command.add_argument("--fidelity", type=int, help="perplexity of the supernet after this "
                                                      "many training steps (default: fully "
                                                      "trained)")
    command.add_argument("--family", default="best",
                         help="surrogate family: best (per metric, device and condition, the "
                              "one its quality table selected) or lightgbm, mlp_ensemble, blend")
    command.add_argument("--out", help="write .parquet or .csv instead of printing")
