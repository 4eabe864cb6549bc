"""The transfer stage's subcommands: ``transfer`` (leave-one-target-out quality) and
``adapt`` (surrogates of a new device from k measured archs)."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from .. import layout
from ..adaptation.targets import TransferError
from ..io import write_parquet
from ..options import (
    Add,
    load,
    load_settings,
    one_of,
    params_int,
    scale_and_results,
    scale_and_vocab,
    space_of,
    vocab_size,
    vocab_source,
)
from ..settings.sections import PaperSettings, TransferSettings
from ..space import read_archs

if TYPE_CHECKING:
    from .adapt import MeasuredHere

log = logging.getLogger("hwgptbench")


def cmd_transfer(args: argparse.Namespace) -> None:
    """Leave-one-target-out quality of few-shot transfer to a new device or condition; where
    the scale ships tables of two devices or more, also across those devices."""
    from .. import published
    from .evaluate import evaluate, evaluate_shipped, report, shipped_per_target, shipped_tables

    section = load_settings(args, TransferSettings)
    tables = [pl.read_parquet(path) for path in [args.measurements, *args.runtime]]
    quality = evaluate(pl.concat(tables, how="diagonal_relaxed"),
                       space_of(load(args, ["spaces"]), args.scale), vocab_size(args), section)
    shipped = shipped_tables(args.scale)
    if shipped:
        log.info("transfer across the shipped %s tables: %s", args.scale, ", ".join(shipped))
        quality = pl.concat([quality, evaluate_shipped(
            shipped, published.space(args.scale), published.vocab_size(args.scale), section)])
    summary = report(quality, section.report_k)
    write_parquet(quality, args.out)
    write_parquet(summary, args.summary_out)
    log.info("wrote %s: %d rows, and %s", args.out, quality.height, args.summary_out)
    for origin, metric, hold_out, reason in quality.filter(
            pl.col("status") == "skipped", pl.col("method").is_null()).select(
            "tables", "metric", "hold_out", "reason").unique(maintain_order=True).iter_rows():
        print(f"{origin}: {metric}{f' (hold out {hold_out})' if hold_out else ''}: "
              f"not evaluated: {reason}")
    with pl.Config(tbl_rows=100, tbl_cols=16, tbl_width_chars=200, float_precision=3):
        print(summary.filter("reported").select(
            "tables", "metric", "hold_out", "method", "selection", "k", "targets",
            "spearman_median", "spearman_worst", "kendall_tau_median", "within_10pct_median",
            "within_10pct_worst", "mdape_median", "mdape_worst"))
    if shipped:
        with pl.Config(tbl_rows=100, tbl_cols=16, tbl_width_chars=250, float_precision=3,
                       fmt_str_lengths=40):
            print(f"shipped {args.scale} tables, Spearman ρ per target at k = "
                  f"{section.report_k} (mean over seeds):")
            print(shipped_per_target(quality, section.report_k))


def cmd_adapt(args: argparse.Namespace) -> None:
    """Adapt the hardware surrogates to a new device from k measured archs (measured on this
    machine, or read from --measurements), for `Benchmark.query` and `hwgptbench query`; print
    each surrogate's estimated error (leave-one-out, and on --validate archs)."""
    from .. import published
    from ..campaign.shard import device_label
    from ..outputs import check_output_dir
    from .adapt import (
        SOURCE_COLUMNS,
        SUMMARY,
        NothingAdapted,
        adapt_device,
        adaptation_space,
        candidate_archs,
        default_sources,
        measure_for_adaptation,
    )
    from .measurements import read_measurements

    out = Path(layout.adapted(args.scale, args.results))
    if args.measurements:  # else the label is this machine's, known once it is measured
        check_output_dir(out / layout.check_label(args.device, "--device"), "adapt", "--device")
        published.check_unshipped_label(args.scale, args.device, "--device")
    config = load(args, ["transfer", "measure", "spaces"])
    section = config.transfer
    space = adaptation_space(args.scale, config.spaces)
    vocab = adaptation_vocab(args)
    k = args.k or section.report_k
    selection = args.selection or section.selection
    sources = (read_measurements(args.sources, space, "--sources", SOURCE_COLUMNS)
               if args.sources else default_sources(args.scale, args.results, space))
    device, fit_archs, here = args.device, None, None
    if args.measurements:
        target = read_measurements(args.measurements, space)
    else:
        measure = config.measure
        device = device_label(measure.model_copy(update={"device": device}), measure.threads)
        if args.device == "auto":
            device = published.unshipped_label(args.scale, device)
        published.check_unshipped_label(args.scale, device, "--device")
        candidates = (read_archs(args.archs) if args.archs
                      else candidate_archs(args.scale, args.results))
        here = measure_for_adaptation(
            measure, space, candidates, vocab, device, k, selection, section.seed,
            args.validate, layout.adapt_progress(args.scale, device, args.results),
            args.max_minutes)
        target, fit_archs = here.table, here.fit_archs
    resume = "" if here is None else _resume(args, device, here)
    if not target.height:
        raise TransferError(f"nothing measured on {device} within --max-minutes "
                            f"{args.max_minutes:g}{resume}")
    try:
        adapted = adapt_device(section, space, vocab, sources, target, device, k, out,
                               args.method, selection, args.validate, fit_archs)
    except NothingAdapted as nothing:
        raise TransferError(f"{nothing}{resume}") from None
    print_estimate(adapted.written, device, out / device / SUMMARY)
    print_coverage(adapted.coverage)
    written = adapted.written
    if here is not None and here.parts is not None:
        if here.unfinished or not adapted.coverage["adapted"].all():
            print(resume.strip())
        else:
            here.parts.remove()
    print(f"query it: hwgptbench query --scale {args.scale} --results {args.results} "
          f"--device {device} --metric {written[0]['metric']} --metric perplexity "
          f"--arch ARCH_ID --interval")


