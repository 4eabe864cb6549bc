"""The params sections the workflow's stages read, one typed model each: field types, bounds,
defaults (params.yaml's values: tests/test_settings.py) and a one-line description per field
(`hwgptbench params --describe`, docs/params.md). Lists are tuples."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal

from pydantic import Field, create_model, model_validator
from pydantic.dataclasses import dataclass

from ..meters.condition import Condition
from ..metrics import PERPLEXITY, hardware_metrics
from ..search_algorithms import ALGORITHMS
from .fields import (
    DATACLASS,
    Count,
    Count0,
    Count2,
    Count3,
    Coverage,
    Device,
    Distinct,
    Dtype,
    Estimator,
    Folds,
    Label,
    Launch,
    Loadable,
    Model,
    Name,
    NonNegative,
    OneOf,
    Positive,
    Section,
    Seed,
    Seeds,
    Share,
    Some,
    Steps,
    Text,
    Threads,
    Width,
    doc,
)
from .problems import Problems

if TYPE_CHECKING:
    from ..space import SearchSpace
    from .document import Params

HardwareMetric = Annotated[str, OneOf(hardware_metrics)]
Objective = Annotated[str, OneOf(lambda: [PERPLEXITY, *hardware_metrics()])]
Algorithm = Annotated[str, OneOf(lambda: list(ALGORITHMS))]
TransferMethod = Literal["ensemble", "table_prior", "meta_ridge", "source_ridge", "feature_ridge",
                         "flops_line"]
Scale = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")]
Big = Annotated[int, Field(ge=1, le=10**12)]
Source = Annotated[str, Field(pattern=r"^[A-Za-z0-9._~/][A-Za-z0-9._~:/@+%=, -]*$")]  # no -x
Folder = Annotated[str, Field(pattern=r"(?a)^(?!/)(?!.*(^|/)[.]{1,2}(/|$))\w[\w. /-]*$")]
LIGHTGBM = {"num_iterations": 200, "num_leaves": 15, "learning_rate": 0.05, "min_data_in_leaf": 5}


class WorkflowSettings(Section):
    """What a run covers: the scales and the devices it measures."""

    SECTION: ClassVar[str] = "workflow"
    scales: Some[Name] = doc(("tiny",), "search spaces (keys of spaces) the workflow runs")
    devices: Distinct[Annotated[str, Field(pattern=r"^(auto|[a-z0-9][a-z0-9-]*)$")]] = doc(
        ("auto",), "devices measured (auto: this machine; []: published tables only)")


class CorpusSettings(Model):
    """Where the data stage's text comes from."""

    source: Literal["text_files", "huggingface"] = doc("text_files", "a folder or a HF dataset")
    path: Text | None = doc("data/corpora/shakespeare", "folder of .txt files (text_files)")
    pattern: Text | None = doc("*.txt", "glob of the files inside path (text_files)")
    dataset: Text | None = doc(None, "Hugging Face dataset id (huggingface)")
    config: str | None = doc(None, "dataset configuration (huggingface)")
    split: Text | None = doc(None, "dataset split (huggingface)")
    revision: str | None = doc(None, "dataset revision to pin (huggingface)")
    text_field: Text | None = doc(None, "column holding the text (huggingface)")
    max_documents: Big | None = doc(None, "read at most this many documents (null: all)")

    @model_validator(mode="after")
    def _source_fields(self) -> CorpusSettings:
        needed = {"text_files": ("path", "pattern"),
                  "huggingface": ("dataset", "split", "text_field")}[self.source]
        Problems.missing(self, needed, f"source {self.source}")
        return self


class TokenizerSettings(Model):
    """The tokenizer trained or read by the data stage."""

    kind: Literal["bpe", "file"] = doc("bpe", "train a byte-level BPE, or load a tokenizer.json")
    vocab_size: Annotated[int, Field(ge=512, le=1_000_000)] | None = doc(
        2048, "vocabulary size of the trained BPE, special tokens included (bpe)")
    min_frequency: Annotated[int, Field(ge=1, le=10**9)] = doc(2, "minimum pair count of a merge")
    file: Text | None = doc(None, "a Hugging Face tokenizers JSON file (file)")

    @model_validator(mode="after")
    def _kind_fields(self) -> TokenizerSettings:
        Problems.missing(self, ("vocab_size",) if self.kind == "bpe" else ("file",),
                         f"kind {self.kind}")
        return self


