"""The recipes of docs/architecture.md ("Where does X go?"), followed in a copy of the project:
a hardware metric (a meter module and its entry in metrics.py) and a search algorithm (a module
and its entry in search_algorithms.py) run through the command line, and after `hwgptbench
dvc-deps` the copy differs from the repository in the files the recipe names and no others; a
params field added to its section's model and to params.yaml reaches a command typed."""

from __future__ import annotations

import os
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import make_project, run, tool_env

pytestmark = pytest.mark.e2e

TOY_METER = '''"""A toy meter: the weight bytes of the model in kB."""


def weights_kb(model, forward, x):
    forward()
    return {"toy_weights_kb": sum(p.numel() * p.element_size() for p in model.parameters())
            / 1024}
'''
TOY_METRIC = '''    Metric("toy_weights_kb", "kB", "weight size (kB)", "toy_reason",
           {"toy_weights_kb": "Float64", "toy_reason": "String"},
           measure="hwgptbench.meters.toy:weights_kb"),
'''
TOY_ALGORITHM = '''"""A toy search: sampled archs, a batch at a time, until the budget ends it."""

import itertools

from ...search_algorithms import ToyOptions


def toy_walk(evaluate, genome, seed, options: ToyOptions) -> None:
    for offset in itertools.count():
        evaluate(genome.space.sample(options.batch, seed + offset))
'''
TOY_OPTIONS = '''class ToyOptions(Model):
    """The toy search's options."""

    batch: int = option(3, "archs sampled per step", ge=1)


'''
TOY_ENTRY = '    "toy": Algorithm("toy_walk", "toy_walk", "toy", ToyOptions),\n'


def insert_before(path: Path, anchor: str, text: str) -> None:
    """Put ``text`` before the one occurrence of ``anchor`` in the file."""
    source = path.read_text()
    assert source.count(anchor) == 1, f"{path}: {anchor!r} is not there once"
    path.write_text(source.replace(anchor, text + anchor))


def in_copy(project: Path) -> dict[str, str]:
    """The tools' environment with the copy's package ahead of the installed one."""
    env = tool_env()
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(project / "src"),
                                                      env.get("PYTHONPATH")]))
    return env


def changed_files(project: Path) -> set[str]:
    out = run(["git", "status", "--porcelain", "--untracked-files=all"], project).stdout
    return {line[3:] for line in out.splitlines()}


