"""HW-GPT-Bench's API (``hwgptbench.compat.HWGPT``): its example script and its syne-tune
baselines' calls run unchanged on the shipped s tables."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from hwgptbench import published
from hwgptbench.api import QueryError
from hwgptbench.compat import HWGPT, arch_of, config_of
from hwgptbench.space import Arch

# HW-GPT-Bench's README example, but for the import line and its device name (one of
# HW-GPT-Bench's 13 devices, whose measurements it never published: DEVICE is one of ours)
README_EXAMPLE = '''
api = HWGPT(search_space="s", use_supernet_surrogate=False, base_path=BASE) # initialize API
random_arch = api.sample_arch() # sample random arch
api.set_arch(random_arch) # set  arch
results = api.query() # query all for the sampled arch
print("Results: ", results)
energy = api.query(metric="energies") # query energy
print("Energy: ", energy)
rtx2080 = api.query(device=DEVICE) # query device
print("RTX2080: ", rtx2080)
# query perplexity based on mlp predictor
perplexity_mlp = api.query(metric="perplexity",predictor="mlp")
print("Perplexity MLP: ", perplexity_mlp)
'''


@pytest.fixture(scope="module")
def base(published_s: Path) -> Path:
    """A base_path whose results/ holds the fitted surrogates of the shipped s tables."""
    return published_s.parent


@pytest.fixture(scope="module")
def api(base: Path) -> HWGPT:
    return HWGPT(search_space="s", use_supernet_surrogate=False, base_path=base)


def test_readme_example_runs(api: HWGPT, base: Path) -> None:
    """The example's calls and return shapes: every metric for all devices, a metric for all
    devices, a device's latencies and energies, the perplexity."""
    scope = {"HWGPT": HWGPT, "BASE": base, "DEVICE": api.device_list[0]}
    exec(README_EXAMPLE, scope)
    device = api.device_list[0]
    results = scope["results"]
    assert set(results) == {"latencies", "energies", "flops", "params", "float16_memory",
                            "bfloat16_memory"}
    assert set(results["latencies"]) == set(api.device_list)
    assert results["latencies"][device] > 0
    assert results["energies"][device] is None  # no energy counter on the shipped CPU
    assert isinstance(results["flops"], int) and isinstance(results["params"], int)
    assert results["float16_memory"] == results["params"] * 2 / 1e6
    assert set(scope["energy"]) == {"energies"}
    assert set(scope["rtx2080"]) == {"latencies", "energies"}
    assert 15 < scope["perplexity_mlp"]["perplexity"] < 60


