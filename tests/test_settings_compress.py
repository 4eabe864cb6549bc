"""Typed settings of the compress and export sections: each command's settings type holds
compress entries that match the schema, every entry is read by some command, READS is the
types' fields, params.yaml and its overlays build them, and a value that does not fit names
its field."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from conftest import REPO_ROOT
from hwgptbench import params
from hwgptbench.compress.commands import READS, SETTINGS
from hwgptbench.settings.build import SettingsError
from hwgptbench.settings.compress import CompressExport, CompressReads, CompressTable
from hwgptbench.settings.export import ExportSettings
from test_settings import SCHEMA, _mismatches

COMPRESS = SCHEMA["properties"]["compress"]
TYPES = [*SETTINGS.values(), CompressExport]
FILES = ["params.yaml", *sorted(str(p.relative_to(REPO_ROOT))
                                for p in (REPO_ROOT / "params").glob("*.yaml"))]


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_each_command_type_holds_schema_entries(cls: type[CompressReads]) -> None:
    hints = typing.get_type_hints(cls)
    found = [f"compress.{name}: in {cls.__name__}, not in the schema"
             for name in cls.entries() if name not in COMPRESS["properties"]]
    for name in set(cls.entries()) & set(COMPRESS["properties"]):
        if dataclasses.is_dataclass(hints[name]):
            found += _mismatches(hints[name], COMPRESS["properties"][name], f"compress.{name}")
    assert found == []


def test_every_entry_is_read_and_reads_are_the_types_fields() -> None:
    assert {e for cls in TYPES for e in cls.entries()} == set(COMPRESS["properties"])
    assert READS == {command: tuple(f.name for f in dataclasses.fields(cls))
                     for command, cls in SETTINGS.items()}
    assert READS["compress-search"] == ("evaluate", "timing", "search")


def test_the_export_type_is_its_schema_section() -> None:
    assert _mismatches(ExportSettings, SCHEMA["properties"]["export"], "export") == []


@pytest.mark.parametrize("path", FILES)
def test_the_params_files_build(path: str) -> None:
    """params.yaml, and each overlay merged over it, builds every command's type."""
    doc = params.load_overlaid(REPO_ROOT / "params.yaml",
                               [] if path == "params.yaml" else [REPO_ROOT / path])
    for cls in TYPES:
        settings = cls.of(doc["compress"], "test")
        assert isinstance(settings, cls)
    export = ExportSettings.of(doc["export"])
    assert isinstance(export.formats, tuple) and export.SECTION == "export"
    table = CompressTable.of(doc["compress"], "test")
    assert all(isinstance(m, str) for ms in table.search.objectives.values() for m in ms)
    with pytest.raises(dataclasses.FrozenInstanceError):
        table.timing.threads = 2  # type: ignore[misc]


def test_a_value_that_does_not_fit_names_its_field() -> None:
    section = params.load(REPO_ROOT / "params.yaml")["compress"]
    timing = section["timing"]
    with pytest.raises(SettingsError, match=r"compress\.timing\.estimator: 'mean' is not one"):
        CompressExport.of(section | {"timing": timing | {"estimator": "mean"}}, "test")
    with pytest.raises(SettingsError, match=r"compress\.search\.options\.nsga2\.eta: expected a "
                                            r"number"):
        search = section["search"]
        CompressTable.of(section | {"search": search | {"options": {"nsga2": {"eta": "x"}}}},
                         "test")
    with pytest.raises(SettingsError, match=r"compress\.importance\.enable: not a setting"):
        SETTINGS["compress-finetune"].of(section | {"importance": {"enable": True}}, "test")
    with pytest.raises(SettingsError, match=r"compress-search reads compress\.evaluate, "
                                            r"compress\.search: pass params\.yaml"):
        SETTINGS["compress-search"].of({"timing": timing}, "compress-search")
    with pytest.raises(SettingsError, match=r"export\.formats\[0\]: 'gguf' is not one"):
        ExportSettings.of(params.load(REPO_ROOT / "params.yaml")["export"] | {"formats": ["gguf"]})
