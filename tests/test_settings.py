"""Typed settings: every section dataclass matches the params schema field for field, builds
from params.yaml and its overlays, and names the field a value does not fit."""

from __future__ import annotations

import ast
import dataclasses
import typing
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import REPO_ROOT
from hwgptbench import params
from hwgptbench.settings.build import SettingsError, build
from hwgptbench.settings.sections import (
    ClusterSettings,
    DataSettings,
    MeasureSettings,
    PerplexitySettings,
    RuntimeSettings,
    SampleSettings,
    SearchSettings,
    SectionSettings,
    SupernetSettings,
    SurrogateSettings,
    TransferSettings,
    WorkflowSettings,
)

SECTIONS = [WorkflowSettings, DataSettings, SupernetSettings, SampleSettings, PerplexitySettings,
            MeasureSettings, RuntimeSettings, SurrogateSettings, TransferSettings, SearchSettings,
            ClusterSettings]
SCHEMA = yaml.safe_load((REPO_ROOT / "src/hwgptbench/schemas/params.schema.yaml").read_text())


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _mismatches(cls: type, node: dict[str, Any], where: str) -> list[str]:
    """Fields of ``cls`` (recursively) that the schema node lacks, and the other way round."""
    node = _resolved(node)
    if node.get("type") != "object" or "properties" not in node:
        return []  # a free-form mapping (lightgbm's parameters, device aliases)
    fields = {f.name for f in dataclasses.fields(cls)}
    found = [f"{where}.{n}: in the schema, not in {cls.__name__}"
             for n in sorted(set(node["properties"]) - fields)]
    found += [f"{where}.{n}: in {cls.__name__}, not in the schema"
              for n in sorted(fields - set(node["properties"]))]
    hints = typing.get_type_hints(cls)
    for name in fields & set(node["properties"]):
        kind = hints[name]
        if dataclasses.is_dataclass(kind):
            found += _mismatches(kind, node["properties"][name], f"{where}.{name}")
    return found


@pytest.mark.parametrize("cls", SECTIONS, ids=lambda c: c.SECTION)
def test_each_settings_type_is_its_schema_section(cls: type[SectionSettings]) -> None:
    assert _mismatches(cls, SCHEMA["properties"][cls.SECTION], cls.SECTION) == []


@pytest.mark.parametrize("path", ["params.yaml", *sorted(
    str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "params").glob("*.yaml"))])
def test_the_params_files_build(path: str) -> None:
    """params.yaml, and each overlay merged over it, builds every typed section."""
    doc = params.load_overlaid(REPO_ROOT / "params.yaml",
                               [] if path == "params.yaml" else [REPO_ROOT / path])
    for cls in SECTIONS:
        settings = cls.of(doc[cls.SECTION])
        assert dataclasses.is_dataclass(settings) and settings.SECTION == cls.SECTION
    measure = MeasureSettings.of(doc["measure"])
    assert isinstance(measure.batch_sizes, tuple) and all(
        isinstance(b, int) for b in measure.batch_sizes)
    with pytest.raises(dataclasses.FrozenInstanceError):
        measure.threads = 2  # type: ignore[misc]


def test_a_value_that_does_not_fit_names_its_field(tmp_path: Path) -> None:
    doc = params.load(REPO_ROOT / "params.yaml")
    runtime = doc["runtime"]
    with pytest.raises(SettingsError, match=r"runtime\.parallel\.modes\[0\]: 'zero9' is not one"):
        RuntimeSettings.of(runtime | {"parallel": runtime["parallel"] | {"modes": ["zero9"]}})
    with pytest.raises(SettingsError, match=r"measure\.threads: expected int, got 'two'"):
        MeasureSettings.of(doc["measure"] | {"threads": "two"})
    with pytest.raises(SettingsError, match=r"sample\.n_arch: not a setting of SampleSettings"):
        SampleSettings.of({"n_arch": 3, "seed": 0})
    with pytest.raises(SettingsError, match=r"sample\.seed: missing"):
        build(SampleSettings, {"n_archs": 3})
    assert SurrogateSettings.of(doc["surrogate"]).workers is None  # the default of an optional


# where params may be read by string key: the settings types, the params module, the command
# line and each stage's subcommands (which build the settings)
# the params document is checked as a whole there, before its settings types are built
BOUNDARY = ("settings/", "params.py", "workflow_checks.py", "options.py", "cli.py", "commands.py")
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
             "take its settings type (hwgptbench.settings), built at the command boundary"
             for path in sorted(package.rglob("*.py"))
             if not str(path.relative_to(package)).startswith(BOUNDARY)
             and path.name != "commands.py"
             for line, key in params_reads(path.read_text(encoding="utf-8"))]
    assert not found, "\n".join(found)
    # the check finds such reads
    assert params_reads('def f(c):\n    return c["measure"]["threads"]\n') == [(2, "measure")]
    assert params_reads('x = config.get("search", {})') == [(1, "search")]
    assert params_reads('x = table["perplexity"]') == []  # a column
    assert params_reads('x = doc["perplexity"]["source"]') == [(1, "perplexity")]
