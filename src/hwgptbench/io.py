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
import stat
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


# Bounds by cost of the readers of files from outside (docs/security.md, "Readers are bounded
# by cost", says what real file each was chosen against and the margin).
MAX_JSON = 16 << 20  # bytes of a JSON document read by read_json
MAX_TEXT = 64 << 20  # bytes of a text file a user names (--archs-file, paper-docs --doc)
MAX_PARQUET = 256 << 20  # bytes of an outside parquet file
MAX_PARQUET_ROWS = 1_000_000  # rows of an outside parquet table, from its footer
MAX_PARQUET_DECODED = 256 << 20  # bytes an outside parquet table decodes to
PARQUET_BATCH = 8192  # rows decoded at a time, each batch counted against the bound
MAX_YAML_NODES = 100_000  # nodes of a YAML document with its aliases expanded
_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
          (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "a special file")


def check_outside_file(path: str | os.PathLike[str], fix: str, max_bytes: int | None = None,
                       error: type[Exception] = CorruptFileError) -> int:
    """The size of the regular file at ``path``, checked before it is opened: anything else (a
    FIFO, whose opening waits for a writer, a device, a socket, a folder), or a file larger
    than ``max_bytes``, is ``error`` naming the file and ``fix``. A missing file is
    FileNotFoundError, left to the caller. Every reader of a file from outside calls this."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise
    except OSError as err:
        raise error(f"{path} cannot be read ({err.strerror or type(err).__name__}): "
                    f"{fix}") from None
    if not stat.S_ISREG(info.st_mode):
        raise error(f"{path} is not a regular file: {fix} (it is {_kind(info.st_mode)})")
    if max_bytes is not None and info.st_size > max_bytes:
        raise error(f"{path} holds {info.st_size:,} bytes, more than the {max_bytes:,} its "
                    f"reader takes (docs/security.md): {fix}")
    return info.st_size


def read_outside_bytes(path: str | os.PathLike[str], fix: str, max_bytes: int,
                       error: type[Exception] = CorruptFileError) -> bytes:
    """The bytes of the regular file at ``path`` (:func:`check_outside_file`), at most
    ``max_bytes``; opened without waiting (a FIFO put in its place after the check is refused,
    not waited on) and checked again on the open file."""
    check_outside_file(path, fix, max_bytes, error)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    with os.fdopen(fd, "rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        if not stat.S_ISREG(mode):
            raise error(f"{path} is not a regular file: {fix} (it is {_kind(mode)})")
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise error(f"{path} holds more than the {max_bytes:,} bytes its reader takes "
                    f"(docs/security.md): {fix}")
    return data


def read_outside_text(path: str | os.PathLike[str], fix: str, max_bytes: int = MAX_TEXT,
                      error: type[Exception] = CorruptFileError) -> str:
    """The UTF-8 text of a file from outside (:func:`read_outside_bytes`); text that is not
    UTF-8 is ``error``."""
    try:
        return read_outside_bytes(path, fix, max_bytes, error).decode("utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} is not a UTF-8 text file: {fix}") from None


def read_json(path: str | os.PathLike[str], fix: str) -> Any:
    """The JSON document at path; :class:`CorruptFileError` names the file, why and ``fix``
    (what to do: delete it and rerun its stage, or pull it again) when it is not JSON."""
    try:
        return json.loads(read_outside_bytes(path, fix, MAX_JSON).decode("utf-8"))
    except (FileNotFoundError, CorruptFileError):
        raise
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as err:
        reason = "nested too deep" if isinstance(err, RecursionError) else str(err)[:200]
        raise CorruptFileError(f"{path} cannot be read as JSON ({reason}): {fix}") from None


def read_parquet(path: str | os.PathLike[str], fix: str,
                 columns: list[str] | None = None) -> pl.DataFrame:
    """The parquet table at path; :class:`CorruptFileError` names the file, why and ``fix``
    when polars cannot read it (or it lacks ``columns``)."""
    import polars as pl

    check_outside_file(path, fix)
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

    size = check_outside_file(path, fix, MAX_PARQUET)

    def refuse(why: str) -> CorruptFileError:
        return CorruptFileError(f"{path} cannot be read as a parquet table ({why}): {fix}")

    try:
        with pa.OSFile(os.fspath(path)) as handle:
            data = handle.read_buffer(MAX_PARQUET + 1)
        if data.size != size:
            raise refuse("it changed while it was read")
        reader = pq.ParquetFile(pa.BufferReader(data))
        rows = reader.metadata.num_rows
        if rows > MAX_PARQUET_ROWS:
            raise refuse(f"its footer counts {rows:,} rows, more than the "
                         f"{MAX_PARQUET_ROWS:,} a table given to hwgptbench may hold")
        batches, decoded = [], 0
        for batch in reader.iter_batches(batch_size=PARQUET_BATCH, use_threads=False):
            decoded += batch.nbytes
            if decoded > MAX_PARQUET_DECODED:
                raise refuse(f"it decodes to more than {MAX_PARQUET_DECODED >> 20} MiB")
            batches.append(batch)
        arrow = pa.Table.from_batches(batches, schema=reader.schema_arrow)
        if arrow.num_rows != rows:
            raise refuse(f"its pages hold {arrow.num_rows:,} rows, its footer {rows:,}")
        arrow.validate(full=True)
        table = pl.from_arrow(arrow)
    except CorruptFileError:
        raise
    except (OSError, ValueError, pa.ArrowException, pl.exceptions.PolarsError,
            pl.exceptions.PanicException) as err:
        raise refuse(first_line(err)) from None
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


def check_tensors(obj: Any, path: str | os.PathLike[str], fix: str) -> None:
    """Raise :class:`TorchFileError` unless every tensor in ``obj`` (a loaded torch file's
    tensors, containers and plain values) holds at most as many elements as its storage: a
    tensor's sizes and strides may make a few stored bytes a view of billions of elements (a
    stride of 0), which any copy of it (``numpy.asarray``, ``float()``) then materialises.
    ``torch.save`` of this package's tensors writes each element once."""
    import torch

    stack = [obj]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.Tensor):
            stored = item.untyped_storage().nbytes()
            if item.numel() * item.element_size() > stored:
                raise TorchFileError(
                    f"{path} cannot be read (a tensor of sizes {tuple(item.shape)} and strides "
                    f"{item.stride()} views {item.numel():,} elements of a storage of "
                    f"{stored:,} bytes; refused unread): {fix}")
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def load_torch(path: str | os.PathLike[str], fix: str, device: Any = "cpu",
               mmap: bool = False, max_bytes: int | None = None) -> Any:
    """The contents of a file written by :func:`save_torch`, read as data only (tensors,
    containers, numbers and strings; ``weights_only``: a pulled or given file runs no code,
    docs/security.md): a regular file of at most ``max_bytes`` (when given), each tensor no
    larger than its storage (:func:`check_tensors`). A file that cannot be read raises
    :class:`TorchFileError` naming it and ``fix``, what to do about it."""
    import pickle
    import struct

    import torch

    try:
        check_outside_file(path, fix, max_bytes, TorchFileError)
        loaded = torch.load(path, map_location=device, weights_only=True, mmap=mmap)
        check_tensors(loaded, path, fix)
        return loaded
    except (FileNotFoundError, TorchFileError):
        raise
    except pickle.UnpicklingError as err:
        raise TorchFileError(f"{path} cannot be read ({refusal_reason(err)}): {fix}") from err
    except (RuntimeError, EOFError, OSError, ValueError) as err:
        raise TorchFileError(f"{path} cannot be read ({first_line(err, 1000)}): {fix}") from err
    except (IndexError, KeyError, TypeError, struct.error) as err:  # a corrupt pickle stream:
        # torch's unpickler pops an empty stack, reads a memo it never stored, unpacks too few
        raise TorchFileError(f"{path} cannot be read (corrupt: {type(err).__name__}: "
                             f"{first_line(err, 1000)}): {fix}") from err


