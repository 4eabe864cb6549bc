"""Loading and validation of params.yaml and its overlays by the typed models of
:mod:`hwgptbench.settings` (their fields' types, bounds, defaults and cross-field rules are
the schema; :func:`schema` is their JSON schema).

The Snakefile (before any job starts) and every command load params here, so a bad value is
refused the same way everywhere, before anything is written, each problem named by its field,
the file that set it, the value and what is allowed.
"""

from __future__ import annotations

import copy
import functools
import json
import math
import os
from collections.abc import Sequence
from functools import cache, lru_cache
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import ValidationError

from .io import (
    YamlExpansionError,
    atomic_write_json,
    canonical_json,
    parse_yaml,
    read_outside_text,
)
from .metrics import hardware_metrics
from .settings.document import Params
from .settings.fields import Loadable
from .settings.problems import ParamsError, Problems

MAX_PARAMS = 4 << 20  # bytes of a params file or overlay (params.yaml: 19 kB)
SECTIONS = tuple(Params.model_fields)
S = TypeVar("S", bound=Loadable)


def schema() -> dict[str, Any]:
    """The JSON schema of params.yaml, generated from the models with the registries' entries
    of now (for editors, messages and the bounds of command-line flags that stand for a
    param); not to be changed by callers."""
    from .search_algorithms import ALGORITHMS

    return _schema(tuple(hardware_metrics()), tuple(ALGORITHMS))


@cache
def _schema(metrics: tuple[str, ...], algorithms: tuple[str, ...]) -> dict[str, Any]:
    """The models' JSON schema for these registries' entries (the cache's key)."""
    return Params.model_json_schema()


def _field(path: Sequence[Any]) -> str:
    return ".".join(map(str, path)) if path else "<top level>"


def schema_at(path: Sequence[Any]) -> dict[str, Any]:
    """The JSON schema of the field at ``path`` (keys and list indices), ``$ref``s followed;
    {} where the path leaves the models (a free-form mapping)."""
    root = schema()
    node = root
    for part in path:
        node = _resolved(root, node)
        branches = [_resolved(root, b) for b in node.get("anyOf", [node])]
        node = next((b for b in branches if b.get("type") != "null"), {})
        if isinstance(part, str) and part in node.get("properties", {}):
            node = node["properties"][part]
        elif isinstance(part, int) and "prefixItems" in node:
            node = node["prefixItems"][min(part, len(node["prefixItems"]) - 1)]
        elif isinstance(part, int) and "items" in node:
            node = node["items"]
        elif (entry := mapping_entry(node)) is not None:
            node = entry
        else:
            return {}
    return _resolved(root, node)


def mapping_entry(node: dict[str, Any]) -> Any:
    """The schema of each value of a mapping field (None: not a mapping of values)."""
    entries = [*node.get("patternProperties", {}).values(), node.get("additionalProperties")]
    return next((entry for entry in entries if isinstance(entry, dict)), None)


