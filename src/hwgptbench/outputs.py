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

Every write of the package goes through this module (``tests/test_one_writer.py`` scans the
package for any other), and every write is checked here, whatever flag named the path
(docs/security.md, "One writer"): no component of the path is a link out of the allowed roots
(:func:`allowed_roots`), nothing is written inside a ``.git`` folder, and an existing file is
replaced only when this package wrote it, as its folder's ledger records (:data:`MARKER`'s
``files``), unless it lies in the workflow's results folder or the caller checked it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import shutil
import socket
import tempfile
import threading
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
STAGING_MARKER = ".hwgptbench-staging.json"  # in every staging folder while it is written
RESULTS = "results"  # the workflow's folder (layout.RESULTS), relative to the working directory
# names the user cache folder (as HF_HOME names Hugging Face's): :func:`user_cache`
CACHE_ENV = "HWGPTBENCH_CACHE"
_ACTIVE: set[Path] = set()  # staging and temporary folders of this process, being written
_ACTIVE_LOCK = threading.Lock()


class OutputPathError(UserError, ValueError):
    """An output path that would overwrite what is not the command's own: the working
    directory or one of its parents, a folder or file of other content, a link out of the
    project, a device or pipe, or a file whose suffix is not the format written."""


def marker(command: str) -> dict[str, Any]:
    """The marker that says ``command`` wrote an output."""
    return {"format": FORMAT, "version": 1, "command": command}


def write_marker(folder: Path, command: str, files: Sequence[str] = ()) -> None:
    """Write ``command``'s :data:`MARKER` into folder, listing ``files`` (relative paths) as
    written by it (atomically: a reader sees it whole)."""
    _write_marker_document(make_dirs(folder), {**marker(command), "version": 2,
                                          "files": sorted(set(files))})


def _write_marker_document(folder: Path, document: dict[str, Any]) -> None:
    """Write a marker or ledger document (a temporary sibling renamed into place)."""
    fd, name = tempfile.mkstemp(prefix=f"{MARKER}{_TMP_MARK}", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(json.dumps(document, sort_keys=True) + "\n")
        os.chmod(name, 0o666 & ~_UMASK)
        os.replace(name, folder / MARKER)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


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


def user_cache() -> Path:
    """The user cache folder of hwgptbench, absolute: ``$HWGPTBENCH_CACHE`` where it is set
    and not empty, else the platform's (``platformdirs.user_cache_dir``: on Linux
    ``$XDG_CACHE_HOME/hwgptbench``, ``~/.cache/hwgptbench`` without it). A query outside a
    project checkout caches the shipped tables' surrogates there
    (:func:`hwgptbench.published.surrogates.cache_results`)."""
    named = os.environ.get(CACHE_ENV)
    if named:
        return Path(named).expanduser().absolute()
    import platformdirs

    return Path(platformdirs.user_cache_dir("hwgptbench", appauthor=False)).absolute()


def allowed_roots() -> list[Path]:
    """The folders a symbolic link on a written path may lead into: the working directory
    (the project), the results folder (which may itself be a link to other storage), the
    user cache folder (:func:`user_cache`, which may lie behind a link too) and the system's
    temporary folder. A path named outright (absolute, no link on it) may lie anywhere but in
    a protected folder or a ``.git`` folder."""
    return [Path.cwd().resolve(), Path(RESULTS).resolve(), user_cache().resolve(),
            Path(tempfile.gettempdir()).resolve()]


def _within(path: Path, roots: Sequence[Path]) -> bool:
    return any(path == root or root in path.parents for root in roots)


def _path_problem(path: Path) -> str | None:
    """Why nothing may be written at ``path`` whatever it holds, or None: a symbolic link on
    the way (any component but the last) that leads out of :func:`allowed_roots`, or a place
    inside a ``.git`` folder."""
    literal = Path(os.path.abspath(path.parent))
    parent = path.parent.resolve()
    if ".git" in literal.parts or ".git" in parent.parts or path.name == ".git":
        return "is inside a git folder (.git), which only git writes"
    if parent != literal and not _within(parent, allowed_roots()):
        return (f"leads through a symbolic link out of the project (to {parent}); name a path "
                "without such a link")
    if path.is_symlink() and ".git" in path.resolve().parts:
        return "is a symbolic link into a git folder (.git), which only git writes"
    return None


def check_write_path(path: str | os.PathLike[str], flag: str | None = None) -> Path:
    """path, when something may be written there (:func:`_path_problem`); else
    :class:`OutputPathError` naming it (and ``flag``). Every write of this module checks it."""
    path = Path(path)
    why = _path_problem(path)
    if why:
        raise OutputPathError(f"{flag + ' ' if flag else ''}{path}: {why}")
    return path


def check_target(path: Path, flag: str, what: str) -> None:
    """Refusals common to every output, file or folder: protected folders, links out of the
    project (any component), ``.git``, anything that exists and is neither a regular file nor
    a folder."""
    why = _protected(path.resolve())
    if why:
        raise OutputPathError(f"{flag} {path}: {why}; name a new {what}")
    check_write_path(path, flag)
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
    extra = unlisted_files(path)
    if extra:
        raise OutputPathError(f"{flag} {path}: holds files that hwgptbench {command} did not "
                              f"write ({', '.join(extra[:3])}{', ...' if len(extra) > 3 else ''}"
                              f"; its {MARKER} does not list them), and the folder would be "
                              "replaced as a whole; move those files away first")
    return path


def _folder_files(folder: Path) -> list[str]:
    """Relative paths of everything in folder but folders and its :data:`MARKER`."""
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*")
                  if (p.is_symlink() or not p.is_dir()) and p != folder / MARKER)


