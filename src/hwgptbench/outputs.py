"""Every path the package writes, replaced safely: the one output policy.

A command writes a file or a folder through a temporary sibling that is renamed into place
once complete (:func:`atomic_path`, :func:`atomic_dir`), so a killed job never leaves a
partial output. Before a path a user named (``--out``, ``--folder``) is written, it is checked
(:func:`check_output_dir`, :func:`check_output_file`): the command replaces only what the same
command wrote before, recognised by a marker of its own format that names the command (a
folder's :data:`MARKER` file; a parquet table's key-value metadata; a JSON document's
:data:`JSON_KEY`), and never the working directory, its parents, the filesystem root, the home
folder, a symbolic link that leaves the project, or anything that is not a regular file or
folder. A file's suffix must name the format written into it. docs/security.md, "Nothing of
yours is deleted".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import UserError

if TYPE_CHECKING:
    import polars as pl

_TMP_MARK = ".tmp-"
_UMASK = os.umask(0)
os.umask(_UMASK)
MARKER = ".hwgptbench-output.json"  # in every folder a command replaces as a whole
FORMAT = "hwgptbench-output"  # the marker's format name (its "format" field)
JSON_KEY = "hwgptbench_output"  # the marker's key in a JSON document or parquet metadata
TABLE_SUFFIXES = (".parquet", ".csv")  # the formats of a table a user asks for


class OutputPathError(UserError, ValueError):
    """An output path that would overwrite what is not the command's own: the working
    directory or one of its parents, a folder or file of other content, a link out of the
    project, a device or pipe, or a file whose suffix is not the format written."""


def marker(command: str) -> dict[str, Any]:
    """The marker that says ``command`` wrote an output."""
    return {"format": FORMAT, "version": 1, "command": command}


def write_marker(folder: Path, command: str) -> None:
    """Write ``command``'s :data:`MARKER` into folder (atomically: a reader sees it whole)."""
    with atomic_path(folder / MARKER) as tmp:
        tmp.write_text(json.dumps(marker(command), sort_keys=True) + "\n")


def _is_marker(value: Any, command: str) -> bool:
    return (isinstance(value, dict) and value.get("format") == FORMAT
            and value.get("command") == command)


def _fsync_dir(path: Path) -> None:
    """Flush a directory entry (the rename) to disk where the OS allows it."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _protected(resolved: Path) -> str | None:
    """Why a resolved path may never be replaced, or None."""
    cwd = Path.cwd().resolve()
    if resolved == cwd or resolved in cwd.parents:
        return "is the working directory or one of its parents"
    home = Path.home().resolve()
    if resolved == home or resolved in home.parents:
        return "is the home folder or one of its parents"
    if resolved == Path(resolved.anchor):
        return "is the filesystem root"
    return None


def check_target(path: Path, flag: str, what: str) -> None:
    """Refusals common to every output, file or folder: protected folders, links out of the
    project, anything that exists and is neither a regular file nor a folder."""
    why = _protected(path.resolve())
    if why:
        raise OutputPathError(f"{flag} {path}: {why}; name a new {what}")
    if path.is_symlink():
        project = Path.cwd().resolve()
        target = path.resolve()
        if target != project and project not in target.parents:
            raise OutputPathError(f"{flag} {path}: is a symbolic link out of the project (to "
                                  f"{target}); name the {what} itself")
    if path.exists() and not (path.is_file() or path.is_dir()):
        raise OutputPathError(f"{flag} {path}: is not a regular file or folder (a device, "
                              f"pipe or socket); name a new {what}")


def check_output_flags(values: dict[str, Any]) -> None:
    """:func:`check_target` of every output flag of a command line (``--out``,
    ``--*-out``; ``values``: its parsed arguments), before the command runs: the stages' own
    outputs, which Snakemake deletes before a job, are never a protected folder, a link out of
    the project or a device either."""
    for name, value in values.items():
        if (name == "out" or name.endswith("_out")) and isinstance(value, (str, Path)):
            check_target(Path(value), f"--{name.replace('_', '-')}", "output path")


def folder_marker(path: str | os.PathLike[str]) -> Any:
    """The marker read from a folder (None when it has none, or an unreadable one)."""
    file = Path(path) / MARKER
    if not file.is_file():
        return None
    try:
        return json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return None


def check_output_dir(path: str | os.PathLike[str], command: str,
                     flag: str = "--out") -> Path:
    """path as a folder that ``command`` may replace as a whole: new, empty, or an earlier
    output of the same command (its :data:`MARKER`). Everything else is refused with
    :class:`OutputPathError` before anything is written: nothing of the user's is deleted."""
    path = Path(path)
    what = f"folder for the output of hwgptbench {command}"
    check_target(path, flag, what)
    if path.exists() and not path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a file; name a new {what}")
    if path.is_dir() and any(path.iterdir()) and not _is_marker(folder_marker(path), command):
        raise OutputPathError(f"{flag} {path}: holds files that hwgptbench {command} did not "
                              f"write (no {MARKER} of it), and the folder would be replaced "
                              "as a whole; name a new or empty folder, or move those files "
                              "away first")
    return path


