"""Figures and tables of the benchmark: one function per figure or table, tables in, files out.

Every figure function takes polars tables and an output stem and returns the paths it wrote
(``{stem}.png`` and ``{stem}.svg``, byte-identical for the same inputs), or ``[]`` with a
logged reason when the tables hold nothing to draw.
"""

from __future__ import annotations

from .benchmark import device_correlation, dimension_effects, loss_curve, pareto_3d, pareto_fronts
from .search import attainment_surfaces, hypervolume_curves
from .style import save
from .surrogate import surrogate_calibration, surrogate_scatter
from .tables import device_summary, hypervolume_table, quality_table, write_table

__all__ = ["attainment_surfaces", "device_correlation", "device_summary", "dimension_effects",
           "hypervolume_curves", "hypervolume_table", "loss_curve", "pareto_3d", "pareto_fronts",
           "quality_table", "save", "surrogate_calibration", "surrogate_scatter", "write_table"]
