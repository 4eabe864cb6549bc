"""The ``compress`` and ``export`` sections as typed models (docs/compress.md, docs/export.md).

``compress`` is read entry by entry (each ``compress.X`` entry has a params file of its own,
:data:`hwgptbench.params.PER_ENTRY_SECTIONS`): a command's reads type has one field per entry
it reads, named as the entry, so the entries a command reads are the fields of its type
(:meth:`CompressReads.entries`).
"""

from __future__ import annotations

from typing import Annotated, ClassVar, Literal, TypeVar

from pydantic import Field, model_validator

from .fields import (
    Count,
    Count0,
    Count2,
    Device,
    Distinct,
    Estimator,
    Model,
    NonNegative,
    Positive,
    Section,
    Seed,
    Seeds,
    Some,
    Text,
    Threads,
    Width,
    doc,
)
from .problems import ParamsError, Problems
from .sections import SpaceSettings, Timing, TrainingSettings, options_model

R = TypeVar("R", bound="CompressReads")
CompressObjective = Literal["perplexity", "params", "latency_ms"]
Quantize = Literal["int8_dynamic", "int8_weight_only", "int4_weight_only"]
SubnetOptions = options_model("SubnetOptions", ("rs", "ls", "nsga2", "morea", "iterative"))


class ImportanceSettings(Model):
    """The importance order of heads and MLP channels before import."""

    enabled: bool = doc(True, "false: keep the dense model's unit order (an ablation)")
    batches: Count = doc(2, "calibration batches of training windows")
    batch_size: Width = doc(16, "sequences per batch")
    seed: Seed = doc(5, "seed of the calibration windows")


class ClozeSettings(Model):
    """The multiple-choice cloze task on held-out text (accuracy)."""

    items: Count0 = doc(100, "questions (0: no accuracy)")
    context_len: Width = doc(48, "tokens of context")
    choice_len: Width = doc(16, "tokens of each choice")
    choices: Annotated[int, Field(ge=2, le=1000)] = doc(4, "choices per question")
    seed: Seed = doc(7, "seed of the questions")


class EvaluateSettings(Model):
    """The held-out data every sub-network and model is scored on."""

    batches: Count = doc(4, "validation batches (perplexity)")
    batch_size: Width = doc(16, "sequences per batch")
    seed: Seed = doc(99, "seed of the validation windows")
    cloze: ClozeSettings = ClozeSettings()
    device: Device = doc("auto", "auto: cuda when available, else cpu")


class TimingSettings(Timing):
    """Prefill latency of sub-networks and models on this machine."""

    batch_size: Width = doc(1, "sequences per call")
    seq_len: Width = doc(128, "tokens per sequence")
    threads: Threads = doc(2, "CPU threads")
    warmup: Count0 = doc(2, "untimed calls before timing")
    min_repeats: Count2 = doc(5, "timed calls at least")
    max_repeats: Count2 = doc(50, "timed calls at most")
    target_rel_ci: Positive = doc(0.05, "stop once the median's 95% CI is within this share")
    max_seconds: Positive = doc(0.1, "timing budget per model")
    estimator: Estimator = doc("min", "CPU latency, as measure.estimator")


class LoraSettings(Model):
    """The LoRA adapters (peft)."""

    r: Width = doc(8, "LoRA rank")
    alpha: Positive = doc(16.0, "scaling numerator (scale alpha / r)")
    targets: Some[Text] = doc(("qkv", "proj", "gate", "up"), "Linear names adapted, as peft "
                              "matches them: qkv, proj, attn.proj, mlp.proj, fc, gate, up")


class FinetuneMethodsSettings(Model):
    """Full fine-tuning vs LoRA of the dense model, timed on this machine (docs/runtime.md)."""

    methods: Some[Literal["full", "lora", "lora_frozen_embeddings"]] = doc(
        ("full", "lora", "lora_frozen_embeddings"), "every weight, adapters + embeddings, adapters")
    lora: LoraSettings = LoraSettings()
    batch_size: Width = doc(8, "sequences per step")
    seq_len: Width = doc(128, "tokens per sequence (at most compress.space.block_size)")
    dtype: Literal["fp32", "bf16"] = doc("fp32", "fp32, or bf16 autocast over fp32 weights")
    warmup: Count0 = doc(1, "untimed steps")
    repeats: Count2 = doc(5, "timed steps (the median is reported)")
    device: Device = doc("auto", "auto: cuda when available, else cpu")
    seed: Seed = doc(0, "seed of the adapters' init and the token ids")


class SubnetSearchSettings(Model):
    """The search of the fine-tuned supernet's sub-networks, evaluated for real."""

    objectives: dict[str, Annotated[Some[CompressObjective], Field(min_length=2)]] = Field(
        {"ppl-params": ("perplexity", "params"), "ppl-latency": ("perplexity", "latency_ms")},
        min_length=1, description="named objective sets, all minimized")
    algorithms: Some[Literal["rs", "ls", "nsga2", "morea", "iterative"]] = doc(
        ("nsga2", "iterative"), "algorithms run")
    budget: Count2 = doc(14, "evaluated sub-networks per run")
    seed: Seed = doc(0, "seed of the runs")
    options: SubnetOptions = doc(SubnetOptions.parse({  # type: ignore[valid-type]
        "nsga2": {"population_size": 8},
        "iterative": {"initial": 6, "per_round": 4, "population_size": 40, "generations": 20}}),
        "options per algorithm")


