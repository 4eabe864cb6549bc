"""The search stage's subcommands: ``search-reference``, ``search`` and ``search-summary``."""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from .. import params
from ..io import atomic_write_json, write_parquet
from ..options import Add, load_settings, one_of, params_int, scale_and_results
from ..outputs import check_output_dir
from ..settings.sections import SearchSettings, SurrogateSettings

if TYPE_CHECKING:
    from ..moo.problem import Problem

log = logging.getLogger("hwgptbench")


def _search_problem(args: argparse.Namespace) -> tuple[SearchSettings, Problem]:
    """The search section and the problem of --objectives on --device."""
    from ..api import Benchmark
    from ..moo.problem import make_problem

    config = load_settings(args, SearchSettings)
    family = load_settings(args, SurrogateSettings).default_family
    if args.objectives not in config.objective_sets:
        raise params.ParamsError(f"--objectives {args.objectives!r} is not a key of "
                                 f"search.objective_sets ({', '.join(config.objective_sets)})")
    bench = Benchmark.load(args.scale, args.results, family=family, source=args.source)
    return config, make_problem(bench, list(config.objective_sets[args.objectives]),
                                args.device, config.condition)


def cmd_search_reference(args: argparse.Namespace) -> None:
    """Scaling, reference point and reference Pareto front of one objective set on a device."""
    from ..moo.reference import compute_reference, save_reference

    check_output_dir(args.out, "search-reference")
    config, problem = _search_problem(args)
    reference, front = compute_reference(problem, config.reference_archs, config.reference_seed)
    save_reference(reference, front, args.out)
    log.info("wrote %s: %d front archs, hypervolume %.4f", args.out,
             int(front["on_front"].sum()), reference.hypervolume)


def cmd_search(args: argparse.Namespace) -> None:
    """Run one search algorithm for every seed against the surrogate benchmark."""
    import torch
    from threadpoolctl import threadpool_limits

    from ..moo.reference import load_reference
    from ..moo.runner import run_seeds

    check_output_dir(args.out, "search")
    config, problem = _search_problem(args)
    torch.set_num_threads(args.threads)
    # every thread pool of the job (BLAS, OpenMP) too: searches run side by side, one a core
    with threadpool_limits(args.threads):
        run_seeds(problem, load_reference(args.reference), args.algorithm, config.budget,
                  range(config.seeds), config.options, args.out,
                  {"objectives": args.objectives, "device": args.device})
    log.info("wrote %s: %d runs of %s", args.out, config.seeds, args.algorithm)


def cmd_search_summary(args: argparse.Namespace) -> None:
    """The final reference fronts (stored references united with every run's archive), every
    run scored against them, final hypervolume per run, per-algorithm summary, attainment
    surfaces, rank tests (Friedman, critical difference, pairwise Wilcoxon-Holm), the EAF
    difference of the best two algorithms, DVC metrics."""
    from ..moo import compare, summary
    from ..moo.reference import load_front, load_reference
    from .front import final_fronts

    config = load_settings(args, SearchSettings)
    references = [(load_reference(f), load_front(f)) for f in args.references]
    runs, stages, fronts = final_fronts(summary.read_runs(args.inputs), references,
                                        config.objective_sets)
    final = summary.final_runs(runs)
    table = summary.summarize(final)
    out = Path(args.out_dir)
    write_parquet(runs, out / "runs.parquet")
    write_parquet(stages, out / "reference.parquet")
    write_parquet(fronts, out / "front.parquet")
    write_parquet(final, out / "final.parquet")
    write_parquet(table, out / "summary.parquet")
    write_parquet(summary.attainment(runs, config.objective_sets), out / "attainment.parquet")
    comparisons = compare.comparison_tables(runs, final, config.objective_sets)
    for name, comparison in comparisons.items():
        write_parquet(comparison, out / f"{name}.parquet")
    atomic_write_json(args.metrics_out, summary.metrics_document(table))
    with pl.Config(tbl_rows=100, tbl_width_chars=160):
        print(stages.drop("metrics", "ideal", "nadir"))
        print(table)
        print(comparisons["friedman"])


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    for name, func in (("search-reference", cmd_search_reference), ("search", cmd_search)):
        command = add(name, func)
        scale_and_results(command)
        command.add_argument("--objectives", required=True, help="key of search.objective_sets")
        command.add_argument("--device", required=True,
                             help="device label of the hardware metrics")
        command.add_argument("--out", required=True, help="output folder")
        command.add_argument("--source", choices=["results", "published"], default="results",
                             help="results: the run's surrogates under --results; published: "
                                  "the tables shipped with the package (their surrogates "
                                  "fitted once under --results/published/)")
    command.add_argument("--algorithm", required=True,
                         type=one_of("hwgptbench.search_algorithms", "ALGORITHMS"),
                         help="search algorithm (docs/search.md)")
    command.add_argument("--reference", required=True, help="folder of search-reference")
    command.add_argument("--threads", type=params_int("measure", "threads"), default=1,
                         help="torch threads (default: 1)")
    command = add("search-summary", cmd_search_summary)
    command.add_argument("--out-dir", required=True, help="folder of the summary tables")
    command.add_argument("--metrics-out", required=True, help="DVC metrics file (JSON)")
    command.add_argument("--references", nargs="+", required=True,
                         help="folders of search-reference, one per objective set and device")
    command.add_argument("inputs", nargs="+", help="algorithm folders of search runs")
