"""Figures and tables of the benchmark: one function per figure or table, tables in, files out.

Every figure function takes polars tables and an output stem and returns the paths it wrote
(``{stem}.png`` and ``{stem}.svg``, byte-identical for the same inputs), or ``[]`` with a
logged reason when the tables hold nothing to draw.
"""

from ..lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "attainment_surfaces": "search",
    "critical_difference": "search",
    "eaf_difference": "search",
    "hypervolume_time": "search",
    "pairwise_table": "tables",
    "rank_table": "tables",
    "device_correlation": "benchmark",
    "device_summary": "tables",
    "dimension_effects": "benchmark",
    "hypervolume_curves": "search",
    "hypervolume_table": "tables",
    "loss_curve": "benchmark",
    "pareto_3d": "benchmark",
    "pareto_fronts": "benchmark",
    "quality_table": "tables",
    "surrogate_calibration": "surrogate",
    "surrogate_scatter": "surrogate",
})
__all__ = ["attainment_surfaces", "critical_difference", "device_correlation", "device_summary",
           "dimension_effects", "eaf_difference", "hypervolume_curves", "hypervolume_table",
           "hypervolume_time", "loss_curve", "pairwise_table", "pareto_3d", "pareto_fronts",
           "quality_table", "rank_table", "surrogate_calibration", "surrogate_scatter"]
