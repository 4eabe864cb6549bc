"""The compression stage: each step of the compression workflow on its entries of the
``compress`` params section (its settings type, :mod:`hwgptbench.settings.compress`), outputs
returned as tables or written where the caller says.

:func:`dense` (pretrain or import the dense model), :func:`finetune_supernet` (importance
order, import, one sandwich fine-tune), :func:`search` (sub-networks searched and evaluated),
:func:`table` (dense vs found vs quantized vs pruning baselines), :func:`seed` (all of it again
with another fine-tune seed), :func:`figures` and :func:`finetune_methods` (what full
fine-tuning and LoRA of the dense model cost). ``commands.py`` parses the subcommands' options
and calls these.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import polars as pl

from .. import io, params
from ..settings.compress import (
    CompressDense,
    CompressFinetune,
    CompressFinetuneMethods,
    CompressModel,
    CompressSearch,
    CompressSeed,
    CompressTable,
    EvaluateSettings,
    TimingSettings,
)
from ..settings.fields import required
from ..space import SearchSpace
from ..tokens.shards import TokenShards

if TYPE_CHECKING:
    import torch

    from ..model import GPT
    from .evaluate import SubnetEvaluator
    from .table import BaselinePlan

log = logging.getLogger(__name__)


def space_of(settings: CompressModel) -> SearchSpace:
    """The compression's search space (``compress.space``)."""
    return settings.space.space(settings.name)


def dense(settings: CompressDense, data: str, out: str, work_dir: str) -> None:
    """The dense model: trained here (source pretrain) or imported from a local Hugging Face
    LLaMA-family checkpoint (source huggingface), written to ``out``."""
    from .dense import from_huggingface, pretrain

    space = space_of(settings)
    if settings.source == "huggingface":
        from_huggingface(required(settings.checkpoint, "compress.checkpoint"), space, out,
                         settings.allow_pickle_weights)
        return
    pretrain(space, settings.pretrain, TokenShards.open(data, verify=True), out,
             work_dir)


def finetune_supernet(settings: CompressFinetune, data: str, dense_path: str,
                      out: str | Path, work_dir: str | Path) -> Path:
    """The dense model's heads and MLP channels ordered by importance, imported into the
    supernet of compress.space and fine-tuned once with the sandwich rule (resumes); the
    supernet's file."""
    from .finetune import finetune

    supernet = finetune(dense_path, space_of(settings), settings.finetune,
                        TokenShards.open(data, verify=True), settings.importance, out, work_dir)
    assert supernet is not None  # None only for a run told to stop early
    return supernet


def evaluator(evaluate: EvaluateSettings, timing: TimingSettings, data_dir: str,
              supernet_path: str) -> SubnetEvaluator:
    """Sub-network evaluation on the held-out data of ``evaluate``, timed as ``timing`` says,
    on this machine."""
    import torch

    from ..evaluation.perplexity import validation_batches
    from ..evaluation.tasks import build_cloze
    from ..training.train import load_supernet, resolve_device
    from .evaluate import SubnetEvaluator

    torch.set_num_threads(timing.threads)
    device = resolve_device(evaluate.device)
    supernet, space = load_supernet(supernet_path, device)
    val = TokenShards.open(data_dir).split("val")
    batches = validation_batches(val, space.block_size, evaluate.batches, evaluate.batch_size,
                                 evaluate.seed)
    cloze = evaluate.cloze
    items = (build_cloze(val, cloze.items, cloze.context_len, cloze.choice_len, cloze.choices,
                         cloze.seed) if cloze.items else None)
    return SubnetEvaluator(supernet, batches, items, timing, device)


