"""Few-shot transfer of hardware surrogates to a new device (or condition) from k measured
archs, and its leave-one-target-out evaluation (docs/transfer.md).

Modules, one job each: :mod:`.targets` (targets and their value matrix), :mod:`.sources`
(source models, cross-fitted), :mod:`.methods` (adaptation methods), :mod:`.selection` (which
k archs to measure), :mod:`.model` (the stored ``adapted`` surrogate family), :mod:`.evaluate`
(leave-one-target-out quality, baselines, summary), :mod:`.adapt` (`hwgptbench adapt`).
"""

from ..lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "BASELINES": "evaluate",
    "METHODS": "methods",
    "SELECTIONS": "selection",
    "SelectionError": "selection",
    "Target": "targets",
    "TransferError": "targets",
    "UPPER_BOUND": "evaluate",
    "retest": "evaluate",
    "summarize": "evaluate",
})
__all__ = ["BASELINES", "METHODS", "SELECTIONS", "SelectionError", "Target", "TransferError",
           "UPPER_BOUND", "retest", "summarize"]
