"""The ``export`` section as typed settings (the schema holds each field's meaning)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

from .sections import SectionSettings


@dataclass(frozen=True)
class ExportSettings(SectionSettings):
    """The workflow's export: which of the compression's archs, in which formats."""

    SECTION: ClassVar[str] = "export"
    pareto: tuple[str, ...]
    max_archs: int
    archs: tuple[str, ...]
    formats: tuple[Literal["pt2", "onnx", "hf"], ...]