def unlisted_files(folder: str | os.PathLike[str]) -> list[str]:
    """Files in a folder that its marker does not list as written by this package (none when
    the folder has no listing marker: a marker of version 1 lists nothing and covers all)."""
    folder = Path(folder)
    document = folder_marker(folder)
    if not folder.is_dir() or not isinstance(document, dict):
        return []
    listed = document.get("files")
    if not isinstance(listed, list):
        return []
    return [name for name in _folder_files(folder) if name not in set(listed)]


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


def _in_results(path: Path) -> bool:
    """Whether a resolved path lies in the workflow's results folder (where Snakemake and DVC
    delete and replace the stages' outputs, and each stage replaces its own)."""
    results = Path(RESULTS).resolve()
    return path == results or results in path.parents


def _in_active(path: Path) -> bool:
    """Whether a resolved path lies in a staging or temporary folder this process is writing."""
    with _ACTIVE_LOCK:
        return any(path == root or root in path.parents for root in _ACTIVE)


@contextlib.contextmanager
def _active(folder: Path) -> Iterator[None]:
    resolved = folder.resolve()
    with _ACTIVE_LOCK:
        _ACTIVE.add(resolved)
    try:
        yield
    finally:
        with _ACTIVE_LOCK:
            _ACTIVE.discard(resolved)


@contextlib.contextmanager
def _folder_lock(folder: Path) -> Iterator[None]:
    """An exclusive lock on a folder (flock of the folder itself) while its ledger changes."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _ledger(folder: Path) -> list[str] | None:
    """The files a folder's :data:`MARKER` lists as written by this package (None: no listing)."""
    document = folder_marker(folder)
    files = document.get("files") if isinstance(document, dict) else None
    return [f for f in files if isinstance(f, str)] if isinstance(files, list) else None


def _ledger_of(dest: Path) -> tuple[Path, str] | None:
    """The folder whose ledger covers dest, and dest's name in it: its own folder's, or the
    nearest folder above that a command made whole (a marker naming the command); the search
    stops at the first marker found. None: no ledger covers dest."""
    folder = dest.parent
    for above in (folder, *folder.parents):
        if not (above / MARKER).exists():
            continue
        document = folder_marker(above)
        listed = isinstance(document, dict) and isinstance(document.get("files"), list)
        if listed and (above == folder or isinstance(document.get("command"), str)):
            return above, dest.relative_to(above).as_posix()
        return None
    return None


