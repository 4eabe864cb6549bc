"""The params models: their defaults are params.yaml's values, params.yaml and every overlay
build them, each field has a one-line description that the generated reference prints, a
value that does not fit is named with its field, and library code reads params through the
models only (no second set of defaults: the timing settings of the meters take every value)."""

from __future__ import annotations

import ast
import dataclasses
import subprocess
import sys

import pydantic
import pytest
import yaml

from conftest import REPO_ROOT, run
from hwgptbench import params
from hwgptbench.meters.runner import Settings
from hwgptbench.params_reference import fields_of
from hwgptbench.settings.document import Params
from hwgptbench.settings.sections import MeasureSettings, RuntimeSettings, SampleSettings

OVERLAYS = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "params").glob("*.yaml"))


def test_the_defaults_are_params_yaml() -> None:
    """One source of defaults: params.yaml holds the models' defaults, value for value."""
    from_file = params.load_typed([REPO_ROOT / "params.yaml"])
    assert from_file == Params()
    for section in params.SECTIONS:
        assert getattr(from_file, section) == getattr(Params(), section), section


@pytest.mark.parametrize("path", ["params.yaml", *OVERLAYS])
def test_the_params_files_build(path: str) -> None:
    """params.yaml, and each overlay merged over it, builds every typed section, frozen."""
    files = [REPO_ROOT / "params.yaml"] + ([] if path == "params.yaml" else [REPO_ROOT / path])
    typed = params.load_typed(files)
    assert isinstance(typed.measure.batch_sizes, tuple)
    assert all(isinstance(b, int) for b in typed.measure.batch_sizes)
    with pytest.raises(pydantic.ValidationError):
        typed.measure.threads = 2  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        typed.supernet.steps = 2  # type: ignore[misc]


def test_every_field_has_a_one_line_description() -> None:
    """The reference is generated from the models: each leaf field says what it is, in one
    line (the search condition's fields are those of meters.condition.Condition, described
    in docs/measure.md)."""
    leaves = [(path, node) for section, top in params.schema()["properties"].items()
              for path, node, _ in fields_of(top, section) if not path.startswith(
                  ("search.condition.", "paper.search.condition."))]
    assert len(leaves) > 200
    missing = [path for path, node in leaves if not node.get("description")]
    assert not missing, missing
    assert all("\n" not in node["description"] for _, node in leaves)


def test_the_reference_is_current() -> None:
    """docs/params.md is `hwgptbench params --describe`'s output: the docs cannot drift."""
    result = run(["hwgptbench", "params", "--check", "docs/params.md"], REPO_ROOT, check=False)
    assert result.returncode == 0, result.stderr
    assert "`measure.min_repeats` | integer >= 3" in (REPO_ROOT / "docs/params.md").read_text()


def test_a_value_that_does_not_fit_names_its_field() -> None:
    doc = params.load(REPO_ROOT / "params.yaml")
    runtime = doc["runtime"]
    with pytest.raises(params.ParamsError, match=r"runtime\.parallel\.modes\.0: 'zero9' is not "
                                                 r"allowed; allowed: one of 'none'"):
        params.section_of(RuntimeSettings,
                          runtime | {"parallel": runtime["parallel"] | {"modes": ["zero9"]}})
    with pytest.raises(params.ParamsError, match=r"measure\.threads: 'two' is not allowed; "
                                                 r"allowed: integer >= 1, <= 1024"):
        params.section_of(MeasureSettings, doc["measure"] | {"threads": "two"})
    with pytest.raises(params.ParamsError, match=r"sample: unknown key\(s\) 'n_arch'; allowed "
                                                 r"keys: archs_of, n_archs, seed"):
        params.section_of(SampleSettings, {"n_arch": 3, "seed": 0})
    left_out = params.section_of(SampleSettings, {"n_archs": 3})
    assert left_out.seed == 4321  # a field left out: its default
    assert params.typed(doc).surrogate.workers is None  # the default of an optional


def test_the_meters_take_every_timing_value() -> None:
    """meters.runner.Settings (torch and numpy only: it runs where pydantic is not installed)
    has no defaults of its own for what params set; the measure stage fills each from the
    measure model."""
    from hwgptbench.campaign.shard import measure_settings

    defaults = {f.name for f in dataclasses.fields(Settings)
                if f.default is not dataclasses.MISSING}
    assert defaults == {"latency", "deadline"}
    built = measure_settings(MeasureSettings())
    assert (built.warmup, built.min_repeats, built.max_repeats, built.max_seconds,
            built.estimator) == (3, 8, 300, 0.3, "min")


def test_params_files_do_not_import_the_models_into_the_meters() -> None:
    """The GPU machine has torch and numpy only: the meters import no pydantic."""
    code = ("import sys, hwgptbench.meters.runner, hwgptbench.meters.latency; "
            "print(any(m.startswith('pydantic') for m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


# where params may be read by string key: the params models and their loader (every command,
# the workflow checks and the command line take the typed models)
BOUNDARY = ("settings/", "params.py")
# params section names that are also data fields: the perplexity column of tables, the
# transfer entry of a surrogate's metadata; read as a section only through these names
DATA_KEYS = {"perplexity", "transfer"}
PARAMS_NAMES = {"config", "params", "doc", "document", "merged", "section", "sections"}
PARAMS_SECTIONS = set(yaml.safe_load((REPO_ROOT / "params.yaml").read_text()))


def _root_name(node: ast.expr) -> str:
    while isinstance(node, (ast.Subscript, ast.Attribute, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def params_reads(source: str) -> list[tuple[int, str]]:
    """(line, section) of each ``x["section"]`` or ``x.get("section")`` of a params section in
    source (a data field of the same name only on a params-like name)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant):
            key, obj = node.slice.value, node.value
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "get" and node.args
              and isinstance(node.args[0], ast.Constant)):
            key, obj = node.args[0].value, node.func.value
        else:
            continue
        if key in PARAMS_SECTIONS and (key not in DATA_KEYS or _root_name(obj) in PARAMS_NAMES):
            found.append((node.lineno, key))
    return found


def test_library_code_reads_params_through_settings_types_only() -> None:
    """Outside the boundary, code takes typed settings: a section read by string key is named
    with its file and line."""
    package = REPO_ROOT / "src" / "hwgptbench"
    found = [f"{path.relative_to(package)}:{line}: reads params section {key!r} by string key; "
             "take its typed model (hwgptbench.settings), loaded at the command boundary"
             for path in sorted(package.rglob("*.py"))
             if not str(path.relative_to(package)).startswith(BOUNDARY)
             for line, key in params_reads(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)
    # the check finds such reads
    assert params_reads('def f(c):\n    return c["measure"]["threads"]\n') == [(2, "measure")]
    assert params_reads('x = config.get("search", {})') == [(1, "search")]
    assert params_reads('x = table["perplexity"]') == []  # a column
    assert params_reads('x = doc["perplexity"]["source"]') == [(1, "perplexity")]
