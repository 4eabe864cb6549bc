"""The ``hwgptbench compress-*`` subcommands, one per stage of the compression workflow:

``compress-dense`` (pretrain or import the dense model), ``compress-finetune`` (importance
order, import, one sandwich fine-tune), ``compress-search`` (sub-networks searched and
evaluated), ``compress-table`` (dense vs found vs quantized), ``compress-figures`` and
``compress-finetune-methods`` (what full fine-tuning and LoRA of the dense model cost) and
``compress-seed`` (fine-tune, search and table again with another seed, compress.seeds).
"""

from __future__ import annotations

import argparse
import copy
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl

from .. import io, params
from ..options import Add
from ..space import SearchSpace
from ..tokens.shards import TokenShards

if TYPE_CHECKING:
    import torch

    from ..model import GPT
    from .evaluate import SubnetEvaluator
    from .table import BaselinePlan

log = logging.getLogger(__name__)

# the entries of the compress section each command reads (the workflow passes just their files)
READS = {
    "compress-dense": ("name", "source", "checkpoint", "space", "pretrain"),
    "compress-finetune": ("name", "space", "importance", "finetune"),
    "compress-search": ("evaluate", "timing", "search"),
    "compress-table": ("evaluate", "timing", "search", "quantize", "table", "importance",
                       "finetune"),
    "compress-finetune-methods": ("timing", "finetune_methods"),
    "compress-seed": ("name", "space", "importance", "finetune", "evaluate", "timing", "search",
                      "quantize", "table", "seeds"),
}


def _section(args: argparse.Namespace) -> dict[str, Any]:
    """The compress entries this command reads, validated; a missing one is an error."""
    section = params.merge_files(args.params or ["params.yaml"], ["compress"])["compress"]
    missing = [key for key in READS[args.command] if key not in section]
    if missing:
        raise params.ParamsError(f"{args.command} reads compress.{', compress.'.join(missing)}"
                                 ": pass params.yaml or their files under results/.params/")
    return section


def _space(section: dict[str, Any]) -> SearchSpace:
    return SearchSpace.from_dict(section["name"], section["space"])


def cmd_dense(args: argparse.Namespace) -> None:
    """The dense model: trained here (source pretrain) or imported from a local Hugging Face
    LLaMA-family checkpoint (source huggingface)."""
    from ..training.train import TrainConfig
    from .dense import from_huggingface, pretrain

    section = _section(args)
    space = _space(section)
    if section["source"] == "huggingface":
        from_huggingface(section["checkpoint"], space, args.out,
                         section["allow_pickle_weights"])
        return
    shards = TokenShards.open(args.data, verify=True)
    pretrain(space, TrainConfig.from_params(section["pretrain"]), shards, args.out,
             args.work_dir)


def cmd_finetune(args: argparse.Namespace) -> None:
    """Order the dense model's heads and MLP channels by importance, import it into the
    supernet of compress.space and fine-tune that once with the sandwich rule (resumes)."""
    from ..training.train import TrainConfig
    from .finetune import finetune

    section = _section(args)
    shards = TokenShards.open(args.data, verify=True)
    finetune(args.dense, _space(section), TrainConfig.from_params(section["finetune"]), shards,
             section["importance"], args.out, args.work_dir)


def _evaluator(section: dict[str, Any], data_dir: str, supernet_path: str) -> SubnetEvaluator:
    """Sub-network evaluation on the held-out data the params describe, on this machine."""
    import torch

    from ..evaluation.perplexity import validation_batches
    from ..evaluation.tasks import build_cloze
    from ..training.train import load_supernet, resolve_device
    from .evaluate import SubnetEvaluator

    torch.set_num_threads(section["timing"]["threads"])
    evaluate = section["evaluate"]
    device = resolve_device(evaluate["device"])
    supernet, space = load_supernet(supernet_path, device)
    val = TokenShards.open(data_dir).split("val")
    batches = validation_batches(val, space.block_size, evaluate["batches"],
                                 evaluate["batch_size"], evaluate["seed"])
    cloze = evaluate["cloze"]
    items = (build_cloze(val, cloze["items"], cloze["context_len"], cloze["choice_len"],
                         cloze["choices"], cloze["seed"]) if cloze["items"] else None)
    return SubnetEvaluator(supernet, batches, items, section["timing"], device)


def _search(section: dict[str, Any], evaluator: SubnetEvaluator
            ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The search runs and the table of every sub-network they evaluated."""
    from .search import run_searches, subnet_table

    runs = run_searches(evaluator, section["search"])
    subnets = subnet_table(evaluator, runs, section["search"]["objectives"])
    log.info("%d runs, %d distinct sub-networks evaluated",
             runs.select("objectives", "algorithm").n_unique(), subnets.height)
    return runs, subnets


def cmd_search(args: argparse.Namespace) -> None:
    """Search the fine-tuned supernet's sub-networks (NSGA-II and the surrogate-assisted
    iterative search), evaluating each on held-out data and timing it on this machine."""
    section = _section(args)
    runs, subnets = _search(section, _evaluator(section, args.data, args.supernet))
    io.write_parquet(runs, args.runs_out)
    io.write_parquet(subnets, args.subnets_out)


def _baseline_plan(section: dict[str, Any], dense: GPT, shards: TokenShards,
                   calibration: list[torch.Tensor], device: torch.device) -> BaselinePlan:
    """The table's baselines as compress.table.baseline_finetune asks: the pretrained dense
    model in the importance order the supernet import gave it, and the recovery fine-tune
    with compress.finetune's budget."""
    from ..training.train import TrainConfig, WindowSampler
    from .importance import reorder, unit_importance
    from .recovery import recover
    from .table import BaselinePlan

    pretrained = copy.deepcopy(dense)
    if section["importance"]["enabled"]:  # as write_imported orders it
        reorder(pretrained, unit_importance(pretrained, calibration))
    sampler = WindowSampler(shards.split("train"), dense.config.block_size)
    cfg = TrainConfig.from_params(section["finetune"])
    return BaselinePlan(calibration, section["table"]["baseline_finetune"], pretrained,
                        lambda model, keep_zeros: recover(model, cfg, sampler, device,
                                                          keep_zeros))


