"""Bad arguments of the Python facades (``compat.HWGPT``, ``Benchmark``) are a QueryError naming
the argument and what it accepts, never a TypeError or a traceback from deep inside; and
`hwgptbench validate` merges params.yaml and overlays as Snakemake merges them, naming the file
behind a bad value."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT, run
from hwgptbench import cli, params
from hwgptbench.api import Benchmark, QueryError
from hwgptbench.compat import HWGPT
from hwgptbench.space import Arch

PARAMS = REPO_ROOT / "params.yaml"
OVERLAYS = sorted((REPO_ROOT / "params").glob("*.yaml"))
ARCH = "e192-l10-h4_4_4_4_4_4_4_4_4_4-r2_2_2_2_2_2_2_2_2_2-b0"
OTHER_SPACE = Arch(64, 2, (2, 2), (2.0, 2.0), True)  # of tiny, not of s
JUNK = st.one_of(st.none(), st.booleans(), st.integers(-3, 3), st.floats(allow_nan=True),
                 st.text(max_size=4), st.lists(st.one_of(st.none(), st.integers(0, 20),
                                                         st.text(max_size=3)), max_size=3),
                 st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))


@pytest.fixture(scope="module")
def base(published_s: Path) -> Path:
    """A base_path whose results/ holds the shipped s tables' surrogates."""
    return published_s.parent


@pytest.fixture(scope="module")
def api(base: Path) -> HWGPT:
    api = HWGPT(search_space="s", use_supernet_surrogate=False, base_path=base)
    api.sample_arch()
    return api


def _config(api: HWGPT, **fields: Any) -> dict[str, Any]:
    """The current arch's config with ``fields`` replaced."""
    assert api.config is not None
    return {**api.config, **fields}


HWGPT_CASES: list[tuple[str, Callable[[HWGPT, Path], Any], str]] = [
    ("set_arch(None)", lambda a, b: a.set_arch(None), "config: None is not a dict"),
    ("set_arch(str)", lambda a, b: a.set_arch("s"), "config: 's' is not a dict"),
    ("heads None", lambda a, b: a.set_arch(_config(a, sample_n_head=None)),
     "sample_n_head: None is not a list"),
    ("ratios int", lambda a, b: a.set_arch(_config(a, sample_mlp_ratio=4)),
     "sample_mlp_ratio: 4 is not a list"),
    ("indices None", lambda a, b: a.set_arch(_config(a, sample_layer_indices=None)),
     "sample_layer_indices: None is not a list"),
    ("embed str", lambda a, b: a.set_arch(_config(a, sample_embed_dim="768")),
     "is not an arch of the s space"),
    ("query(metric=3)", lambda a, b: a.query(metric=3), "metric: 3 is not a name"),
    ("query(metric={})", lambda a, b: a.query(metric={}), "metric: {} is not a name"),
    ("query(metric=[.., 3])", lambda a, b: a.query(metric=["latencies", 3]), "metric: "),
    ("query(device=3)", lambda a, b: a.query(device=3), "device: 3 is not a name"),
    ("query(device=[None])", lambda a, b: a.query(device=[None]),
     r"device: \[None\] is not a name"),
    ("query(predictor=None)", lambda a, b: a.query(metric="perplexity", predictor=None),
     "predictor: None is not a str"),
    ("get_memory(list)", lambda a, b: a.get_memory(["float16_memory"]),
     "unknown memory metric"),
    ("hw(list, device)", lambda a, b: a.compute_predictions_hw(["latencies"], a.device_list[0]),
     "unknown per-device metric"),
    ("hw(metric, None)", lambda a, b: a.compute_predictions_hw("latencies", None),
     "device: None is not a device name"),
    ("HWGPT(3)", lambda a, b: HWGPT(3, base_path=b), "search_space: 3 is not a scale name"),
    ("HWGPT(unknown)", lambda a, b: HWGPT("zz", base_path=b), "search_space: 'zz' has no"),
    ("base_path file", lambda a, b: HWGPT("s", base_path=Path(__file__)),
     "base_path: .* is not an existing folder"),
    ("base_path None", lambda a, b: HWGPT("s", base_path=None), "base_path: None is not a path"),
    ("flag str", lambda a, b: HWGPT("s", use_supernet_surrogate="no", base_path=b),
     "use_supernet_surrogate: 'no' is not True or False"),
    ("prefer int", lambda a, b: HWGPT("s", base_path=b, prefer_measured=1),
     "prefer_measured: 1 is not True or False"),
]


@pytest.mark.parametrize(("case", "call", "message"), HWGPT_CASES,
                         ids=[case for case, _, _ in HWGPT_CASES])
def test_hwgpt_refuses_bad_arguments_by_name(api: HWGPT, base: Path, case: str,
                                             call: Callable[[HWGPT, Path], Any],
                                             message: str) -> None:
    arch = api.arch
    with pytest.raises(QueryError, match=message):
        call(api, base)
    assert api.arch == arch  # a refused config leaves the current arch


