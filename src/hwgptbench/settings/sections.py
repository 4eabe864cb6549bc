"""The params sections as frozen dataclasses, one per section, with the schema's field names
(src/hwgptbench/schemas/params.schema.yaml holds each field's meaning and bounds). Lists are
tuples; a field the schema lets a file leave out has the default the code applied before.

Built with :func:`hwgptbench.settings.build.build` (``MeasureSettings.of(section)``) at the
command boundary; a command's params reads are the ``SECTION`` names of the types it builds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypeVar

from ..search_algorithms import ALGORITHMS, options_type
from .build import SettingsError, build

Dtype = Literal["fp32", "bf16", "fp16"]
Estimator = Literal["median", "min", "cpu_median"]
S = TypeVar("S", bound="SectionSettings")


class SectionSettings:
    """What every section's dataclass shares: its section name and its builder."""

    SECTION: ClassVar[str]

    @classmethod
    def of(cls: type[S], values: Mapping[str, Any]) -> S:
        """This section's settings from its validated params mapping."""
        return build(cls, values, cls.SECTION)

    @classmethod
    def from_files(cls: type[S], paths: Sequence[str | os.PathLike[str]]) -> S:
        """This section's settings from params files merged in order and validated (params.yaml
        and overlays, or the section files the workflow writes under ``results/.params/``)."""
        from ..params import merge_files  # jsonschema: loaded where files are read only

        return cls.of(merge_files(paths, [cls.SECTION])[cls.SECTION])


@dataclass(frozen=True)
class WorkflowSettings(SectionSettings):
    """What a run covers: the scales (keys of ``spaces``) and the devices it measures."""

    SECTION: ClassVar[str] = "workflow"
    scales: tuple[str, ...]
    devices: tuple[str, ...]


@dataclass(frozen=True)
class CorpusSettings:
    """Where the data stage's text comes from (``data.corpus``)."""

    source: Literal["text_files", "huggingface"]
    path: str | None = None
    pattern: str | None = None
    dataset: str | None = None
    config: str | None = None
    split: str | None = None
    revision: str | None = None
    text_field: str | None = None
    max_documents: int | None = None


@dataclass(frozen=True)
class TokenizerSettings:
    """The tokenizer trained or read by the data stage (``data.tokenizer``)."""

    kind: Literal["bpe", "file"]
    vocab_size: int | None = None
    min_frequency: int = 2
    file: str | None = None


@dataclass(frozen=True)
class DataSettings(SectionSettings):
    """The data stage: corpus, tokenizer and token shards."""

    SECTION: ClassVar[str] = "data"
    name: str
    corpus: CorpusSettings
    tokenizer: TokenizerSettings
    val_fraction: float
    shard_tokens: int
    seed: int


@dataclass(frozen=True)
class TrainingSettings:
    """A sandwich-rule training of a weight-sharing supernet (``supernet``,
    ``compress.pretrain``, ``compress.finetune``); refuses snapshots past the last step and a
    batch that the processes cannot split evenly."""

    steps: int
    batch_size: int
    random_subnets: int
    lr: float
    betas: tuple[float, float]
    weight_decay: float
    warmup_steps: int
    min_lr_ratio: float
    grad_clip: float
    checkpoint_every: int
    device: Literal["auto", "cpu", "cuda"]
    seed: int
    snapshots: tuple[int, ...]
    processes: int

    def __post_init__(self) -> None:
        from ..params import ParamsError, batch_problems, snapshot_problems

        problems = (snapshot_problems(self.snapshots, self.steps)
                    + batch_problems(self.batch_size, self.processes))
        if problems:
            raise ParamsError("invalid supernet params:\n"
                              + "\n".join(f"  - {problem}" for problem in problems))


@dataclass(frozen=True)
class SupernetSettings(TrainingSettings, SectionSettings):
    """The supernet stage's training."""

    SECTION: ClassVar[str] = "supernet"


@dataclass(frozen=True)
class SampleSettings(SectionSettings):
    """The archs sampled from each space for evaluation and measuring."""

    SECTION: ClassVar[str] = "sample"
    n_archs: int
    seed: int


@dataclass(frozen=True)
class HWGPTBenchSource:
    """HW-GPT-Bench's published perplexities (``perplexity.hwgptbench``)."""

    url: str
    rev: str
    files: str
    vocab_size: int
    source_url: str | None = None


@dataclass(frozen=True)
class PerplexitySettings(SectionSettings):
    """The perplexity stage: inherited-weight evaluation of the sampled archs."""

    SECTION: ClassVar[str] = "perplexity"
    source: Literal["supernet", "hwgptbench"]
    hwgptbench: HWGPTBenchSource
    batches: int
    batch_size: int
    device: Literal["auto", "cpu", "cuda"]
    seed: int