class DataSettings(Section):
    """The data stage: corpus, tokenizer and token shards."""

    SECTION: ClassVar[str] = "data"
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")] = doc(
        "shakespeare", "label of the dataset: outputs go to results/data/{name}/")
    corpus: CorpusSettings = CorpusSettings()
    tokenizer: TokenizerSettings = TokenizerSettings()
    val_fraction: Annotated[float, Field(gt=0, le=0.5)] = doc(0.1, "documents held out")
    shard_tokens: Annotated[int, Field(ge=1024, le=10**11)] = doc(50_000_000, "tokens per shard")
    seed: Seed = doc(1234, "seed of the train/validation document split")


class SpaceSettings(Model):
    """A search space: choices per dimension; head size, context and rotary fraction fixed."""

    embed_dim: Some[Width] = doc((64, 96, 128), "embedding widths")
    n_layer: Some[Width] = doc((2, 3, 4), "layer counts")
    n_head: Some[Width] = doc((2, 4), "heads per layer")
    mlp_ratio: Some[Positive] = doc((2, 3, 4), "MLP width per layer, in embedding widths")
    bias: Some[bool] = doc((True, False), "whether linear layers and norms have biases")
    head_size: Annotated[int, Field(ge=2, le=2**20)] = doc(16, "size of every attention head")
    block_size: Annotated[int, Field(ge=2, le=2**20)] = doc(128, "context length in tokens")
    rotary_fraction: Share = doc(0.5, "share of each head's dimensions with rotary embeddings")
    family: Literal["gpt_neox", "llama"] | None = doc(None, "model family (null: gpt_neox)")
    n_kv_head: Annotated[int, Field(ge=0, le=2**20)] | None = doc(
        None, "key/value heads of every layer (grouped-query attention; 0: one per head)")
    rope_base: Positive | None = doc(None, "rotary base theta (null: 10000)")
    norm_eps: Positive | None = doc(None, "epsilon of every norm (null: 1e-5)")

    def space(self, name: str) -> SearchSpace:
        """The search space these settings describe, named ``name``."""
        from ..space import SearchSpace

        return SearchSpace.from_dict(name, {k: v for k, v in self if v is not None})

    @model_validator(mode="after")
    def _valid_space(self) -> SpaceSettings:
        try:
            self.space("this")
        except ValueError as error:
            problems = Problems()
            problems.add(None, str(error))
            raise problems from None
        return self


def _space(embed: tuple[int, ...], layers: tuple[int, ...], heads: tuple[int, ...]
           ) -> SpaceSettings:
    return SpaceSettings(embed_dim=embed, n_layer=layers, n_head=heads, head_size=64,
                         block_size=1024)


SPACES = {"tiny": SpaceSettings(), "s": _space((192, 384, 768), (10, 11, 12), (4, 8, 12)),
          "m": _space((256, 512, 1024), (22, 23, 24), (8, 12, 16)),
          "l": _space((320, 640, 1280), (34, 35, 36), (8, 16, 20))}
Beta = Annotated[float, Field(ge=0, lt=1)]


