"""The `hwgptbench` command line: one thin subcommand per workflow stage.

Snakemake rules call these subcommands, so a stage runs the same from the workflow, a
cluster job or a shell. Each command imports the stage modules it runs (torch, LightGBM,
BoTorch and DVC take seconds to load), so that a command starts with only what it needs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from . import __version__, data, io, params
from .compress import commands as compress_commands
from .data import commands as data_commands
from .errors import UserError
from .hwgpt_import import commands as hwgpt_import_commands
from .measure import commands as measure_commands
from .perplexity import commands as perplexity_commands
from .runtime import commands as runtime_commands
from .space import SearchSpace, read_archs
from .supernet import commands as supernet_commands
from .surrogate import commands as surrogate_commands

if TYPE_CHECKING:
    from .search import Problem

log = logging.getLogger("hwgptbench")

def _one_of(module: str, registry: str) -> Callable[[str], str]:
    """An argparse type accepting a key of ``module.registry``, imported only when the option
    is given."""
    def check(name: str) -> str:
        choices = getattr(importlib.import_module(module, __package__), registry)
        if name not in choices:
            raise argparse.ArgumentTypeError(f"{name!r} is not one of "
                                             f"{', '.join(sorted(choices))}")
        return name
    return check


def _params_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", action="append",
                        help="params file: params.yaml, or section files written by the "
                             "workflow under results/.params/ (repeat to merge several); "
                             "default: params.yaml")


def _load(args: argparse.Namespace, sections: list[str]) -> dict:
    """The validated params sections a command reads."""
    return params.merge_files(args.params or ["params.yaml"], sections)


def _space(config: dict, scale: str) -> SearchSpace:
    if scale not in config["spaces"]:
        raise params.ParamsError(f"unknown scale '{scale}'; the params define the spaces "
                                 f"{', '.join(config['spaces'])}")
    return SearchSpace.from_dict(scale, config["spaces"][scale])


def cmd_validate(args: argparse.Namespace) -> None:
    """Check params.yaml against the schema."""
    for path in args.params or ["params.yaml"]:
        params.load(path)
        print(f"{path}: valid")


def _vocab_size(args: argparse.Namespace) -> int:
    """--vocab-size, else that of --data (default: the data stage's folder of the params)."""
    if args.vocab_size:
        return int(args.vocab_size)
    folder = args.data or f"results/data/{_load(args, ['data'])['data']['name']}"
    return data.TokenShards.open(folder).manifest["tokenizer"]["vocab_size"]


def cmd_transfer(args: argparse.Namespace) -> None:
    """Leave-one-target-out quality of few-shot transfer to a new device or condition."""
    from . import transfer

    config = _load(args, ["transfer", "spaces"])
    section = config["transfer"]
    tables = [pl.read_parquet(path) for path in [args.measurements, *args.runtime]]
    quality = transfer.evaluate(pl.concat(tables, how="diagonal_relaxed"),
                                _space(config, args.scale), _vocab_size(args), section)
    summary = transfer.summarize(quality, [section["report_k"]])
    io.write_parquet(quality, args.out)
    io.write_parquet(summary, args.summary_out)
    log.info("wrote %s: %d rows, and %s", args.out, quality.height, args.summary_out)
    for metric, hold_out, reason in quality.filter(
            pl.col("status") == "skipped", pl.col("method").is_null()).select(
            "metric", "hold_out", "reason").unique(maintain_order=True).iter_rows():
        print(f"{metric}{f' (hold out {hold_out})' if hold_out else ''}: not evaluated: "
              f"{reason}")
    with pl.Config(tbl_rows=100, tbl_cols=16, tbl_width_chars=200, float_precision=3):
        print(summary.select(
            "metric", "hold_out", "method", "selection", "k", "targets", "spearman_median",
            "spearman_worst", "kendall_tau_median", "within_10pct_median",
            "within_10pct_worst", "mdape_median", "mdape_worst"))


def cmd_adapt(args: argparse.Namespace) -> None:
    """Adapt the hardware surrogates to a new device from k measured archs (measured on this
    machine, or read from --measurements), for `Benchmark.query` and `hwgptbench query`."""
    from .api import ADAPTED
    from .measure import stage as measurements
    from .transfer.adapt import adapt_device, measure_for_adaptation

    config = _load(args, ["transfer", "measure", "spaces"])
    section, space, vocab_size = config["transfer"], _space(config, args.scale), _vocab_size(args)
    root = Path(args.results) / args.scale
    k = args.k or section["report_k"]
    selection = args.selection or section["selection"]
    sources = pl.read_parquet(args.sources or root / "measurements.parquet")
    device = args.device
    if args.measurements:
        target = pl.read_parquet(args.measurements)
    else:
        measure = config["measure"]
        device = measurements.device_label({**measure, "device": device}, measure["threads"])
        candidates = read_archs(args.archs or root / "archs.parquet")
        target = measure_for_adaptation(measure, space, candidates, vocab_size, device, k,
                                        selection, section["seed"])
    written = adapt_device(section, space, vocab_size, sources, target, device, k,
                           root / ADAPTED, args.method, selection)
    with pl.Config(tbl_rows=100, fmt_str_lengths=100, tbl_width_chars=200):
        print(pl.DataFrame(written))
    print(f"query it: hwgptbench query --scale {args.scale} --results {args.results} "
          f"--device {device} --metric {written[0]['metric']} "
          f"--condition {written[0]['condition']} --arch ARCH_ID")


def cmd_query(args: argparse.Namespace) -> None:
    """Predicted (or measured) metrics of archs on a device."""
    from .api import Benchmark, QueryError

    bench = Benchmark.load(args.scale, args.results, family=args.family)
    ids = list(args.arch or [])
    if args.archs_file:
        ids += [line.strip() for line in Path(args.archs_file).read_text().splitlines()
                if line.strip()]
    if not ids:
        raise QueryError("give archs with --arch ID (repeatable) or --archs-file FILE")
    table = bench.query(ids, args.metric, device=args.device, condition=args.condition,
                        mode=args.mode, return_interval=args.interval,
                        fidelity=args.fidelity)
    if args.mode == "surrogate":
        for row in bench.used().iter_rows(named=True):
            log.info("%s on %s, %s: %s surrogate", row["metric"], row["device"],
                     row["condition"], row["family"])
    if args.out:
        out = Path(args.out)
        if out.suffix == ".csv":
            table.write_csv(out)
        else:
            io.write_parquet(table, out)
        log.info("wrote %s: %d rows", out, table.height)
    else:
        with pl.Config(tbl_rows=len(table), fmt_str_lengths=60, tbl_width_chars=160):
            print(table)


def _search_problem(args: argparse.Namespace) -> tuple[dict, Problem]:
    """The search section and the problem of --objectives on --device."""
    from . import search
    from .api import Benchmark

    loaded = _load(args, ["search", "surrogate"])
    config, family = loaded["search"], loaded["surrogate"]["default_family"]
    if args.objectives not in config["objective_sets"]:
        raise params.ParamsError(f"--objectives {args.objectives!r} is not a key of "
                                 f"search.objective_sets ({', '.join(config['objective_sets'])})")
    bench = Benchmark.load(args.scale, args.results, family=family)
    return config, search.make_problem(bench, config["objective_sets"][args.objectives],
                                       args.device, config["condition"])


def cmd_search_reference(args: argparse.Namespace) -> None:
    """Scaling, reference point and reference Pareto front of one objective set on a device."""
    from . import search

    config, problem = _search_problem(args)
    reference, front = search.compute_reference(problem, config["reference_archs"],
                                                config["reference_seed"])
    search.save_reference(reference, front, args.out)
    log.info("wrote %s: %d front archs, hypervolume %.4f", args.out, front.height,
             reference.hypervolume)


def cmd_search(args: argparse.Namespace) -> None:
    """Run one search algorithm for every seed against the surrogate benchmark."""
    import torch

    from . import search
    from .search.algorithms import options_of

    config, problem = _search_problem(args)
    torch.set_num_threads(args.threads)
    search.run_seeds(problem, search.load_reference(args.reference), args.algorithm,
                     config["budget"], range(config["seeds"]),
                     options_of(args.algorithm, config["options"]), args.out,
                     {"objectives": args.objectives, "device": args.device})
    log.info("wrote %s: %d runs of %s", args.out, config["seeds"], args.algorithm)


def cmd_search_summary(args: argparse.Namespace) -> None:
    """Final hypervolume per run, per-algorithm summary, attainment surfaces, DVC metrics."""
    from .search import summary

    config = _load(args, ["search"])["search"]
    runs = summary.read_runs(args.inputs)
    final = summary.final_runs(runs)
    table = summary.summarize(final)
    out = Path(args.out_dir)
    io.write_parquet(final, out / "final.parquet")
    io.write_parquet(table, out / "summary.parquet")
    io.write_parquet(summary.attainment(runs, config["objective_sets"]),
                      out / "attainment.parquet")
    io.atomic_write_json(args.metrics_out, summary.metrics_document(table))
    with pl.Config(tbl_rows=100, tbl_width_chars=160):
        print(table)


def cmd_figures(args: argparse.Namespace) -> None:
    """Figures, tables and DVC plot files of a scale, from its result tables only."""
    from . import report

    report.render(Path(args.results) / args.scale, args.runs)


def cmd_unlock_stale(args: argparse.Namespace) -> None:
    """Remove the Snakemake and DVC locks of an interrupted run, when none still runs here."""
    from . import locks

    locks.clear_stale_locks(Path(args.project))


def cmd_pull(args: argparse.Namespace) -> None:
    """Fetch results from the DVC remote; mark those that are current up to date for Snakemake."""
    from . import sync

    sync.pull(args.targets, remote=args.remote)


def cmd_publish_device(args: argparse.Namespace) -> None:
    """Publish a device's measurement table (devices/{scale}/{label}.parquet) to the DVC remote."""
    from . import sync
    from .measure import stage as measurements

    section = _load(args, ["measure"])["measure"]
    label = args.device or measurements.device_label(section, section["threads"])
    pointer = sync.publish_device(args.scale, label, args.results, push=not args.no_push,
                                  remote=args.remote)
    print(f"published {label}; commit the pointer: git add {pointer} {pointer.parent}/.gitignore "
          f"&& git commit -m 'Measurements of {label}'")


def _scale_and_data(command: argparse.ArgumentParser) -> None:
    command.add_argument("--scale", default="tiny", help="search space (default: %(default)s)")
    command.add_argument("--data", required=True, help="data-stage output folder")


def _scale_and_vocab(command: argparse.ArgumentParser) -> None:
    command.add_argument("--scale", default="tiny", help="search space (default: %(default)s)")
    _vocab_source(command)


def _vocab_source(command: argparse.ArgumentParser) -> None:
    """--data or --vocab-size: where a command that builds archs takes the vocabulary size."""
    source = command.add_mutually_exclusive_group()
    source.add_argument("--data", help="data-stage folder, for the vocabulary size "
                                       "(default: results/data/{data.name})")
    source.add_argument("--vocab-size", type=int,
                        help="the vocabulary size instead of --data (perplexity.source "
                             "hwgptbench has no data stage: perplexity.hwgptbench.vocab_size)")


def _scale_and_results(command: argparse.ArgumentParser) -> None:
    command.add_argument("--scale", default="tiny", help="search space (default: %(default)s)")
    command.add_argument("--results", default="results", help="results folder (default: "
                                                              "%(default)s)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hwgptbench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hwgptbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], None], params: bool = True
            ) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=func.__doc__, description=func.__doc__)
        command.set_defaults(func=func)
        if params:
            _params_arg(command)
        return command

    add("validate", cmd_validate)
    data_commands.register(add)
    supernet_commands.register(add)
    perplexity_commands.register(add)
    measure_commands.register(add)
    runtime_commands.register(add)
    surrogate_commands.register(add)
    command = add("transfer", cmd_transfer)
    _scale_and_vocab(command)
    command.add_argument("--measurements", required=True,
                         help="the measurements table of the scale (all devices)")
    command.add_argument("--runtime", nargs="*", default=[],
                         help="runtime tables: their workloads and options are targets too")
    command.add_argument("--out", required=True, help="quality table (parquet)")
    command.add_argument("--summary-out", required=True,
                         help="its summary at transfer.report_k (parquet)")
    command = add("adapt", cmd_adapt)
    _scale_and_results(command)
    command.add_argument("--device", required=True,
                         help="label of the new device (measuring here: auto, this machine's "
                              "label or an alias of it in measure.aliases)")
    command.add_argument("--k", type=int, help="measured archs to adapt from (default: "
                                               "transfer.report_k)")
    command.add_argument("--measurements", help="the new device's measured rows (parquet); "
                                                "default: measure k archs on this machine")
    command.add_argument("--archs", help="candidate archs to measure (default: "
                                         "{results}/{scale}/archs.parquet)")
    command.add_argument("--sources", help="measurements of the source devices (default: "
                                           "{results}/{scale}/measurements.parquet)")
    command.add_argument("--method", type=_one_of(".transfer", "METHODS"),
                         help="adaptation method (default: transfer.method; docs/transfer.md)")
    command.add_argument("--selection", type=_one_of(".transfer", "SELECTIONS"),
                         help="which archs to measure (default: transfer.selection)")
    _vocab_source(command)
    command = add("query", cmd_query, params=False)
    _scale_and_results(command)
    command.add_argument("--device", help="device label (see the quality table; default: the "
                                          "only device)")
    command.add_argument("--metric", action="append", required=True,
                         help="metric, repeatable: perplexity, latency_ms, energy_mj, ...")
    command.add_argument("--condition", help="condition id, e.g. b1-t128-fp32-eager (default: "
                                             "the first the measure params define)")
    command.add_argument("--arch", action="append", help="arch id, repeatable")
    command.add_argument("--archs-file", help="file of arch ids, one per line")
    command.add_argument("--mode", choices=["surrogate", "measured"], default="surrogate")
    command.add_argument("--interval", action="store_true", help="add the surrogate's interval")
    command.add_argument("--fidelity", type=int, help="perplexity of the supernet after this "
                                                      "many training steps (default: fully "
                                                      "trained)")
    command.add_argument("--family", default="best",
                         help="surrogate family: best (per metric, device and condition, the "
                              "one its quality table selected) or lightgbm, mlp_ensemble, blend")
    command.add_argument("--out", help="write .parquet or .csv instead of printing")
    for name, func in (("search-reference", cmd_search_reference), ("search", cmd_search)):
        command = add(name, func)
        _scale_and_results(command)
        command.add_argument("--objectives", required=True, help="key of search.objective_sets")
        command.add_argument("--device", required=True,
                             help="device label of the hardware metrics")
        command.add_argument("--out", required=True, help="output folder")
    command.add_argument("--algorithm", required=True, type=_one_of(".search", "ALGORITHMS"),
                         help="search algorithm (docs/search.md)")
    command.add_argument("--reference", required=True, help="folder of search-reference")
    command.add_argument("--threads", type=int, default=1, help="torch threads (default: 1)")
    command = add("search-summary", cmd_search_summary)
    command.add_argument("--out-dir", required=True, help="folder of the summary tables")
    command.add_argument("--metrics-out", required=True, help="DVC metrics file (JSON)")
    command.add_argument("inputs", nargs="+", help="algorithm folders of search runs")
    command = add("figures", cmd_figures, params=False)
    _scale_and_results(command)
    command.add_argument("runs", nargs="+", help="algorithm folders of search runs")
    command = add("unlock-stale", cmd_unlock_stale, params=False)
    command.add_argument("--project", default=".", help="project folder (default: .)")
    command = add("pull", cmd_pull, params=False)
    command.add_argument("targets", nargs="*", help="stages to pull (default: all)")
    command.add_argument("--remote", help="DVC remote name (default: the configured default)")
    command = add("publish-device", cmd_publish_device)
    _scale_and_results(command)
    command.add_argument("--device", help="device label (default: this machine's, from the "
                                          "measure params)")
    command.add_argument("--no-push", action="store_true", help="dvc add only, push later")
    command.add_argument("--remote", help="DVC remote name (default: the configured default)")
    compress_commands.register(add)
    hwgpt_import_commands.register(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        args.func(args)
    except subprocess.CalledProcessError as exc:
        print(f"hwgptbench {args.command}: error: {' '.join(exc.cmd)} exited with "
              f"{exc.returncode}", file=sys.stderr)
        return 1
    except (UserError, FileNotFoundError) as exc:
        print(f"hwgptbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
