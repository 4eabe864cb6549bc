"""Figures and tables of the benchmark: one function per figure or table, tables in, files out.

Every figure function takes polars tables and an output stem and returns the paths it wrote
(``{stem}.png`` and ``{stem}.svg``, byte-identical for the same inputs), or ``[]`` with a
logged reason when the tables hold nothing to draw.
"""

from ..lazy import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "attainment_surfaces": "search",
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
__all__ = ["attainment_surfaces", "device_correlation", "device_summary", "dimension_effects",
           "hypervolume_curves", "hypervolume_table", "loss_curve", "pareto_3d", "pareto_fronts",
           "quality_table", "surrogate_calibration", "surrogate_scatter"]