@dataclass(frozen=True)
class ContentionSettings:
    """When a timed row counts as contended, and how often it is timed again
    (``measure.contention``)."""

    max_wall_cpu_ratio: float = 1.10
    max_ci_rel: float = 0.25
    max_runqueue_wait: float = 0.10
    retries: int = 2
    wait_s: float = 2.0


@dataclass(frozen=True)
class MeasureSettings(SectionSettings):
    """The measure stage: the conditions, timing protocol and memory budget of a campaign."""

    SECTION: ClassVar[str] = "measure"
    device: str
    aliases: dict[str, str]
    batch_sizes: tuple[int, ...]
    seq_lens: tuple[int, ...]
    dtypes: tuple[Dtype, ...]
    launch: tuple[Literal["eager", "cuda_graph"], ...]
    threads: int
    shards: int
    warmup: int
    min_repeats: int
    max_repeats: int
    target_rel_ci: float
    max_seconds: float
    interleave: bool
    memory_budget_gb: float | None
    group_anchors: int
    energy_window_s: float
    memory: bool
    seed: int
    repeat_share: float = 0.0
    estimator: Estimator = "median"
    contention: ContentionSettings = ContentionSettings()


@dataclass(frozen=True)
class RuntimeOptions:
    """The options the runtime stage varies one at a time (``runtime.options``)."""

    attention: tuple[Literal["math", "flash", "efficient", "cudnn"], ...] = ()
    quant: tuple[Literal["int8"], ...] = ()
    compile: tuple[Literal[True], ...] = ()
    recompute: tuple[Literal[True], ...] = ()

    def items(self) -> list[tuple[str, tuple[Any, ...]]]:
        """(option, values) of each option, in the schema's order."""
        return [(f.name, getattr(self, f.name)) for f in fields(self)]


@dataclass(frozen=True)
class BreakdownSettings:
    """The per-module time breakdown (``runtime.breakdown``)."""

    n_archs: int
    repeats: int


@dataclass(frozen=True)
class ServingSettings:
    """The serving sweep over batch sizes (``runtime.serving``)."""

    n_archs: int
    batch_sizes: tuple[int, ...]


@dataclass(frozen=True)
class ParallelSettings:
    """The data-parallel train-step modes (``runtime.parallel``)."""

    n_archs: int
    modes: tuple[Literal["none", "ddp", "zero1", "zero2", "zero3"], ...]
    recompute: tuple[bool, ...]
    dtypes: tuple[Literal["fp32", "bf16"], ...]
    batch_size: int
    cpu_ranks: int
    repeats: int
    profile_steps: int


@dataclass(frozen=True)
class RuntimeSettings(SectionSettings):
    """The runtime stage: workloads, options, breakdown, serving and parallel modes."""

    SECTION: ClassVar[str] = "runtime"
    n_archs: int
    batch_size: int
    seq_len: int
    gen_len: int
    workloads: tuple[Literal["prefill", "decode", "train_step"], ...]
    dtypes: tuple[Dtype, ...]
    options: RuntimeOptions
    warmup: int
    min_repeats: int
    max_repeats: int
    target_rel_ci: float
    max_seconds: float
    breakdown: BreakdownSettings
    serving: ServingSettings
    parallel: ParallelSettings
    seed: int
    repeat_share: float = 0.0
    estimator: Estimator = "median"


@dataclass(frozen=True)
class MLPEnsembleSettings:
    """The MLP ensemble surrogate family (``surrogate.mlp_ensemble``; defaults: params.yaml's)."""

    hidden: int = 64
    layers: int = 2
    members: int = 5
    epochs: int = 150
    lr: float = 0.01
    weight_decay: float = 1e-4


@dataclass(frozen=True)
class SurrogateSettings(SectionSettings):
    """The surrogates stage: families, their settings, intervals and cross-validation."""

    SECTION: ClassVar[str] = "surrogate"
    metrics: tuple[str, ...]
    families: tuple[Literal["lightgbm", "mlp_ensemble", "linear"], ...]
    lightgbm: dict[str, Any]
    coverage: float
    folds: int
    min_rows: int
    seed: int
    default_family: Literal["best", "lightgbm", "mlp_ensemble", "linear", "blend"] = "best"
    mlp_ensemble: MLPEnsembleSettings = MLPEnsembleSettings()
    workers: int | None = None  # None: one process per core


@dataclass(frozen=True)
class ClusterDevice:
    """Where one device's measure jobs run under a cluster profile, and its memory
    (``cluster.devices.{label}``)."""

    partition: str | None = None
    constraint: str | None = None
    gpus: int = 0
    runtime: int | None = None
    mem_mb: int | None = None
    memory_gb: float | None = None


