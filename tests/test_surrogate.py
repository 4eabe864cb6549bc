"""Surrogates: features, LightGBM and MLP-ensemble models, cross-validation, storage."""

from __future__ import annotations

from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from conftest import surrogate_settings
from hwgptbench.meters.flops import forward_flops
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.predictors.base import Surrogate
from hwgptbench.predictors.conformal import ConformalSurrogate, cross_conformal, widen, widening
from hwgptbench.predictors.features import analytic_counts, feature_matrix, feature_names
from hwgptbench.predictors.lightgbm_model import LightGBMSurrogate
from hwgptbench.predictors.linear import LinearSurrogate
from hwgptbench.predictors.mlp import MLPEnsembleSurrogate
from hwgptbench.predictors.quality import (
    cross_validate,
    fold_indices,
    interval_coverage,
    out_of_fold,
    relative_errors,
)
from hwgptbench.predictors.store import SurrogateMismatchError, load_surrogate, save_surrogate
from hwgptbench.space import SearchSpace

SPACES = {
    "tiny": {"embed_dim": [64, 96, 128], "n_layer": [2, 3, 4], "n_head": [2, 4],
             "mlp_ratio": [2, 3, 4], "bias": [True, False], "head_size": 16, "block_size": 128,
             "rotary_fraction": 0.5},
    "s": {"embed_dim": [192, 384, 768], "n_layer": [10, 11, 12], "n_head": [4, 8, 12],
          "mlp_ratio": [2, 3, 4], "bias": [True, False], "head_size": 64, "block_size": 1024,
          "rotary_fraction": 0.5},
    "fractional": {"embed_dim": [10, 16, 24], "n_layer": [1, 2, 3], "n_head": [1, 2],
                   "mlp_ratio": [0.3, 1, 2.5, 1 / 3], "bias": [True, False], "head_size": 4,
                   "block_size": 8, "rotary_fraction": 0.5},
}
VOCAB, BATCH, SEQ = 256, 8, 128
FAMILIES: dict[str, Callable[..., Surrogate]] = {
    "lightgbm": lambda **options: LightGBMSurrogate(seed=3, **options),
    "mlp_ensemble": lambda **options: MLPEnsembleSurrogate(members=3, epochs=150, seed=3,
                                                           **options),
    "linear": lambda **options: LinearSurrogate(**options),
}
NONLINEAR = ("lightgbm", "mlp_ensemble")


def space(name: str) -> SearchSpace:
    return SearchSpace.from_dict(name, SPACES[name])


