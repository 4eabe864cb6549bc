"""Atomic file writes of text, JSON and tables, content hashing, files read as data only
(JSON, parquet, torch), YAML.

Every stage writes its outputs through these helpers, which write through
:func:`~hwgptbench.outputs.atomic_path`: data goes to a temporary path in the same folder and
is renamed into place only once complete, so a killed job never leaves a partial output that
a later run (or Snakemake, or DVC) could mistake for a finished one.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UserError
from .outputs import atomic_path

if TYPE_CHECKING:
    import polars as pl


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes, owned: bool = False) -> None:
    """Write ``data`` to ``dest`` atomically (``owned``: see
    :func:`~hwgptbench.outputs.atomic_path`; an existing file is otherwise replaced only when
    this package wrote it)."""
    with atomic_path(dest, owned) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: str | os.PathLike[str], text: str, owned: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``dest`` atomically."""
    atomic_write_bytes(dest, text.encode("utf-8"), owned)


def canonical_json(obj: Any) -> str:
    """Serialise ``obj`` as stable JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def atomic_write_json(dest: str | os.PathLike[str], obj: Any, owned: bool = False) -> None:
    """Write ``obj`` as canonical JSON to ``dest`` atomically."""
    atomic_write_text(dest, canonical_json(obj), owned)


def write_parquet(table: pl.DataFrame, path: str | os.PathLike[str], owned: bool = False,
                  **options: Any) -> None:
    """Write a polars table as parquet, atomically (every result table is written so;
    ``options``: polars' ``write_parquet`` options)."""
    with atomic_path(path, owned) as tmp:
        table.write_parquet(tmp, **options)


def first_line(err: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message (at most ``limit`` characters), or its type's
    name when it has none: what a one-line error message quotes of a library's error."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__


class CorruptFileError(UserError, ValueError):
    """A file of an earlier stage (or given by a user) that its format's reader refuses."""


def read_json(path: str | os.PathLike[str], fix: str) -> Any:
    """The JSON document at path; :class:`CorruptFileError` names the file, why and ``fix``
    (what to do: delete it and rerun its stage, or pull it again) when it is not JSON."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        reason = "nested too deep" if isinstance(err, RecursionError) else str(err)[:200]
        raise CorruptFileError(f"{path} cannot be read as JSON ({reason}): {fix}") from None


def read_parquet(path: str | os.PathLike[str], fix: str,
                 columns: list[str] | None = None) -> pl.DataFrame:
    """The parquet table at path; :class:`CorruptFileError` names the file, why and ``fix``
    when polars cannot read it (or it lacks ``columns``)."""
    import polars as pl

    try:
        return pl.read_parquet(Path(path), columns=columns)
    except FileNotFoundError:
        raise
    except (OSError, pl.exceptions.PolarsError) as err:
        raise CorruptFileError(f"{path} cannot be read as a parquet table ({first_line(err)}): "
                               f"{fix}") from None


def read_outside_parquet(path: str | os.PathLike[str], fix: str) -> pl.DataFrame:
    """The parquet table of a file from outside (given by a user, or to be shipped), read by
    pyarrow's reader and validated in full before polars holds it: polars' own reader panics
    on some corrupt files and aborts the process on others (a data page header asking for 2^61
    bytes), and text that is not UTF-8 makes polars panic, where pyarrow refuses them with an
    error. Bounded by cost (docs/security.md): a regular file of at most :data:`MAX_PARQUET`
    bytes, at most :data:`MAX_PARQUET_ROWS` rows by its footer, checked before a page is
    decoded, and decoded :data:`PARQUET_BATCH` rows at a time, refused once the batches hold
    more than :data:`MAX_PARQUET_DECODED` bytes (a table of one value repeated compresses to
    almost nothing). The file's bytes are held in a buffer of Arrow's own, never a Python
    object: a reader thread still decoding when a corrupt page ends the read released its
    last reference to a Python-owned buffer during the interpreter's exit, and the process
    aborted (``terminate called without an active exception``). Anything but a regular file
    holding such a table is :class:`CorruptFileError` naming the file and ``fix``."""
    import polars as pl
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not Path(path).is_file():
        raise CorruptFileError(f"{path} is not a regular file: {fix}")
    try:
        arrow = pq.read_table(pa.BufferReader(Path(path).read_bytes()))
        arrow.validate(full=True)
        table = pl.from_arrow(arrow)
    except (OSError, ValueError, pa.ArrowException, pl.exceptions.PolarsError,
            pl.exceptions.PanicException) as err:
        raise CorruptFileError(f"{path} cannot be read as a parquet table ({first_line(err)}): "
                               f"{fix}") from None
    assert isinstance(table, pl.DataFrame)  # a pyarrow Table converts to a DataFrame
    return table


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's content, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def save_torch(obj: Any, path: str | os.PathLike[str], owned: bool = False) -> None:
    """torch.save through an atomic rename."""
    import torch

    with atomic_path(path, owned) as tmp:
        torch.save(obj, tmp)


class TorchFileError(UserError, ValueError):
    """A torch file that cannot be read: truncated, corrupt, or holding more than data."""


# torch's weights-only unpickler refusing a global names it after GLOBAL: "Unsupported global:
# GLOBAL io.open was not an allowed global" (a function or class), "unsupported GLOBAL
# posix.system whose module posix is blocked" (torch 2.13, a blocked module)
_GLOBAL = re.compile(r"\bGLOBAL ([\w.]+)")


def refusal_reason(err: BaseException) -> str:
    """Why ``torch.load(weights_only=True)`` failed, in words: the global a file asks for (code,
    refused unread), else corrupt or truncated."""
    found = _GLOBAL.search(str(err))
    if found:
        return (f"it asks for {found.group(1)}, an object other than tensors and plain data, "
                "refused unread")
    if "weights only load failed" in str(err).lower():  # an opcode it refuses: junk or objects
        return ("corrupt or truncated, or it holds objects other than tensors and plain data; "
                "refused unread")
    return "corrupt or truncated"


def load_torch(path: str | os.PathLike[str], fix: str, device: Any = "cpu",
               mmap: bool = False) -> Any:
    """The contents of a file written by :func:`save_torch`, read as data only (tensors,
    containers, numbers and strings; ``weights_only``: a pulled or given file runs no code,
    docs/security.md). A file that cannot be read raises :class:`TorchFileError` naming it and
    ``fix``, what to do about it."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location=device, weights_only=True, mmap=mmap)
    except FileNotFoundError:
        raise
    except pickle.UnpicklingError as err:
        raise TorchFileError(f"{path} cannot be read ({refusal_reason(err)}): {fix}") from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise TorchFileError(f"{path} cannot be read ({first_line(err, 1000)}): {fix}") from err


def parse_yaml(text: str) -> Any:
    """The document of a YAML text, as ``yaml.safe_load`` reads it (data only, no tags that
    construct objects), parsed by libyaml where PyYAML was built with it: ~10x faster (params
    and their schema took 0.3 s of every command and every Snakemake plan)."""
    import yaml  # here: the modules that measure on a GPU machine import this one

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
