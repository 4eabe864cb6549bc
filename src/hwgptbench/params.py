"""Loading and validation of params.yaml against the packaged JSON schema.

The same schema is used by the Snakefile (before any job starts) and by the CLI when a stage
runs alone, so a bad value is rejected the same way everywhere, before anything is written.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
import os
from collections.abc import Sequence
from functools import cache, lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from .errors import UserError
from .io import (
    YamlExpansionError,
    atomic_write_json,
    canonical_json,
    parse_yaml,
    read_outside_text,
)
from .metrics import PERPLEXITY, hardware_metrics

SCHEMA_RESOURCE = "schemas/params.schema.yaml"
MAX_PARAMS = 4 << 20  # bytes of a params file or overlay (params.yaml: 19 kB)


class ParamsError(UserError, ValueError):
    """params.yaml is missing, unreadable or does not match the schema."""


@cache
def schema_file() -> dict[str, Any]:
    """The params schema file as shipped (its metric enums empty: :func:`schema` fills them)."""
    text = resources.files("hwgptbench").joinpath(SCHEMA_RESOURCE).read_text(encoding="utf-8")
    return parse_yaml(text)


def schema() -> dict[str, Any]:
    """The params schema shipped with the package, its metric enums those of the registry
    (:data:`hwgptbench.metrics.METRICS`) and its search algorithms and their options those
    declared in :mod:`hwgptbench.search_algorithms`."""
    from .search_algorithms import ALGORITHMS, options_schemas

    full = schema_file()
    metrics = hardware_metrics()
    defs = {**full["$defs"],
            "hardware_metric": {**full["$defs"]["hardware_metric"], "enum": metrics},
            "objective": {**full["$defs"]["objective"], "enum": [PERPLEXITY, *metrics]},
            "search_algorithm": {**full["$defs"]["search_algorithm"], "enum": list(ALGORITHMS)}}
    search = _with_options(full["properties"]["search"], options_schemas())
    compress = full["properties"]["compress"]
    subnets = compress["properties"]["search"]
    subnets = _with_options(subnets, options_schemas(subnets["properties"]["algorithms"]
                                                     ["items"]["enum"]))
    compress = {**compress, "properties": {**compress["properties"], "search": subnets}}
    return {**full, "$defs": defs,
            "properties": {**full["properties"], "search": search, "compress": compress}}


def _with_options(section: dict[str, Any], options: dict[str, Any]) -> dict[str, Any]:
    """A search section's schema, its ``options`` object holding these entries."""
    filled = {**section["properties"]["options"], "properties": options}
    return {**section, "properties": {**section["properties"], "options": filled}}


def _field(path: Any) -> str:
    parts = [str(p) for p in path]
    return ".".join(parts) if parts else "<top level>"


def _allowed(subschema: dict[str, Any]) -> str:
    """A short description of the values a subschema accepts."""
    if "enum" in subschema:
        return "one of " + ", ".join(repr(v) for v in subschema["enum"])
    kinds = subschema.get("type")
    kinds = " or ".join(kinds) if isinstance(kinds, list) else (kinds or "value")
    bounds = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"),
                      ("maximum", "<="), ("exclusiveMaximum", "<")):
        if key in subschema:
            bounds.append(f"{sign} {subschema[key]}")
    if "pattern" in subschema:
        bounds.append(f"matching {subschema['pattern']}")
    if "minLength" in subschema:
        bounds.append("non-empty")
    text = kinds + (" " + ", ".join(bounds) if bounds else "")
    if "description" in subschema:
        text += f" ({subschema['description']})"
    return text


def _extra_keys(error: jsonschema.ValidationError) -> list[Any]:
    """The keys an ``additionalProperties`` error refuses, in a stable order."""
    allowed = error.schema.get("properties", {})
    return sorted(set(error.instance) - set(allowed), key=repr)  # keys of any type


def _describe(error: jsonschema.ValidationError) -> str:
    """One line naming the field, the problem and what is allowed."""
    field = _field(error.absolute_path)
    if error.validator == "additionalProperties":
        allowed = sorted(error.schema.get("properties", {}))
        return (f"{field}: unknown key(s) {', '.join(map(repr, _extra_keys(error)))}; "
                f"allowed keys: {', '.join(allowed)}")
    if error.validator == "required":
        missing = error.message.split("'")[1]
        sub = error.schema.get("properties", {}).get(missing, {})
        return f"{field}: missing key '{missing}'; allowed: {_allowed(sub)}"
    return f"{field}: {error.instance!r} is not allowed; allowed: {_allowed(error.schema)}"


