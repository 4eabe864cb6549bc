"""The baselines' recovery fine-tune (the supernet fine-tune's windows and schedule, zeros
kept), the table's plan of which baselines to build, and the search's edge over seeds."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest
import torch
from scipy import stats

from hwgptbench.compress.baselines import input_norms, nonzero_params, param_count, wanda
from hwgptbench.compress.figures import search_edge
from hwgptbench.compress.recovery import recover
from hwgptbench.compress.table import BaselinePlan, baselines
from hwgptbench.model import GPT
from hwgptbench.settings.sections import TrainingSettings
from hwgptbench.training.train import WindowSampler
from test_compress_baselines import VOCAB, calibration, supernet_of


def config(steps: int = 3, lr: float = 1e-2, seed: int = 0) -> TrainingSettings:
    return TrainingSettings(steps=steps, batch_size=2, random_subnets=0, lr=lr,
                            betas=(0.9, 0.98), weight_decay=0.1, warmup_steps=1,
                            min_lr_ratio=0.1, grad_clip=1.0, checkpoint_every=1, device="cpu",
                            seed=seed, snapshots=(), processes=1)


def sampler() -> WindowSampler:
    """Windows of a learnable sequence (each token determines the next)."""
    return WindowSampler([(np.arange(4000) * 7 % VOCAB).astype(np.uint16)], 16)


def loss_on(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor]) -> float:
    with torch.no_grad():
        return float(model(*batch)[1])


def test_recovery_trains_and_is_deterministic() -> None:
    held_out = sampler().sample(np.random.default_rng(99), 4)
    first = recover(supernet_of("llama-gqa").extract(), config(steps=8), sampler(),
                    torch.device("cpu"))
    second = recover(supernet_of("llama-gqa").extract(), config(steps=8), sampler(),
                     torch.device("cpu"))
    assert not first.training
    for a, b in zip(first.parameters(), second.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=0, rtol=0)  # same windows, same steps
    untrained = supernet_of("llama-gqa").extract()
    assert loss_on(first, held_out) < loss_on(untrained, held_out)
    other_seed = recover(supernet_of("llama-gqa").extract(), config(steps=8, seed=1),
                         sampler(), torch.device("cpu"))
    assert not torch.equal(other_seed.wte.weight, first.wte.weight)  # other windows


def test_recovery_keeps_a_sparse_model_sparse() -> None:
    model = supernet_of("neox-bias").extract()
    target = param_count(model) * 6 // 10
    sparse, masks = wanda(model, input_norms(model, calibration()), target)
    before = {name: p.clone() for name, p in sparse.named_parameters()}
    recover(sparse, config(), sampler(), torch.device("cpu"), keep_zeros=True)
    assert nonzero_params(sparse) == target
    weights = dict(sparse.named_parameters())
    for name, mask in masks.items():
        assert not weights[name][~mask].any()  # the pruned entries stay zero
        assert not torch.equal(weights[name][mask], before[name][mask])  # the rest trained


def test_recovery_without_keep_zeros_fills_them_in() -> None:
    model = supernet_of("llama-gqa").extract()
    target = param_count(model) * 6 // 10
    sparse, _ = wanda(model, input_norms(model, calibration()), target)
    recover(sparse, config(), sampler(), torch.device("cpu"))
    assert nonzero_params(sparse) > target


def test_baseline_plan_names_what_it_misses() -> None:
    batches = calibration()
    with pytest.raises(ValueError, match="unknown baseline fine-tune"):
        BaselinePlan(batches, ["prune"])
    with pytest.raises(ValueError, match="pass it as pretrained"):
        BaselinePlan(batches, ["supernet", "none"])
    with pytest.raises(ValueError, match="pass recover"):
        BaselinePlan(batches, ["equal"], supernet_of("llama-gqa").extract())
    assert BaselinePlan(batches).finetunes == ("supernet",)


def seed_table(pick_perplexity: float, baseline_perplexity: float) -> pl.DataFrame:
    """A compression table of one pick and one Wanda baseline at its size."""
    rows = [("fewest", "search", "supernet", None, pick_perplexity, 10.0),
            ("wanda at fewest", "wanda", "equal", "fewest", baseline_perplexity, 20.0)]
    return pl.DataFrame(
        [{"model": m, "baseline": b, "finetune": f, "matched_to": to, "perplexity": ppl,
          "latency_ms": ms, "params": 100, "accuracy": 0.5, "quant": "none"}
         for m, b, f, to, ppl, ms in rows], infer_schema_length=None)


def test_search_edge_over_seeds_has_a_t_interval() -> None:
    edges = [0.01, 0.02, 0.06]
    tables = [seed_table(100.0, 100.0 * (1 + e)) for e in edges]
    row = search_edge(tables).row(0, named=True)
    half = stats.t.ppf(0.975, 2) * np.std(edges, ddof=1) / np.sqrt(3)
    assert row["seeds"] == 3 and row["finetune"] == "equal"
    assert row["perplexity_vs_search"] == pytest.approx(np.mean(edges))
    assert row["perplexity_vs_search_lo"] == pytest.approx(np.mean(edges) - half)
    assert row["perplexity_vs_search_hi"] == pytest.approx(np.mean(edges) + half)
    assert row["throughput_vs_search"] == pytest.approx(0.5)
    single = search_edge(tables[:1]).row(0, named=True)
    assert single["seeds"] == 1 and single["perplexity_vs_search_lo"] is None
    assert single["perplexity_vs_search"] == pytest.approx(0.01)


def test_a_baseline_two_sizes_prune_alike_is_trained_once() -> None:
    """Two sizes between the same layer counts give one depth baseline: trained once and
    shared; each size's Wanda mask is its own."""
    model = supernet_of("llama-gqa").extract()
    total = param_count(model)
    trained: list[tuple[str, bool]] = []

    def recover_stub(pruned: GPT, keep_zeros: bool) -> GPT:
        trained.append((pruned.config.arch.id, keep_zeros))
        return pruned

    sizes = [("a", total * 96 // 100), ("b", total * 97 // 100)]
    entries = baselines(model, sizes, calibration(), "equal", recover_stub)
    depth = [e for e in entries if e.baseline == "depth"]
    assert len(depth) == 2 and depth[0].arch_id == depth[1].arch_id
    assert depth[0].model is depth[1].model
    assert sum(keep for _, keep in trained) == 2  # one Wanda model per size
    assert len(trained) == len(entries) - 1  # the shared depth baseline once
