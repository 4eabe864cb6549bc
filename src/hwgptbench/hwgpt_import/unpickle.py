"""Read HW-GPT-Bench's pickle files without running code from them.

A pickle runs code only through the globals it names (a class to build, a function to call);
its files are plain lists of dicts of numbers, strings, lists and bools, which need none. So
:class:`RestrictedUnpickler` refuses every global and every persistent id: a file asking for
one is not such a file and is refused before anything it names is looked up.
"""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any, NoReturn

from ..hwgpt_source import PublishedDataError


class RestrictedUnpickler(pickle.Unpickler):
    """An unpickler for plain data: any global or persistent id is refused with an error
    naming it, the file and the revision the file came from."""

    def __init__(self, file: Any, name: str, rev: str) -> None:
        super().__init__(file)
        self._name, self._rev = name, rev

    def _refuse(self, what: str) -> NoReturn:
        raise PublishedDataError(
            f"refusing to load {self._name} (revision {self._rev}): it asks for {what}, and "
            "HW-GPT-Bench's perplexity files are plain lists of dicts that need none; check "
            "where the file came from (hwgptbench fetch-hwgptbench imports it from the "
            "repository)")

    def find_class(self, module: str, name: str) -> NoReturn:
        self._refuse(f"the global {module}.{name}")

    def persistent_load(self, pid: Any) -> NoReturn:
        self._refuse(f"the persistent id {pid!r}")


MAX_DEPTH = 64  # containers within containers: the published rows nest 4 deep


def _depth_exceeds(obj: Any, limit: int) -> bool:
    """Whether containers nest deeper than limit in obj (iteratively: such an object would
    make any recursive reader of it, even its repr, raise RecursionError)."""
    stack = [(obj, 1)]
    seen: set[int] = set()
    while stack:
        item, depth = stack.pop()
        if not isinstance(item, (list, tuple, dict, set, frozenset)) or id(item) in seen:
            continue
        if depth > limit:
            return True
        seen.add(id(item))
        children = [*item.keys(), *item.values()] if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children)
    return False


def load(path: str | Path, rev: str) -> Any:
    """The object pickled in ``path`` (from revision ``rev``), read with
    :class:`RestrictedUnpickler`; containers may nest at most :data:`MAX_DEPTH` deep."""
    with open(path, "rb") as handle:
        try:
            obj = RestrictedUnpickler(handle, str(path), rev).load()
        except PublishedDataError:
            raise
        except Exception as err:  # truncated or not a pickle at all (RecursionError too)
            raise PublishedDataError(f"{path} (revision {rev}) is not a readable pickle: "
                                     f"{type(err).__name__}: {str(err)[:200]}") from None
    if _depth_exceeds(obj, MAX_DEPTH):
        raise PublishedDataError(f"{path} (revision {rev}) nests containers deeper than "
                                 f"{MAX_DEPTH} levels, which HW-GPT-Bench's plain rows never "
                                 "do; check where the file came from (hwgptbench "
                                 "fetch-hwgptbench imports it from the repository)")
    return obj