def _blamed_path(error: jsonschema.ValidationError) -> list[Any]:
    """Where the value an error refuses sits: an unknown key's own path, a missing key's
    path (which no file holds), else the field's."""
    path = list(error.absolute_path)
    if error.validator == "additionalProperties":
        return [*path, *_extra_keys(error)[:1]]
    if error.validator == "required":
        return [*path, error.message.split("'")[1]]
    return path


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


def validate(doc: Any, sections: list[str] | None = None, source: str = "params",
             sources: Sources = ()) -> dict[str, Any]:
    """Validate a params document; return it unchanged or raise one :class:`ParamsError`.

    ``sections`` restricts the required top-level sections (a stage that is given only its own
    sections, e.g. a `results/.params/data.json` file, validates just those). ``sources``, the
    files ``doc`` was merged from (:func:`merge_files`), name the file behind each bad value.
    """
    full = schema()
    if sections is not None:  # a stage given the entry files it reads has only those entries
        properties = {name: {**prop, "required": []} if name in PER_ENTRY_SECTIONS else prop
                      for name, prop in full["properties"].items()}
        full = {**full, "required": list(sections), "properties": properties}
    validator = jsonschema.Draft202012Validator(full)
    try:
        errors = sorted(validator.iter_errors(doc),
                        key=lambda e: [str(p) for p in e.absolute_path])
    except RecursionError:
        raise ParamsError(f"invalid {source}: it nests deeper than any params document") from None
    found = [(_blamed_path(e), _describe(e)) for e in errors] + _non_finite(doc)
    problems = ([_blamed(problem, path, sources) for path, problem in found]
                or _cross_field_problems(doc))
    if problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise ParamsError(f"invalid {source}:\n{lines}\nFix these fields and run again; "
                          "nothing was written.")
    return doc


def _non_finite(doc: Any) -> list[tuple[list[Any], str]]:
    """The path and a line of each NaN or infinite number anywhere in doc: JSON-schema bounds
    are false for NaN, so every bound would let it through."""
    problems = []
    stack: list[tuple[list[Any], Any]] = [([], doc)]
    while stack:  # iteratively: a document may nest deeper than the recursion limit
        path, node = stack.pop()
        if isinstance(node, float) and not math.isfinite(node):
            problems.append((path, f"{_field(path)}: {node!r} is not allowed; allowed: a finite "
                                   "number (nan and inf are refused everywhere)"))
        elif isinstance(node, dict):
            stack.extend(([*path, key], value) for key, value in node.items())
        elif isinstance(node, list):
            stack.extend(([*path, index], value) for index, value in enumerate(node))
    return sorted(problems, key=lambda problem: problem[1])


def snapshot_problems(snapshots: Sequence[int], steps: int) -> list[str]:
    """Why ``supernet.snapshots`` does not fit ``supernet.steps`` (empty when it does)."""
    problems = []
    late = [s for s in snapshots if s >= steps]
    if late:
        problems.append(f"supernet.snapshots: {list(snapshots)!r} is not allowed; every snapshot "
                        f"must be < supernet.steps ({steps}): drop {late} or raise "
                        "supernet.steps")
    if any(a >= b for a, b in itertools.pairwise(snapshots)):
        problems.append(f"supernet.snapshots: {list(snapshots)!r} is not allowed; list distinct "
                        f"steps in increasing order, e.g. {sorted(set(snapshots))}")
    return problems


def batch_problems(batch_size: int, processes: int) -> list[str]:
    """Why ``supernet.batch_size`` cannot be split evenly over ``supernet.processes``."""
    if batch_size % processes == 0:
        return []
    lower, upper = batch_size // processes * processes, -(-batch_size // processes) * processes
    multiples = f"{lower} or {upper}" if lower else f"{upper}"
    return [f"supernet.batch_size: {batch_size} is not divisible by supernet.processes "
            f"({processes}); each process trains batch_size / processes sequences: set "
            f"supernet.batch_size to a multiple of {processes} (e.g. {multiples}) or "
            f"supernet.processes to a divisor of {batch_size}"]


def search_problems(search: dict[str, Any], field: str = "search") -> list[str]:
    """Why ``search.objectives`` names sets that ``search.objective_sets`` lacks (``field``:
    where the search section is, ``paper.search`` for the paper's)."""
    unknown = [name for name in search["objectives"] if name not in search["objective_sets"]]
    if not unknown:
        return []
    return [f"{field}.objectives: {unknown} are not keys of {field}.objective_sets "
            f"({', '.join(search['objective_sets'])}); define them there or remove them"]