def _resume(args: argparse.Namespace, device: str, here: MeasuredHere) -> str:
    """What was left unmeasured, where the measured rows are kept and the command that
    resumes (it measures only what is missing and times the contended rows again)."""
    command = ["hwgptbench", "adapt", "--scale", args.scale, "--device", device,
               "--k", str(args.k), "--validate", str(args.validate),
               "--max-minutes", f"{args.max_minutes:g}"]
    for flag in ("results", "archs", "sources", "method", "selection", "vocab_size", "data"):
        value = getattr(args, flag, None)
        if value is not None and not (flag == "results" and value == layout.RESULTS):
            command += [f"--{flag.replace('_', '-')}", str(value)]
    for path in args.params or []:
        command += ["--params", str(path)]
    unfinished = (f"\nnot measured within --max-minutes {args.max_minutes:g}: "
                  f"{', '.join(here.unfinished)}" if here.unfinished else "")
    kept = here.parts.root if here.parts is not None else "nowhere"
    return (f"{unfinished}\nthe rows measured are kept in {kept}; resume (it measures only "
            f"what is missing and times the contended rows again): {shlex.join(command)}")


def adaptation_vocab(args: argparse.Namespace) -> int:
    """--vocab-size, else that of --data; without either, a scale whose tables ship takes their
    vocabulary (the networks its sources were measured with), another the data stage's."""
    from .. import published

    if args.vocab_size or args.data or args.scale not in published.scales():
        return vocab_size(args)
    return published.vocab_size(args.scale)


def _percent(name: str) -> pl.Expr:
    """A column of fractions (null where not measured) as percentages, ``{name}_%``."""
    return (pl.col(name).cast(pl.Float64) * 100).alias(f"{name}_%")


def print_estimate(written: list[dict[str, Any]], device: str, summary: Path) -> None:
    """The adapted surrogates, each with its estimated error (percentages)."""
    table = pl.DataFrame(written).select(
        "metric", "condition", "measured", "k", "method", "sources", _percent("loo_error"),
        "validation_archs", pl.col("spearman").cast(pl.Float64), _percent("within_10pct"),
        _percent("mdape"), _percent("coverage"))
    with pl.Config(tbl_rows=100, tbl_cols=16, fmt_str_lengths=60, tbl_width_chars=200,
                   float_precision=3, tbl_hide_dataframe_shape=True):
        print(f"adapted {device} ({Path(summary).parent}); estimated error of each surrogate:")
        print(table)
    print("loo_error: RMS leave-one-out error on the k archs (relative; floored by "
          "transfer.sigma_floor: the interval's scale)")
    if not table["validation_archs"].sum():
        print("no validation archs: --validate N measures N more archs (or takes N rows of "
              "--measurements beyond the k) and scores the surrogate on them")
    else:
        print("spearman, within_10%, mdape, coverage: on the validation archs, which the fit "
              "did not see")
    print(f"written to {summary}")


