"""The export subcommands: ``hwgptbench export`` writes a fixed sub-network (or dense model) as
model files (:mod:`hwgptbench.export.write`), ``hwgptbench export-pareto`` the compression's
Pareto sub-networks as the workflow asks (:mod:`hwgptbench.export.pareto`), ``hwgptbench
evaluate`` runs tasks on such an export folder (:mod:`hwgptbench.export.evaluate`)."""

from __future__ import annotations

import argparse
import logging

from ..options import Add, one_of

log = logging.getLogger("hwgptbench")

FORMAT_NAMES = "pt2, onnx, hf"  # hwgptbench.export.write.FORMATS, for the help (torch-free)


def cmd_export(args: argparse.Namespace) -> None:
    """Export one arch of a supernet (its sub-network) or a dense model file as model.pt2,
    model.onnx and a Hugging Face folder, each checked against the model's logits; manifest.json
    records the files, checks and formats skipped."""
    from ..outputs import check_output_dir
    from ..space import Arch
    from .write import export_arch, load_source

    Arch.from_id(args.arch)  # bad input is refused before the checkpoint is read
    check_output_dir(args.out, "export")
    model, info = load_source(args.checkpoint, args.arch)
    source = {"name": args.source_name, **info} if args.source_name else info
    manifest = export_arch(model, args.out, args.formats, source, args.tokenizer)
    done = [fmt for fmt, record in manifest["formats"].items() if "skipped" not in record]
    skipped = [fmt for fmt, record in manifest["formats"].items() if "skipped" in record]
    log.info("exported %s to %s: %s%s", manifest["arch"], args.out, ", ".join(done) or "nothing",
             f" (skipped {', '.join(skipped)}: see manifest.json)" if skipped else "")


def cmd_evaluate(args: argparse.Namespace) -> None:
    """Evaluate an export folder: the offline cloze and perplexity tasks on the data stage's
    held-out split, and lm-eval's tasks with their data from the local Hugging Face cache."""
    from ..outputs import check_output_file
    from .evaluate import PERPLEXITY_KEYS, defaults, evaluate_export, overridden, write_results

    cloze = {key: getattr(args, f"cloze_{key}") for key in ("items", "context_len",
                                                            "choice_len", "choices", "seed")}
    perplexity = {key: getattr(args, f"ppl_{key}") for key in PERPLEXITY_KEYS}
    settings = overridden(defaults(args.params),
                          {k: v for k, v in cloze.items() if v is not None},
                          {k: v for k, v in perplexity.items() if v is not None})
    check_output_file(args.out, "evaluate", (".json",))
    results = evaluate_export(args.model, args.data, args.format, args.tasks, settings,
                              args.batch_size, args.limit, args.num_fewshot)
    write_results(results, args.out)
    log.info("evaluated %s (%s) on %s: %s", results["arch"], results["format"],
             ", ".join(results["tasks"]), args.out)


def cmd_export_pareto(args: argparse.Namespace) -> None:
    """The workflow's export (params ``export``): the compression's Pareto sub-networks, and
    export.archs, one folder each under --out with the index table exports.parquet."""
    from pathlib import Path

    import polars as pl

    from .. import params
    from ..outputs import check_output_dir
    from ..settings.compress import CompressExport
    from ..tokens.tokenizer import TOKENIZER_FILE
    from .pareto import chosen_archs, export_archs

    check_output_dir(args.out, "export-pareto")
    merged = params.load_typed(args.params or ["params.yaml"], ["export", "compress"])
    settings = merged.export
    compress = CompressExport.of(merged.compress, args.command)
    archs = chosen_archs(pl.read_parquet(args.subnets), settings.pareto, settings.max_archs,
                         settings.archs)
    tokenizer = Path(args.data) / TOKENIZER_FILE
    index = export_archs(args.supernet, archs, args.out, settings.formats,
                         tokenizer if tokenizer.exists() else None,
                         {"name": compress.name, "stage": "compress"}, compress.timing)
    log.info("exported %d archs to %s (%d files checked)", len(archs), args.out,
             index.filter(index["passed"].is_not_null()).height)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _limit(text: str) -> int | float:
    """lm-eval's limit: a count (an integer) or a fraction below 1."""
    value = float(text)
    if not 0 < value < float("inf") or (value >= 1 and not value.is_integer()):
        raise argparse.ArgumentTypeError(f"{text} is neither a count nor a fraction in (0, 1)")
    return int(value) if value >= 1 else value