def write_yaml(path: Path, doc: dict) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.fixture(scope="module")
def extended(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the project with a toy metric and a toy algorithm added as the recipes say,
    then `hwgptbench dvc-deps` (make deps) run in it."""
    project = make_project(tmp_path_factory.mktemp("recipes"))
    package = project / "src" / "hwgptbench"
    (package / "meters" / "toy.py").write_text(TOY_METER)
    insert_before(package / "metrics.py", ")}\n# labels of table columns", TOY_METRIC)
    (package / "moo" / "algorithms" / "toy_walk.py").write_text(TOY_ALGORITHM)
    insert_before(package / "search_algorithms.py", "@dataclass(frozen=True)\nclass Algorithm:",
                  TOY_OPTIONS)
    insert_before(package / "search_algorithms.py", '    "iterative": Algorithm(', TOY_ENTRY)
    run(["hwgptbench", "dvc-deps"], project, env=in_copy(project))
    return project


def test_the_recipes_change_the_files_they_name_and_no_others(extended: Path) -> None:
    """The new meter module joins the deps of the stages that load metrics.py and the code
    listings of the rules whose commands do (make deps writes both); the new algorithm module
    is inside moo/algorithms/, which the search stages list as a folder, so dvc.yaml needs
    nothing for it."""
    recipes = {"src/hwgptbench/meters/toy.py", "src/hwgptbench/metrics.py",
               "src/hwgptbench/moo/algorithms/toy_walk.py",
               "src/hwgptbench/search_algorithms.py", "dvc.yaml"}
    changed = changed_files(extended)
    listings = {f for f in changed if f.startswith("workflow/code/")}
    assert recipes <= changed <= recipes | {"paper/dvc.yaml"} | listings
    assert "src/hwgptbench/meters/toy.py" in (extended / "dvc.yaml").read_text()
    assert "toy_walk" not in (extended / "dvc.yaml").read_text()
    # a rule's listing changed exactly where its commands now load the meter
    loading = {p.relative_to(extended).as_posix()
               for p in (extended / "workflow" / "code").glob("*.txt")
               if "src/hwgptbench/meters/toy.py" in p.read_text()}
    assert listings == loading and "workflow/code/measure.txt" in listings


def test_a_metric_added_by_the_recipe_is_measured_by_the_cli(extended: Path, tmp_path: Path,
                                                             shakespeare: Path) -> None:
    fast = {"warmup": 1, "min_repeats": 3, "max_repeats": 5, "max_seconds": 0.05,
            "dtypes": ["fp32"], "memory": False, "repeat_share": 0.0,
            "contention": {"retries": 0, "wait_s": 0.0}}
    overlay = write_yaml(tmp_path / "fast.yaml", {"measure": fast})
    archs = tmp_path / "archs.parquet"
    pl.DataFrame({"arch_id": ["e64-l2-h2_2-r2_2-b0", "e128-l4-h4_4_4_4-r4_4_4_4-b1"]}
                 ).write_parquet(archs)
    shard = tmp_path / "shard.parquet"
    run(["hwgptbench", "measure", "--scale", "tiny", "--params", "params.yaml", "--params",
         str(overlay), "--data", str(shakespeare), "--archs", str(archs), "--device", "auto",
         "--out", str(shard)], extended, env=in_copy(extended), baseline_s=30)
    table = pl.read_parquet(shard).sort("params")
    small, large = table["toy_weights_kb"]
    assert 0 < small < large and table["toy_reason"].null_count() == 2


def test_an_algorithm_added_by_the_recipe_runs_from_the_cli(extended: Path, tmp_path: Path,
                                                            published_s: Path) -> None:
    search = yaml.safe_load((extended / "params.yaml").read_text())["search"]
    search |= {"algorithms": ["toy"], "budget": 9, "seeds": 1, "reference_archs": 300,
               "options": {"toy": {"batch": 4}}}
    files = write_yaml(tmp_path / "search.yaml", {"search": search})
    common = ["--source", "published", "--scale", "s", "--results", str(published_s),
              "--params", "params.yaml", "--params", str(files), "--objectives", "ppl-latency",
              "--device", "cpu-amd-epyc-1t"]
    reference, runs = tmp_path / "reference", tmp_path / "runs"
    env = in_copy(extended)
    run(["hwgptbench", "search-reference", *common, "--out", str(reference)], extended,
        env=env, baseline_s=30)
    run(["hwgptbench", "search", *common, "--algorithm", "toy", "--reference", str(reference),
         "--out", str(runs)], extended, env=env, baseline_s=30)
    evaluated = pl.read_parquet(runs / "0.parquet")
    assert evaluated.height >= 9 and evaluated["arch_id"].n_unique() >= 5


TOY_FIELD = '''    toy_margin: Positive = doc(0.5, "a toy share of each timing budget")
'''


def test_a_params_field_is_its_model_line_and_its_params_value(tmp_path: Path) -> None:
    """Adding a field means one line in its section's model and its value in params.yaml:
    the loader, `hwgptbench validate`, the section file the workflow writes and the
    generated reference (regenerated as docs/params.md says) follow; a command loads it typed,
    and a bad value is refused with the field's name."""
    project = make_project(tmp_path / "field")
    sections = project / "src" / "hwgptbench" / "settings" / "sections.py"
    insert_before(sections, '    contention: ContentionSettings = ContentionSettings()\n',
                  TOY_FIELD)
    doc = yaml.safe_load((project / "params.yaml").read_text())
    doc["measure"]["toy_margin"] = 0.75
    write_yaml(project / "params.yaml", doc)
    env = in_copy(project)
    reference = run(["hwgptbench", "params", "--describe"], project, env=env).stdout
    (project / "docs" / "params.md").write_text(reference)
    assert changed_files(project) == {"src/hwgptbench/settings/sections.py", "params.yaml",
                                      "docs/params.md"}
    assert "| `measure.toy_margin` | number > 0 | 0.5 | a toy share" in reference
    run(["hwgptbench", "validate"], project, env=env)
    code = ("from hwgptbench import params; from hwgptbench.settings.sections import "
            "MeasureSettings; m = params.load_section(MeasureSettings, ['params.yaml']); "
            "print(repr(m.toy_margin)); import json; "
            "print(json.loads(open(params.write_sections(params.load('params.yaml'), "
            "'sections')['measure']).read())['measure']['toy_margin'])")
    out = run(["python", "-c", code], project, env=env).stdout.split()
    assert out == ["0.75", "0.75"]
    doc["measure"]["toy_margin"] = "wide"
    write_yaml(project / "params.yaml", doc)
    refused = run(["hwgptbench", "validate"], project, env=env, check=False)
    assert refused.returncode == 2
    assert "measure.toy_margin: 'wide' is not allowed; allowed: number > 0" in refused.stderr
