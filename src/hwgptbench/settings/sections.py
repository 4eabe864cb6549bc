"""The params sections as frozen dataclasses, one per section, with the schema's field names
(src/hwgptbench/schemas/params.schema.yaml holds each field's meaning and bounds). Lists are
tuples; a field the schema lets a file leave out has the default the code applied before.

Built with :func:`hwgptbench.settings.build.build` (``MeasureSettings.of(section)``) at the
command boundary; a command's params reads are the ``SECTION`` names of the types it builds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal, TypeVar

from .build import build

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
class SearchCondition:
    """The measurement condition whose hardware metrics the searches minimise
    (``search.condition``)."""

    batch_size: int
    seq_len: int
    dtype: Dtype
    launch: Literal["eager", "cuda_graph"]


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
    options: dict[str, dict[str, Any]]  # per algorithm, checked by search_algorithms.OPTIONS


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