@dataclass(frozen=True, config=DATACLASS)
class TrainingSettings:
    """A sandwich-rule training of a weight-sharing supernet (``supernet``,
    ``compress.pretrain``, ``compress.finetune``); a dataclass, which the training records
    as it is (``dataclasses.asdict``)."""

    steps: Steps = doc(100, "optimizer steps")
    batch_size: Width = doc(16, "sequences per sub-network and step, split over processes")
    random_subnets: Count0 = doc(2, "random sub-networks per step besides largest and smallest")
    lr: Positive = doc(3.16e-4, "peak AdamW learning rate")
    betas: tuple[Beta, Beta] = doc((0.9, 0.98), "AdamW betas")
    weight_decay: NonNegative = doc(0.1, "AdamW weight decay (matrices only)")
    warmup_steps: Annotated[int, Field(ge=0, le=10**8)] = doc(10, "linear warm-up steps")
    min_lr_ratio: Share = doc(0.1, "final learning rate of the cosine schedule, as a share of lr")
    grad_clip: Positive = doc(1.0, "max gradient norm")
    checkpoint_every: Steps = doc(40, "steps between resumable checkpoints")
    device: Device = doc("auto", "auto: cuda when available, else cpu")
    seed: Seed = doc(1234, "seed of initialisation, data and sub-network sampling")
    snapshots: Distinct[Steps] = doc(
        (40, 80), "training steps at which a snapshot of the supernet is also kept (< steps)")
    processes: Threads = doc(1, "training processes, one per GPU (> 1: torchrun)")

    @model_validator(mode="after")
    def _fits(self) -> TrainingSettings:
        problems = Problems()
        late = [s for s in self.snapshots if s >= self.steps]
        if late:
            problems.add("snapshots", f"{list(self.snapshots)!r} is not allowed; every snapshot "
                         f"must be < {{at}}steps ({self.steps}): drop {late} or raise {{at}}steps")
        if list(self.snapshots) != sorted(self.snapshots):
            problems.add("snapshots", f"{list(self.snapshots)!r} is not allowed; list distinct "
                         f"steps in increasing order, e.g. {sorted(self.snapshots)}")
        if self.batch_size % self.processes:
            lower = self.batch_size // self.processes * self.processes
            upper = lower + self.processes
            problems.add("batch_size", f"{self.batch_size} is not divisible by {{at}}processes "
                         f"({self.processes}); each process trains batch_size / processes "
                         f"sequences: set {{at}}batch_size to a multiple of {self.processes} "
                         f"(e.g. {f'{lower} or ' if lower else ''}{upper}) or {{at}}processes "
                         f"to a divisor of {self.batch_size}")
        problems.raise_any()
        return self


@dataclass(frozen=True, config=DATACLASS)
class SupernetSettings(TrainingSettings, Loadable):
    """The supernet stage's training."""

    SECTION: ClassVar[str] = "supernet"


class SampleSettings(Section):
    """The archs sampled from each space for evaluation and measuring."""

    SECTION: ClassVar[str] = "sample"
    n_archs: Count = doc(60, "archs sampled uniformly (the largest and the smallest added)")
    seed: Seed = doc(4321, "sampling seed")
    archs_of: Label | None = doc(
        None, "a device shipped in the package whose archs are the pool (null: the space or "
              "the imported table): the same archs measured on another device")


class HWGPTBenchSource(Model):
    """HW-GPT-Bench's published perplexities (docs/hwgptbench_import.md)."""

    url: Source = doc("https://github.com/automl/HW-GPT-Bench", "repository or a local clone")
    rev: Annotated[str, Field(pattern=r"^[0-9a-f]{7,40}$")] = doc(
        "795cba8124826acc600df1bd2bb516b22f207671", "the commit that holds the files")
    files: Folder = doc("data/hwgptbench", "folder the files and their .dvc pointers go to")
    vocab_size: Annotated[int, Field(ge=1, le=1_000_000)] = doc(50304, "embedding rows")
    source_url: Source | None = doc(None, "the repository the tables name (null: url)")


class PerplexitySettings(Section):
    """The perplexity stage: inherited-weight evaluation of the sampled archs."""

    SECTION: ClassVar[str] = "perplexity"
    source: Literal["supernet", "hwgptbench"] = doc(
        "supernet", "the trained supernet, or HW-GPT-Bench's published tables")
    hwgptbench: HWGPTBenchSource = HWGPTBenchSource()
    batches: Count = doc(3, "validation batches per arch")
    batch_size: Width = doc(16, "sequences per batch")
    device: Device = doc("auto", "auto: cuda when available, else cpu")
    seed: Seed = doc(99, "seed of the validation windows")


class ContentionSettings(Model):
    """When a timed CPU row counts as contended and is timed again (docs/measure.md)."""

    max_wall_cpu_ratio: Annotated[float, Field(ge=1, le=100)] = doc(
        1.10, "contended: median wall/CPU time of its calls above this")
    max_ci_rel: Annotated[float, Field(gt=0, le=100)] = doc(
        0.25, "or its latency's 95% CI half-width above this share of it")
    max_runqueue_wait: Share = doc(0.10, "or its threads waited for a core this share of time")
    retries: Annotated[int, Field(ge=0, le=100)] = doc(2, "later visits at most")
    wait_s: Annotated[float, Field(ge=0, le=3600)] = doc(2.0, "pause before each visit")


