"""Measurement conditions: how a model is run, and the folder-safe id that names each.

A condition is the input shape (batch size, sequence length), the dtype, the launch mode
(eager, or a captured CUDA graph replayed) and the runtime options of the dissection stage:

- ``workload``: ``prefill`` (one forward over ``seq_len`` tokens), ``decode`` (``gen_len``
  tokens generated one by one with a KV cache after a ``seq_len``-token prompt; latency is per
  token) or ``train_step`` (forward, backward and AdamW step over ``seq_len`` tokens);
- ``attention``: the PyTorch SDPA backend (``default``: PyTorch's choice, ``math``, ``flash``,
  ``efficient``, ``cudnn``);
- ``quant``: ``none`` or ``int8`` (int8 weights and dynamically quantized int8 activations of
  every Linear, inference only);
- ``compile``: ``torch.compile`` the model;
- ``recompute``: activation recomputation of every block (``train_step`` only).

Ids keep the form of the default condition, ``b1-t128-fp32-eager``, and append one part per
option that differs from its default, e.g. ``b1-t64-fp32-eager-decode32-sdpa_math``.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import polars as pl

DTYPE_NAMES = ("fp32", "bf16", "fp16")  # measure.device.DTYPES maps them to torch dtypes
LAUNCHES = ("eager", "cuda_graph")
WORKLOADS = ("prefill", "decode", "train_step")
ATTENTIONS = ("default", "math", "flash", "efficient", "cudnn")
QUANTS = ("none", "int8")
SHAPE_KEYS = ("batch_size", "seq_len", "dtype", "launch")
_ID = re.compile(r"b(\d+)-t(\d+)-([a-z0-9]+)-(eager|cuda_graph)((?:-[a-z0-9_]+)*)")


def _positive_int(name: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name}: {value!r} is not a positive int")


def _one_of(name: str, value: Any, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: {value!r} is not one of {list(choices)}")


@dataclass(frozen=True, order=True)
class Condition:
    """The input shape, dtype, launch mode and runtime options of a measurement (ordered by
    its fields, so that collections of conditions sort)."""

    batch_size: int
    seq_len: int
    dtype: str
    launch: str = "eager"
    workload: str = "prefill"
    gen_len: int = 0
    attention: str = "default"
    quant: str = "none"
    compile: bool = False
    recompute: bool = False

    def __post_init__(self) -> None:
        _positive_int("batch_size", self.batch_size)
        _positive_int("seq_len", self.seq_len)
        _one_of("dtype", self.dtype, DTYPE_NAMES)
        _one_of("launch", self.launch, LAUNCHES)
        _one_of("workload", self.workload, WORKLOADS)
        _one_of("attention", self.attention, ATTENTIONS)
        _one_of("quant", self.quant, QUANTS)
        if self.workload == "decode":
            _positive_int("gen_len (decode)", self.gen_len)
        elif self.gen_len:
            raise ValueError(f"gen_len: {self.gen_len} set for workload {self.workload!r}; "
                             "only decode generates tokens (set it to 0)")
        if self.recompute and self.workload != "train_step":
            raise ValueError("recompute: activation recomputation applies to workload "
                             f"train_step only, not {self.workload!r}")
        if self.quant != "none" and self.workload == "train_step":
            raise ValueError("quant: int8 weights are for inference; train_step runs "
                             "unquantized (set quant: none)")
        if self.launch == "cuda_graph" and self.workload != "prefill":
            raise ValueError(f"launch: cuda_graph replays a fixed-shape forward; workload "
                             f"{self.workload!r} runs eager")

    @property
    def id(self) -> str:
        """Folder-safe name, e.g. ``b1-t128-fp32-eager`` or ``b1-t64-bf16-eager-train``."""
        parts = [f"b{self.batch_size}-t{self.seq_len}-{self.dtype}-{self.launch}"]
        if self.workload == "decode":
            parts.append(f"decode{self.gen_len}")
        elif self.workload == "train_step":
            parts.append("train")
        if self.attention != "default":
            parts.append(f"sdpa_{self.attention}")
        if self.quant != "none":
            parts.append(self.quant)
        if self.compile:
            parts.append("compiled")
        if self.recompute:
            parts.append("recompute")
        return "-".join(parts)

    @classmethod
    def from_id(cls, condition_id: str) -> Condition:
        """The condition named by an id of :attr:`id`'s form."""
        match = _ID.fullmatch(condition_id)
        if match is None:
            raise ValueError(f"malformed condition id {condition_id!r}; expected e.g. "
                             "'b1-t128-fp32-eager' or 'b1-t64-fp32-eager-decode32'")
        batch, seq, dtype, launch, rest = match.groups()
        options: dict[str, Any] = {}
        for part in filter(None, rest.split("-")):
            if part.startswith("decode") and part[6:].isdigit():
                options |= {"workload": "decode", "gen_len": int(part[6:])}
            elif part == "train":
                options["workload"] = "train_step"
            elif part.startswith("sdpa_"):
                options["attention"] = part[5:]
            elif part in QUANTS:
                options["quant"] = part
            elif part in ("compiled", "recompute"):
                options["compile" if part == "compiled" else part] = True
            else:
                raise ValueError(f"condition id {condition_id!r}: unknown part {part!r}")
        condition = cls(int(batch), int(seq), dtype, launch, **options)
        if condition.id != condition_id:
            raise ValueError(f"condition id {condition_id!r} is not canonical; "
                             f"it is written {condition.id!r}")
        return condition

    def as_dict(self) -> dict[str, Any]:
        """The fields, as table columns."""
        return asdict(self)


CONDITION_KEYS = tuple(field.name for field in fields(Condition))
DEFAULTS = {field.name: field.default for field in fields(Condition)
            if field.name not in ("batch_size", "seq_len", "dtype")}


def condition_id(batch_size: int, seq_len: int, dtype: str, launch: str = "eager",
                 **options: Any) -> str:
    """Folder-safe name of a measurement condition, e.g. ``b1-t128-fp32-eager`` (runtime
    options, see :class:`~hwgptbench.meters.condition.Condition`, append parts)."""
    return Condition(batch_size, seq_len, dtype, launch, **options).id


def with_condition_columns(table: pl.DataFrame) -> pl.DataFrame:
    """table with every condition column, holding its default where the table lacks it or
    it is null (rows measured before the runtime options existed)."""
    import polars as pl  # not at the top: measurement machines need torch and numpy only

    return table.with_columns(
        pl.col(key).fill_null(value) if key in table.columns else pl.lit(value).alias(key)
        for key, value in DEFAULTS.items())
