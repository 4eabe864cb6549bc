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

from . import PublishedDataError


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


def load(path: str | Path, rev: str) -> Any:
    """The object pickled in ``path`` (from revision ``rev``), read with
    :class:`RestrictedUnpickler`."""
    with open(path, "rb") as handle:
        try:
            return RestrictedUnpickler(handle, str(path), rev).load()
        except PublishedDataError:
            raise
        except Exception as err:  # truncated or not a pickle at all
            raise PublishedDataError(f"{path} (revision {rev}) is not a readable pickle: "
                                     f"{type(err).__name__}: {err}") from None