def test_a_device_without_a_metric_is_named_once_per_object(
        base: Path, caplog: pytest.LogCaptureFixture) -> None:
    api = HWGPT(search_space="s", use_supernet_surrogate=False, base_path=base)
    device = api.device_list[0]  # the shipped CPU: no energy counter
    api.sample_arch()
    with caplog.at_level("WARNING", logger="hwgptbench.compat"):
        assert api.query(metric="energies", device=device)["energies"][device] is None
        api.sample_arch()
        assert api.query(device=device)["energies"][device] is None
    named = [r.getMessage() for r in caplog.records if "has no energy_mj table" in r.getMessage()]
    assert named == [f"energies: {device} has no energy_mj table here, so every query answers "
                     "None for it"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hwgptbench.compat"):  # a new object says it again
        other = HWGPT(search_space="s", use_supernet_surrogate=False, base_path=base)
        other.sample_arch()
        other.query(metric="energies", device=device)
    assert len([r for r in caplog.records if "has no energy_mj table" in r.getMessage()]) == 1


def test_hwgptbench_devices_are_named_as_missing(api: HWGPT) -> None:
    api.sample_arch()
    with pytest.raises(QueryError, match="never published.*devices with tables here: cpu-"):
        api.query(device="rtx2080")
    with pytest.raises(QueryError, match="unknown device 'tpu'"):
        api.query(metric="latencies", device="tpu")


def test_published_archs_answer_their_published_values(api: HWGPT) -> None:
    """Perplexity and accuracy of a published arch are HW-GPT-Bench's values, exactly."""
    table = published.perplexity_table("s").sample(25, seed=0)
    for arch_id, ppl, accuracy in table.select("arch_id", "perplexity", "accuracy").iter_rows():
        api.set_arch(config_of(Arch.from_id(arch_id), api.benchmark.space))
        assert api.query(metric="perplexity", predictor="mlp") == {"perplexity": ppl}
        assert api.query(metric="accuracy", predictor="supernet") == {"accuracy": accuracy}
    surrogate = HWGPT("s", use_supernet_surrogate=True, base_path=api.base_path,
                      prefer_measured=False)
    surrogate.set_arch(api.config or {})
    assert surrogate.query(metric="params").keys() == {"params", "perplexity", "accuracy"}


def test_supernet_evaluation_of_an_unpublished_arch_is_refused(api: HWGPT) -> None:
    published_ids = set(published.perplexity_table("s")["arch_id"])
    random.seed(5)
    while api.sample_arch() and api.arch.id in published_ids:
        pass
    assert api.query(metric="perplexity")["perplexity"] > 0
    with pytest.raises(QueryError, match="not among the published archs"):
        api.query(metric="perplexity", predictor="supernet")


def test_configs_as_hwgptbench_writes_them(api: HWGPT) -> None:
    """Its baselines build configs without layer indices and with the bias as a string; lists
    may be at the space's maximum depth; sample_arch repeats under random.seed."""
    space = api.benchmark.space
    config = {"sample_n_layer": 10, "sample_embed_dim": 384, "sample_bias": "False",
              "sample_n_head": [8] * 12, "sample_mlp_ratio": [3] * 12}
    assert arch_of(config, space) == Arch(384, 10, (8,) * 10, (3,) * 10, False)
    random.seed(1)
    first = api.sample_arch()
    random.seed(1)
    assert api.sample_arch() == first
    assert arch_of(config_of(api.arch, space), space) == api.arch
    for bad, field in ((dict(config, sample_embed_dim=100), "not an arch of the s space"),
                       (dict(config, sample_bias="no"), "sample_bias"),
                       (dict(config, sample_layer_indices=[0, 2]), "sample_layer_indices"),
                       (dict(config, sample_n_head=[8] * 3), "sample_n_head"),
                       ({"sample_n_layer": 10}, "config lacks")):
        with pytest.raises(QueryError, match=field):
            arch_of(bad, space)
    fresh = HWGPT("s", use_supernet_surrogate=False, base_path=api.base_path)
    with pytest.raises(QueryError, match="set arch config before querying"):
        fresh.query()


def test_syne_tune_baseline_through_the_facade(api: HWGPT) -> None:
    """A syne-tune multi-objective baseline (MOREA) over HW-GPT-Bench's config space, whose
    objective is its gpt_objective_2d.py's: perplexity and latency on a device."""
    from syne_tune.config_space import choice
    from syne_tune.optimizer.schedulers.ask_tell_scheduler import AskTellScheduler
    from syne_tune.optimizer.schedulers.multiobjective.multi_objective_regularized_evolution import (  # noqa: E501
        MultiObjectiveRegularizedEvolution,
    )
    from syne_tune.optimizer.schedulers.single_fidelity_scheduler import (
        SingleFidelityScheduler,
    )

    space = api.search_space
    max_layers = max(space["n_layer_choices"])
    config_space = {"num_layers": choice(space["n_layer_choices"]),
                    "embed_dim": choice(space["embed_dim_choices"]),
                    "bias": choice(space["bias_choices"])}
    for i in range(max_layers):
        config_space[f"mlp_ratio_{i}"] = choice(space["mlp_ratio_choices"])
        config_space[f"num_heads_{i}"] = choice(space["n_head_choices"])
    device = api.device_list[0]

    def objective(config: dict) -> dict[str, float]:
        sample_config = {"sample_n_layer": config["num_layers"],
                         "sample_embed_dim": config["embed_dim"],
                         "sample_bias": str(config["bias"]),
                         "sample_n_head": [config[f"num_heads_{i}"] for i in range(max_layers)],
                         "sample_mlp_ratio": [config[f"mlp_ratio_{i}"]
                                              for i in range(max_layers)]}
        api.set_arch(sample_config)
        perplexity = api.query(metric="perplexity", predictor="mlp")["perplexity"]
        latency = api.query(metric="latencies", device=device)["latencies"][device]
        return {"perplexity": perplexity, "hw_metric": latency}

    searcher = MultiObjectiveRegularizedEvolution(config_space, population_size=5,
                                                  sample_size=3, random_seed=0)
    loop = AskTellScheduler(base_scheduler=SingleFidelityScheduler(
        config_space, metrics=["perplexity", "hw_metric"], do_minimize=True,
        searcher=searcher, random_seed=0))
    seen = []
    for _ in range(12):
        trial = loop.ask()
        result = objective(trial.config)
        loop.tell(trial, result)
        seen.append(result)
    assert len(seen) == 12
    assert all(15 < r["perplexity"] < 60 and r["hw_metric"] > 0 for r in seen)