class Timing(Model):
    """How long and how precisely a latency is timed."""

    warmup: Count0 = doc(3, "untimed calls before timing")
    min_repeats: Count3 = doc(8, "timed calls at least")
    max_repeats: Count3 = doc(300, "timed calls at most")
    target_rel_ci: Positive = doc(0.02, "stop once the median's 95% CI is within this share")
    max_seconds: Positive = doc(0.3, "timing budget per arch and condition")

    @model_validator(mode="after")
    def _bounds(self) -> Timing:
        if self.min_repeats > self.max_repeats:
            Problems.one("min_repeats", f"{self.min_repeats} exceeds {{at}}max_repeats "
                         f"{self.max_repeats}; lower it or raise max_repeats")
        return self


class MeasureSettings(Timing, Loadable):
    """The measure stage: the conditions, timing protocol and memory budget of a campaign."""

    SECTION: ClassVar[str] = "measure"
    device: Label = doc("auto", "this machine's label (auto: from the hardware)")
    aliases: dict[Label, str] = doc({}, "own labels: {label: the hardware's auto label}")
    batch_sizes: Some[Width] = doc((1,), "batch sizes measured")
    seq_lens: Some[Width] = doc((128,), "sequence lengths measured")
    dtypes: Some[Dtype] = doc(("fp32", "bf16"), "dtypes measured")
    launch: Some[Launch] = doc(("eager", "cuda_graph"), "launch modes (cuda_graph: GPUs only)")
    threads: Threads = doc(1, "CPU intra-op threads")
    shards: Count = doc(1, "jobs the archs are split into")
    interleave: bool = doc(True, "time a shard's archs round-robin")
    memory_budget_gb: Positive | None = doc(None, "memory of models timed together (null: 60%)")
    group_anchors: Count = doc(3, "archs timed in every group, to divide out its speed")
    energy_window_s: Positive = doc(3.0, "seconds of forwards per energy reading")
    memory: bool = doc(True, "measure peak memory")
    seed: Seed = doc(0, "seed of the random input tokens")
    repeat_share: Share = doc(0.1, "share of archs timed again: each surrogate's ceiling")
    estimator: Estimator = doc("min", "CPU latency: wall median, minimum or CPU-time median")
    contention: ContentionSettings = ContentionSettings()


class RuntimeOptions(Model):
    """The options the runtime stage varies one at a time from the defaults."""

    attention: Distinct[Literal["math", "flash", "efficient", "cudnn"]] = doc(
        ("math", "flash", "efficient"), "SDPA backends forced")
    quant: Distinct[Literal["int8"]] = doc(("int8",), "dynamic int8 Linear layers (CPU, fp32)")
    compile: Distinct[Literal[True]] = doc((), "[true]: torch.compile each model")
    recompute: Distinct[Literal[True]] = doc((True,), "[true]: recomputation in train_step")


class BreakdownSettings(Model):
    """The per-module time breakdown (torch.profiler) of the first dtype's defaults."""

    n_archs: Count0 = doc(2, "archs profiled (0: none)")
    repeats: Count = doc(4, "profiled calls per arch and condition")


class ServingSettings(Model):
    """The serving sweep: TTFT, TPOT and throughput per batch size (first dtype)."""

    n_archs: Count0 = doc(3, "archs swept (0: none)")
    batch_sizes: Distinct[Width] = doc((1, 4, 16), "batch sizes swept")


class ParallelSettings(Model):
    """The data-parallel train step under torchrun, one row per rank (docs/runtime.md)."""

    n_archs: Count0 = doc(2, "archs run (0: none)")
    modes: Some[Literal["none", "ddp", "zero1", "zero2", "zero3"]] = doc(
        ("none", "ddp", "zero1", "zero2", "zero3"), "data-parallel modes")
    recompute: Some[bool] = doc((False,), "activation recomputation off and/or on")
    dtypes: Some[Literal["fp32", "bf16"]] = doc(("fp32",), "fp32, or bf16 autocast")
    batch_size: Width = doc(2, "sequences per rank")
    cpu_ranks: Threads = doc(2, "ranks on a machine without CUDA (gloo)")
    repeats: Count2 = doc(5, "timed steps (the median is reported)")
    profile_steps: Count = doc(2, "steps under the profiler")


