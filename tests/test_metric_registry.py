"""Declared once: a hardware metric in hwgptbench.metrics reaches the measurement table, the
params schema, the surrogate targets, the quality table and the figures' labels; a search
algorithm in hwgptbench.search_algorithms, with its options, is what the params schema accepts."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pydantic
import pytest
import torch
import yaml

from conftest import REPO_ROOT, no_contention_wait, surrogate_settings
from hwgptbench import params
from hwgptbench.measure import merge
from hwgptbench.measure import stage as measurements
from hwgptbench.metrics import (
    METRICS,
    Metric,
    MetricError,
    hardware_metrics,
    nullable_columns,
    register,
    registered,
)
from hwgptbench.params import section_of
from hwgptbench.plotting.style import metric_label
from hwgptbench.predictors.fitting import fit_device
from hwgptbench.settings.fields import Model
from hwgptbench.settings.sections import MeasureSettings, SearchOptions, options_model
from hwgptbench.space import SearchSpace

SPACE = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5})
VOCAB = 100
FAST = {"warmup": 1, "min_repeats": 3, "max_repeats": 5, "target_rel_ci": 0.5,
        "max_seconds": 0.05, "energy_window_s": 0.05, "memory": False, "threads": 1,
        "shards": 1, "seed": 0, "interleave": True, "repeat_share": 0.0,
        "batch_sizes": [1], "seq_lens": [16], "dtypes": ["fp32"]}
FIT = {"metrics": ["latency_ms", "toy_weights_kb"], "families": ["lightgbm"],
       "default_family": "lightgbm",
       "lightgbm": {"num_iterations": 30, "num_leaves": 7, "min_data_in_leaf": 2},
       "mlp_ensemble": {}, "coverage": 0.9, "folds": 3, "min_rows": 6, "seed": 0, "workers": 1}


def weights_kb(model: torch.nn.Module, forward: Callable[[], Any], x: torch.Tensor
               ) -> dict[str, Any]:
    """A toy meter: the model's weight bytes in kB (it runs one forward, as a meter may)."""
    forward()
    return {"toy_weights_kb": sum(p.numel() * p.element_size() for p in model.parameters())
            / 1024}


TOY = Metric("toy_weights_kb", "kB", "weight size (kB)", "toy_reason",
             {"toy_weights_kb": "Float64", "toy_reason": "String"}, measure=weights_kb)


@pytest.fixture
def toy() -> Iterator[Metric]:
    with registered(TOY) as metric:
        yield metric


def _measure_section() -> MeasureSettings:
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["measure"]
    return section_of(MeasureSettings, doc | FAST | no_contention_wait(doc))


def test_a_registered_metric_is_measured_fitted_and_labelled(toy: Metric, tmp_path: Path
                                                               ) -> None:
    archs = SPACE.sample(12, seed=0)
    shard = tmp_path / "shard.parquet"
    measurements.measure_shard(_measure_section(), SPACE, archs, VOCAB, "auto", (0, 1), shard)
    table = merge.merge_shards([shard], tmp_path / "device.parquet")
    assert table["toy_weights_kb"].null_count() == 0 and table["toy_reason"].null_count() == 12
    small, large = table.sort("params")["toy_weights_kb"][[0, -1]]
    assert 0 < small < large

    quality = fit_device(surrogate_settings(FIT), SPACE, VOCAB, table, tmp_path / "surrogates")
    toy_rows = quality.filter(pl.col("metric") == "toy_weights_kb")
    assert toy_rows["status"].to_list() == ["ok"]
    assert toy_rows["spearman_rho"][0] > 0.8  # weight bytes follow the arch closely
    assert (tmp_path / "surrogates" / "toy_weights_kb").is_dir()

    assert metric_label("toy_weights_kb") == "weight size (kB)"
    assert nullable_columns()["toy_weights_kb"] == pl.Float64


def test_the_schema_accepts_registered_metrics_only(toy: Metric) -> None:
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    doc["surrogate"]["metrics"] = ["latency_ms", "toy_weights_kb"]
    doc["search"]["objective_sets"]["ppl-toy"] = ["perplexity", "toy_weights_kb"]
    params.validate(copy.deepcopy(doc))
    del METRICS["toy_weights_kb"]
    try:
        with pytest.raises(params.ParamsError, match=r"surrogate\.metrics\.1: 'toy_weights_kb'"
                                                     r".*one of 'latency_ms'"):
            params.validate(doc)
    finally:
        register(TOY)


def test_a_metric_is_declared_once() -> None:
    assert hardware_metrics()[:2] == ["latency_ms", "energy_mj"]
    with pytest.raises(MetricError, match="already registered"):
        register(METRICS["energy_mj"])
    with pytest.raises(MetricError, match="reason column"):
        register(Metric("bad_ms", "ms", "bad (ms)", "bad_reason", {"bad_ms": "Float64"}))
    with pytest.raises(MetricError, match="not found"):
        Metric("lost_ms", "ms", "lost", "r", {}, measure="hwgptbench.meters:nothing").meter()
    assert "toy_weights_kb" not in METRICS


def test_a_search_algorithm_is_declared_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """An algorithm and its options type declared in search_algorithms are what params
    accept (its name when a value is checked; its options in the options model built from
    the declarations, as params' is at import: docs/architecture.md's recipe adds both to
    search_algorithms.py, tests/test_extension_recipes.py runs it), and what the search
    runs."""
    from hwgptbench import search_algorithms as declared
    from hwgptbench.moo import algorithms

    class ToyOptions(Model):
        """A toy's options."""

        initial: int = declared.option(7, "archs first", ge=1)

    toy = declared.Algorithm("local_search", "local_search", "toy", ToyOptions)
    monkeypatch.setitem(declared.ALGORITHMS, "toy", toy)
    doc = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    doc["search"]["algorithms"] = ["nsga2", "toy"]
    params.validate(copy.deepcopy(doc))
    assert algorithms.get_algorithm("toy") is algorithms.get_algorithm("ls")
    with_toy = options_model("WithToy", declared.ALGORITHMS)
    options = with_toy.parse({"toy": {"initial": 3}})
    assert options.of("toy") == ToyOptions(initial=3)
    assert SearchOptions().of("toy") == ToyOptions(initial=7)  # the default, written once
    with pytest.raises(pydantic.ValidationError, match=r"toy\.initial"):
        with_toy.parse({"toy": {"initial": 0}})
    monkeypatch.delitem(declared.ALGORITHMS, "toy")
    with pytest.raises(params.ParamsError, match=r"search\.algorithms\.1: 'toy'"):
        params.validate(doc)