def test_hwgpt_refuses_a_base_path_that_does_not_exist(tmp_path: Path) -> None:
    """The folder is not created: a typo must not grow a results tree somewhere else."""
    missing = tmp_path / "no" / "such" / "dir"
    with pytest.raises(QueryError, match=r"base_path: .*dir is not an existing folder"):
        HWGPT("s", base_path=missing)
    assert not (tmp_path / "no").exists()


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(device=JUNK, metric=JUNK, predictor=JUNK, field=st.sampled_from(
    ["sample_embed_dim", "sample_n_layer", "sample_layer_indices", "sample_n_head",
     "sample_mlp_ratio", "sample_bias"]), value=JUNK)
def test_hwgpt_answers_or_refuses_any_argument(api: HWGPT, device: Any, metric: Any,
                                               predictor: Any, field: str, value: Any) -> None:
    """Whatever the arguments, a query answers or raises QueryError."""
    try:
        api.query(device=device, metric=metric, predictor=predictor)
    except QueryError:
        pass
    config = _config(api)
    try:
        api.set_arch({**config, field: value})
    except QueryError:
        pass
    api.set_arch(config)


@pytest.fixture(scope="module")
def bench(published_s: Path) -> Benchmark:
    return Benchmark.load("s", published_s)


BENCHMARK_CASES: list[tuple[str, Callable[[Benchmark], Any], str]] = [
    ("archs None", lambda b: b.query(None, "params"), "archs: None is not a list of archs"),
    ("archs [5]", lambda b: b.query([5], "params"), r"archs\[0\]: 5 is not an Arch"),
    ("archs dict", lambda b: b.query({ARCH: 1}, "params"), "archs: .* is not a list of archs"),
    ("archs bad id", lambda b: b.query([ARCH, "e1"], "params"), r"archs\[1\]: bad arch id"),
    ("archs other space", lambda b: b.query([OTHER_SPACE], "perplexity"),
     r"archs\[0\]: e64-l2-h2_2-r2_2-b1 is not an arch of this benchmark"),
    ("archs other space measured", lambda b: b.query([ARCH, OTHER_SPACE], "perplexity",
                                                      mode="measured"), r"archs\[1\]"),
    ("metrics None", lambda b: b.query([ARCH], None), "metrics: None is not a name"),
    ("metrics [3]", lambda b: b.query([ARCH], ["params", 3]), "metrics: .* available: "),
    ("device 3", lambda b: b.query([ARCH], "latency_ms", device=3), "device: 3 is not a str"),
    ("device list", lambda b: b.query([ARCH], "latency_ms", device=[b.devices[0]]),
     "device: .* is not a str"),
    ("condition 3", lambda b: b.query([ARCH], "latency_ms", device=b.devices[0], condition=3),
     "condition: 3 is not a condition id"),
    ("condition list", lambda b: b.query([ARCH], "latency_ms", device=b.devices[0],
                                         condition=["b1-t128-fp32-eager"]), "condition: "),
    ("interval str", lambda b: b.query([ARCH], "params", return_interval="yes"),
     "return_interval: 'yes' is not True or False"),
    ("fidelity True", lambda b: b.query([ARCH], "perplexity", fidelity=True),
     "unknown fidelity True"),
    ("sample str", lambda b: b.sample("3"), "n: '3' is not an integer"),
    ("sample too many", lambda b: b.sample(b.space.size() + 1), "n: .* more archs"),
    ("conditions 3", lambda b: b.conditions(3), "device: 3 is not a str"),
    ("devices_of None", lambda b: b.devices_of(None), "metric: None is not a str"),
]


@pytest.mark.parametrize(("case", "call", "message"), BENCHMARK_CASES,
                         ids=[case for case, _, _ in BENCHMARK_CASES])
def test_benchmark_refuses_bad_arguments_by_name(bench: Benchmark, case: str,
                                                 call: Callable[[Benchmark], Any],
                                                 message: str) -> None:
    with pytest.raises(QueryError, match=message):
        call(bench)


def test_one_arch_alone_is_a_list_of_one(bench: Benchmark) -> None:
    """An arch id or an Arch alone stands for a list of one, as a metric name does."""
    one = bench.query(ARCH, "params")
    assert one.equals(bench.query([ARCH], ["params"]))
    assert one.equals(bench.query(Arch.from_id(ARCH), "params"))
    assert one.equals(bench.query((a for a in [ARCH]), "params"))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"scale": 3}, "scale: 3 is not a scale name"),
    ({"scale": "../s"}, "scale: '../s' is not a scale name"),
    ({"results_dir": None}, "results_dir: None is not a path"),
    ({"results_dir": Path(__file__)}, "results_dir: .* is a file"),
    ({"source": ["auto"]}, "unknown source"),
])
def test_load_refuses_bad_arguments_by_name(published_s: Path, kwargs: dict[str, Any],
                                            message: str) -> None:
    with pytest.raises(QueryError, match=message):
        Benchmark.load(**{"scale": "s", "results_dir": published_s, **kwargs})


