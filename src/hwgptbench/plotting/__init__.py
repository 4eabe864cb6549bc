"""The look of every figure and table: colors, markers, sizes and labels, deterministic saving
(``style``), and tables as markdown (``markdown``). The figures and compression stages draw with
it."""
