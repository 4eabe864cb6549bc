"""Typed settings from validated params: a params section becomes one frozen dataclass, built
once where a command starts, so that library code reads attributes that mypy checks instead of
string keys.

The params schema validates first (:mod:`hwgptbench.params`); :func:`build` then turns the
section's mapping into its dataclass by the dataclass's type hints (nested dataclasses, tuples
for lists, ``X | None``, ``Literal``, mappings), refusing a key the dataclass lacks, so the
dataclasses and the schema cannot drift apart unnoticed (tests/test_settings.py checks both
ways).
"""

from __future__ import annotations

import dataclasses
import types
from collections.abc import Mapping
from typing import (
    Any,
    Literal,
    TypeVar,
    Union,
    get_args,
    get_origin,
    get_type_hints,
)

from ..errors import UserError

T = TypeVar("T")


class SettingsError(UserError, ValueError):
    """A params value that its settings type cannot hold; the message names the field."""


def build(cls: type[T], values: Mapping[str, Any], where: str | None = None) -> T:
    """``cls`` (a dataclass) from a validated params mapping; ``where`` names it in errors
    (default: the class's ``SECTION``)."""
    where = where or getattr(cls, "SECTION", cls.__name__)
    if not isinstance(values, Mapping):
        raise SettingsError(f"{where}: expected a mapping, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise SettingsError(f"{where}.{unknown[0]}: not a setting of {cls.__name__} "
                            f"(known: {', '.join(fields)})")
    hints = get_type_hints(cls)
    kwargs = {}
    for name, field in fields.items():
        if name in values:
            kwargs[name] = _convert(hints[name], values[name], f"{where}.{name}")
        elif (field.default is dataclasses.MISSING
              and field.default_factory is dataclasses.MISSING):
            raise SettingsError(f"{where}.{name}: missing; add it to the params")
    return cls(**kwargs)


def required(value: T | None, where: str) -> T:
    """``value`` of an optional field that this use needs (the schema requires it where it is
    used: a text_files corpus' path, a bpe tokenizer's vocab_size)."""
    if value is None:
        raise SettingsError(f"{where}: missing; add it to the params")
    return value


def as_params(settings: Any) -> Any:
    """A settings object as the params it was built from (lists for tuples), the fields left
    unset (None) out: what a manifest records."""
    if dataclasses.is_dataclass(settings) and not isinstance(settings, type):
        return {f.name: as_params(getattr(settings, f.name))
                for f in dataclasses.fields(settings) if getattr(settings, f.name) is not None}
    if isinstance(settings, (tuple, list)):
        return [as_params(v) for v in settings]
    if isinstance(settings, Mapping):
        return {k: as_params(v) for k, v in settings.items()}
    return settings


def _convert(kind: Any, value: Any, where: str) -> Any:
    """``value`` as the type hint ``kind`` says."""
    origin, args = get_origin(kind), get_args(kind)
    if kind is Any:
        return value
    if dataclasses.is_dataclass(kind) and isinstance(kind, type):
        return build(kind, value, where)
    if isinstance(kind, type) and hasattr(kind, "from_params"):  # a type that builds itself
        return kind.from_params(value, where)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        inner = [a for a in args if a is not type(None)]
        if len(inner) == 1:
            return _convert(inner[0], value, where)
        for option in inner:
            try:
                return _convert(option, value, where)
            except SettingsError:
                continue
        raise SettingsError(f"{where}: {value!r} is none of {kind}")
    if origin is Literal:
        if value not in args:
            raise SettingsError(f"{where}: {value!r} is not one of {', '.join(map(repr, args))}")
        return value
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise SettingsError(f"{where}: expected a list, got {value!r}")
        item = args[0] if args else Any
        return tuple(_convert(item, v, f"{where}[{i}]") for i, v in enumerate(value))
    if origin in (dict, Mapping) or kind in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise SettingsError(f"{where}: expected a mapping, got {value!r}")
        item = args[1] if len(args) == 2 else Any
        return {str(k): _convert(item, v, f"{where}.{k}") for k, v in value.items()}
    if kind is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingsError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if kind in (int, str, bool):
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise SettingsError(f"{where}: expected {kind.__name__}, got {value!r}")
        return value
    raise SettingsError(f"{where}: settings type {kind!r} is not supported")