def register(add: Add) -> None:
    """Add ``export`` and ``evaluate`` through the CLI's ``add``."""
    formats = one_of("hwgptbench.export.write", "FORMATS")
    command = add("export", cmd_export, params=False)
    command.add_argument("--checkpoint", required=True, metavar="FILE",
                         help="supernet file (its sub-network of --arch) or dense model file")
    command.add_argument("--arch", required=True, metavar="ID", help="arch id to export")
    command.add_argument("--out", required=True, metavar="DIR",
                         help="export folder: new, empty or an earlier export (replaced as a "
                              "whole)")
    command.add_argument("--formats", nargs="+", type=formats, metavar="FORMAT",
                         help=f"formats to write, each of which must apply ({FORMAT_NAMES}); "
                              "default: every one that applies, the others recorded as skipped")
    command.add_argument("--tokenizer", metavar="FILE",
                         help="the data stage's tokenizer.json, saved into the Hugging Face "
                              "folder")
    command.add_argument("--source-name", metavar="NAME",
                         help="name of the source (scale or compression) for the manifest")

    command = add("export-pareto", cmd_export_pareto, params=True)
    for flag, help_text in (("--data", "data-stage output folder (its tokenizer)"),
                            ("--supernet", "the compression's fine-tuned supernet file"),
                            ("--subnets", "the compression's evaluated sub-networks table"),
                            ("--out", "folder of the exported archs (replaced as a whole)")):
        command.add_argument(flag, required=True, help=help_text)

    command = add("evaluate", cmd_evaluate, params=False)
    command.add_argument("--model", required=True, metavar="DIR",
                         help="export folder (hwgptbench export)")
    command.add_argument("--format", type=formats, metavar="FORMAT",
                         help=f"which model file to run ({FORMAT_NAMES}); default: hf if the "
                              "folder holds it, else pt2, else onnx")
    command.add_argument("--data", required=True, metavar="DIR",
                         help="data-stage output folder: its val split and tokenizer")
    command.add_argument("--tasks", nargs="+", default=["cloze", "perplexity"], metavar="TASK",
                         help="cloze and perplexity (offline, on the val split), or lm-eval "
                              "task names or task YAML files, their data from the local "
                              "Hugging Face cache (default: %(default)s)")
    command.add_argument("--out", required=True, metavar="FILE", help="results JSON file")
    command.add_argument("--params", action="append", metavar="FILE",
                         help="params file whose compress.evaluate gives the cloze and "
                              "perplexity settings (repeat to merge several); default: the "
                              "values of params.yaml, built in")
    for flag, help_text in (("items", "number of cloze items"),
                            ("context-len", "context tokens of a cloze item"),
                            ("choice-len", "tokens of a cloze choice"),
                            ("choices", "choices of a cloze item")):
        command.add_argument(f"--cloze-{flag}", type=_positive, metavar="N", help=help_text)
    command.add_argument("--cloze-seed", type=int, metavar="N", help="seed of the cloze items")
    for flag, kind, help_text in (("batches", _positive, "batches of windows"),
                                  ("batch-size", _positive, "windows a batch"),
                                  ("seed", int, "seed of the windows")):
        command.add_argument(f"--ppl-{flag}", type=kind, metavar="N",
                             help=f"perplexity: {help_text}")
    command.add_argument("--batch-size", type=_positive, default=16, metavar="N",
                         help="rows a forward pass, cloze and lm-eval (default: %(default)s)")
    command.add_argument("--limit", type=_limit, metavar="N",
                         help="lm-eval: the first N examples of each task (a fraction if < 1)")
    command.add_argument("--num-fewshot", type=int, metavar="N", help="lm-eval: few-shot examples")