class TableSettings(Model):
    """The compression table's picks and its pruning baselines."""

    tolerances: Annotated[tuple[NonNegative, ...], Field(min_length=1)] = doc(
        (0.01, 0.05), "relative perplexity losses within which the cheapest is picked")
    baseline_finetune: Distinct[Literal["supernet", "none", "equal"]] = doc(
        ("supernet", "none", "equal"), "the baselines' trainings after pruning (docs/compress.md)")


COMPRESS_SPACE = SpaceSettings(embed_dim=(128,), n_layer=(4, 5, 6), n_head=(4, 6, 8),
                               mlp_ratio=(1.5, 2, 2.5, 3), bias=(False,), head_size=16,
                               block_size=128, rotary_fraction=1.0, family="llama", n_kv_head=2)


class CompressSettings(Section):
    """One-shot compression of a dense model, LLaMA-NAS style (stage `compress`)."""

    SECTION: ClassVar[str] = "compress"
    name: Annotated[str, Field(pattern=r"^(?![.]{1,2}$)[A-Za-z0-9_.-]+$")] = doc(
        "llama-tiny", "outputs go to results/compress/{name}/")
    source: Literal["pretrain", "huggingface"] = doc("pretrain", "train here, or import")
    checkpoint: str | None = doc(None, "a local Hugging Face checkpoint folder (huggingface)")
    allow_pickle_weights: bool = doc(False, "read pickled .bin weights (runs code: trust it)")
    space: SpaceSettings = doc(COMPRESS_SPACE, "the sub-networks; the largest is the dense model")
    pretrain: TrainingSettings = doc(TrainingSettings(
        steps=120, random_subnets=0, lr=1.0e-3, warmup_steps=12, snapshots=()),
        "the dense model's training (pretrain)")
    importance: ImportanceSettings = ImportanceSettings()
    finetune: TrainingSettings = doc(TrainingSettings(
        steps=40, lr=3.0e-4, warmup_steps=4, checkpoint_every=20, snapshots=()),
        "the one sandwich-rule fine-tune of the imported supernet")
    evaluate: EvaluateSettings = EvaluateSettings()
    timing: TimingSettings = TimingSettings()
    finetune_methods: FinetuneMethodsSettings = FinetuneMethodsSettings()
    search: SubnetSearchSettings = SubnetSearchSettings()
    quantize: Distinct[Quantize] = doc(("int8_dynamic",), "quantizations on top of none")
    table: TableSettings = TableSettings()
    seeds: Seeds = doc(1, "fine-tune seeds of the table's comparison")

    @model_validator(mode="after")
    def _checkpoint(self) -> CompressSettings:
        if self.source == "huggingface" and not self.checkpoint:
            Problems.one("checkpoint", "source huggingface needs the checkpoint directory")
        return self


class ExportSettings(Section):
    """The compression's found archs as runnable model files (rule compress_export)."""

    SECTION: ClassVar[str] = "export"
    pareto: Distinct[str] = doc(("ppl-params",), "compress.search.objectives whose fronts export")
    max_archs: Count = doc(2, "at most this many archs of each front")
    archs: Distinct[str] = doc(("e128-l6-h8_8_8_8_8_8-r3_3_3_3_3_3-b0",), "arch ids exported too")
    formats: Some[Literal["pt2", "onnx", "hf"]] = doc(("pt2", "onnx", "hf"), "file formats")


class CompressReads(Model):
    """The compress entries a command reads: one field per entry, named as it."""

    @classmethod
    def entries(cls) -> tuple[str, ...]:
        """The names of the compress entries this type reads."""
        return tuple(cls.model_fields)

    @classmethod
    def of(cls: type[R], section: CompressSettings, reader: str) -> R:
        """This type's entries of a validated compress section; ``reader`` (the command)
        names the entries the section's files lack."""
        missing = [entry for entry in cls.entries() if entry not in section.model_fields_set]
        if missing:
            raise ParamsError(f"{reader} reads compress.{', compress.'.join(missing)}: pass "
                              "params.yaml or their files under results/.params/")
        return cls(**{entry: getattr(section, entry) for entry in cls.entries()})


class CompressModel(CompressReads):
    """The compression's name and the search space of its supernet."""

    name: str
    space: SpaceSettings


class CompressDense(CompressModel):
    """compress-dense: the dense model, pretrained or imported."""

    source: Literal["pretrain", "huggingface"]
    checkpoint: str | None
    allow_pickle_weights: bool
    pretrain: TrainingSettings


class CompressFinetune(CompressModel):
    """compress-finetune: importance order, import and fine-tune of the supernet."""

    importance: ImportanceSettings
    finetune: TrainingSettings


class CompressEvaluation(CompressReads):
    """export-evaluate: the cloze and perplexity settings of the compression."""

    evaluate: EvaluateSettings


class CompressSearch(CompressReads):
    """compress-search: sub-networks searched, evaluated and timed."""

    evaluate: EvaluateSettings
    timing: TimingSettings
    search: SubnetSearchSettings


class CompressTable(CompressSearch):
    """compress-table: the picks, their quantized versions and the pruning baselines."""

    quantize: tuple[Quantize, ...]
    table: TableSettings
    importance: ImportanceSettings
    finetune: TrainingSettings


class CompressSeed(CompressFinetune, CompressTable):
    """compress-seed: fine-tune, search and table again with another seed."""

    seeds: int


class CompressFinetuneMethods(CompressReads):
    """compress-finetune-methods: full fine-tuning vs LoRA of the dense model."""

    timing: TimingSettings
    finetune_methods: FinetuneMethodsSettings


class CompressExport(CompressReads):
    """export-pareto's compress entries: the compression's name and timing."""

    name: str
    timing: TimingSettings

