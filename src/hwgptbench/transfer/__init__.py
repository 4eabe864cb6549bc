"""Few-shot transfer of hardware surrogates to a new device (or condition) from k measured
archs, and its leave-one-target-out evaluation (docs/transfer.md).

Modules, one job each: :mod:`.targets` (targets and their value matrix), :mod:`.sources`
(source models, cross-fitted), :mod:`.methods` (adaptation methods), :mod:`.selection` (which
k archs to measure), :mod:`.model` (the stored ``adapted`` surrogate family), :mod:`.evaluate`
(leave-one-target-out quality, baselines, summary), :mod:`.adapt` (`hwgptbench adapt`).
"""

from .evaluate import BASELINES, UPPER_BOUND, evaluate, retest, summarize
from .methods import METHODS
from .selection import SELECTIONS, SelectionError
from .targets import Target, TransferError

__all__ = ["BASELINES", "METHODS", "SELECTIONS", "SelectionError", "Target", "TransferError",
           "UPPER_BOUND", "evaluate", "retest", "summarize"]
