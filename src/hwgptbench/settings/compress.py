"""The ``compress`` section as typed settings. The section is read entry by entry (each
``compress.X`` entry has a params file of its own, :data:`hwgptbench.params.PER_ENTRY_SECTIONS`):
a command's settings type has one field per entry it reads, named as the entry, so the
entries a command reads are the fields of its type (:meth:`CompressReads.entries`).

Field names are the schema's (src/hwgptbench/schemas/params.schema.yaml); lists are tuples.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .build import SettingsError, build
from .sections import Estimator, SearchOptions, TrainingSettings

Device = Literal["auto", "cpu", "cuda"]
Objective = Literal["perplexity", "params", "latency_ms"]
R = TypeVar("R", bound="CompressReads")


@dataclass(frozen=True)
class ImportanceSettings:
    """The importance order of heads and MLP channels before import (``compress.importance``)."""

    enabled: bool
    batches: int
    batch_size: int
    seed: int


@dataclass(frozen=True)
class ClozeSettings:
    """The multiple-choice cloze task on held-out text (``compress.evaluate.cloze``)."""

    items: int
    context_len: int
    choice_len: int
    choices: int
    seed: int


@dataclass(frozen=True)
class EvaluateSettings:
    """The held-out data every sub-network and model is scored on (``compress.evaluate``)."""

    batches: int
    batch_size: int
    seed: int
    cloze: ClozeSettings
    device: Device


@dataclass(frozen=True)
class TimingSettings:
    """Prefill latency on this machine (``compress.timing``)."""

    batch_size: int
    seq_len: int
    threads: int
    warmup: int
    min_repeats: int
    max_repeats: int
    target_rel_ci: float
    max_seconds: float
    estimator: Estimator


@dataclass(frozen=True)
class LoraSettings:
    """The LoRA adapters of ``compress.finetune_methods.lora``."""

    r: int
    alpha: float
    targets: tuple[str, ...]


@dataclass(frozen=True)
class FinetuneMethodsSettings:
    """Full fine-tuning vs LoRA of the dense model (``compress.finetune_methods``)."""

    methods: tuple[Literal["full", "lora", "lora_frozen_embeddings"], ...]
    lora: LoraSettings
    batch_size: int
    seq_len: int
    dtype: Literal["fp32", "bf16"]
    warmup: int
    repeats: int
    device: Device
    seed: int


@dataclass(frozen=True)
class SubnetSearchSettings:
    """The search of the fine-tuned supernet's sub-networks (``compress.search``)."""

    objectives: dict[str, tuple[Objective, ...]]
    algorithms: tuple[Literal["rs", "ls", "nsga2", "morea", "iterative"], ...]
    budget: int
    seed: int
    options: SearchOptions


@dataclass(frozen=True)
class TableSettings:
    """The compression table's picks and baselines (``compress.table``)."""

    tolerances: tuple[float, ...]
    baseline_finetune: tuple[Literal["supernet", "none", "equal"], ...]


@dataclass(frozen=True)
class CompressReads:
    """The compress entries a command reads: one field per entry, named as it."""

    @classmethod
    def entries(cls) -> tuple[str, ...]:
        """The names of the compress entries this type reads."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def of(cls: type[R], section: Mapping[str, Any], reader: str) -> R:
        """This type's entries of a validated compress section; ``reader`` (the command)
        names the entries the section lacks."""
        missing = [entry for entry in cls.entries() if entry not in section]
        if missing:
            raise SettingsError(f"{reader} reads compress.{', compress.'.join(missing)}: pass "
                                "params.yaml or their files under results/.params/")
        return build(cls, {entry: section[entry] for entry in cls.entries()}, "compress")

    @classmethod
    def from_files(cls: type[R], paths: Sequence[str | os.PathLike[str]], reader: str) -> R:
        """This type's entries of the compress section of params files merged and validated
        (params.yaml, or the entries' files under ``results/.params/``)."""
        from ..params import merge_files  # jsonschema: loaded where files are read only

        return cls.of(merge_files(paths, ["compress"])["compress"], reader)


@dataclass(frozen=True)
class CompressModel(CompressReads):
    """The compression's name and the search space of its supernet."""

    name: str
    space: dict[str, Any]  # as hwgptbench.space.SearchSpace.from_dict reads it


@dataclass(frozen=True)
class CompressDense(CompressModel):
    """compress-dense: the dense model, pretrained or imported."""

    source: Literal["pretrain", "huggingface"]
    checkpoint: str | None
    allow_pickle_weights: bool
    pretrain: TrainingSettings


@dataclass(frozen=True)
class CompressFinetune(CompressModel):
    """compress-finetune: importance order, import and fine-tune of the supernet."""

    importance: ImportanceSettings
    finetune: TrainingSettings


@dataclass(frozen=True)
class CompressEvaluation(CompressReads):
    """export-evaluate: the cloze and perplexity settings of the compression."""

    evaluate: EvaluateSettings


@dataclass(frozen=True)
class CompressSearch(CompressReads):
    """compress-search: sub-networks searched, evaluated and timed."""

    evaluate: EvaluateSettings
    timing: TimingSettings
    search: SubnetSearchSettings


@dataclass(frozen=True)
class CompressTable(CompressSearch):
    """compress-table: the picks, their quantized versions and the pruning baselines."""

    quantize: tuple[Literal["int8_dynamic", "int8_weight_only", "int4_weight_only"], ...]
    table: TableSettings
    importance: ImportanceSettings
    finetune: TrainingSettings


@dataclass(frozen=True)
class CompressSeed(CompressFinetune, CompressTable):
    """compress-seed: fine-tune, search and table again with another seed."""

    seeds: int


@dataclass(frozen=True)
class CompressFinetuneMethods(CompressReads):
    """compress-finetune-methods: full fine-tuning vs LoRA of the dense model."""

    timing: TimingSettings
    finetune_methods: FinetuneMethodsSettings


@dataclass(frozen=True)
class CompressExport(CompressReads):
    """export-pareto's compress entries: the compression's name and timing."""

    name: str
    timing: TimingSettings
