"""The look of every figure: colours, sizes, labels, and byte-reproducible saving.

Figures are plain ``matplotlib.figure.Figure`` objects on the Agg canvas (no pyplot, so no
global figure registry to leak into and nothing to close); figure functions run inside
``styled`` so that sizes and fonts are the same everywhere, including the tick labels that
matplotlib creates lazily at save time.
"""

from __future__ import annotations

import functools
import os
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

import matplotlib
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from ..metrics import label
from ..outputs import atomic_path

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

DPI = 200
SINGLE_WIDTH = 3.5  # inches, one paper column
DOUBLE_WIDTH = 7.2  # inches, full page width

RC: dict[RcKeyType, Any] = {
    "font.size": 8.5,
    "axes.titlesize": 8.5,
    "axes.labelsize": 8.5,
    "xtick.labelsize": 8,
    "ytick.labelsize": 8,
    "legend.fontsize": 8,
    "figure.titlesize": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.color": "#dddddd",
    "grid.linewidth": 0.5,
    "axes.axisbelow": True,
    "lines.linewidth": 1.4,
    "lines.markersize": 4,
    "legend.frameon": False,
    "savefig.dpi": DPI,
    "savefig.bbox": "tight",
    "savefig.pad_inches": 0.03,
    "svg.hashsalt": "hwgptbench",
    "svg.fonttype": "path",
    "path.simplify": False,
    "image.cmap": "viridis",
}

# Okabe-Ito colour-blind-safe palette (plus a wine red): one fixed colour per algorithm.
ALGORITHM_COLORS: dict[str, str] = {
    "rs": "#7f7f7f",
    "ls": "#cc79a7",
    "nsga2": "#0072b2",
    "morea": "#56b4e9",
    "moasha": "#009e73",
    "rsbo": "#e69f00",
    "lsbo": "#d55e00",
    "ehvi": "#882255",
}
ALGORITHM_MARKERS: dict[str, str] = {
    "rs": "o", "ls": "s", "nsga2": "^", "morea": "v", "moasha": "D", "rsbo": "<", "lsbo": ">",
    "ehvi": "P",
}
# Devices and other open-ended categories cycle through these (tab10 without its grey).
CYCLE: tuple[str, ...] = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                          "#e377c2", "#bcbd22", "#17becf")
FAMILY_COLORS: dict[str, str] = {"lightgbm": "#0072b2", "mlp_ensemble": "#d55e00"}
KIND_COLORS: dict[str, str] = {"smallest": "#0072b2", "largest": "#d55e00", "random": "#7f7f7f"}
FRONT_COLOR = "#d55e00"
CLOUD_COLOR = "#b0b0b0"

_UNITS = {"ms": "ms", "s": "s", "mj": "mJ", "j": "J", "mb": "MB", "gb": "GB"}

P = ParamSpec("P")
R = TypeVar("R")


def metric_label(metric: str) -> str:
    """Axis label of a metric column, with its unit (``latency_ms`` -> ``latency (ms)``)."""
    known = label(metric)
    if known is not None:
        return known
    name, _, unit = metric.rpartition("_")
    if name and unit in _UNITS:
        return f"{name.replace('_', ' ')} ({_UNITS[unit]})"
    return metric.replace("_", " ")


def number(value: object) -> float:
    """A numeric aggregate of a polars Series (``max()``, ``min()``: a Python scalar, or None
    for an empty or all-null Series) as the number it is; TypeError for anything else."""
    if isinstance(value, (int, float)):
        return value
    raise TypeError(f"not a number: {value!r}")


def _fallback(name: str) -> str:
    return CYCLE[zlib.crc32(name.encode()) % len(CYCLE)]


def algorithm_color(algorithm: str) -> str:
    """The algorithm's fixed colour (a stable colour from the cycle for unknown names)."""
    return ALGORITHM_COLORS.get(algorithm, _fallback(algorithm))


def algorithm_marker(algorithm: str) -> str:
    """The algorithm's fixed marker."""
    return ALGORITHM_MARKERS.get(algorithm, "o")


def family_color(family: str) -> str:
    """The surrogate family's fixed colour."""
    return FAMILY_COLORS.get(family, _fallback(family))


def cycle_colors(names: Iterable[str]) -> dict[str, str]:
    """Colours for an ordered set of names (devices, conditions), in cycle order."""
    return {name: CYCLE[i % len(CYCLE)] for i, name in enumerate(dict.fromkeys(names))}


def algorithm_order(algorithms: Iterable[str]) -> list[str]:
    """Algorithms in the fixed order of ``ALGORITHM_COLORS``, unknown ones after, sorted."""
    known = list(ALGORITHM_COLORS)
    return sorted(set(algorithms), key=lambda a: (known.index(a) if a in known else len(known), a))


@contextmanager
def style() -> Iterator[None]:
    """The figure style, as a matplotlib rc context."""
    with matplotlib.rc_context(RC):
        yield


def styled(func: Callable[P, R]) -> Callable[P, R]:
    """Run a figure function (building and saving) inside ``style``."""
    @functools.wraps(func)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with style():
            return func(*args, **kwargs)
    return wrapper


def new_figure(width: float, height: float) -> Figure:
    """A figure of width x height inches on the Agg canvas, laid out by constrained layout."""
    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def grid_shape(n: int, max_cols: int = 3) -> tuple[int, int]:
    """(rows, cols) of a panel grid for n panels."""
    cols = min(n, max_cols)
    return -(-n // cols), cols


def save(fig: Figure, out_stem: str | os.PathLike[str]) -> list[Path]:
    """Write ``{out_stem}.png`` and ``{out_stem}.svg`` atomically with fixed metadata, so the
    same figure gives the same bytes; return the two paths. The figure is cleared after."""
    stem = Path(out_stem)
    paths = [stem.with_name(stem.name + ".png"), stem.with_name(stem.name + ".svg")]
    metadata: dict[str, dict[str, Any]] = {"png": {"Software": None},
                                           "svg": {"Date": None, "Creator": None}}
    with style():
        for path in paths:
            fmt = path.suffix[1:]
            with atomic_path(path) as tmp:
                fig.savefig(tmp, format=fmt, dpi=DPI, metadata=metadata[fmt])
    fig.clear()
    return paths
