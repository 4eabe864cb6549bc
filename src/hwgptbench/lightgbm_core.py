"""LightGBM's core (``Booster``, ``Dataset``, ``train``), imported without its scikit-learn
and pandas integrations.

``import lightgbm`` imports scikit-learn and pandas whenever they are installed (for its
estimator classes and DataFrame input): about 2 s of a 2.5 s import on 2 cores, most of a
cached ``hwgptbench query``. This project uses only the core on numpy arrays, so the first
import hides those two packages (unless they are loaded already) and then restores them; in
that process lightgbm's scikit-learn estimators (``LGBMRegressor``) are unavailable.
"""

from __future__ import annotations

import sys
from types import ModuleType
from typing import TYPE_CHECKING

OPTIONAL = ("sklearn", "pandas")


def _import_core() -> ModuleType:
    if "lightgbm" in sys.modules:
        return sys.modules["lightgbm"]
    hidden = [name for name in OPTIONAL if name not in sys.modules]
    for name in hidden:
        sys.modules[name] = None  # type: ignore[assignment]  # import raises ImportError
    try:
        import lightgbm
    finally:
        for name in hidden:
            if sys.modules.get(name, ...) is None:
                del sys.modules[name]
    return lightgbm


if TYPE_CHECKING:
    import lightgbm as lgb
else:
    lgb = _import_core()
