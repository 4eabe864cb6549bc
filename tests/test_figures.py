"""Figures and tables: every function writes non-empty files, byte-identical on a rerun."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from hwgptbench import figures
from hwgptbench.figures.benchmark import perplexity_label
from hwgptbench.figures.search import mean_band, step_values
from hwgptbench.outputs import MARKER
from hwgptbench.plotting.markdown import format_float, write_table
from hwgptbench.plotting.style import algorithm_color, metric_label

ARCHS = ["e64-l2-h2_2-r2_2-b0", "e64-l3-h2_2_4-r4_2_3-b1", "e96-l2-h4_2-r3_3-b0",
         "e96-l4-h2_4_4_2-r3_3_4_4-b1", "e128-l3-h4_4_2-r4_4_3-b0", "e128-l4-h4_4_4_4-r4_4_4_4-b1"]
DEVICES = ("cpu-a", "gpu-b")


@pytest.fixture(scope="module")
def perplexity() -> pl.DataFrame:
    rng = np.random.default_rng(0)
    return pl.DataFrame([{"arch_id": a, "train_steps": s, "perplexity": 600 / (1 + i) + 300
                          - s / 10 + rng.normal(0, 5)}
                         for s in (100, 300) for i, a in enumerate(ARCHS)])


@pytest.fixture(scope="module")
def measurements() -> pl.DataFrame:
    rng = np.random.default_rng(1)
    rows = []
    for d, device in enumerate(DEVICES):
        for batch in (1, 8):
            for i, arch in enumerate(ARCHS):
                rows.append({"device": device, "arch_id": arch, "batch_size": batch,
                             "seq_len": 128, "dtype": "fp32", "launch": "eager",
                             "status": "ok" if (d, i) != (1, 0) else "failed",
                             "latency_ms": (1 + i + rng.normal(0, 0.5)) * batch * (d + 1),
                             "energy_mj": None if d == 0 else float(10 + i * batch),
                             "memory_peak_mb": 5.0 + 2 * i + batch})
    return pl.DataFrame(rows, schema_overrides={"energy_mj": pl.Float64})


@pytest.fixture(scope="module")
def quality() -> pl.DataFrame:
    rows = [{"metric": m, "device": "cpu-a", "condition": "b1-t128-fp32-eager", "family": f,
             "status": "ok", "rows": 6, "r2": 0.9, "mae": 0.1, "kendall_tau": 0.8,
             "spearman_rho": 0.9, "coverage": c, "nominal_coverage": 0.9}
            for m in ("latency_ms", "perplexity") for f, c in (("lightgbm", 0.85),
                                                               ("mlp_ensemble", 0.95))]
    rows.append({**rows[0], "metric": "energy_mj", "status": "skipped", "rows": 0, "r2": None,
                 "mae": None, "kendall_tau": None, "spearman_rho": None, "coverage": None})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def predictions() -> pl.DataFrame:
    rng = np.random.default_rng(2)
    rows = []
    for metric, device, condition in (("latency_ms", "cpu-a", "b1-t128-fp32-eager"),
                                      ("perplexity", "any", "any")):
        for family in ("lightgbm", "mlp_ensemble"):
            for i, arch in enumerate(ARCHS):
                measured, predicted = 1.0 + i, 1.0 + i + rng.normal(0, 0.3)
                rows.append({"metric": metric, "device": device, "condition": condition,
                             "family": family, "arch_id": arch, "measured": measured,
                             "predicted": predicted, "lower": predicted - 0.5,
                             "upper": predicted + 0.5})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def runs() -> pl.DataFrame:
    rng = np.random.default_rng(3)
    rows = []
    for device in ("cpu-a",):
        for algorithm in ("rs", "ehvi", "nsga2"):
            for seed in range(3):
                hv = np.maximum.accumulate(rng.uniform(0, 0.8, 10))
                for k in range(10):
                    rows.append({"objectives": "ppl-latency", "device": device,
                                 "algorithm": algorithm, "seed": seed, "evaluation": k + 1,
                                 "cumulative_cost": float(k + 1) - (0.5 if seed else 0),
                                 "hypervolume": hv[k], "hv_regret": 0.8 - hv[k]})
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def attainment() -> pl.DataFrame:
    rows = [{"objectives": "ppl-latency", "device": "cpu-a", "algorithm": a, "percentile": p,
             "x_metric": "perplexity", "x": 300.0 + 10 * k + j, "y_metric": "latency_ms",
             "y": 5.0 - k - 0.1 * j}
            for j, a in enumerate(("rs", "ls", "ehvi")) for p in (0.0, 50.0, 100.0)
            for k in range(4)]
    return pl.DataFrame(rows)


@pytest.fixture(scope="module")
def loss() -> pl.DataFrame:
    return pl.DataFrame([{"step": s, "kind": k, "arch_id": ARCHS[0], "loss": 8.0 - s / 20 + j}
                         for s in range(60) for j, k in enumerate(("smallest", "largest",
                                                                   "random", "random"))])


def _figure_calls(perplexity: pl.DataFrame, measurements: pl.DataFrame, quality: pl.DataFrame,
                  predictions: pl.DataFrame, runs: pl.DataFrame, attainment: pl.DataFrame,
                  loss: pl.DataFrame) -> dict[str, Callable[[Path], list[Path]]]:
    joined = measurements.filter(pl.col("status") == "ok").join(
        perplexity.filter(pl.col("train_steps") == 300), on="arch_id")
    return {
        "pareto_fronts": lambda s: figures.pareto_fronts(perplexity, measurements, s),
        "device_correlation": lambda s: figures.device_correlation(measurements, s),
        "surrogate_calibration": lambda s: figures.surrogate_calibration(quality, s),
        "surrogate_scatter": lambda s: figures.surrogate_scatter(predictions, s),
        "hypervolume_curves": lambda s: figures.hypervolume_curves(runs, s),
        "attainment_surfaces": lambda s: figures.attainment_surfaces(attainment, s),
        "pareto_3d": lambda s: figures.pareto_3d(
            joined, ["perplexity", "latency_ms", "memory_peak_mb"], s),
        "dimension_effects": lambda s: figures.dimension_effects(
            measurements, s, metrics=("latency_ms", "memory_peak_mb")),
        "loss_curve": lambda s: figures.loss_curve(loss, s),
    }


FIGURES = ["pareto_fronts", "device_correlation", "surrogate_calibration", "surrogate_scatter",
           "hypervolume_curves", "attainment_surfaces", "pareto_3d", "dimension_effects",
           "loss_curve"]


@pytest.mark.parametrize("name", FIGURES)
def test_figure_writes_png_and_svg_reproducibly(
        name: str, tmp_path: Path, perplexity: pl.DataFrame, measurements: pl.DataFrame,
        quality: pl.DataFrame, predictions: pl.DataFrame, runs: pl.DataFrame,
        attainment: pl.DataFrame, loss: pl.DataFrame) -> None:
    call = _figure_calls(perplexity, measurements, quality, predictions, runs, attainment,
                         loss)[name]
    paths = call(tmp_path / name)
    assert [p.name for p in paths] == [f"{name}.png", f"{name}.svg"]
    first = [p.read_bytes() for p in paths]
    assert first[0].startswith(b"\x89PNG") and len(first[0]) > 1000
    assert b"<svg" in first[1] and b"<dc:date>" not in first[1]
    assert call(tmp_path / name) == paths
    assert [p.read_bytes() for p in paths] == first
    # beside the figures, only the package's record of the files it wrote there
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != MARKER) == sorted(
        p.name for p in paths)


def test_all_null_metric_is_skipped(tmp_path: Path, perplexity: pl.DataFrame,
                                    measurements: pl.DataFrame,
                                    caplog: pytest.LogCaptureFixture) -> None:
    cpu = measurements.filter(pl.col("device") == "cpu-a")
    with caplog.at_level("INFO"):
        assert figures.pareto_fronts(perplexity, cpu, tmp_path / "e", metric="energy_mj") == []
        assert figures.device_correlation(cpu, tmp_path / "c", metric="energy_mj") == []
        assert figures.dimension_effects(cpu, tmp_path / "d", metrics=("energy_mj",)) == []
    assert "no energy_mj values" in caplog.text
    assert not list(tmp_path.iterdir())


def test_device_correlation_single_column(tmp_path: Path, measurements: pl.DataFrame) -> None:
    one = measurements.filter((pl.col("device") == "cpu-a") & (pl.col("batch_size") == 1))
    assert len(figures.device_correlation(one, tmp_path / "one")) == 2


def test_step_values_and_band() -> None:
    grid = np.array([0.5, 1.0, 2.0, 3.0])
    values = step_values(np.array([1.0, 3.0]), np.array([0.2, 0.5]), grid)
    assert np.isnan(values[0]) and values[1:].tolist() == [0.2, 0.2, 0.5]
    mean, half = mean_band(np.array([[np.nan, 1.0, 2.0], [np.nan, 3.0, 2.0]]))
    assert np.isnan(mean[0]) and mean[1:].tolist() == [2.0, 2.0]
    assert half[1] > 0 and half[2] == 0 and half[0] == 0


def test_style_helpers() -> None:
    assert metric_label("latency_ms") == "latency (ms)"
    assert metric_label("gpu_power_w") == "gpu_power_w".replace("_", " ")
    assert metric_label("window_s") == "window (s)"
    assert algorithm_color("ehvi") != algorithm_color("rs")
    assert algorithm_color("unknown") == algorithm_color("unknown")


def test_tables(tmp_path: Path, measurements: pl.DataFrame, quality: pl.DataFrame) -> None:
    summary = figures.device_summary(measurements)
    assert summary.height == 4
    assert summary.filter(pl.col("device") == "gpu-b")["failed"].to_list() == [1, 1]
    csv, md = write_table(summary, tmp_path / "devices")
    lines = md.read_text().splitlines()
    assert len(lines) == 2 + 4 and "n/a" in lines[2]  # cpu-a: no energy
    assert len(csv.read_text().splitlines()) == 1 + 4
    again = write_table(summary, tmp_path / "devices")
    assert [p.read_bytes() for p in again] == [csv.read_bytes(), md.read_bytes()]
    assert summary["contended"].to_list() == [0] * 4  # no re-timed rows in this table
    flagged = measurements.with_columns(latency_contended=pl.col("status") == "ok",
                                        latency_remeasured=pl.lit(2))
    assert figures.device_summary(flagged)["contended"].sum() == \
        measurements.filter(pl.col("status") == "ok").height

    table = figures.quality_table(quality)
    assert table.height == 5 and "reason" not in table.columns
    _, md = write_table(table, tmp_path / "quality")
    assert md.read_text().count("n/a") == 5

    final = pl.DataFrame([{"objectives": "ppl-latency", "device": "cpu-a", "algorithm": a,
                           "seed": s, "evaluations": 10, "cost": 10.0, "hypervolume": hv + s / 100,
                           "hv_regret": 0.9 - hv - s / 100, "rank": float(r)}
                          for r, (a, hv) in enumerate((("ehvi", 0.8), ("rs", 0.7)), 1)
                          for s in range(3)])
    hv = figures.hypervolume_table(final)
    assert hv["algorithm"].to_list() == ["ehvi", "rs"]
    assert hv["hypervolume"][0] == "0.8100 ± 0.0100" and hv["mean_rank"].to_list() == [1.0, 2.0]
    csv, _ = write_table(hv, tmp_path / "hv")
    assert csv.read_text().splitlines()[1] == (
        "ppl-latency,cpu-a,ehvi,3,0.8100 ± 0.0100,0.0900 ± 0.0100,1.0")


def test_format_float() -> None:
    assert [format_float(v) for v in (0.97396, 1082.87, 123456.7, None)] == [
        "0.9740", "1083", "123457", "n/a"]
    assert format_float(0.1 + 0.2, None) == "0.30000000000000004"


def test_perplexity_label_names_the_source_of_imported_perplexities() -> None:
    trained = pl.DataFrame({"arch_id": ["a"], "train_steps": [300], "perplexity": [9.0]})
    assert perplexity_label(trained) == "perplexity (300 training steps)"
    imported = trained.with_columns(
        train_steps=pl.lit(1), source=pl.lit("github.com/automl/HW-GPT-Bench@795cba81"))
    assert perplexity_label(imported) == "perplexity (published by HW-GPT-Bench)"