def print_coverage(table: pl.DataFrame) -> None:
    """Per metric and condition measured: its rows, how many were usable and whether it was
    adapted (and why not)."""
    with pl.Config(tbl_rows=100, tbl_cols=16, fmt_str_lengths=90, tbl_width_chars=220,
                   tbl_hide_dataframe_shape=True):
        print("measured rows per metric and condition (contended latencies are not usable):")
        print(table)


def measured_archs(text: str) -> int:
    """--k: a whole number of measured archs, at least the 2 that a fit needs (at most the
    params schema's bound of transfer.report_k)."""
    from ..params import schema_at

    most = schema_at(["transfer", "report_k"])["maximum"]
    try:
        k = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if not 2 <= k <= most:
        raise argparse.ArgumentTypeError(f"{k} is not in [2, {most}]: a fit needs 2 measured "
                                         "archs or more")
    return k


def positive_minutes(text: str) -> float:
    """--max-minutes: a number of minutes above 0."""
    try:
        minutes = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes") from None
    if not minutes > 0 or minutes == float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of minutes above 0")
    return minutes


def validation_archs(text: str) -> int:
    """--validate: 0 (none) or a whole number of validation archs from 2 (a rank needs two)."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n != 0 and n < 2:
        raise argparse.ArgumentTypeError(f"{n} is neither 0 nor 2 or more: Spearman's ρ needs "
                                         "2 archs or more")
    return n


def table_count(text: str) -> tuple[str, int]:
    """--drop-first: TABLE:N, a table's name and a whole number of archs from 0."""
    name, colon, count = text.rpartition(":")
    if not colon or not name or not count.isdigit():
        raise argparse.ArgumentTypeError(f"{text!r} is not TABLE:N (N a whole number from 0)")
    return name, int(count)


def external_method(name: str) -> str:
    """--methods: a transfer method or a baseline (imported only when the flag is given)."""
    from ..adaptation.methods import METHODS
    from .evaluate import BASELINES

    if name not in (*METHODS, *BASELINES):
        raise argparse.ArgumentTypeError(f"{name!r} is not one of "
                                         f"{', '.join((*METHODS, *BASELINES))}")
    return name


