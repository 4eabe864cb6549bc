"""Problems between the fields of one params model, raised by its validators: each line names
its field relative to the model, and the loader puts the model's own path in front
(``{at}`` in a line: that path with a dot, where the text names a sibling field)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..errors import UserError


class ParamsError(UserError, ValueError):
    """params.yaml is missing, unreadable or does not fit the params models."""


class Problems(UserError, ValueError):
    """The lines of one model's cross-field problems (``field``: None names the model)."""

    def __init__(self) -> None:
        super().__init__("cross-field problems")
        self.lines: list[tuple[str | None, str]] = []

    def __str__(self) -> str:
        return "; ".join(self.render(""))

    def add(self, field: str | None, text: str) -> None:
        self.lines.append((field, text))

    def raise_any(self) -> None:
        if self.lines:
            raise self

    @classmethod
    def one(cls, field: str, text: str) -> None:
        problems = cls()
        problems.add(field, text)
        raise problems

    @classmethod
    def missing(cls, model: Any, names: Sequence[str], needs: str) -> None:
        """Raise for the fields of ``names`` that ``model`` leaves unset (None)."""
        problems = cls()
        for name in names:
            if getattr(model, name) is None:
                problems.add(None, f"missing key '{name}' ({needs} needs it)")
        problems.raise_any()

    def render(self, path: str) -> list[str]:
        """The lines, each prefixed by its field's path below ``path`` (the model's)."""
        at = f"{path}." if path else ""
        return [f"{at}{field}: {text}".replace("{at}", at) if field
                else f"{path or '<top level>'}: {text}" for field, text in self.lines]