def _table(section: dict[str, Any], evaluator: SubnetEvaluator, data_dir: str,
           dense_path: str, subnets: pl.DataFrame) -> pl.DataFrame:
    """The compression table (hwgptbench.compress.table) of the evaluator's fine-tuned
    supernet."""
    from ..model.dense import load_dense
    from .finetune import calibration_batches
    from .table import compression_table, picks

    dense = load_dense(dense_path, evaluator.device)
    largest = evaluator.space.largest()  # the fair reference: the fine-tuned dense shape
    chosen = picks(subnets, evaluator.perplexity(largest), section["search"]["objectives"],
                   section["table"]["tolerances"], largest.id)
    shards = TokenShards.open(data_dir)
    calibration = calibration_batches(shards, evaluator.space.block_size, section["importance"])
    plan = _baseline_plan(section, dense, shards, calibration, evaluator.device)
    table = compression_table(dense, evaluator, chosen, section["quantize"], plan)
    log.info("compression table: %d rows", table.height)
    return table


def cmd_table(args: argparse.Namespace) -> None:
    """Dense model vs found sub-networks vs quantized vs pruning baselines: size, throughput,
    perplexity and accuracy, measured on this machine, against the fine-tuned largest
    sub-network."""
    section = _section(args)
    evaluator = _evaluator(section, args.data, args.supernet)
    io.write_parquet(_table(section, evaluator, args.data, args.dense,
                            pl.read_parquet(args.subnets)), args.out)


def cmd_seed(args: argparse.Namespace) -> None:
    """One more fine-tune seed of the compression (compress.seeds): the fine-tune, search and
    table again, with compress.finetune.seed and compress.search.seed offset by
    ``--seed-index``; the table goes to --out, the rest to --work-dir (resumes)."""
    from ..training.train import TrainConfig
    from .finetune import finetune

    section = _section(args)
    if not 1 <= args.seed_index < section["seeds"]:
        raise params.ParamsError(f"--seed-index {args.seed_index} is not in [1, compress.seeds "
                                 f"= {section['seeds']}): seed 0 is the run's own outputs")
    for entry in ("finetune", "search"):
        section[entry] = section[entry] | {"seed": section[entry]["seed"] + args.seed_index}
    work = Path(args.work_dir)
    supernet = finetune(args.dense, _space(section), TrainConfig.from_params(section["finetune"]),
                        TokenShards.open(args.data, verify=True), section["importance"],
                        work / "supernet", work / "finetune")
    evaluator = _evaluator(section, args.data, str(supernet))  # the search's and the table's
    runs, subnets = _search(section, evaluator)
    io.write_parquet(runs, work / "search.parquet")
    io.write_parquet(subnets, work / "subnets.parquet")
    io.write_parquet(_table(section, evaluator, args.data, args.dense, subnets), args.out)


def cmd_figures(args: argparse.Namespace) -> None:
    """The compression figure, its table and the search's edge over the baselines (CSV and
    Markdown; over the tables of every fine-tune seed, with intervals)."""
    from ..plotting.markdown import write_table
    from .figures import compression_figure, compression_summary, search_edge

    table, subnets = pl.read_parquet(args.table), pl.read_parquet(args.subnets)
    out = Path(args.out_dir)
    compression_figure(table, subnets, pl.read_parquet(args.runs), out / "compress")
    write_table(compression_summary(table), out / "table_compress")
    seeds = [table, *(pl.read_parquet(path) for path in args.seed_tables)]
    write_table(search_edge(seeds), out / "table_compress_baselines")


def cmd_finetune_methods(args: argparse.Namespace) -> None:
    """Full fine-tuning vs LoRA of the dense model on this machine: trainable parameters, step
    time and peak memory of each method."""
    import functools

    import torch

    from ..meters.device import fingerprint
    from ..model.dense import load_dense
    from ..training.train import resolve_device
    from ..versions import library_versions
    from .finetune_methods import measure_finetune_methods

    section = _section(args)
    spec, threads = section["finetune_methods"], section["timing"]["threads"]
    torch.set_num_threads(threads)
    device = resolve_device(spec["device"])
    load = functools.partial(load_dense, args.dense, device)
    rows = measure_finetune_methods(
        load, spec["methods"], spec["lora"], load().config.vocab_size, spec["batch_size"],
        spec["seq_len"], spec["dtype"], device, spec["warmup"], spec["repeats"], spec["seed"])
    extra = {**fingerprint(threads, device), **library_versions()}
    io.write_parquet(pl.DataFrame([row | extra for row in rows], infer_schema_length=None),
                     args.out)
    log.info("fine-tuning methods: %d rows", len(rows))


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