def _resolved(root: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """node, its ``$ref`` (``#/$defs/NAME``) followed, its own keys kept over the target's."""
    while "$ref" in node:
        target = root["$defs"][node["$ref"].rsplit("/", 1)[1]]
        node = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
    return node


def schema_at_node(node: dict[str, Any]) -> dict[str, Any]:
    """node of the params schema, its ``$ref`` followed."""
    return _resolved(schema(), node)


def allowed(node: dict[str, Any]) -> str:
    """A short description of the values a field's schema accepts."""
    if "anyOf" in node:
        text = " or ".join(allowed({k: v for k, v in branch.items() if k != "description"})
                           for branch in node["anyOf"])
    elif "enum" in node or "const" in node:
        text = "one of " + ", ".join(map(repr, node.get("enum", [node.get("const")])))
    elif node.get("type") == "array" and isinstance(node.get("items"), dict):
        text = f"list of {allowed(schema_at_node(node['items']))}"
        if node.get("minItems"):
            text += f" (at least {node['minItems']})"
        if node.get("uniqueItems"):
            text += ", each once"
    else:
        text = node.get("type", "value")
        bounds = [f"{sign} {node[key]}" for key, sign in (
            ("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
            ("exclusiveMaximum", "<")) if key in node]
        if "pattern" in node:
            bounds.append(f"matching {node['pattern']}")
        if node.get("minLength") == 1:
            bounds.append("non-empty")
        text += f" {', '.join(bounds)}" if bounds else ""
    return text + (f" ({node['description']})" if node.get("description") else "")


def _problems(error: ValidationError) -> list[tuple[list[Any], str]]:
    """(path of the value refused, one line) of each of a validation's errors; the unknown
    keys of one mapping make one line."""
    found: list[tuple[list[Any], str]] = []
    unknown: dict[tuple[Any, ...], list[Any]] = {}
    items = error.errors()
    deeper = {tuple(item["loc"][:-1]) for item in items if len(item["loc"]) > 1}
    for item in items:
        path, kind = list(item["loc"]), item["type"]
        context = item.get("ctx", {}).get("error")
        if kind == "too_short" and tuple(path) in deeper:
            continue  # a list whose refused item is named on its own line
        if kind in ("extra_forbidden", "unexpected_keyword_argument"):
            unknown.setdefault(tuple(path[:-1]), []).append(path[-1])
        elif isinstance(context, Problems):
            found += [([*path, *(f.split(".") if f else [])], line)
                      for (f, _), line in zip(context.lines, context.render(_field(path)),
                                              strict=True)]
        elif kind == "missing":
            found.append((path, f"{_field(path[:-1])}: missing key '{path[-1]}'; allowed: "
                                f"{allowed(schema_at(path))}"))
        else:
            why = f" ({context})" if context else ""
            found.append((path, f"{_field(path)}: {item['input']!r} is not allowed{why}; "
                                f"allowed: {allowed(schema_at(path))}"))
    for parent, keys in unknown.items():
        names = sorted(schema_at(parent).get("properties", {}))
        found.append(([*parent, keys[0]], f"{_field(parent)}: unknown key(s) "
                                          f"{', '.join(map(repr, keys))}; allowed keys: "
                                          f"{', '.join(names)}"))
    return found


# (file name, its document) of each params file merged, in merge order (:func:`merge_files`)
Sources = Sequence[tuple[str, Any]]


def _holds(document: Any, path: Sequence[Any]) -> bool:
    """Whether ``document`` has a value at ``path`` (mapping keys and list indices)."""
    node = document
    for key in path:
        if isinstance(node, dict) and key in node:
            node = node[key]
        elif isinstance(node, list) and isinstance(key, int) and 0 <= key < len(node):
            node = node[key]
        else:
            return False
    return True


def _origin(path: Sequence[Any], sources: Sources) -> str | None:
    """The file the merged value at ``path`` came from: the last one that sets it (mappings
    merge key by key, anything else the last file replaces); None when none sets it."""
    return next((name for name, document in reversed(sources) if _holds(document, path)), None)


def _blamed(problem: str, path: Sequence[Any], sources: Sources) -> str:
    """``problem`` prefixed by the file that set the value, when several files were merged."""
    origin = _origin(path, sources) if len(sources) > 1 else None
    return f"{origin}: {problem}" if origin else problem


def typed(doc: Any, sections: Sequence[str] | None = None, source: str = "params",
          sources: Sources = ()) -> Params:
    """A params document as its typed model, or one :class:`ParamsError` listing every
    problem. ``sections``: the top-level sections it must hold (None: all; a stage given the
    section files it reads, e.g. `results/.params/data.json`, holds just those). ``sources``,
    the files ``doc`` was merged from (:func:`merge_files`), name the file behind each bad
    value."""
    if not isinstance(doc, dict):
        raise ParamsError(f"invalid {source}: not a mapping of params sections "
                          "(e.g. `data: {...}`)")
    unjsonable = _unjsonable(doc)
    found = unjsonable or [
        ([name], f"<top level>: missing key '{name}'; allowed: {allowed(schema_at([name]))}")
        for name in (SECTIONS if sections is None else sections) if name not in doc]
    model = None
    try:
        model = None if unjsonable else Params.model_validate_json(json.dumps(doc))
    except ValidationError as error:
        found += _problems(error)
    except RecursionError:
        raise ParamsError(f"invalid {source}: it nests deeper than any params document"
                          ) from None
    if model is None or found:
        lines = "\n".join(f"  - {_blamed(problem, path, sources)}"
                          for path, problem in sorted(found, key=lambda p: p[1]))
        raise ParamsError(f"invalid {source}:\n{lines}\nFix these fields and run again; "
                          "nothing was written.")
    return model


def validate(doc: Any, sections: Sequence[str] | None = None, source: str = "params",
             sources: Sources = ()) -> dict[str, Any]:
    """``doc`` unchanged when :func:`typed` accepts it (Snakemake's config, the section files
    and DVC read the document as written)."""
    typed(doc, sections, source, sources)
    return doc


def _unjsonable(doc: Any) -> list[tuple[list[Any], str]]:
    """The path and a line of each value no params document holds: NaN or infinite numbers
    (JSON has none) and keys that are not strings; walked iteratively, as a document may nest
    deeper than the recursion limit."""
    problems = []
    stack: list[tuple[list[Any], Any]] = [([], doc)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            problems.append((path, f"{_field(path)}: {node!r} is not allowed; allowed: a finite "
                                   "number (nan and inf are refused everywhere)"))
        elif isinstance(node, dict):
            problems += [([*path, key], f"{_field(path)}: key {key!r} is not allowed; allowed: "
                                        "a string (quote it)")
                         for key in node if not isinstance(key, str)]
            stack.extend(([*path, key], value) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend(([*path, index], value) for index, value in enumerate(node))
        elif not isinstance(node, (str, int, float, type(None))):
            problems.append((path, f"{_field(path)}: {node!r} is not allowed; allowed: a string, "
                                   "number, boolean, list, mapping or null"))
    return problems


@lru_cache(maxsize=32)
def _parsed(text: str) -> Any:
    """The YAML document of a params file's text; a command loads its sections one settings
    type at a time (options.load_settings), each from the same files, parsed once."""
    return parse_yaml(text)


def _read(path: str | os.PathLike[str]) -> Any:
    """The document of a params file (YAML or JSON), not validated (a copy: callers may edit
    it)."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ParamsError(f"{path} is a folder, not a params file")
        text = read_outside_text(path, "give a params file (YAML or JSON)", MAX_PARAMS,
                                 ParamsError)
        return copy.deepcopy(_parsed(text))
    except FileNotFoundError:
        raise ParamsError(f"params file not found: {path}") from None
    except yaml.YAMLError as exc:
        raise ParamsError(f"{path} is not valid YAML: {exc}") from None
    except YamlExpansionError as exc:
        raise ParamsError(f"{path} is refused: {exc} (a params file is a few thousand; "
                          "docs/security.md)") from None
    except RecursionError:
        raise ParamsError(f"{path} nests deeper than any params file") from None


def load(path: str | os.PathLike[str], sections: list[str] | None = None) -> dict[str, Any]:
    """Read a params file (YAML or JSON) and validate it."""
    return validate(_read(path), sections=sections, source=str(path))


def load_typed(paths: Sequence[str | os.PathLike[str]], sections: Sequence[str] | None = None
               ) -> Params:
    """Params files merged in order (:func:`merge_files`) as the typed model: the one way
    a command reads its params."""
    sources = read_sources(paths)
    return typed(merged([document for _, document in sources]), sections,
                 " + ".join(name for name, _ in sources), sources)


def load_section(cls: type[S], paths: Sequence[str | os.PathLike[str]]) -> S:
    """The section of type ``cls`` of params files merged in order and validated (params.yaml
    and overlays, or the section files the workflow writes under ``results/.params/``)."""
    return getattr(load_typed(paths, [cls.SECTION]), cls.SECTION)


def section_of(cls: type[S], values: Any) -> S:
    """The section of type ``cls`` from its params mapping alone, validated as in a file."""
    return getattr(typed({cls.SECTION: values}, [cls.SECTION]), cls.SECTION)


# Sections whose entries are read separately (one search space per scale; the compression
# stages each read a few entries of `compress`): each entry gets a file of its own, so editing
# the `s` space does not rerun the `tiny` stages, nor `compress.table` the pretraining.
PER_ENTRY_SECTIONS = ("spaces", "compress")


def write_sections(params: dict[str, Any], folder: str | os.PathLike[str]) -> dict[str, Path]:
    """Write each section to ``folder/{section}.json``, only where its values changed.

    A file's content, and so its mtime, changes only when that section's values change, so a
    rule that takes the file as input reruns exactly when the params it reads change. The
    file holds ``{section: values}``, a valid partial params document. Entries of
    :data:`PER_ENTRY_SECTIONS` get ``{section}.{entry}.json`` files holding
    ``{section: {entry: values}}``.
    """
    folder = Path(folder)
    documents = {}
    for section, values in params.items():
        if section in PER_ENTRY_SECTIONS:
            for entry, entry_values in values.items():
                documents[f"{section}.{entry}"] = {section: {entry: entry_values}}
        else:
            documents[section] = {section: values}
    for name, document in documents.items():
        target = folder / f"{name}.json"
        if not target.exists() or target.read_text(encoding="utf-8") != canonical_json(document):
            atomic_write_json(target, document)
    return {name: folder / f"{name}.json" for name in documents}


def overlay(base: Any, over: dict[str, Any]) -> Any:
    """base with over merged in, as Snakemake merges a ``--configfile`` over the workflow's
    ``configfile`` (``snakemake.utils.update_config``): a mapping merges key by key into a
    mapping and replaces anything else (an empty one changes nothing), any other value
    replaces; neither argument is changed."""
    if not over:
        return base
    merged = dict(base) if isinstance(base, dict) else {}
    for key, value in over.items():
        merged[key] = overlay(merged.get(key, {}), value) if isinstance(value, dict) else value
    return merged


def merged(documents: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The first document with the others merged over it as Snakemake merges ``configfile:``
    and ``--configfile`` files: the others merged together in order, then over the first."""
    first, *others = documents
    return overlay(first, functools.reduce(overlay, others, {}))


def read_sources(paths: Sequence[str | os.PathLike[str]]) -> list[tuple[str, dict[str, Any]]]:
    """(name, document) of each params file, not validated: each a mapping of sections."""
    sources = []
    for path in paths:
        document = _read(path)
        if not isinstance(document, dict):
            raise ParamsError(f"{path}: not a mapping of params sections (e.g. `data: {{...}}`)")
        sources.append((str(path), document))
    return sources


def merge_files(paths: Sequence[str | os.PathLike[str]], sections: list[str] | None = None
                ) -> dict[str, Any]:
    """Params files merged in order, each over the ones before by :func:`overlay` (the
    configuration ``snakemake --configfile`` runs with for params.yaml and overlays, or the
    union of the section files under ``results/.params/``), then validated; a bad value is
    named with the file that set it. ``sections``: the top-level sections required (None:
    every one)."""
    sources = read_sources(paths)
    return validate(merged([document for _, document in sources]), sections=sections,
                    source=" + ".join(name for name, _ in sources), sources=sources)


def load_overlaid(path: str | os.PathLike[str],
                  overlays: Sequence[str | os.PathLike[str]] = ()) -> dict[str, Any]:
    """params.yaml with overlays (e.g. params/paper.yaml) merged over it in order, validated:
    the configuration ``snakemake --configfile OVERLAY`` runs with."""
    return merge_files([path, *overlays])