def search(settings: CompressSearch, evaluator: SubnetEvaluator
           ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The search runs and the table of every sub-network they evaluated."""
    from .search import run_searches, subnet_table

    runs = run_searches(evaluator, settings.search)
    subnets = subnet_table(evaluator, runs, settings.search.objectives)
    log.info("%d runs, %d distinct sub-networks evaluated",
             runs.select("objectives", "algorithm").n_unique(), subnets.height)
    return runs, subnets


def _baseline_plan(settings: CompressTable, dense: GPT, shards: TokenShards,
                   calibration: list[torch.Tensor], device: torch.device) -> BaselinePlan:
    """The table's baselines as compress.table.baseline_finetune asks: the pretrained dense
    model in the importance order the supernet import gave it, and the recovery fine-tune
    with compress.finetune's budget."""
    from ..training.train import WindowSampler
    from .importance import reorder, unit_importance
    from .recovery import recover
    from .table import BaselinePlan

    pretrained = copy.deepcopy(dense)
    if settings.importance.enabled:  # as write_imported orders it
        reorder(pretrained, unit_importance(pretrained, calibration))
    sampler = WindowSampler(shards.split("train"), dense.config.block_size)
    cfg = settings.finetune
    return BaselinePlan(calibration, settings.table.baseline_finetune, pretrained,
                        lambda model, keep_zeros: recover(model, cfg, sampler, device,
                                                          keep_zeros))


def table(settings: CompressTable, evaluator: SubnetEvaluator, data_dir: str,
          dense_path: str, subnets: pl.DataFrame) -> pl.DataFrame:
    """The compression table (hwgptbench.compress.table) of the evaluator's fine-tuned
    supernet."""
    from ..model.dense import load_dense
    from .finetune import calibration_batches
    from .table import compression_table, picks

    dense_model = load_dense(dense_path, evaluator.device)
    largest = evaluator.space.largest()  # the fair reference: the fine-tuned dense shape
    chosen = picks(subnets, evaluator.perplexity(largest), settings.search.objectives,
                   settings.table.tolerances, largest.id)
    shards = TokenShards.open(data_dir)
    calibration = calibration_batches(shards, evaluator.space.block_size, settings.importance)
    plan = _baseline_plan(settings, dense_model, shards, calibration, evaluator.device)
    result = compression_table(dense_model, evaluator, chosen, settings.quantize, plan)
    log.info("compression table: %d rows", result.height)
    return result


def seed(settings: CompressSeed, index: int, data: str, dense_path: str,
         work_dir: str | Path) -> pl.DataFrame:
    """One more fine-tune seed of the compression (compress.seeds): the fine-tune, search and
    table again, with compress.finetune.seed and compress.search.seed offset by ``index``; the
    supernet, runs and sub-networks go to ``work_dir`` (resumes); the table is returned."""
    if not 1 <= index < settings.seeds:
        raise params.ParamsError(f"--seed-index {index} is not in [1, compress.seeds "
                                 f"= {settings.seeds}): seed 0 is the run's own outputs")
    settings = settings.model_copy(update={
        "finetune": dataclasses.replace(settings.finetune, seed=settings.finetune.seed + index),
        "search": settings.search.model_copy(update={"seed": settings.search.seed + index})})
    work = Path(work_dir)
    supernet = finetune_supernet(settings, data, dense_path, work / "supernet",
                                 work / "finetune")
    subnet_evaluator = evaluator(settings.evaluate, settings.timing, data,
                                 str(supernet))  # the search's and the table's
    runs, subnets = search(settings, subnet_evaluator)
    io.write_parquet(runs, work / "search.parquet")
    io.write_parquet(subnets, work / "subnets.parquet")
    return table(settings, subnet_evaluator, data, dense_path, subnets)


def figures(compression: pl.DataFrame, subnets: pl.DataFrame, runs: pl.DataFrame,
            seed_tables: Sequence[pl.DataFrame], out_dir: str | Path) -> None:
    """The compression figure, its table and the search's edge over the baselines (CSV and
    Markdown; over the tables of every fine-tune seed, with intervals)."""
    from ..plotting.markdown import write_table
    from .figures import compression_figure, compression_summary, search_edge

    out = Path(out_dir)
    compression_figure(compression, subnets, runs, out / "compress")
    write_table(compression_summary(compression), out / "table_compress")
    write_table(search_edge([compression, *seed_tables]), out / "table_compress_baselines")


def finetune_methods(settings: CompressFinetuneMethods, dense_path: str) -> pl.DataFrame:
    """Full fine-tuning vs LoRA of the dense model on this machine: trainable parameters, step
    time and peak memory of each method, with the machine's identity and versions."""
    import torch

    from ..meters.device import fingerprint
    from ..model.dense import load_dense
    from ..training.train import resolve_device
    from ..versions import library_versions
    from .finetune_methods import measure_finetune_methods

    spec, threads = settings.finetune_methods, settings.timing.threads
    torch.set_num_threads(threads)
    device = resolve_device(spec.device)
    load = functools.partial(load_dense, dense_path, device)
    rows = measure_finetune_methods(
        load, spec.methods, spec.lora, load().config.vocab_size, spec.batch_size,
        spec.seq_len, spec.dtype, device, spec.warmup, spec.repeats, spec.seed)
    extra = {**fingerprint(threads, device), **library_versions()}
    log.info("fine-tuning methods: %d rows", len(rows))
    return pl.DataFrame([row | extra for row in rows], infer_schema_length=None)
