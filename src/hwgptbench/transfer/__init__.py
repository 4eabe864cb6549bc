"""Few-shot transfer of hardware surrogates to a new device (or condition) from k measured
archs, and its leave-one-target-out evaluation (docs/transfer.md).

Modules, one job each: :mod:`.targets` (targets and their value matrix), :mod:`.sources`
(source models, cross-fitted), :mod:`.methods` (adaptation methods), :mod:`.selection` (which
k archs to measure), :mod:`.model` (the stored ``adapted`` surrogate family), :mod:`.evaluate`
(leave-one-target-out quality, baselines, summary), :mod:`.adapt` (`hwgptbench adapt`); on
other projects' public data: :mod:`.external` (loaders: HELP's FBNet files, HAT's latency CSVs,
this project's device tables, as feature vectors) and :mod:`.fewshot` (methods on any feature
vectors and the evaluation of those data sets' splits).
"""