@dataclass(frozen=True)
class ClusterSettings(SectionSettings):
    """Job placement under a cluster profile (read by Snakemake; results never depend on it)."""

    SECTION: ClassVar[str] = "cluster"
    devices: dict[str, ClusterDevice]


@dataclass(frozen=True)
class MeasurePlanSettings:
    """What the measure jobs' memory plan reads across sections: measure, cluster, the data
    stage's tokenizer, the spaces of ``workflow.scales`` and ``sample.n_archs``; built one way
    for ``hwgptbench measure-plan`` and for workflow/rules/cluster.smk's check before any job."""

    measure: MeasureSettings
    cluster: ClusterSettings
    tokenizer: TokenizerSettings
    spaces: dict[str, dict[str, Any]]  # by scale, as hwgptbench.space.SearchSpace reads them
    n_archs: int

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> MeasurePlanSettings:
        """These settings of the merged, validated params."""
        scales = WorkflowSettings.of(config["workflow"]).scales
        return cls(MeasureSettings.of(config["measure"]), ClusterSettings.of(config["cluster"]),
                   DataSettings.of(config["data"]).tokenizer,
                   {scale: config["spaces"][scale] for scale in scales},
                   SampleSettings.of(config["sample"]).n_archs)


@dataclass(frozen=True)
class SearchCondition:
    """The measurement condition whose hardware metrics the searches minimise
    (``search.condition``)."""

    batch_size: int
    seq_len: int
    dtype: Dtype
    launch: Literal["eager", "cuda_graph"]


class SearchOptions(Mapping[str, Any]):
    """The search algorithms' options (``search.options``, ``compress.search.options``): each
    entry built as the options type its key declares in
    :mod:`hwgptbench.search_algorithms`, whose fields hold the defaults of what it leaves out;
    an algorithm without an entry runs with its type's defaults."""

    def __init__(self, entries: Mapping[str, Any] | None = None) -> None:
        self._entries = dict(entries or {})

    @classmethod
    def from_params(cls, values: Mapping[str, Any], where: str) -> SearchOptions:
        """The options of a validated params mapping (key -> the options' mapping)."""
        if not isinstance(values, Mapping):
            raise SettingsError(f"{where}: expected a mapping, got {values!r}")
        entries: dict[str, Any] = {}
        for key, entry in values.items():
            try:
                kind = options_type(key)
            except KeyError:
                raise SettingsError(f"{where}.{key}: no search algorithm has options {key!r}"
                                    ) from None
            entries[key] = build(kind, entry, f"{where}.{key}")
        return cls(entries)

    def of(self, algorithm: str) -> Any:
        """The options an algorithm runs with (its type's defaults where not given)."""
        declared = ALGORITHMS[algorithm]
        return self._entries.get(declared.options) or declared.options_type()

    def __getitem__(self, key: str) -> Any:
        return self._entries[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"SearchOptions({self._entries!r})"


@dataclass(frozen=True)
class SearchSettings(SectionSettings):
    """The search stage: objective sets, algorithms, budgets and the reference front."""

    SECTION: ClassVar[str] = "search"
    objective_sets: dict[str, tuple[str, ...]]
    objectives: tuple[str, ...]
    devices: tuple[str, ...]
    condition: SearchCondition
    algorithms: tuple[str, ...]
    budget: int
    seeds: int
    reference_archs: int
    reference_seed: int
    options: SearchOptions


@dataclass(frozen=True)
class ExternalSettings:
    """Other projects' public latency data for few-shot transfer (``paper.external``): the
    folders of the user's copies, None where not given."""

    help_fbnet: str | None
    hat: str | None
    ks: tuple[int, ...]
    seeds: int
    report_k: int


@dataclass(frozen=True)
class PaperSettings(SectionSettings):
    """`make paper`: the shipped tables' scales, the search at the paper's budget, external
    data."""

    SECTION: ClassVar[str] = "paper"
    scales: tuple[str, ...]
    search_scale: str
    search: SearchSettings
    external: ExternalSettings


TransferMethod = Literal["ensemble", "table_prior", "meta_ridge", "source_ridge", "feature_ridge",
                         "flops_line"]


@dataclass(frozen=True)
class TransferSettings(SectionSettings):
    """The transfer stage: few-shot adaptation of the hardware surrogates to a new target."""

    SECTION: ClassVar[str] = "transfer"
    metrics: tuple[str, ...]
    ks: tuple[int, ...]
    report_k: int
    hold_out: tuple[Literal["target", "device"], ...]
    methods: tuple[TransferMethod, ...]
    method: TransferMethod
    selections: tuple[Literal["designed", "random"], ...]
    selection: Literal["designed", "random"]
    seeds: int
    min_test: int
    folds: int
    source_model: dict[str, Any]  # LightGBM parameters of the source devices' models
    sigma_floor: float  # the smallest log sd of an adapted surrogate's interval
    coverage: float
    seed: int
