"""Names of the report's figures and tables, importable without the plotting stack (the
workflow reads them when it builds its DAG)."""

# the figures and tables every scale gets (workflow/report/ has a caption for each); the
# energy Pareto and correlation figures are added where energy was measured
FIGURES = ("pareto_latency", "device_correlation", "surrogate_scatter", "surrogate_calibration",
           "hypervolume", "hypervolume_time", "critical_difference", "eaf_difference",
           "attainment", "pareto_3d", "dimension_effects", "supernet_loss",
           "transfer_quality", "runtime_breakdown", "runtime_options", "serving",
           "runtime_parallel")
TABLES = ("surrogate_quality", "hypervolume", "rank_tests", "pairwise_tests", "reference_front",
          "devices", "transfer", "runtime",
          "serving", "parallel")

# `make paper` (figures/paper.py): the device tables (every paper scale in each), the search's,
# and the figures of each scale ({scale}_{name}) and of the search; workflow/report/ has a
# caption paper_{name}.rst for each figure name and paper_table_{name}.rst for each table
PAPER_DEVICE_TABLES = ("devices", "cost_vs_size", "energy", "fronts", "front_disagreement",
                       "kendall_tau", "dtype_speed", "surrogate_quality")
PAPER_SEARCH_TABLES = ("search_reference", "search_hypervolume", "search_rank_tests",
                       "search_pairwise")
PAPER_TABLES = (*PAPER_DEVICE_TABLES, *PAPER_SEARCH_TABLES)
PAPER_SCALE_FIGURES = ("pareto_latency", "pareto_energy", "pareto_memory", "kendall_latency",
                       "cost_vs_size")
PAPER_SEARCH_FIGURES = ("search_hypervolume", "search_hypervolume_time",
                        "search_critical_difference", "search_eaf_difference")
