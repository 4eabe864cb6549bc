"""Atomic file and directory writes, content hashing, torch files read as data only, YAML.

Every stage writes its outputs through these helpers: data goes to a temporary path in the
same folder and is renamed into place only once complete, so a killed job never leaves a
partial output that a later run (or Snakemake, or DVC) could mistake for a finished one.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    import polars as pl

_TMP_MARK = ".tmp-"
_UMASK = os.umask(0)
os.umask(_UMASK)


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry (the rename) to disk where the OS allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary file path beside ``dest``; rename it onto ``dest`` on success.

    On any exception the temporary file is removed and ``dest`` is left untouched.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}{_TMP_MARK}", dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give ordinary permissions
        os.replace(tmp, dest)
        _fsync_dir(dest.parent)
    finally:
        tmp.unlink(missing_ok=True)


def atomic_write_bytes(dest: str | os.PathLike[str], data: bytes) -> None:
    """Write ``data`` to ``dest`` atomically."""
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` (UTF-8) to ``dest`` atomically."""
    atomic_write_bytes(dest, text.encode("utf-8"))


def canonical_json(obj: Any) -> str:
    """Serialise ``obj`` as stable JSON: sorted keys, fixed indentation, trailing newline."""
    return json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=False) + "\n"


def atomic_write_json(dest: str | os.PathLike[str], obj: Any) -> None:
    """Write ``obj`` as canonical JSON to ``dest`` atomically."""
    atomic_write_text(dest, canonical_json(obj))


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging directory beside ``dest``; swap it in as ``dest`` on success.

    A previous ``dest`` is replaced only after the new one is complete. On any exception the
    staging directory is deleted and a previous ``dest`` is left as it was. Staging
    directories left by killed runs carry a ``.tmp-`` mark and are removed by
    :func:`remove_stale_staging`.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(dest)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}{_TMP_MARK}", dir=dest.parent))
    try:
        yield staging
        os.chmod(staging, 0o777 & ~_UMASK)  # mkdtemp creates 0700
        for path in staging.rglob("*"):
            if path.is_file():
                with open(path, "rb+") as handle:
                    os.fsync(handle.fileno())
        if dest.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{dest.name}{_TMP_MARK}old-", dir=dest.parent))
            os.replace(dest, retired / dest.name)
            os.replace(staging, dest)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, dest)
        _fsync_dir(dest.parent)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


class OutputPathError(UserError, ValueError):
    """An output path that would overwrite what is not ours: a folder given for a file, the
    working directory or one of its parents, or a folder of other files."""


def check_output_file(path: str | os.PathLike[str], flag: str = "--out") -> Path:
    """path as a file to write: refused when it is a folder."""
    path = Path(path)
    if path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a folder; name a file to write")
    return path


def check_output_dir(path: str | os.PathLike[str], marker: str, what: str,
                     flag: str = "--out") -> Path:
    """path as a folder that :func:`atomic_dir` may replace as a whole: new, empty, or holding
    ``marker`` (the file an earlier output of this kind has: ``what``). The working directory
    and its parents are refused, and so is a folder of anything else: nothing of the user's is
    deleted."""
    path = Path(path)
    resolved, cwd = path.resolve(), Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        raise OutputPathError(f"{flag} {path}: is the working directory or one of its parents; "
                              f"name a new folder for the {what}")
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a file; name a new folder for the {what}")
    if path.is_dir() and any(path.iterdir()) and not (path / marker).is_file():
        raise OutputPathError(f"{flag} {path}: holds files that are not an earlier {what} (no "
                              f"{marker}), and the folder would be replaced as a whole; name a "
                              "new or empty folder, or move those files away first")
    return path


def remove_stale_staging(dest: str | os.PathLike[str]) -> None:
    """Delete temporary files and directories that killed writes to ``dest`` left behind."""
    dest = Path(dest)
    if not dest.parent.exists():
        return
    for leftover in dest.parent.glob(f".{dest.name}{_TMP_MARK}*"):
        if leftover.is_dir():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def write_parquet(table: pl.DataFrame, path: str | os.PathLike[str]) -> None:
    """Write a polars table as parquet, atomically (every result table is written so)."""
    with atomic_path(path) as tmp:
        table.write_parquet(tmp)


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


def sha256_file(path: str | os.PathLike[str], chunk_size: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's content, read in chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_size):
            digest.update(chunk)
    return digest.hexdigest()


def save_torch(obj: Any, path: str | os.PathLike[str]) -> None:
    """torch.save through an atomic rename."""
    import torch

    with atomic_path(path) as tmp:
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