class RuntimeSettings(Timing, Loadable):
    """The runtime stage: workloads, options, breakdown, serving and parallel modes."""

    SECTION: ClassVar[str] = "runtime"
    n_archs: Count = doc(20, "archs spread over the sampled ones' sizes")
    batch_size: Width = doc(1, "sequences per call")
    seq_len: Width = doc(64, "prompt and training sequence length")
    gen_len: Width = doc(16, "tokens generated per decode call")
    workloads: Some[Literal["prefill", "decode", "train_step"]] = doc(
        ("prefill", "decode", "train_step"), "workloads timed")
    dtypes: Some[Dtype] = doc(("fp32", "bf16"), "dtypes; options are varied on the first")
    options: RuntimeOptions = RuntimeOptions()
    warmup: Count0 = doc(2, "untimed calls before timing")
    min_repeats: Count3 = doc(5, "timed calls at least")
    max_repeats: Count3 = doc(40, "timed calls at most")
    target_rel_ci: Positive = doc(0.05, "stop once the median's 95% CI is within this share")
    max_seconds: Positive = doc(0.08, "timing budget per arch and condition")
    breakdown: BreakdownSettings = BreakdownSettings()
    serving: ServingSettings = ServingSettings()
    parallel: ParallelSettings = ParallelSettings()
    seed: Seed = doc(0, "seed of the weights and input tokens")
    repeat_share: Share = doc(0.25, "share of archs timed again under every condition")
    estimator: Estimator = doc("min", "as measure.estimator")


class MLPEnsembleSettings(Model):
    """The MLP ensemble surrogate family."""

    hidden: Width = doc(64, "hidden width")
    layers: Annotated[int, Field(ge=1, le=1000)] = doc(2, "hidden layers")
    members: Seeds = doc(5, "networks in the ensemble")
    epochs: Steps = doc(150, "training epochs")
    lr: Positive = doc(0.01, "learning rate")
    weight_decay: NonNegative = doc(1e-4, "weight decay")


Family = Literal["lightgbm", "mlp_ensemble", "linear"]


class SurrogateSettings(Section):
    """The surrogates stage: families, their settings, intervals and cross-validation."""

    SECTION: ClassVar[str] = "surrogate"
    metrics: Some[HardwareMetric] = doc(
        ("latency_ms", "energy_mj", "memory_peak_mb"), "hardware metrics modelled")
    families: Some[Family] = doc(("lightgbm", "mlp_ensemble", "linear"), "families compared")
    lightgbm: dict[str, Any] = doc(LIGHTGBM, "LightGBM parameters (any of lgb.train)")
    coverage: Coverage = doc(0.9, "nominal coverage of the predicted intervals")
    folds: Folds = doc(5, "cross-validation folds of the quality table")
    min_rows: Annotated[int, Field(ge=4, le=10**7)] = doc(20, "fewer measured archs: no model")
    seed: Seed = doc(0, "seed of the folds and models")
    default_family: Literal["best", "lightgbm", "mlp_ensemble", "linear", "blend"] = doc(
        "best", "what the search queries (best: the quality table's pick per target)")
    mlp_ensemble: MLPEnsembleSettings = MLPEnsembleSettings()
    workers: Threads | None = doc(None, "processes fitting in parallel (null: one per core)")

    @model_validator(mode="after")
    def _family_fitted(self) -> SurrogateSettings:
        family = self.default_family
        if not (family == "best" or family in self.families
                or (family == "blend" and len(self.families) > 1)):
            Problems.one("default_family", f"{family!r} is not fitted ({{at}}families "
                         f"{list(self.families)}; blend needs two or more): add it there or "
                         "choose best")
        return self


class ClusterDevice(Model):
    """Where one device's measure jobs run under a cluster profile, and its memory."""

    partition: str | None = doc(None, "SLURM partition")
    constraint: str | None = doc(None, "node features, e.g. a100")
    gpus: Annotated[int, Field(ge=0, le=1024)] = doc(0, "GPUs the job gets")
    runtime: Annotated[int, Field(ge=1, le=10**6)] | None = doc(None, "wall time in minutes")
    mem_mb: Annotated[int, Field(ge=1, le=10**8)] | None = doc(None, "memory in MB")
    memory_gb: Positive | None = doc(None, "the device's memory (GiB), checked against the plan")