def parse_yaml(text: str) -> Any:
    """The document of a YAML text, as ``yaml.safe_load`` reads it (data only, no tags that
    construct objects), parsed by libyaml where PyYAML was built with it: ~10x faster (params
    and their schema took 0.3 s of every command and every Snakemake plan)."""
    import yaml  # here: the modules that measure on a GPU machine import this one

    document = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    expanded_nodes(document)
    return document


class YamlExpansionError(UserError, ValueError):
    """A YAML document whose aliases expand beyond :data:`MAX_YAML_NODES` nodes, or refer to
    themselves."""


def expanded_nodes(document: Any, limit: int = MAX_YAML_NODES) -> int:
    """The nodes of a parsed YAML document with its aliases expanded, as every later walk
    (merging, validation, copies) sees them, counted without expanding them: an alias is one
    shared object, counted once per reference. :class:`YamlExpansionError` when they number
    more than ``limit`` (a 528-byte file of aliases nested nine deep stands for 9^9 nodes) or
    an alias refers to a node that holds it."""
    sizes: dict[int, int] = {}
    open_: set[int] = set()

    def size(node: Any) -> int:
        if not isinstance(node, (dict, list)):
            return 1
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in open_:
            raise YamlExpansionError("an alias refers to a node that holds it")
        open_.add(key)
        children = (*node.keys(), *node.values()) if isinstance(node, dict) else node
        total = 1 + sum(size(child) for child in children)
        open_.discard(key)
        if total > limit:
            raise YamlExpansionError(f"its aliases expand to more than {limit:,} nodes")
        sizes[key] = total
        return total

    return size(document)
