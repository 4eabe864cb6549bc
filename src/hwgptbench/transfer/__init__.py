"""Few-shot transfer of hardware surrogates to a new device (or condition) from k measured
archs, and its leave-one-target-out evaluation (docs/transfer.md).

Modules, one job each: :mod:`.targets` (targets and their value matrix), :mod:`.sources`
(source models, cross-fitted), :mod:`.methods` (the one family of transfer methods, on any
linear features), :mod:`.selection` (which
k archs to measure), :mod:`.model` (the stored ``adapted`` surrogate family), :mod:`.evaluate`
(leave-one-target-out quality, baselines, summary), :mod:`.adapt` (`hwgptbench adapt`); on
other projects' public data: :mod:`.external` (loaders: HELP's FBNet files, HAT's latency CSVs,
this project's device tables, as feature vectors) and :mod:`.external_eval` (the same methods
and baselines on those data sets' choice and report splits, and their drift flags).
"""