class ClusterSettings(Section):
    """Job placement under a cluster profile (read by Snakemake; results never depend on it)."""

    SECTION: ClassVar[str] = "cluster"
    devices: dict[Label, ClusterDevice] = doc({}, "device label -> placement of its jobs")


class SearchOptions(Model):
    """The search algorithms' options by options key; an algorithm without an entry runs with
    its options type's defaults."""

    def of(self, algorithm: str) -> Any:
        """The options an algorithm runs with (its type's defaults where not given)."""
        declared = ALGORITHMS[algorithm]
        return getattr(self, declared.options, None) or declared.options_type()


def options_model(name: str, algorithms: Iterable[str]) -> type[SearchOptions]:
    """The model of an options mapping: one optional entry per options key of ``algorithms``
    (:data:`hwgptbench.search_algorithms.ALGORITHMS`), each its options type."""
    kinds = {ALGORITHMS[a].options: ALGORITHMS[a].options_type for a in algorithms}
    return create_model(name, __base__=SearchOptions,  # type: ignore[call-overload]
                        **{key: (kind | None, None) for key, kind in kinds.items()})


AllOptions = options_model("AllOptions", ALGORITHMS)
SetName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9_-]*$")]
OBJECTIVE_SETS = {"ppl-latency": ("perplexity", "latency_ms"),
                  "ppl-latency-memory": ("perplexity", "latency_ms", "memory_peak_mb"),
                  "ppl-latency-energy": ("perplexity", "latency_ms", "energy_mj")}


class SearchSettings(Section):
    """The search stage: objective sets, algorithms, budgets and the reference front."""

    SECTION: ClassVar[str] = "search"
    objective_sets: dict[SetName, Annotated[Some[Objective], Field(min_length=2)]] = Field(
        OBJECTIVE_SETS, min_length=1, description="named sets of metrics, all minimized")
    objectives: Some[str] = doc(("ppl-latency",), "names of objective_sets that run")
    devices: Some[Label] = doc(("auto",), "device labels with surrogates (auto: this one)")
    condition: Condition = doc(Condition(1, 128, "fp32", "eager"), "condition of the metrics")
    algorithms: Some[Algorithm] = doc(
        ("rs", "ls", "nsga2", "morea", "moasha", "rsbo", "lsbo", "ehvi"), "algorithms run")
    budget: Count2 = doc(40, "evaluations per run")
    seeds: Seeds = doc(2, "runs per algorithm (seeds 0 .. seeds-1)")
    reference_archs: Count2 = doc(100_000, "archs behind the scaling and the reference front")
    reference_seed: Seed = doc(0, "seed of the reference archs")
    options: AllOptions = doc(AllOptions.parse({  # type: ignore[valid-type]
        "ls": {"initial": 10}, "nsga2": {"population_size": 20},
        "morea": {"population_size": 20, "sample_size": 5}, "moasha": {"reduction_factor": 2.0},
        "bo": {"initial": 10, "candidates": 200}}), "options per algorithm (docs/search.md)")

    @model_validator(mode="after")
    def _objectives_defined(self) -> SearchSettings:
        unknown = [name for name in self.objectives if name not in self.objective_sets]
        if unknown:
            Problems.one("objectives", f"{unknown} are not keys of {{at}}objective_sets "
                         f"({', '.join(self.objective_sets)}); define them there or remove them")
        return self