def _file_marker(path: Path) -> Any:
    """The marker of a file this package wrote (parquet metadata or a JSON key), or None."""
    if path.suffix == ".parquet":
        import polars as pl

        try:
            metadata = pl.read_parquet_metadata(path)
            return json.loads(metadata.get(JSON_KEY, "null"))
        except Exception:  # noqa: BLE001 - any unreadable file is simply not ours
            return None
    if path.suffix == ".json":
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError):
            return None
        return document.get(JSON_KEY) if isinstance(document, dict) else None
    return None


def check_output_file(path: str | os.PathLike[str], command: str, suffixes: Sequence[str],
                      flag: str = "--out") -> Path:
    """path as a file that ``command`` may write: its suffix one of ``suffixes`` (the formats
    it writes), new or an earlier output of the same command (its marker); a CSV file, which
    holds no marker, is never replaced."""
    path = Path(path)
    what = f"file ({' or '.join(suffixes)}) for hwgptbench {command}"
    check_target(path, flag, what)
    if path.suffix not in suffixes:
        raise OutputPathError(f"{flag} {path}: the suffix must name the format written "
                              f"({', '.join(suffixes)}); name a {what}")
    if path.is_dir():
        raise OutputPathError(f"{flag} {path}: is a folder; name a {what}")
    if path.exists() and not _is_marker(_file_marker(path), command):
        raise OutputPathError(f"{flag} {path}: exists and was not written by hwgptbench "
                              f"{command}; name a new file, or move that one away first")
    return path


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


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging directory beside ``dest``; swap it in as ``dest`` on success.

    A previous ``dest`` is replaced only after the new one is complete. On any exception the
    staging directory is deleted and a previous ``dest`` is left as it was. Staging
    directories left by killed runs carry a ``.tmp-`` mark and are removed by
    :func:`remove_stale_staging`. A path a user named goes through :func:`replace_dir`.
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
        if dest.exists() or dest.is_symlink():
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


@contextlib.contextmanager
def replace_dir(dest: str | os.PathLike[str], command: str,
                flag: str = "--out") -> Iterator[Path]:
    """:func:`atomic_dir` of a folder ``command`` may replace (:func:`check_output_dir`); the
    staging folder gets ``command``'s marker, so a later run of it may replace the folder."""
    dest = check_output_dir(dest, command, flag)
    with atomic_dir(dest) as staging:
        yield staging
        write_marker(staging, command)


def make_own_dir(path: str | os.PathLike[str], command: str) -> Path:
    """Create a working folder of ``command`` (e.g. a job's resume state) with its marker, or
    return it when ``command`` made it before; a path that exists and is not such a folder is
    refused (:class:`OutputPathError`), so :func:`remove_own_dir` never deletes a user's."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not path.is_dir() or not _is_marker(folder_marker(path),
                                                                    command):
            raise OutputPathError(f"{path}: exists and is not a folder hwgptbench {command} "
                                  f"made (no {MARKER} of it); move it away and rerun")
        return path
    path.mkdir(parents=True)
    write_marker(path, command)
    return path


def remove_own_dir(path: str | os.PathLike[str], command: str) -> None:
    """Delete a folder that :func:`make_own_dir` made for ``command`` (nothing when absent)."""
    path = Path(path)
    if path.exists() or path.is_symlink():
        shutil.rmtree(make_own_dir(path, command))


def remove_stale_staging(dest: str | os.PathLike[str]) -> None:
    """Delete temporary files and directories that killed writes to ``dest`` left behind
    (siblings named ``.{dest.name}.tmp-*``, which only :func:`atomic_path` and
    :func:`atomic_dir` create)."""
    dest = Path(dest)
    if not dest.parent.is_dir():
        return
    for leftover in dest.parent.glob(f".{dest.name}{_TMP_MARK}*"):
        if leftover.is_dir() and not leftover.is_symlink():
            shutil.rmtree(leftover, ignore_errors=True)
        else:
            leftover.unlink(missing_ok=True)


def parquet_marker(command: str) -> dict[str, str]:
    """The key-value metadata that marks a parquet table as written by ``command``."""
    return {JSON_KEY: json.dumps(marker(command), sort_keys=True)}


def write_table(table: pl.DataFrame, path: str | os.PathLike[str], command: str,
                flag: str = "--out") -> Path:
    """Write a table a user asked for to ``path`` (parquet with ``command``'s marker, or CSV,
    by suffix), atomically, after :func:`check_output_file`."""
    path = check_output_file(path, command, TABLE_SUFFIXES, flag)
    with atomic_path(path) as tmp:
        if path.suffix == ".csv":
            table.write_csv(tmp)
        else:
            table.write_parquet(tmp, metadata=parquet_marker(command))
    return path


def write_json_output(document: dict[str, Any], path: str | os.PathLike[str], command: str,
                      flag: str = "--out") -> Path:
    """Write a JSON document a user asked for (with ``command``'s marker under
    :data:`JSON_KEY`), atomically, after :func:`check_output_file`."""
    path = check_output_file(path, command, (".json",), flag)
    text = json.dumps({**document, JSON_KEY: marker(command)}, sort_keys=True, indent=2,
                      ensure_ascii=False) + "\n"
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
