"""Typed settings of the compress and export sections: each command's settings type holds
compress entries of the compress model, every entry is read by some command, READS is the
types' fields, params.yaml and its overlays build them, and a value that does not fit names
its field."""

from __future__ import annotations

import pydantic
import pytest

from conftest import REPO_ROOT
from hwgptbench import params
from hwgptbench.compress.commands import READS, SETTINGS
from hwgptbench.params import ParamsError, section_of
from hwgptbench.settings.compress import (
    CompressExport,
    CompressReads,
    CompressSettings,
    CompressTable,
    ExportSettings,
)
from hwgptbench.settings.document import Params

COMPRESS = CompressSettings.model_fields
TYPES = [*SETTINGS.values(), CompressExport]
FILES = ["params.yaml", *sorted(str(p.relative_to(REPO_ROOT))
                                for p in (REPO_ROOT / "params").glob("*.yaml"))]


@pytest.mark.parametrize("cls", TYPES, ids=lambda c: c.__name__)
def test_each_command_type_holds_schema_entries(cls: type[CompressReads]) -> None:
    found = [f"compress.{name}: in {cls.__name__}, not in the compress section"
             for name in cls.entries() if name not in COMPRESS]
    found += [f"compress.{name}: {cls.__name__} holds {field.annotation}, the section "
              f"{COMPRESS[name].annotation}"
              for name, field in cls.model_fields.items()
              if name in COMPRESS and field.annotation != COMPRESS[name].annotation]
    assert found == []


def test_every_entry_is_read_and_reads_are_the_types_fields() -> None:
    assert {e for cls in TYPES for e in cls.entries()} == set(COMPRESS)
    assert set(COMPRESS) == set(params.schema_at(["compress"])["properties"])
    assert READS == {command: tuple(cls.model_fields) for command, cls in SETTINGS.items()}
    assert READS["compress-search"] == ("evaluate", "timing", "search")


def test_the_export_type_is_its_schema_section() -> None:
    assert Params.model_fields["export"].annotation is ExportSettings
    assert set(params.schema_at(["export"])["properties"]) == set(ExportSettings.model_fields)


@pytest.mark.parametrize("path", FILES)
def test_the_params_files_build(path: str) -> None:
    """params.yaml, and each overlay merged over it, builds every command's type."""
    paths = [REPO_ROOT / "params.yaml", *([] if path == "params.yaml" else [REPO_ROOT / path])]
    doc = params.load_typed(paths)
    for cls in TYPES:
        settings = cls.of(doc.compress, "test")
        assert isinstance(settings, cls)
    export = section_of(ExportSettings, params.load_overlaid(paths[0], paths[1:])["export"])
    assert isinstance(export.formats, tuple) and export.SECTION == "export"
    assert export == doc.export
    table = CompressTable.of(doc.compress, "test")
    assert all(isinstance(m, str) for ms in table.search.objectives.values() for m in ms)
    with pytest.raises(pydantic.ValidationError):
        table.timing.threads = 2  # type: ignore[misc]


def test_a_value_that_does_not_fit_names_its_field() -> None:
    section = params.load(REPO_ROOT / "params.yaml")["compress"]
    timing = section["timing"]
    with pytest.raises(ParamsError, match=r"compress\.timing\.estimator: 'mean' is not allowed"):
        CompressExport.of(section_of(
            CompressSettings, section | {"timing": timing | {"estimator": "mean"}}), "test")
    with pytest.raises(ParamsError, match=r"compress\.search\.options\.nsga2\.eta: 'x' is not "
                                          r"allowed; allowed: number"):
        search = section["search"]
        CompressTable.of(section_of(CompressSettings, section | {
            "search": search | {"options": {"nsga2": {"eta": "x"}}}}), "test")
    with pytest.raises(ParamsError, match=r"compress\.importance: unknown key\(s\) 'enable'"):
        SETTINGS["compress-finetune"].of(
            section_of(CompressSettings, section | {"importance": {"enable": True}}), "test")
    with pytest.raises(ParamsError, match=r"compress-search reads compress\.evaluate, "
                                          r"compress\.search: pass params\.yaml"):
        SETTINGS["compress-search"].of(section_of(CompressSettings, {"timing": timing}),
                                       "compress-search")
    with pytest.raises(ParamsError, match=r"export\.formats\.0: 'gguf' is not allowed"):
        section_of(ExportSettings,
                   params.load(REPO_ROOT / "params.yaml")["export"] | {"formats": ["gguf"]})
