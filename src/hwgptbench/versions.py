"""Versions of the code that produces a result's numbers, recorded as columns of its table."""

from __future__ import annotations

import platform
import re
import sys
from importlib.metadata import PackageNotFoundError, version

from . import __version__


def library_versions(*distributions: str) -> dict[str, str]:
    """``{name}_version`` columns (``syne-tune`` -> ``syne_tune_version``) of hwgptbench, Python
    and each distribution; ``not installed`` for one that is missing. A module already imported
    reports its own ``__version__``: the code that ran, with its build's local label
    (``2.11.0+cu130``), which a CUDA build's package metadata may leave out."""
    columns = {"hwgptbench_version": __version__, "python_version": platform.python_version()}
    for name in distributions:
        loaded = getattr(sys.modules.get(re.sub(r"[-.]", "_", name)), "__version__", None)
        try:
            found = str(loaded) if loaded is not None else version(name)
        except PackageNotFoundError:
            found = "not installed"
        columns[f"{re.sub(r'[-.]', '_', name).lower()}_version"] = found
    return columns
