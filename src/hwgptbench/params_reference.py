"""The params reference (docs/params.md), generated from the params models: every field with
what it allows, its default and its description, so that the reference cannot drift from the
code (`hwgptbench params --describe`; tests/test_settings.py checks the file is current)."""

from __future__ import annotations

import json
from typing import Any

from .params import allowed, mapping_entry, schema, schema_at_node

HEADER = """# Params reference

Every field of `params.yaml`, generated from the typed models of `hwgptbench.settings`
(`hwgptbench params --describe > docs/params.md`); the defaults are params.yaml's values.
A value is checked before any job starts (`hwgptbench validate`); lists are written as YAML
lists and hold each value once where the type says so.
"""


def _resolved(node: dict[str, Any]) -> dict[str, Any]:
    """node, its ``$ref`` followed and an optional model's model branch taken."""
    node = schema_at_node(node)
    branch = next((b for b in node.get("anyOf", []) if "$ref" in b), None)
    if branch is None:
        return node
    return {**schema_at_node(branch), "description": node.get("description")}


def fields_of(node: dict[str, Any], path: str, default: Any = None
              ) -> list[tuple[str, dict[str, Any], Any]]:
    """(dotted path, schema, default) of every leaf field under node, in the models' order;
    a nested model's defaults are its parent's default values where the parent has one."""
    default = node.get("default") if default is None else default
    node = _resolved(node)
    if "properties" in node:
        return [row for name, child in node["properties"].items()
                for row in fields_of(child, f"{path}.{name}" if path else name,
                                 default.get(name) if isinstance(default, dict) else None)]
    entry = mapping_entry(node)
    if entry is not None and "properties" in _resolved(entry):
        return fields_of(entry, f"{path}.NAME")
    return [(path, node, default)]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def describe() -> str:
    """The params reference as Markdown: one table per section."""
    lines = [HEADER]
    for section, node in schema()["properties"].items():
        resolved = _resolved(node)
        lines += [f"## `{section}`", "", resolved.get("description", ""), "",
                  "| field | allowed | default | description |", "|---|---|---|---|"]
        for path, leaf, value in fields_of(node, section):
            kind = allowed({k: v for k, v in leaf.items()
                            if k not in ("description", "title", "default")})
            default = "" if value is None and "default" not in leaf else json.dumps(value)
            lines.append(f"| `{path}` | {_cell(kind)} | {_cell(default)} | "
                         f"{_cell(leaf.get('description', ''))} |")
        lines.append("")
    return "\n".join(lines)