def _record(dest: Path, add: bool = True) -> None:
    """Add dest to (or remove it from) the ledger that covers it (:func:`_ledger_of`): a
    :data:`MARKER`'s ``files``, created in dest's folder where no marker covers it. A marker
    of version 1 (no ``files``) is left as it is."""
    folder, name = _ledger_of(dest) or (dest.parent, dest.name)
    with _folder_lock(folder):
        document = folder_marker(folder)
        if document is None:
            if not add or (folder / MARKER).exists():
                return  # nothing to remove; an unreadable marker is left alone
            document = {"format": FORMAT, "version": 2, "files": []}
        if not isinstance(document, dict) or not isinstance(document.get("files"), list):
            return
        files = set(document["files"])
        if (name in files) == add:
            return
        files = files | {name} if add else files - {name}
        _write_marker_document(folder, {**document, "files": sorted(files)})


def _listed(dest: Path) -> bool:
    """Whether the ledger that covers dest lists it, or the folder holding it was made whole by
    a command before ledgers listed files (a marker of version 1 naming the command: all its
    files are that command's, as they were when it wrote them)."""
    found = _ledger_of(dest)
    if found is not None:
        return found[1] in (_ledger(found[0]) or [])
    for above in (dest.parent, *dest.parent.parents):
        if (above / MARKER).exists():
            document = folder_marker(above)
            return (isinstance(document, dict) and "files" not in document
                    and isinstance(document.get("command"), str))
    return False


def _exempt(dest: Path) -> bool:
    """Whether ownership of dest needs no ledger: it lies in a staging or temporary folder of
    this process, or in the results folder."""
    parent = dest.parent.resolve()
    return _in_active(parent) or _in_results(parent)


def _records(dest: Path, owned: bool) -> bool:
    """Whether a write of dest is recorded in its folder's ledger: always where the folder
    has one (a folder made by :func:`make_own_dir`, a listing marker), never in a staging or
    temporary folder, else for a file neither ``owned`` nor in the results folder."""
    parent = dest.parent.resolve()
    if _in_active(parent):
        return False
    if _ledger_of(dest) is not None:
        return True
    return not owned and not _in_results(parent)


def check_replaceable(dest: str | os.PathLike[str], owned: bool = False) -> Path:
    """dest, when a write may create or replace it: :func:`check_write_path`, and an existing
    path must be a file this package wrote (listed in its folder's ledger), unless it is
    ``owned`` (a path the package names itself, or checked by its content's marker) or lies in
    a staging, temporary or results folder (:func:`_exempt`)."""
    dest = check_write_path(dest)
    if not (dest.exists() or dest.is_symlink()):
        return dest
    if dest.is_dir() and not dest.is_symlink():
        raise OutputPathError(f"{dest}: is a folder, where a file is written; name a new file")
    if owned or _exempt(dest):
        return dest
    if not _listed(dest):
        raise OutputPathError(f"{dest}: exists and was not written by hwgptbench (its folder's "
                              f"{MARKER} does not list it); name a new file, or move that one "
                              "away first")
    return dest


def _new_staging(dest: Path, kind: str = "") -> Path:
    """A new staging folder beside dest (``.{name}.tmp-{kind}XXXX``) holding a
    :data:`STAGING_MARKER` that names dest and this process: the only folders
    :func:`remove_stale_staging` deletes."""
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}{_TMP_MARK}{kind}", dir=dest.parent))
    (staging / STAGING_MARKER).write_text(json.dumps(
        {"format": "hwgptbench-staging", "dest": dest.name, "pid": os.getpid(),
         "host": socket.gethostname()}) + "\n")
    return staging