def smooth_data(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A positive smooth function of four features with 2% multiplicative noise."""
    rng = np.random.default_rng(seed)
    X = rng.uniform(-1, 1, (n, 4)).astype(np.float32)
    y = np.exp(np.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.5 * X[:, 2]) * np.exp(rng.normal(0, .02, n))
    return X, y


def metadata(sp: SearchSpace, rows: int) -> dict[str, object]:
    return {"space_name": sp.name, "space": sp.to_dict(), "metric": "latency_ms",
            "feature_args": {"vocab_size": VOCAB, "batch_size": BATCH, "seq_len": SEQ},
            "device": "cpu-test", "device_fingerprint": {"device_name": "test"},
            "condition": f"b{BATCH}-t{SEQ}-fp32-eager",
            "training_rows": rows}


def test_feature_matrix_shape_and_names() -> None:
    sp = space("tiny")
    archs = sp.sample(50, seed=0)
    X = feature_matrix(sp, archs, VOCAB, BATCH, SEQ)
    names = feature_names(sp)
    assert X.dtype == np.float32 and X.shape == (50, len(names)) == (50, 3 + 2 * 4 + 2)
    assert names[-2:] == ["log_n_params", "log_forward_flops"]
    np.testing.assert_array_equal(X[:, :-2], sp.encode(archs))
    assert feature_matrix(sp, [], VOCAB, BATCH, SEQ).shape == (0, len(names))


@pytest.mark.parametrize("name", SPACES)
@pytest.mark.parametrize(("vocab", "batch", "seq"), [(256, 8, 128), (50304, 1, 1024)])
def test_analytic_columns_equal_per_arch_counts(name: str, vocab: int, batch: int,
                                                 seq: int) -> None:
    sp = space(name)
    archs = sp.sample(300, seed=1) + [sp.smallest(), sp.largest()]
    n_params, flops = analytic_counts(sp, sp.encode(archs), vocab, batch, seq)
    assert n_params.tolist() == [sp.n_params(a, vocab) for a in archs]
    assert flops.tolist() == [forward_flops(a, sp, vocab, batch, seq) for a in archs]
    X = feature_matrix(sp, archs, vocab, batch, seq)
    np.testing.assert_allclose(X[:, -2:], np.log(np.column_stack([n_params, flops])), rtol=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_fits_are_bit_identical(family: str) -> None:
    X, y = smooth_data(200, seed=0)
    first, second = FAMILIES[family]().fit(X, y), FAMILIES[family]().fit(X, y)
    np.testing.assert_array_equal(first.predict(X), second.predict(X))
    for a, b in zip(first.predict_interval(X), second.predict_interval(X), strict=True):
        np.testing.assert_array_equal(a, b)


def test_relative_errors_of_known_predictions() -> None:
    y = np.array([100.0, 100.0, 100.0, 100.0, 50.0])
    predicted = np.array([100.0, 104.0, 92.0, 130.0, 50.0 * 0.949])
    errors = relative_errors(y, predicted)
    assert errors["within_5pct"] == pytest.approx(2 / 5)  # 0% and 4%; not 5.1%, 8%, 30%
    assert errors["within_10pct"] == pytest.approx(4 / 5)
    assert errors["mdape"] == pytest.approx(5.1) and errors["max_ape"] == pytest.approx(30.0)


def test_selection_takes_most_within_5pct_then_lowest_mdape() -> None:
    keys = {"device": "d", "status": "ok"}
    quality = pl.DataFrame([
        {**keys, "metric": "latency_ms", "condition": "a", "family": "lightgbm",
         "within_5pct": 0.90, "mdape": 1.0},
        {**keys, "metric": "latency_ms", "condition": "a", "family": "mlp_ensemble",
         "within_5pct": 0.95, "mdape": 2.0},
        {**keys, "metric": "latency_ms", "condition": "b", "family": "lightgbm",
         "within_5pct": 0.95, "mdape": 1.5},
        {**keys, "metric": "latency_ms", "condition": "b", "family": "mlp_ensemble",
         "within_5pct": 0.95, "mdape": 1.0},
        {**keys, "metric": "energy_mj", "condition": "a", "family": "lightgbm",
         "within_5pct": None, "mdape": None, "status": "skipped"},
    ])
    selected = surrogates.mark_selected(quality)
    assert selected.filter("selected").select("condition", "family").rows() == [
        ("a", "mlp_ensemble"), ("b", "mlp_ensemble")]
    assert selected.height == quality.height and selected["selected"].sum() == 2


def test_interval_coverage_exact_fraction() -> None:
    y = np.array([1.0, 2.0, 3.0, 4.0, 5.0])
    low = np.array([0.0, 2.5, 3.0, 5.0, 4.0])
    high = np.array([1.0, 3.0, 3.0, 6.0, 6.0])
    assert interval_coverage(y, low, high) == 0.6
    with pytest.raises(ValueError):
        interval_coverage(y, low[:4], high)


def test_lightgbm_interval_covers_known_gaussian_quantiles() -> None:
    rng = np.random.default_rng(0)

    def draw(n: int) -> tuple[np.ndarray, np.ndarray]:
        X = rng.uniform(-2, 2, (n, 3)).astype(np.float32)
        return X, np.sin(X[:, 0]) + 0.5 * X[:, 1] + rng.normal(0, 0.2, n)

    (X, y), (X_test, y_test) = draw(500), draw(5000)
    model = LightGBMSurrogate(log_target=False).fit(X, y)
    low, high = model.predict_interval(X_test)
    point = model.predict(X_test)
    assert model.coverage == pytest.approx(0.9)
    assert np.all(low <= point) and np.all(point <= high)
    assert 0.85 <= interval_coverage(y_test, low, high) <= 0.97
    # The true 90% interval has width 2 * 1.645 * 0.2; the fitted one is not much wider.
    assert np.mean(high - low) < 2.5 * 2 * 1.645 * 0.2


@pytest.mark.parametrize("family", NONLINEAR)
def test_cross_validate_smooth_function(family: str) -> None:
    X, y = smooth_data(300, seed=1)
    result = cross_validate(FAMILIES[family], X, y, folds=5, seed=0)
    assert result["rows"] == 300 and result["folds"] == 5
    assert result["r2"] > 0.9 and result["kendall_tau"] > 0.8 and result["spearman_rho"] > 0.9
    assert 0.7 <= result["coverage"] <= 1.0
    assert result["mae"] < 0.2 * np.mean(y)


def test_linear_family_recovers_a_log_linear_target_from_few_rows() -> None:
    rng = np.random.default_rng(4)
    X = rng.uniform(-1, 1, (400, 6)).astype(np.float32)
    y = np.exp(X @ np.array([1.0, -0.5, 0.3, 0.0, 0.2, 0.8]) + rng.normal(0, 0.01, 400))
    result = cross_validate(lambda: LinearSurrogate(coverage=0.9), X[:24], y[:24], 4, seed=0)
    assert result["within_5pct"] == 1.0 and result["mdape"] < 2.0
    model = LinearSurrogate(coverage=0.9).fit(X[:24], y[:24])
    low, high = model.predict_interval(X[24:])
    assert 0.8 <= interval_coverage(y[24:], low, high) <= 1.0


def test_latency_like_target_ranks_well() -> None:
    sp = space("tiny")
    archs = sp.sample(100, seed=2)
    X = feature_matrix(sp, archs, VOCAB, BATCH, SEQ)
    flops = np.array([forward_flops(a, sp, VOCAB, BATCH, SEQ) for a in archs], dtype=float)
    latency_ms = 2e-9 * flops * (1 + np.random.default_rng(0).normal(0, 0.03, len(archs)))
    result = cross_validate(lambda: LightGBMSurrogate(), X, latency_ms, folds=5, seed=0)
    assert result["kendall_tau"] >= 0.8


@pytest.mark.parametrize("family", FAMILIES)
def test_store_round_trip(tmp_path: Path, family: str) -> None:
    sp = space("tiny")
    archs = sp.sample(120, seed=3)
    X = feature_matrix(sp, archs, VOCAB, BATCH, SEQ)
    y = np.exp(X[:, -1] - 20) * (1 + 0.1 * X[:, 2])
    model = FAMILIES[family]().fit(X, y)
    folder = tmp_path / "surrogate"
    save_surrogate(model, folder, metadata(sp, len(y)))
    loaded, meta = load_surrogate(folder, expected_space=sp)
    assert type(loaded) is type(model)
    np.testing.assert_array_equal(loaded.predict(X), model.predict(X))
    for a, b in zip(loaded.predict_interval(X), model.predict_interval(X), strict=True):
        np.testing.assert_array_equal(a, b)
    assert meta["family"] == family and meta["feature_names"] == feature_names(sp)
    assert meta["metric"] == "latency_ms" and meta["training_rows"] == 120
    assert set(meta["versions"]) == {"hwgptbench", "lightgbm", "torch", "numpy"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["surrogate"]  # no staging left over


def test_load_with_other_space_names_both(tmp_path: Path) -> None:
    tiny = space("tiny")
    X, y = smooth_data(60, seed=4)
    save_surrogate(LightGBMSurrogate().fit(X, y), tmp_path / "m", metadata(tiny, 60))
    with pytest.raises(SurrogateMismatchError, match=r"'tiny'.*'s'"):
        load_surrogate(tmp_path / "m", expected_space=space("s"))
    widened = SearchSpace.from_dict("tiny", {**SPACES["tiny"], "n_layer": [2, 3, 4, 5]})
    with pytest.raises(SurrogateMismatchError, match=r"\[2, 3, 4\].*\[2, 3, 4, 5\]"):
        load_surrogate(tmp_path / "m", expected_space=widened)


def test_save_requires_metadata(tmp_path: Path) -> None:
    X, y = smooth_data(40, seed=5)
    incomplete = {k: v for k, v in metadata(space("tiny"), 40).items() if k != "metric"}
    with pytest.raises(ValueError, match="metric"):
        save_surrogate(LightGBMSurrogate().fit(X, y), tmp_path / "m", incomplete)
    assert not (tmp_path / "m").exists()


@pytest.mark.parametrize("family", FAMILIES)
def test_log_target_needs_positive_targets(family: str) -> None:
    X, y = smooth_data(50, seed=6)
    with pytest.raises(ValueError, match="strictly positive"):
        FAMILIES[family]().fit(X, y - 2)
    model = FAMILIES[family](log_target=False).fit(X, y - 2)
    assert np.isfinite(model.predict(X)).all() and (model.predict(X) < 0).any()


def test_fit_perplexity_one_surrogate_per_fidelity(tmp_path: Path) -> None:
    sp = space("tiny")
    archs = sp.sample(30, seed=7)
    n_params, _ = analytic_counts(sp, sp.encode(archs), VOCAB, 1, sp.block_size)
    final = 1e4 / np.log(n_params) ** 2
    table = pl.concat([pl.DataFrame({"arch_id": [a.id for a in archs], "train_steps": steps,
                                     "perplexity": final * factor})
                       for steps, factor in ((10, 2.0), (40, 1.0), (20, 1.5))])
    section = {"families": ["lightgbm"], "lightgbm": {"num_iterations": 20, "num_leaves": 4,
                                                      "min_data_in_leaf": 3},
               "coverage": 0.9, "folds": 3, "min_rows": 10, "seed": 0}
    quality = surrogates.fit_perplexity(surrogate_settings(section), sp, VOCAB, table,
                                        tmp_path / "perplexity")
    assert quality.select("condition", "status").rows() == [
        ("any", "ok"), ("steps-20", "ok"), ("steps-10", "ok")]
    X = feature_matrix(sp, archs, VOCAB, 1, sp.block_size)
    for folder, condition, steps, factor in [("lightgbm", "any", 40, 1.0),
                                             ("steps-20/lightgbm", "steps-20", 20, 1.5),
                                             ("steps-10/lightgbm", "steps-10", 10, 2.0)]:
        model, meta = load_surrogate(tmp_path / "perplexity" / folder, expected_space=sp)
        assert (meta["metric"], meta["device"]) == ("perplexity", "any")
        assert (meta["condition"], meta["train_steps"]) == (condition, steps)
        assert np.median(model.predict(X) / final) == pytest.approx(factor, rel=0.05)


def test_blend_is_the_mean_of_the_families_and_scored_out_of_fold(tmp_path: Path) -> None:
    sp = space("tiny")
    archs = sp.sample(30, seed=7)
    n_params, _ = analytic_counts(sp, sp.encode(archs), VOCAB, 1, sp.block_size)
    table = pl.DataFrame({"arch_id": [a.id for a in archs], "train_steps": 40,
                          "perplexity": 1e4 / np.log(n_params) ** 2})
    section = {"families": ["lightgbm", "mlp_ensemble"], "folds": 3, "min_rows": 10, "seed": 0,
               "coverage": 0.9, "lightgbm": {"num_iterations": 20, "num_leaves": 4,
                                             "min_data_in_leaf": 3},
               "mlp_ensemble": {"hidden": 16, "layers": 1, "members": 2, "epochs": 50,
                                "lr": 0.01, "weight_decay": 0.0}}
    quality = surrogates.fit_perplexity(surrogate_settings(section), sp, VOCAB, table,
                                        tmp_path / "perplexity")
    assert quality["family"].to_list() == ["lightgbm", "mlp_ensemble", "blend"]
    assert quality["lightgbm_version"].unique().to_list() == [version("lightgbm")]
    assert quality["selected"].sum() == 1
    predictions = pl.read_parquet(tmp_path / "perplexity" / "predictions.parquet")
    by_family = {f: predictions.filter(pl.col("family") == f) for f in quality["family"]}
    mean = {column: ((by_family["lightgbm"][column] + by_family["mlp_ensemble"][column]) / 2
                     ).to_numpy() for column in ("predicted", "lower", "upper")}
    np.testing.assert_allclose(by_family["blend"]["predicted"], mean["predicted"])
    folds = fold_indices(len(archs), section["folds"], section["seed"])
    low, high, _, _ = cross_conformal(by_family["blend"]["measured"].to_numpy(),
                                      mean["predicted"], mean["lower"], mean["upper"], folds,
                                      section["coverage"])  # the blend's interval: calibrated
    np.testing.assert_allclose(by_family["blend"]["lower"], low)
    np.testing.assert_allclose(by_family["blend"]["upper"], high)
    blend = quality.row(2, named=True)
    oof = by_family["blend"]
    ape = (oof["predicted"] - oof["measured"]).abs() / oof["measured"]
    assert blend["mdape"] == pytest.approx(100 * ape.median())
    X = feature_matrix(sp, archs, VOCAB, 1, sp.block_size)
    model, meta = load_surrogate(tmp_path / "perplexity" / "blend", expected_space=sp)
    members = [load_surrogate(tmp_path / "perplexity" / f)[0] for f in section["families"]]
    assert meta["family"] == "blend"
    np.testing.assert_allclose(model.predict(X), np.mean([m.predict(X) for m in members], 0))
    low, high = model.predict_interval(X)
    assert (low <= model.predict(X)).all() and (model.predict(X) <= high).all()


def test_conformal_widening_is_the_finite_sample_quantile() -> None:
    scores = np.arange(1.0, 20.0)  # 19 scores: the ceil(20 * 0.9) = 18th smallest
    assert widening(scores, 0.9) == 18.0
    assert widening(scores[:5], 0.9) == 5.0  # too few scores for 90%: the largest
    with pytest.raises(ValueError, match="coverage"):
        widening(scores, 1.0)


def test_cross_conformal_brings_too_narrow_intervals_to_nominal_coverage() -> None:
    rng = np.random.default_rng(0)
    y = np.exp(rng.normal(0, 0.1, 2000))
    point = np.ones_like(y)
    low, high = point * np.exp(-0.02), point * np.exp(0.02)  # covers about 16%
    assert interval_coverage(y, low, high) < 0.2
    folds = fold_indices(len(y), 5, 0)
    calibrated_low, calibrated_high, by, log_space = cross_conformal(y, point, low, high,
                                                                     folds, 0.9)
    assert log_space and by == pytest.approx(0.1645 - 0.02, abs=0.015)
    assert interval_coverage(y, calibrated_low, calibrated_high) == pytest.approx(0.9, abs=0.02)
    wide_low, wide_high, narrowing, _ = cross_conformal(y, point, low / 2, high * 2, folds, 0.9)
    assert narrowing < 0  # too cautious intervals move in, but never past the point
    assert (wide_low <= point).all() and (point <= wide_high).all()
    assert interval_coverage(y, wide_low, wide_high) == pytest.approx(0.9, abs=0.02)


def test_stored_conformal_surrogate_widens_its_models_interval(tmp_path: Path) -> None:
    sp = space("tiny")
    archs = sp.sample(40, seed=2)
    X = feature_matrix(sp, archs, VOCAB, BATCH, SEQ)
    y = np.exp(X[:, 0] / X[:, 0].max()) * np.exp(np.random.default_rng(1).normal(0, .05, 40))
    point, low, high = out_of_fold(LinearSurrogate, X, y, folds=4, seed=0)
    _, _, by, log_space = cross_conformal(y, point, low, high, fold_indices(40, 4, 0), 0.9)
    save_surrogate(ConformalSurrogate(LinearSurrogate().fit(X, y), by, log_space),
                   tmp_path / "m", metadata(sp, 40))
    model, meta = load_surrogate(tmp_path / "m", expected_space=sp)
    raw = LinearSurrogate.load(tmp_path / "m")
    assert meta["family"] == model.family == "linear"
    np.testing.assert_allclose(model.predict(X), raw.predict(X))
    expected = widen(*raw.predict_interval(X), by, log_space, raw.predict(X))
    np.testing.assert_allclose(model.predict_interval(X), expected)
