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