@contextlib.contextmanager
def atomic_path(dest: str | os.PathLike[str], owned: bool = False) -> Iterator[Path]:
    """Yield a temporary file path (of dest's name, in a staging folder beside ``dest``);
    rename it onto ``dest`` on success.

    ``dest`` is checked first (:func:`check_replaceable`; ``owned``: the caller has checked an
    existing ``dest``, or names it itself) and, outside staging, temporary and results
    folders, recorded in its folder's ledger. On any exception the temporary file is removed
    and ``dest`` is left untouched.
    """
    dest = check_replaceable(dest, owned)
    make_dirs(dest.parent)
    staging = _new_staging(dest)
    tmp = staging / dest.name
    tmp.touch()
    try:
        with _active(staging):
            yield tmp
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # give ordinary permissions
        if _records(dest, owned):
            _record(dest)  # before the rename: a killed run leaves a listed name, never an
        os.replace(tmp, dest)  # unlisted file
        _fsync_dir(dest.parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def atomic_dir(dest: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging directory beside ``dest``; swap it in as ``dest`` on success.

    A previous ``dest`` is replaced only after the new one is complete. On any exception the
    staging directory is deleted and a previous ``dest`` is left as it was. Staging
    directories left by killed runs hold a :data:`STAGING_MARKER` and are removed by
    :func:`remove_stale_staging`. A path a user named goes through :func:`replace_dir`.
    """
    dest = check_write_path(dest)
    make_dirs(dest.parent)
    remove_stale_staging(dest)
    holder = _new_staging(dest)  # the marked staging folder; the new folder is made inside it
    staging = holder / dest.name
    staging.mkdir()
    try:
        with _active(holder):
            yield staging
        os.chmod(staging, 0o777 & ~_UMASK)
        for path in staging.rglob("*"):
            if path.is_file():
                with open(path, "rb+") as handle:
                    os.fsync(handle.fileno())
        if dest.exists() or dest.is_symlink():
            retired = _new_staging(dest, "old-")
            os.replace(dest, retired / dest.name)
            os.replace(staging, dest)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, dest)
        _fsync_dir(dest.parent)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


@contextlib.contextmanager
def replace_dir(dest: str | os.PathLike[str], command: str,
                flag: str = "--out") -> Iterator[Path]:
    """:func:`atomic_dir` of a folder ``command`` may replace (:func:`check_output_dir`); the
    staging folder gets ``command``'s marker listing every file in it, so a later run of it may
    replace the folder, and refuses to while it holds a file the marker does not list."""
    dest = check_output_dir(dest, command, flag)
    with atomic_dir(dest) as staging:
        yield staging
        write_marker(staging, command, _folder_files(staging))


@contextlib.contextmanager
def atomic_files(folder: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging folder inside ``folder`` for a library that writes a set of files
    it names itself (an ONNX model and its external data); on success each file written
    there is renamed into ``folder`` (:func:`check_replaceable` first, each recorded as
    :func:`atomic_path` records it). On any exception nothing in ``folder`` changes."""
    folder = make_dirs(folder)
    holder = _new_staging(folder / "files")
    staging = holder / "files"
    staging.mkdir()
    try:
        with _active(holder):
            yield staging
        written = sorted(p for p in staging.iterdir() if p.is_file())
        for path in written:
            check_replaceable(folder / path.name)
        for path in written:
            dest = folder / path.name
            with open(path, "rb+") as handle:
                os.fsync(handle.fileno())
            if _records(dest, False):
                _record(dest)
            os.replace(path, dest)
        _fsync_dir(folder)
    finally:
        shutil.rmtree(holder, ignore_errors=True)


@contextlib.contextmanager
def temp_dir(prefix: str = "hwgptbench-") -> Iterator[Path]:
    """A temporary folder of this process (in the system's temporary folder), deleted on exit:
    what is written in it needs no ledger."""
    with tempfile.TemporaryDirectory(prefix=prefix) as name:
        path = Path(name)
        with _active(path):
            yield path


def make_dirs(path: str | os.PathLike[str]) -> Path:
    """Create a folder and its parents where missing (``mkdir -p``), after
    :func:`check_write_path`."""
    path = check_write_path(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def copy_file(source: str | os.PathLike[str], dest: str | os.PathLike[str],
              owned: bool = False) -> Path:
    """Copy a file's bytes onto dest through :func:`atomic_path` (its checks included)."""
    with atomic_path(dest, owned) as tmp:
        shutil.copyfile(source, tmp)
    return Path(dest)


def remove_file(path: str | os.PathLike[str], owned: bool = False) -> None:
    """Delete a file this package wrote (nothing when absent), by the rules of a replacement
    (:func:`check_replaceable`: listed in its folder's ledger, or ``owned``, or in a staging,
    temporary or results folder), and drop it from the ledger."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return
    check_replaceable(path, owned)
    path.unlink()
    if _ledger_of(path) is not None:
        _record(path, add=False)


def make_own_dir(path: str | os.PathLike[str], command: str) -> Path:
    """Create a working folder of ``command`` (e.g. a job's resume state) with its marker, or
    return it when ``command`` made it before; a path that exists and is not such a folder is
    refused (:class:`OutputPathError`), so :func:`remove_own_dir` never deletes a user's. The
    marker lists the files written into it (:func:`atomic_path` records them)."""
    path = check_write_path(path)
    if path.exists() or path.is_symlink():
        if path.is_symlink() or not path.is_dir() or not _is_marker(folder_marker(path),
                                                                    command):
            raise OutputPathError(f"{path}: exists and is not a folder hwgptbench {command} "
                                  f"made (no {MARKER} of it); move it away and rerun")
        return path
    make_dirs(path)
    write_marker(path, command)
    return path


def remove_own_dir(path: str | os.PathLike[str], command: str) -> None:
    """Delete what :func:`make_own_dir` made for ``command``: the files its marker lists, the
    marker, and the folders left empty (nothing when absent). A file it does not list (one a
    user put there) is kept, and so is the folder holding it, with a marker listing nothing."""
    path = Path(path)
    if not (path.exists() or path.is_symlink()):
        return
    path = make_own_dir(path, command)
    listed = _ledger(path)
    if listed is None:  # a marker of version 1 lists nothing: the folder was made whole
        shutil.rmtree(path)
        return
    for name in listed:
        file = path / name
        if file.is_symlink() or file.is_file():
            file.unlink()
    if unlisted_files(path):  # kept, in a folder that is still the command's (none listed)
        write_marker(path, command)
        return
    (path / MARKER).unlink()
    for folder in sorted((p for p in path.rglob("*") if p.is_dir()), reverse=True):
        with contextlib.suppress(OSError):
            folder.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def _stale(leftover: Path, dest: Path) -> bool:
    """Whether leftover is a staging folder of a write to dest that no live process holds."""
    if leftover.is_symlink() or not leftover.is_dir():
        return False
    try:
        document = json.loads((leftover / STAGING_MARKER).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    if not isinstance(document, dict) or document.get("format") != "hwgptbench-staging" \
            or document.get("dest") != dest.name:
        return False
    if document.get("host") == socket.gethostname() and isinstance(document.get("pid"), int):
        try:
            os.kill(document["pid"], 0)
        except ProcessLookupError:
            return True
        except OSError:
            return False
        return False
    return True


def remove_stale_staging(dest: str | os.PathLike[str]) -> None:
    """Delete the staging folders that killed writes to ``dest`` left behind: siblings named
    ``.{dest.name}.tmp-*`` (the name taken literally, never as a pattern) that hold a
    :data:`STAGING_MARKER` naming ``dest`` and a process no longer running. A file, a link or
    a folder without that marker is never deleted, whatever its name."""
    dest = Path(dest)
    if not dest.parent.is_dir():
        return
    for leftover in dest.parent.glob(glob.escape(f".{dest.name}{_TMP_MARK}") + "*"):
        if _stale(leftover, dest):
            shutil.rmtree(leftover, ignore_errors=True)


def parquet_marker(command: str) -> dict[str, str]:
    """The key-value metadata that marks a parquet table as written by ``command``."""
    return {JSON_KEY: json.dumps(marker(command), sort_keys=True)}


def write_table(table: pl.DataFrame, path: str | os.PathLike[str], command: str,
                flag: str = "--out") -> Path:
    """Write a table a user asked for to ``path`` (parquet with ``command``'s marker, or CSV,
    by suffix), atomically, after :func:`check_output_file`."""
    path = check_output_file(path, command, TABLE_SUFFIXES, flag)
    with atomic_path(path, owned=True) as tmp:
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
    with atomic_path(path, owned=True) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return path
