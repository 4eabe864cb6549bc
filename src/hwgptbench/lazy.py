"""Packages that export names without importing them: the command line imports every stage
package to register its subcommands, so a package's ``__init__`` must not load its libraries
(torch, LightGBM, BoTorch, matplotlib). Its names load from their modules on first use."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any


def lazy_exports(package: str, exports: Mapping[str, str]) -> Callable[[str], Any]:
    """A module ``__getattr__`` (PEP 562) for ``package`` that imports ``name`` from the
    submodule ``exports[name]`` when it is first used. Code inside the package imports the
    submodules themselves (`pipeline/code_closure.py` follows only written imports).

    A name may not be that of a submodule: once the submodule is imported, the package
    attribute of that name is the module, and the export would silently change meaning.
    """
    clashes = sorted(set(exports) & set(exports.values()))
    if clashes:
        raise ValueError(f"{package}: {clashes} name both an export and a submodule")

    def __getattr__(name: str) -> Any:
        if name not in exports:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
    return __getattr__