def cmd_transfer_external(args: argparse.Namespace) -> None:
    """Few-shot transfer on other projects' public latency data (HELP's FBNet, HAT) and on
    device tables, beside their published numbers: a markdown report and the quality rows;
    with no data given, the report says it was skipped and how to add the data."""
    from ..io import atomic_write_text
    from ..outputs import make_dirs
    from .external import ExternalDataError
    from .external_eval import check_ks
    from .external_report import SKIPPED, data_sets, drop_first, evaluate

    external = load_settings(args, PaperSettings).external
    out = Path(args.out_dir)
    ks = args.ks if args.ks is not None else external.ks
    seeds = args.seeds if args.seeds is not None else external.seeds
    report_k = args.report_k if args.report_k is not None else external.report_k
    if report_k not in ks:
        raise ExternalDataError(
            f"--report-k {report_k} is not one of --ks {' '.join(map(str, ks))} (the report "
            "is at one of the k evaluated; params: paper.external.report_k and ks): add it "
            "to --ks or choose one of them")
    runs = data_sets(args.help_fbnet if args.help_fbnet is not None else external.help_fbnet,
                     args.hat if args.hat is not None else external.hat, args.gpt)
    tables = {name for data, _ in runs for name in data.tables}
    for name, count in args.drop_first:
        if name not in tables:
            raise ExternalDataError(f"--drop-first {name}:{count}: no table {name!r} in the "
                                    f"data given (tables: {', '.join(sorted(tables))})")
        for data, _ in runs:
            if name in data.tables:
                if count >= len(data.tables[name].keys):
                    raise ExternalDataError(f"--drop-first {name}:{count}: the table has "
                                            f"{len(data.tables[name].keys)} archs; leave some")
                data.tables[name] = drop_first(data.tables[name], count)
    splits = {split.name for _, splits in runs for split in splits}
    unknown = sorted(set(args.only) - splits)
    if unknown:
        raise ExternalDataError(f"--only {' '.join(unknown)}: no such split of the data given "
                                f"(splits: {', '.join(sorted(splits)) or 'none'})")
    for data, splits_of in runs:
        for split in splits_of:
            if not args.only or split.name in args.only:
                check_ks(data, split, ks)
    make_dirs(out)
    if not runs:
        log.warning("transfer-external: %s", SKIPPED.strip())
        atomic_write_text(out / "external.md", SKIPPED)
        return
    scored = evaluate(runs, ks, seeds, report_k, args.only, args.methods)
    write_parquet(scored.quality, out / "quality.parquet")
    write_parquet(scored.summary, out / "summary.parquet")
    atomic_write_text(out / "external.md", scored.markdown)
    print(scored.markdown)


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("transfer", cmd_transfer)
    scale_and_vocab(command)
    command.add_argument("--measurements", required=True,
                         help="the measurements table of the scale (all devices)")
    command.add_argument("--runtime", nargs="*", default=[],
                         help="runtime tables: their workloads and options are targets too")
    command.add_argument("--out", required=True, help="quality table (parquet)")
    command.add_argument("--summary-out", required=True,
                         help="its summary at transfer.report_k (parquet)")
    command = add("adapt", cmd_adapt)
    scale_and_results(command)
    command.add_argument("--device", required=True,
                         help="label of the new device (measuring here: auto, this machine's "
                              "label, that label extended by a word, or an alias of it in "
                              "measure.aliases; a label of a shipped table is refused, and "
                              "auto then takes {label}-local)")
    command.add_argument("--k", type=measured_archs,
                         help="measured archs to adapt from, 2 or more (default: "
                              "transfer.report_k)")
    command.add_argument("--measurements", help="the new device's measured rows (parquet); "
                                                "default: measure k archs on this machine")
    command.add_argument("--archs", help="candidate archs to measure (default: "
                                         "{results}/{scale}/archs.parquet, else the archs of "
                                         "the scale's shipped perplexity table)")
    command.add_argument("--sources", help="measurements of the source devices (default: "
                                           "{results}/{scale}/measurements.parquet and the "
                                           "scale's shipped device tables)")
    command.add_argument("--validate", type=validation_archs, default=0,
                         help="archs to validate on, 2 or more: measured here besides the k "
                              "(or rows of --measurements beyond the k); default: none")
    command.add_argument("--max-minutes", type=positive_minutes, default=20.0,
                         help="bound on the measuring (default 20): past it no arch or timing "
                              "cycle starts; what was measured is kept and a rerun resumes")
    command.add_argument("--method", type=one_of("hwgptbench.adaptation.methods", "METHODS"),
                         help="adaptation method (default: transfer.method; docs/transfer.md)")
    command.add_argument("--selection",
                         type=one_of("hwgptbench.transfer.selection", "SELECTIONS"),
                         help="which archs to measure (default: transfer.selection)")
    vocab_source(command)
    command = add("transfer-external", cmd_transfer_external)
    command.add_argument("--help-fbnet", help="HELP's data/fbnet folder (default: "
                                              "paper.external.help_fbnet)")
    command.add_argument("--hat", help="HAT's latency_dataset folder, *_all.csv (default: "
                                       "paper.external.hat)")
    command.add_argument("--gpt", nargs="+", default=[],
                         help="device tables of several devices of one scale (this project's)")
    command.add_argument("--ks", type=params_int("paper", "external", "ks"), nargs="+",
                         help="measured archs of the held-out device, each fewer than the "
                              "archs it is drawn from (default: paper.external.ks)")
    command.add_argument("--seeds", type=params_int("paper", "external", "seeds"),
                         help="default: paper.external.seeds")
    command.add_argument("--report-k", type=params_int("paper", "external", "report_k"),
                         help="one of --ks (default: paper.external.report_k)")
    command.add_argument("--drop-first", nargs="+", default=[], metavar="TABLE:N",
                         type=table_count,
                         help="leave out the first N archs of a table (a sensitivity check "
                              "of rows suspected of a measurement artefact)")
    command.add_argument("--only", nargs="+", default=[], metavar="SPLIT",
                         help="evaluate only these splits (names as in the report)")
    command.add_argument("--methods", nargs="+", default=None, metavar="NAME",
                         type=external_method,
                         help="methods and baselines to score (default: all)")
    command.add_argument("--out-dir", required=True,
                         help="folder of external.md, quality.parquet and summary.parquet")