class TransferSettings(Section):
    """The transfer stage: few-shot adaptation of the hardware surrogates to a new target."""

    SECTION: ClassVar[str] = "transfer"
    metrics: Some[HardwareMetric] = doc(("latency_ms", "energy_mj"), "metrics transferred")
    ks: Some[Count2] = doc((2, 5, 10, 20, 40), "measured archs of a held-out target")
    report_k: Count2 = doc(10, "the k of the report (one of ks)")
    hold_out: Some[Literal["target", "device"]] = doc(
        ("target", "device"), "sources: every other target, or other devices' only")
    methods: Some[TransferMethod] = doc(
        ("ensemble", "table_prior", "meta_ridge", "source_ridge", "feature_ridge"),
        "adaptation methods compared (the baselines always run)")
    method: TransferMethod = doc("ensemble", "what `hwgptbench adapt` fits (one of methods)")
    selections: Some[Literal["designed", "random"]] = doc(
        ("designed", "random"), "how the k archs are chosen, compared")
    selection: Literal["designed", "random"] = doc("designed", "what `adapt` measures")
    seeds: Seeds = doc(5, "random selections per held-out target and k")
    min_test: Count2 = doc(20, "a k leaving fewer test archs is skipped")
    folds: Folds = doc(5, "folds of the cross-fitted source models")
    source_model: dict[str, Any] = doc(LIGHTGBM, "LightGBM parameters of the source models")
    sigma_floor: Annotated[float, Field(gt=0, le=10)] = doc(0.05, "smallest log sd of intervals")
    coverage: Coverage = doc(0.9, "nominal coverage of the adapted surrogate's interval")
    seed: Seed = doc(0, "seed of the folds, models and first random selection")

    @model_validator(mode="after")
    def _chosen_among_evaluated(self) -> TransferSettings:
        problems = Problems()
        for field, choices in (("report_k", "ks"), ("method", "methods"),
                               ("selection", "selections")):
            if getattr(self, field) not in getattr(self, choices):
                problems.add(field, f"{getattr(self, field)!r} is not one of {{at}}{choices} "
                             f"{list(getattr(self, choices))}: add it there or choose one of "
                             "them (the report and `hwgptbench adapt` use what the evaluation "
                             "measured)")
        problems.raise_any()
        return self


class ExternalSettings(Model):
    """Few-shot transfer on other projects' public latency data (null folders are skipped)."""

    help_fbnet: Text | None = doc(None, "HELP's data/fbnet folder")
    hat: Text | None = doc(None, "HAT's latency_dataset folder")
    ks: Some[Width] = doc((1, 5, 10, 20), "measured archs of the held-out device")
    seeds: Seeds = doc(10, "random selections per device and k")
    report_k: Count = doc(10, "the k of the report (one of ks)")

    @model_validator(mode="after")
    def _reported(self) -> ExternalSettings:
        if self.report_k not in self.ks:
            Problems.one("report_k", f"{self.report_k} is not one of {{at}}ks {list(self.ks)}: "
                         "add it there or choose one")
        return self


class PaperSettings(Section):
    """`make paper`: the shipped tables' figures and tables, the search at the paper's budget
    and external data (docs/paper_scale.md)."""

    SECTION: ClassVar[str] = "paper"
    scales: Some[Scale] = doc(("s", "m", "l"), "shipped scales summarised")
    search_scale: Scale = doc("s", "the shipped scale of the search at the paper's budget")
    search: SearchSettings = doc(SearchSettings.parse({
        "objective_sets": {"ppl-latency": ["perplexity", "latency_ms"],
                           "ppl-memory": ["perplexity", "memory_peak_mb"]},
        "objectives": ["ppl-latency", "ppl-memory"], "devices": ["cpu-amd-epyc-1t"],
        "algorithms": ["rs", "ls", "nsga2", "morea", "rsbo", "lsbo", "ehvi"], "budget": 200,
        "seeds": 10, "reference_archs": 20000,
        "options": {"ls": {"initial": 10}, "nsga2": {"population_size": 20},
                    "morea": {"population_size": 20, "sample_size": 5},
                    "bo": {"initial": 10, "candidates": 200, "refit_every": 5}}}),
        "the search section's fields, run against the shipped tables")
    external: ExternalSettings = ExternalSettings()

    @model_validator(mode="after")
    def _one_fidelity(self) -> PaperSettings:
        if "moasha" in self.search.algorithms:
            Problems.one("search.algorithms", "moasha needs perplexities at several training "
                         "steps, and the shipped tables have one per arch: remove it")
        return self


class MeasurePlanSettings(Model):
    """What the measure jobs' memory plan reads across sections, for `hwgptbench measure-plan`
    and workflow/rules/cluster.smk's check before any job."""

    measure: MeasureSettings
    cluster: ClusterSettings
    tokenizer: TokenizerSettings
    spaces: dict[str, SpaceSettings]
    n_archs: int

    @classmethod
    def of(cls, params: Params) -> MeasurePlanSettings:
        """These settings of the whole params: the spaces of ``workflow.scales``."""
        return cls(measure=params.measure, cluster=params.cluster,
                   tokenizer=params.data.tokenizer, n_archs=params.sample.n_archs,
                   spaces={scale: params.spaces[scale] for scale in params.workflow.scales})