def test_load_creates_no_folder_outside_an_existing_one(tmp_path: Path) -> None:
    """The shipped tables' cache goes into results_dir, created inside an existing folder
    only."""
    with pytest.raises(QueryError, match=r"neither .*results nor the folder"):
        Benchmark.load("s", tmp_path / "typo" / "results")
    with pytest.raises(QueryError, match=r"neither"):
        Benchmark.from_published("s", tmp_path / "typo" / "results")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("overlay", OVERLAYS, ids=[p.name for p in OVERLAYS])
def test_validate_merges_each_overlay_as_snakemake_does(
        overlay: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["validate", "--params", str(PARAMS), "--params", str(overlay)]) == 0
    assert capsys.readouterr().out.strip() == f"{PARAMS} + {overlay}: valid"
    assert params.merge_files([PARAMS, overlay]) == params.load_overlaid(PARAMS, [overlay])


def _overlay(tmp_path: Path, name: str, doc: dict[str, Any]) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def test_validate_names_the_file_that_set_a_bad_value(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    full = REPO_ROOT / "params" / "full.yaml"
    bad = _overlay(tmp_path, "bad.yaml", {"supernet": {"steps": -3, "fancy": 1}})
    assert cli.main(["validate", "--params", str(PARAMS), "--params", str(full),
                     "--params", str(bad)]) == 2
    err = capsys.readouterr().err
    assert f"  - {bad}: supernet.steps: -3 is not allowed" in err
    assert f"  - {bad}: supernet: unknown key(s) 'fancy'" in err
    assert "missing key" not in err and f"{PARAMS}:" not in err
    broken = yaml.safe_load(PARAMS.read_text())
    broken["data"]["seed"] = "seven"
    base = _overlay(tmp_path, "params.yaml", broken)
    assert cli.main(["validate", "--params", str(base), "--params", str(full)]) == 2
    assert f"  - {base}: data.seed: 'seven' is not allowed" in capsys.readouterr().err
    fixed = _overlay(tmp_path, "fixed.yaml", {"data": {"seed": 7}})
    assert cli.main(["validate", "--params", str(base), "--params", str(fixed)]) == 0


def test_validate_refuses_an_overlay_that_is_no_mapping(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    listed = tmp_path / "list.yaml"
    listed.write_text("- 1\n")
    assert cli.main(["validate", "--params", str(PARAMS), "--params", str(listed)]) == 2
    assert f"{listed}: not a mapping of params sections" in capsys.readouterr().err


def test_section_files_merge_back_into_the_params(tmp_path: Path) -> None:
    """The section files the workflow writes merge (by the same rule) into the params."""
    doc = params.load(PARAMS)
    written = params.write_sections(doc, tmp_path)
    assert params.merge_files(sorted(written.values())) == doc


def _snakemake_config(base: dict[str, Any], overlays: list[dict[str, Any]]) -> dict[str, Any]:
    """The config Snakemake runs with for ``configfile: base`` and ``--configfile`` overlays
    (its Workflow: the overlays merged, the base merged into them, the overlays again)."""
    from snakemake.utils import update_config

    over: dict[str, Any] = {}
    for overlay in overlays:
        update_config(over, copy.deepcopy(overlay))
    config = copy.deepcopy(over)
    update_config(config, copy.deepcopy(base))
    update_config(config, over)
    return config


KEYS = st.sampled_from(["a", "b", "c"])
LEAF = st.one_of(st.integers(0, 3), st.none(), st.lists(st.integers(0, 2), max_size=2))
TREE = st.recursive(LEAF, lambda inner: st.dictionaries(KEYS, inner, max_size=3), max_leaves=8)
DOC = st.dictionaries(KEYS, TREE, max_size=3)


@settings(max_examples=400, deadline=None)
@given(base=DOC, overlays=st.lists(DOC, max_size=3))
def test_merge_is_snakemakes(base: dict[str, Any], overlays: list[dict[str, Any]]) -> None:
    """params.merged merges as Snakemake does, mappings into mappings, an empty mapping
    changing nothing, and leaves its arguments unchanged."""
    before = copy.deepcopy([base, *overlays])
    assert params.merged([base, *overlays]) == _snakemake_config(base, overlays)
    assert [base, *overlays] == before


@pytest.mark.e2e
def test_snakemake_names_the_overlay_behind_a_bad_value(project: Path) -> None:
    bad = _overlay(project, "bad.yaml", {"sample": {"n_archs": 0}})
    result = run(["snakemake", "-n", "--configfile", str(bad)], project, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert f"{bad}: sample.n_archs: 0 is not allowed" in output
    assert not (project / "results").exists()
