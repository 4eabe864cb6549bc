"""What every params model shares: the base class (frozen, unknown keys refused, JSON types
strictly: no string for a number, no number for a boolean, no NaN or infinity) and the field
types that recur, each with its bounds. Counts have upper bounds far beyond any real run, so
that a typo such as 10**12 is refused before a job starts; seeds stay below 2**32 (numpy's
legacy generators take no more).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    GetCoreSchemaHandler,
    GetJsonSchemaHandler,
)

from .problems import ParamsError

T = TypeVar("T")
MT = TypeVar("MT", bound="Model")


DATACLASS = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False,
                       regex_engine="python-re")  # frozen by the dataclass decorator
CONFIG = ConfigDict(frozen=True, **DATACLASS)


class Loadable:
    """A top-level params section: ``SECTION`` is its key in params.yaml (the loader reads
    one with :func:`hwgptbench.params.load_section` or :func:`hwgptbench.params.section_of`)."""

    SECTION: ClassVar[str] = ""


class Model(BaseModel):
    """A params mapping: frozen and strict."""

    model_config = CONFIG

    @classmethod
    def parse(cls: type[MT], values: Any) -> MT:
        """This model from JSON-like values (lists for tuples), as strictly as from a file."""
        return cls.model_validate_json(json.dumps(values))


class Section(Loadable, Model):
    """A top-level params section that is a model (``supernet``'s is a dataclass)."""


def required(value: T | None, where: str) -> T:
    """``value`` of an optional field that this use needs (the validators require it where it
    is used: a text_files corpus' path, a bpe tokenizer's vocab_size)."""
    if value is None:
        raise ParamsError(f"{where}: missing; add it to the params")
    return value


def _distinct(values: tuple[Hashable, ...]) -> tuple[Hashable, ...]:
    """values, each once (a list that repeats one is refused)."""
    if len(set(values)) != len(values):
        raise ValueError("list each value once")
    return values


def doc(default: T, description: str) -> T:
    """A field's default and its one-line description (the params reference prints it)."""
    return Field(default, description=description)


_EACH_ONCE = AfterValidator(_distinct)
_EACH_ONCE_SCHEMA = Field(json_schema_extra={"uniqueItems": True})
Distinct = Annotated[tuple[T, ...], _EACH_ONCE, _EACH_ONCE_SCHEMA]  # a list, each value once
Some = Annotated[tuple[T, ...], Field(min_length=1), _EACH_ONCE, _EACH_ONCE_SCHEMA]  # non-empty


class OneOf:
    """A string among a registry's choices (metrics, algorithms), read when a value is checked
    and when the schema is made: an entry registered later is accepted."""

    def __init__(self, choices: Callable[[], Sequence[str]]) -> None:
        self.choices = choices

    def __get_pydantic_core_schema__(self, source: Any, handler: GetCoreSchemaHandler) -> Any:
        return AfterValidator(self._check).__get_pydantic_core_schema__(source, handler)

    def __get_pydantic_json_schema__(self, schema: Any, handler: GetJsonSchemaHandler) -> Any:
        return {**handler(schema), "enum": list(self.choices())}

    def _check(self, value: str) -> str:
        if value not in self.choices():
            raise ValueError("not registered")
        return value


Seed = Annotated[int, Field(ge=0, le=2**32 - 1)]  # numpy's legacy generators take no more
Count = Annotated[int, Field(ge=1, le=10_000_000)]  # archs, batches, repeats, evaluations
Count0 = Annotated[int, Field(ge=0, le=10_000_000)]
Count2 = Annotated[int, Field(ge=2, le=10_000_000)]
Count3 = Annotated[int, Field(ge=3, le=10_000_000)]
Steps = Annotated[int, Field(ge=1, le=100_000_000)]
Width = Annotated[int, Field(ge=1, le=2**20)]  # tokens, widths, batch sizes
Threads = Annotated[int, Field(ge=1, le=1024)]  # threads, processes, ranks
Folds = Annotated[int, Field(ge=2, le=1000)]
Seeds = Annotated[int, Field(ge=1, le=10_000)]
Positive = Annotated[float, Field(gt=0)]
NonNegative = Annotated[float, Field(ge=0)]
Coverage = Annotated[float, Field(gt=0, lt=1)]
Share = Annotated[float, Field(ge=0, le=1)]
Label = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]  # a device label
Name = Annotated[str, Field(pattern=r"^[A-Za-z0-9_]+$")]  # a scale (key of spaces)
Text = Annotated[str, Field(min_length=1)]
Device = Literal["auto", "cpu", "cuda"]
Dtype = Literal["fp32", "bf16", "fp16"]
Launch = Literal["eager", "cuda_graph"]
Estimator = Literal["median", "min", "cpu_median"]