def paper_problems(paper: dict[str, Any]) -> list[str]:
    """Why the paper's search or its external transfer cannot run as configured."""
    problems = search_problems(paper["search"], "paper.search")
    if "moasha" in paper["search"]["algorithms"]:
        problems.append("paper.search.algorithms: moasha needs perplexities at several "
                        "training steps, and the shipped tables have one per arch: remove it")
    external = paper["external"]
    if external["report_k"] not in external["ks"]:
        problems.append(f"paper.external.report_k: {external['report_k']} is not one of "
                        f"paper.external.ks {external['ks']}: add it there or choose one")
    return problems


def transfer_problems(transfer: dict[str, Any]) -> list[str]:
    """Why ``transfer.report_k``, ``method`` or ``selection`` is not among what is evaluated."""
    problems = []
    for field, choices in (("report_k", "ks"), ("method", "methods"),
                           ("selection", "selections")):
        if transfer[field] not in transfer[choices]:
            problems.append(f"transfer.{field}: {transfer[field]!r} is not one of "
                            f"transfer.{choices} {transfer[choices]}: add it there or choose "
                            "one of them (the report and `hwgptbench adapt` use what the "
                            "evaluation measured)")
    return problems


def runtime_problems(runtime: dict[str, Any]) -> list[str]:
    """Why ``runtime`` timing bounds contradict each other."""
    if runtime["min_repeats"] <= runtime["max_repeats"]:
        return []
    return [f"runtime.min_repeats: {runtime['min_repeats']} exceeds runtime.max_repeats "
            f"{runtime['max_repeats']}; lower it or raise max_repeats"]


def surrogate_problems(surrogate: dict[str, Any]) -> list[str]:
    """Why ``surrogate.default_family`` names a family that is not fitted."""
    family, families = surrogate["default_family"], surrogate["families"]
    if family == "best" or family in families or (family == "blend" and len(families) > 1):
        return []
    return [f"surrogate.default_family: {family!r} is not fitted (surrogate.families "
            f"{families}; blend needs two or more): add it there or choose best"]


def import_problems(doc: dict[str, Any]) -> list[str]:
    """Why ``perplexity.source: hwgptbench`` cannot serve ``workflow.scales``."""
    from .hwgpt_source import FILES

    perplexity, workflow = doc.get("perplexity"), doc.get("workflow")
    if not perplexity or not workflow or perplexity.get("source") != "hwgptbench":
        return []
    problems = []
    other = [scale for scale in workflow["scales"] if scale not in FILES]
    if other:
        problems.append(f"workflow.scales: {other} have no published perplexities; with "
                        f"perplexity.source hwgptbench the scales are among {', '.join(FILES)} "
                        "(or set perplexity.source: supernet to train their supernets)")
    if "moasha" in doc.get("search", {}).get("algorithms", []):
        problems.append("search.algorithms: moasha needs perplexities at several training "
                        "steps, and HW-GPT-Bench published one per arch: remove moasha with "
                        "perplexity.source hwgptbench")
    return problems


def compress_problems(compress: dict[str, Any]) -> list[str]:
    """Why the ``compress`` section cannot run: its space, its dense-model source, timing."""
    from .space import SearchSpace

    problems = []
    if "space" in compress:
        try:
            SearchSpace.from_dict(compress.get("name", "compress"), compress["space"])
        except ValueError as error:
            problems.append(f"compress.space: {error}")
    if compress.get("source") == "huggingface" and not compress.get("checkpoint"):
        problems.append("compress.checkpoint: source huggingface needs the checkpoint directory")
    timing = compress.get("timing")
    if timing and timing["min_repeats"] > timing["max_repeats"]:
        problems.append(f"compress.timing.min_repeats: {timing['min_repeats']} exceeds "
                        f"max_repeats {timing['max_repeats']}")
    for name in ("pretrain", "finetune"):
        section = compress.get(name)
        if section is None:
            continue
        problems += [f"compress.{name}: {problem}" for problem in
                     snapshot_problems(section["snapshots"], section["steps"])
                     + batch_problems(section["batch_size"], section["processes"])]
    return problems


def _cross_field_problems(doc: dict[str, Any]) -> list[str]:
    """Constraints between fields that the schema cannot express, one line each."""
    supernet, search, transfer = doc.get("supernet"), doc.get("search"), doc.get("transfer")
    runtime, compress = doc.get("runtime"), doc.get("compress")
    surrogate, paper = doc.get("surrogate"), doc.get("paper")
    return ((snapshot_problems(supernet["snapshots"], supernet["steps"])
             + batch_problems(supernet["batch_size"], supernet["processes"]))
            if supernet else []) + (search_problems(search) if search else []) + (
        transfer_problems(transfer) if transfer else []) + (
        runtime_problems(runtime) if runtime else []) + (
        surrogate_problems(surrogate) if surrogate else []) + (
        compress_problems(compress) if compress else []) + (
        paper_problems(paper) if paper else []) + import_problems(doc)


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
