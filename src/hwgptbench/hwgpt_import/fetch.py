"""``dvc import`` of HW-GPT-Bench's perplexity files of some scales.

Each file lands at ``{out}/{its path in the repository}`` beside its DVC import pointer
``{file}.dvc``, which records the repository URL, the revision asked for and the commit it
resolved to (``rev_lock``), and is frozen: ``dvc status`` stays clean and only
``dvc update --rev`` moves it. The pointers are small enough for git; the files are not
committed (DVC lists them in the folder's ``.gitignore``). All files share one clone of the
repository (DVC's clones last as long as the process).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from ..hwgpt_source import REV, URL, PublishedDataError, files
from ..outputs import make_dirs

log = logging.getLogger(__name__)


def _recorded(path: str | Path) -> dict[str, Any] | None:
    """The ``repo`` entry (url, rev, rev_lock) of the DVC import pointer ``{path}.dvc``;
    None without one."""
    pointer = Path(f"{path}.dvc")
    if not pointer.exists():
        return None
    stage = yaml.safe_load(pointer.read_text()) or {}
    repo = next((dep.get("repo") for dep in stage.get("deps", []) if dep.get("repo")), None)
    if not repo or "url" not in repo:
        raise PublishedDataError(f"{pointer} is not a DVC import pointer (no deps[].repo.url): "
                                 "fetch the files with hwgptbench fetch-hwgptbench")
    return repo


def recorded_source(path: str | Path) -> tuple[str, str] | None:
    """(url, commit) that the DVC import pointer ``{path}.dvc`` records; None without one."""
    repo = _recorded(path)
    if repo is None:
        return None
    return repo["url"], repo.get("rev_lock") or repo.get("rev") or "unknown"


def _current(path: Path, url: str, rev: str) -> bool:
    """Whether ``path`` is there, imported from ``url`` at ``rev``."""
    repo = _recorded(path) if path.exists() else None
    return repo is not None and repo["url"] == url and rev in (repo.get("rev"),
                                                                 repo.get("rev_lock"))


def _failure(err: Exception, url: str, rev: str, path: str) -> PublishedDataError:
    """One error saying what failed and what to do, from DVC's exception."""
    from dvc.scm import CloneError, RevError

    if isinstance(err, CloneError):
        return PublishedDataError(
            f"cannot reach {url} to import HW-GPT-Bench's files at commit {rev} ({err}): run "
            "again with network access, or pass --url a local clone of the repository "
            f"(git clone {URL}) that has commit {rev}")
    if isinstance(err, RevError):
        return PublishedDataError(
            f"{url} has no revision {rev}: pass --rev a commit of it (the perplexity files "
            f"exist only at {REV}), or --url a clone that has that commit")
    if isinstance(err, FileNotFoundError):
        return PublishedDataError(
            f"{path} is not in {url} at revision {rev}: the perplexity files exist only at "
            f"commit {REV} (pass --rev {REV})")
    return PublishedDataError(f"dvc import of {path} from {url} at {rev} failed: "
                              f"{type(err).__name__}: {err}")


def _repo(out: Path) -> Any:
    """The DVC project that holds ``out``."""
    from dvc.exceptions import NotDvcRepoError
    from dvc.repo import Repo

    try:
        return Repo(Repo.find_root(str(out)))
    except NotDvcRepoError:
        raise PublishedDataError(f"--out {out} is not inside a DVC project: run in the "
                                 "project's checkout (or `dvc init` one first)") from None


def fetch(scales: Sequence[str], out: str | Path, url: str = URL, rev: str = REV
          ) -> list[Path]:
    """``dvc import`` every perplexity file of ``scales`` from ``url`` at ``rev`` into ``out``
    (files already imported from there are kept); returns the pointer files, in file order."""
    from dvc.exceptions import DvcException
    from dvc.repo.open_repo import clean_repos

    paths = [path for scale in scales for path in files(scale)]
    out = Path(out).absolute()
    make_dirs(out)
    pointers = [Path(f"{out / path}.dvc") for path in paths]
    dvc_log = logging.getLogger("dvc")
    level = dvc_log.level
    dvc_log.setLevel(logging.WARNING)  # one line per file, ours
    try:
        with _repo(out) as repo:
            repo.scm_context.quiet = True  # the caller prints one `git add` line for all
            for path in paths:
                dest = out / path
                if _current(dest, url, rev):
                    log.info("%s: already imported from %s at %s", path, url, rev)
                    continue
                make_dirs(dest.parent)  # dvc import needs the folder
                log.info("dvc import %s %s --rev %s -o %s", url, path, rev,
                         os.path.relpath(dest))
                try:
                    repo.imp(url, path, out=str(dest), rev=rev, force=True)
                except (DvcException, FileNotFoundError) as err:
                    raise _failure(err, url, rev, path) from None
    finally:
        clean_repos()  # the temporary clones
        dvc_log.setLevel(level)
    return pointers
