"""The ``hwgptbench compress-*`` subcommands, one per step of the compression stage
(:mod:`.stage`): ``compress-dense``, ``compress-finetune``, ``compress-search``,
``compress-table``, ``compress-seed``, ``compress-figures`` and ``compress-finetune-methods``.
Each reads its entries of the ``compress`` section, calls the stage and writes its outputs.
"""

from __future__ import annotations

import argparse
import logging
from typing import TypeVar

import polars as pl

from .. import io, params
from ..options import Add
from ..settings.compress import (
    CompressDense,
    CompressFinetune,
    CompressFinetuneMethods,
    CompressReads,
    CompressSearch,
    CompressSeed,
    CompressTable,
)

log = logging.getLogger(__name__)
R = TypeVar("R", bound=CompressReads)

# the settings type of each command that reads compress entries: its fields are the entries
# it reads (the workflow passes just their files)
SETTINGS: dict[str, type[CompressReads]] = {
    "compress-dense": CompressDense,
    "compress-finetune": CompressFinetune,
    "compress-search": CompressSearch,
    "compress-table": CompressTable,
    "compress-finetune-methods": CompressFinetuneMethods,
    "compress-seed": CompressSeed,
}
READS = {command: cls.entries() for command, cls in SETTINGS.items()}


def _settings(args: argparse.Namespace, cls: type[R]) -> R:
    """The compress entries this command reads, validated, as ``cls`` (its type in
    :data:`SETTINGS`); a missing one is an error."""
    assert SETTINGS[args.command] is cls, f"{args.command} reads {SETTINGS[args.command]}"
    compress = params.load_typed(args.params or ["params.yaml"], ["compress"]).compress
    return cls.of(compress, args.command)


def cmd_dense(args: argparse.Namespace) -> None:
    """The dense model: trained here (source pretrain) or imported from a local Hugging Face
    LLaMA-family checkpoint (source huggingface)."""
    from . import stage

    stage.dense(_settings(args, CompressDense), args.data, args.out, args.work_dir)


def cmd_finetune(args: argparse.Namespace) -> None:
    """Order the dense model's heads and MLP channels by importance, import it into the
    supernet of compress.space and fine-tune that once with the sandwich rule (resumes)."""
    from . import stage

    stage.finetune_supernet(_settings(args, CompressFinetune), args.data, args.dense, args.out,
                            args.work_dir)


def cmd_search(args: argparse.Namespace) -> None:
    """Search the fine-tuned supernet's sub-networks (NSGA-II and the surrogate-assisted
    iterative search), evaluating each on held-out data and timing it on this machine."""
    from . import stage

    settings = _settings(args, CompressSearch)
    runs, subnets = stage.search(settings, stage.evaluator(settings.evaluate, settings.timing,
                                                           args.data, args.supernet))
    io.write_parquet(runs, args.runs_out)
    io.write_parquet(subnets, args.subnets_out)


def cmd_table(args: argparse.Namespace) -> None:
    """Dense model vs found sub-networks vs quantized vs pruning baselines: size, throughput,
    perplexity and accuracy, measured on this machine, against the fine-tuned largest
    sub-network."""
    from . import stage

    settings = _settings(args, CompressTable)
    evaluator = stage.evaluator(settings.evaluate, settings.timing, args.data, args.supernet)
    io.write_parquet(stage.table(settings, evaluator, args.data, args.dense,
                                 pl.read_parquet(args.subnets)), args.out)


def cmd_seed(args: argparse.Namespace) -> None:
    """One more fine-tune seed of the compression (compress.seeds): the fine-tune, search and
    table again, with compress.finetune.seed and compress.search.seed offset by
    ``--seed-index``; the table goes to --out, the rest to --work-dir (resumes)."""
    from . import stage

    io.write_parquet(stage.seed(_settings(args, CompressSeed), args.seed_index, args.data,
                                args.dense, args.work_dir), args.out)


def cmd_figures(args: argparse.Namespace) -> None:
    """The compression figure, its table and the search's edge over the baselines (CSV and
    Markdown; over the tables of every fine-tune seed, with intervals)."""
    from . import stage

    stage.figures(pl.read_parquet(args.table), pl.read_parquet(args.subnets),
                  pl.read_parquet(args.runs), [pl.read_parquet(p) for p in args.seed_tables],
                  args.out_dir)


def cmd_finetune_methods(args: argparse.Namespace) -> None:
    """Full fine-tuning vs LoRA of the dense model on this machine: trainable parameters, step
    time and peak memory of each method."""
    from . import stage

    io.write_parquet(stage.finetune_methods(_settings(args, CompressFinetuneMethods),
                                            args.dense), args.out)


# every compress-* command's required options: (flag, help)
DATA = ("--data", "data-stage output folder")
DENSE = ("--dense", "dense model file")
SUPERNET = ("--supernet", "fine-tuned supernet file")
WORK_DIR = ("--work-dir", "resumable checkpoints")
OPTIONS: dict[str, list[tuple[str, str]]] = {
    "compress-dense": [DATA, ("--out", "dense model file"), WORK_DIR],
    "compress-finetune": [DATA, DENSE, ("--out", "output folder (supernet.pt, tables)"),
                          WORK_DIR],
    "compress-search": [DATA, SUPERNET, ("--runs-out", "search runs table"),
                        ("--subnets-out", "evaluated sub-networks table")],
    "compress-table": [DATA, DENSE, SUPERNET, ("--subnets", "evaluated sub-networks table"),
                       ("--out", "compression table")],
    "compress-figures": [("--table", "compression table"),
                         ("--subnets", "evaluated sub-networks table"),
                         ("--runs", "search runs table"),
                         ("--out-dir", "folder of the figure and table")],
    "compress-finetune-methods": [DENSE, ("--out", "fine-tuning methods table")],
    "compress-seed": [DATA, DENSE, ("--out", "compression table of this seed"), WORK_DIR],
}
COMMANDS = {"compress-dense": cmd_dense, "compress-finetune": cmd_finetune,
            "compress-search": cmd_search, "compress-table": cmd_table,
            "compress-figures": cmd_figures, "compress-finetune-methods": cmd_finetune_methods,
            "compress-seed": cmd_seed}


def register(add: Add) -> None:
    """Add the compress-* subcommands through the CLI's ``add``."""
    for name, func in COMMANDS.items():
        command = add(name, func, params=name in READS)
        for flag, help_text in OPTIONS[name]:
            command.add_argument(flag, required=True, help=help_text)
        if name == "compress-seed":
            command.add_argument("--seed-index", type=int, required=True,
                                 help="which seed, 1 to compress.seeds - 1")
        if name == "compress-figures":
            command.add_argument("--seed-tables", nargs="*", default=[],
                                 help="compression tables of the other fine-tune seeds")
