"""The compression table: the dense model vs found sub-networks vs their quantized versions.

The reference is fair: the largest sub-network after fine-tuning (:data:`FAIR_REFERENCE`), the
dense model's own shape with the same extra training every sub-network had. Measuring against
the dense model as it was pretrained would credit the search with what the fine-tuning steps
bought (on the default run the largest sub-network alone gains several % perplexity from
them).

Picks, from the sub-networks the search evaluated: the fair reference; and for every objective
set's cost (parameters, latency) and every tolerance t of ``compress.table.tolerances``, the
cheapest sub-network whose perplexity is within t (relative) of the fair reference's. Each pick
and the dense model are then measured as they are (``none``) and under each quantization
method of ``compress.quantize``: size, prefill latency and throughput on this machine,
perplexity and cloze accuracy on the same held-out data, and their ratios to the fair
reference unquantized (``size_x``, ``throughput_x``, ``perplexity_rel_change``,
``accuracy_change``) and to the dense model as pretrained (the same names with
``_vs_pretrained``), so that the training effect reads apart from the search's.

Baselines at matched size (:mod:`hwgptbench.compress.baselines`): at the parameter count of
each searched pick, a model pruned without search (uniform width, depth by block influence,
Wanda sparsity with as many nonzeros). ``baseline`` names the kind (``dense``, ``search``,
``uniform_width``, ``depth``, ``wanda``), ``matched_to`` the pick, and ``finetune`` the
training after pretraining (:data:`FINETUNE`): ``supernet`` pruned from the fine-tuned largest
sub-network (the very weights the search's picks inherit: search against heuristic, weights
equal), ``none`` pruned from the dense model as pretrained, and ``equal`` that model then
fine-tuned with the supernet fine-tune's steps, data and learning rate
(:mod:`hwgptbench.compress.recovery`: prune-then-train against train-then-search, budgets
equal). The dense row is ``none``, the fair reference and the picks ``supernet``. A Wanda
row's ``params`` counts nonzeros and its ``size_mb`` is its CSR size, while its latency is that
of the dense kernels it still runs.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple, cast

import polars as pl
import torch
import torch.nn as nn

from ..evaluation.tasks import score_cloze
from ..meters.latency import measure_latency_interleaved
from ..meters.prefill import prefill_call, speed, timing_kwargs
from ..meters.quantize import QuantizationUnsupported, backend_of, model_size_bytes, quantize
from ..model import GPT
from ..space import Arch
from .baselines import (
    block_influence,
    depth_prune,
    input_norms,
    nonzero_params,
    param_count,
    sparse_size_bytes,
    uniform_width,
    wanda,
)
from .evaluate import SubnetEvaluator, mean_loss

log = logging.getLogger(__name__)

MB = 1e6
COST_WORDS = {"params": "fewest params", "latency_ms": "fastest"}
FAIR_REFERENCE = "largest, fine-tuned"  # the label of the row every ratio is taken against
PRETRAINED = "dense"  # the dense model as pretrained (or imported)


def picks(subnets: pl.DataFrame, reference_perplexity: float,
          objectives: Mapping[str, Sequence[str]], tolerances: Sequence[float], largest: str
          ) -> list[tuple[str, str]]:
    """(label, arch id) of the sub-networks the table reports (see the module docstring);
    ``reference_perplexity`` is the fair reference's, the fine-tuned largest sub-network's."""
    chosen = [(FAIR_REFERENCE, largest)]
    costs = list(dict.fromkeys(m for metrics in objectives.values() for m in metrics
                               if m != "perplexity"))
    for cost in costs:
        for tolerance in tolerances:
            within = subnets.filter(pl.col(cost).is_not_null() & (
                pl.col("perplexity") <= reference_perplexity * (1 + tolerance)))
            if within.is_empty():
                log.info("no evaluated sub-network within %.1f%% of the fair reference's "
                         "perplexity", 100 * tolerance)
                continue
            best = within.sort(cost, "perplexity").row(0, named=True)["arch_id"]
            chosen.append((f"{COST_WORDS.get(cost, cost)}, ppl within {100 * tolerance:g}%",
                           best))
    unique: dict[str, str] = {}
    for label, arch_id in chosen:  # one row per sub-network, under its first label
        unique.setdefault(arch_id, label)
    return [(label, arch_id) for arch_id, label in unique.items()]


def quality(model: nn.Module, evaluator: SubnetEvaluator) -> dict[str, Any]:
    """Size, perplexity and cloze accuracy of a (possibly quantized) model."""
    device = evaluator.device
    accuracy = (None if evaluator.cloze is None
                else score_cloze(model, evaluator.cloze, device=device)["accuracy"])
    return {"size_mb": model_size_bytes(model) / MB,
            "perplexity": math.exp(mean_loss(model, evaluator.batches, device)),
            "accuracy": accuracy}


class Entry(NamedTuple):
    """One model of the table: its label, arch (or what was built), kind, training and model."""

    label: str
    arch_id: str
    baseline: str  # dense | search | uniform_width | depth | wanda
    finetune: str  # the training after pretraining: none | supernet | equal (FINETUNE)
    matched_to: str | None  # the searched pick whose size a baseline matches
    model: nn.Module


# a baseline's training (compress.table.baseline_finetune): what it is pruned from, and after
FINETUNE = {
    "supernet": "pruned from the fine-tuned largest sub-network (the weights the search "
                "inherits), no further training",
    "none": "pruned from the dense model as pretrained, no training",
    "equal": "pruned from the dense model as pretrained, then fine-tuned with the supernet "
             "fine-tune's steps, data and learning rate (compress.recovery)",
}
Recover = Callable[[GPT, bool], GPT]  # (pruned model, keep its zeros) -> fine-tuned model


def baselines(source: GPT, matched: Sequence[tuple[str, int]],
              calibration: Sequence[torch.Tensor], finetune: str,
              recover: Recover | None = None) -> list[Entry]:
    """Each baseline of :mod:`hwgptbench.compress.baselines`, pruned from ``source`` without
    search at the parameter count of each searched pick (``matched``: its label and count),
    then passed through ``recover`` when given; ``finetune`` names that training
    (:data:`FINETUNE`). Block influence and Wanda's input norms are computed once, on
    ``source`` and the calibration batches; a size a baseline cannot reach is logged and left
    out."""
    influence = block_influence(source, calibration)
    norms = input_norms(source, calibration)
    entries = []
    for label, params in matched:
        try:
            width, arch = uniform_width(source, params)
            entries.append(Entry(f"uniform width at {label} [{finetune}]", arch.id,
                                 "uniform_width", finetune, label, width))
        except ValueError as err:
            log.info("no uniform width baseline at %s: %s", label, err)
        try:
            shallow, kept = depth_prune(source, params, influence)
            entries.append(Entry(f"depth at {label} [{finetune}]",
                                 f"layers {','.join(map(str, kept))}", "depth", finetune, label,
                                 shallow))
        except ValueError as err:
            log.info("no depth baseline at %s: %s", label, err)
        sparse, _ = wanda(source, norms, params)
        entries.append(Entry(f"wanda at {label} [{finetune}]", f"{source.config.arch.id} sparse",
                             "wanda", finetune, label, sparse))
    if recover is None:
        return entries
    # a width or depth baseline is its arch: two sizes that prune to the same one (depth keeps
    # the same layers for both) train it once; a Wanda mask differs with each size
    recovered: dict[tuple[str, str], GPT] = {}

    def trained(entry: Entry) -> GPT:
        if entry.baseline == "wanda":
            return recover(cast(GPT, entry.model), True)
        key = (entry.baseline, entry.arch_id)
        if key not in recovered:
            recovered[key] = recover(cast(GPT, entry.model), False)
        return recovered[key]

    return [entry._replace(model=trained(entry)) for entry in entries]


@dataclass(frozen=True)
class BaselinePlan:
    """How the table builds its pruning baselines: on which calibration batches, with which
    trainings (:data:`FINETUNE`), from what."""

    calibration: Sequence[torch.Tensor]  # token ids of training windows
    finetunes: Sequence[str] = ("supernet",)
    pretrained: GPT | None = None  # the importance-ordered dense model as pretrained
    recover: Recover | None = None  # the fine-tune of ``equal``

    def __post_init__(self) -> None:
        unknown = sorted(set(self.finetunes) - set(FINETUNE))
        if unknown:
            raise ValueError(f"unknown baseline fine-tune {unknown}; choose from {list(FINETUNE)}")
        if {"none", "equal"} & set(self.finetunes) and self.pretrained is None:
            raise ValueError("baselines 'none' and 'equal' are pruned from the pretrained dense "
                             "model: pass it as pretrained")
        if "equal" in self.finetunes and self.recover is None:
            raise ValueError("baselines 'equal' need the recovery fine-tune: pass recover")


def compression_table(dense: GPT, evaluator: SubnetEvaluator, chosen: list[tuple[str, str]],
                      methods: Sequence[str], plan: BaselinePlan | None = None) -> pl.DataFrame:
    """One row per (model, quantization method), with ratios to the fair reference and to the
    dense model as pretrained, both unquantized (module docstring). With a ``plan``, the
    baselines of each searched pick follow, at its parameter count, unquantized, once per
    training of ``plan.finetunes`` (:func:`baselines`). All runnable models are timed
    interleaved (:func:`measure_latency_interleaved`), so machine drift biases none of the
    ratios; a method that cannot run here gives null metrics and the reason."""
    if FAIR_REFERENCE not in [label for label, _ in chosen]:
        raise ValueError(f"the table needs the fair reference: pass ({FAIR_REFERENCE!r}, the "
                         "largest arch id) among the picks")
    entries = [Entry(PRETRAINED, dense.config.arch.id, "dense", "none", None, dense.eval())]
    for label, arch_id in chosen:
        model = evaluator.supernet.extract(Arch.from_id(arch_id)).eval()
        entries.append(Entry(label, arch_id, "dense" if label == FAIR_REFERENCE else "search",
                             "supernet", None, model))
    if plan is not None:
        reference = entries[1 + [label for label, _ in chosen].index(FAIR_REFERENCE)].model
        matched = [(e.label, param_count(e.model)) for e in entries if e.baseline == "search"]
        for finetune in plan.finetunes:
            source = cast(GPT, reference if finetune == "supernet" else plan.pretrained)
            entries += baselines(source, matched, plan.calibration, finetune,
                                 plan.recover if finetune == "equal" else None)
    rows: list[dict[str, Any]] = []
    calls = []
    for entry in entries:
        base: dict[str, Any] = {
            "model": entry.label, "arch_id": entry.arch_id, "baseline": entry.baseline,
            "finetune": entry.finetune, "matched_to": entry.matched_to,
            "params": (nonzero_params(entry.model) if entry.baseline == "wanda"
                       else param_count(entry.model))}
        quantized = methods if entry.baseline in ("dense", "search") else []
        for method in ["none", *quantized]:
            row = base | {"quant": method}
            try:
                runnable = entry.model if method == "none" else quantize(entry.model, method)
            except QuantizationUnsupported as reason:
                rows.append(row | {"backend": None, "reason": str(reason)})
                continue
            log.info("evaluating %s (%s), quantization %s", entry.label, entry.arch_id, method)
            measured = quality(runnable, evaluator)
            if entry.baseline == "wanda":  # stored sparse (CSR); the kernels stay dense
                measured["size_mb"] = sparse_size_bytes(cast(GPT, entry.model)) / MB
            rows.append(row | {"backend": backend_of(method), "reason": None} | measured)
            calls.append((len(rows) - 1, prefill_call(runnable, evaluator.timing,
                                                      evaluator.supernet.vocab_size,
                                                      evaluator.device)))
    timing = evaluator.timing
    stats = measure_latency_interleaved([call for _, call in calls], evaluator.device,
                                        **timing_kwargs(timing, evaluator.device))
    for (index, _), stat in zip(calls, stats, strict=True):
        rows[index] |= speed(stat["latency_ms"], timing)
    table = pl.DataFrame(rows, infer_schema_length=None)
    fair = table.filter((pl.col("model") == FAIR_REFERENCE) & (pl.col("quant") == "none"))
    return table.with_columns(**ratios_to(fair.row(0, named=True)),
                              **{f"{name}_vs_pretrained": value for name, value
                                 in ratios_to(table.row(0, named=True)).items()})


def ratios_to(base: dict[str, Any]) -> dict[str, pl.Expr]:
    """The ratio columns of every row to one reference row: size and throughput as multiples,
    perplexity as a relative change, accuracy as a difference."""
    return {
        "size_x": base["size_mb"] / pl.col("size_mb"),
        # scalar / column and differences: polars divides a column by a scalar through its
        # reciprocal, which would make the reference row's own ratio 0.9999999999999999
        "throughput_x": base["latency_ms"] / pl.col("latency_ms"),  # same tokens per call
        "perplexity_rel_change": (pl.col("perplexity") - base["perplexity"])
        / base["perplexity"],
        "accuracy_change": (pl.col("accuracy") - base["accuracy"]
                            if base["accuracy"] is not None else pl.lit(None, dtype=pl.Float64)),
    }
