"""LightGBM model texts are parsed here before LightGBM reads them (docs/security.md): the
canonical text written from the parsed values predicts bit-identically to LightGBM's own;
every value LightGBM's parser would crash on, misread or read as NaN is refused; and mutated
texts (hypothesis) are refused or load and predict finite numbers in a child process, never a
signal. A surrogate folder holding such a text, or a metadata.json whose fields are not what
the writer writes, is refused by its loader and by ``hwgptbench query``, with one message."""

from __future__ import annotations

import contextlib
import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import run, surrogate_settings, toy_perplexity_table
from hwgptbench import layout
from hwgptbench.cli import main
from hwgptbench.lightgbm_core import (
    ModelTextError,
    booster_from_string,
    lgb,
    parse_model_text,
)
from hwgptbench.predictors import fitting
from hwgptbench.predictors.features import feature_names
from hwgptbench.predictors.store import SurrogateFileError, load_surrogate
from hwgptbench.space import SearchSpace
from test_security import reseal

PARAMS = {"num_leaves": 4, "min_data_in_leaf": 3, "verbosity": -1, "num_threads": 1,
          "deterministic": True, "force_row_wise": True, "seed": 0}
N_FEATURES = 5


def train(objective: str = "regression", rounds: int = 5, constant: bool = False,
          init_score: bool = False, **extra: Any) -> str:
    """The text of a small model as the project writes them; missing values in the features
    give splits of every missing type."""
    rng = np.random.default_rng(0)
    X = rng.random((200, N_FEATURES))
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.1] = 0.0
    y = np.ones(200) if constant else np.nan_to_num(X) @ np.arange(1, N_FEATURES + 1)
    params = {**PARAMS, "objective": objective, "num_iterations": rounds, **extra}
    data = lgb.Dataset(X, y, init_score=np.full(200, 0.5) if init_score else None,
                       params=params)
    return lgb.train(params, data).model_to_string()


@pytest.fixture(scope="module")
def text() -> str:
    """A regression model whose first tree has four leaves."""
    model = train()
    assert re.search(r"^Tree=0\nnum_leaves=4$", model, re.MULTILINE)
    return model


def resized(text: str) -> str:
    """text with tree_sizes recomputed, so that an edit of a tree is its only flaw (as it is,
    where it has no trees to measure)."""
    if "\nTree=" not in text or "end of trees" not in text:
        return text
    trees = text[text.index("\nTree=") + 1:text.index("end of trees")]
    starts = [m.start() for m in re.finditer(r"^Tree=", trees, re.MULTILINE)] + [len(trees)]
    sizes = " ".join(str(len(trees[a:b].encode())) for a, b in zip(starts, starts[1:],
                                                                    strict=False))
    return re.sub(r"^tree_sizes=.*$", f"tree_sizes={sizes}", text, count=1, flags=re.MULTILINE)


def _line(key: str, value: str) -> Callable[[str], str]:
    """An edit setting the first ``key=`` line's value (its first token where value ends in
    ``...``, keeping the others)."""
    def edit(text: str) -> str:
        keep = r"((?: \S+)*)" if value.endswith("...") else r"(.*)"
        new = value.removesuffix("...") + (r"\2" if value.endswith("...") else "")
        return resized(re.sub(rf"^({key}=)\S*{keep}$", rf"\g<1>{new}", text, count=1,
                              flags=re.MULTILINE))
    return edit


# hostile edit -> the field the refusal names
HOSTILE: dict[str, tuple[Callable[[str], str], str]] = {
    "num_leaves=1_0": (_line("num_leaves", "1_0"), "num_leaves"),
    "num_leaves=full-width-12": (_line("num_leaves", "\uff11\uff12"), "num_leaves"),
    "internal_count=99999999999": (_line("internal_count", "99999999999..."), "internal_count"),
    "objective=multiclass": (_line("objective", "multiclass num_class:5"), "objective"),
    "num_class=5": (_line("num_class", "5"), "num_class"),
    "num_tree_per_iteration=2": (_line("num_tree_per_iteration", "2"), "num_tree_per_iteration"),
    "leaf_value=nan": (_line("leaf_value", "nan..."), "leaf_value"),
    "threshold=nan": (_line("threshold", "nan..."), "threshold"),
    "threshold=inf": (_line("threshold", "inf..."), "threshold"),
    "leaf_value=1e+999": (_line("leaf_value", "1e+999..."), "leaf_value"),
    "leaf_values-adding-to-inf": (lambda t: resized(re.sub(
        r"^leaf_value=\S+", "leaf_value=1e+308", t, flags=re.MULTILINE)), "leaf values add up"),
    "split_feature=10^9": (_line("split_feature", "1000000000..."), "split_feature"),
    "decision_type=categorical": (_line("decision_type", "1..."), "decision_type"),
    "children-in-a-cycle": (lambda t: resized(re.sub(
        r"^left_child=.*\nright_child=.*$", "left_child=-1 2 1\nright_child=-2 -3 -4", t,
        count=1, flags=re.MULTILINE)), "left_child"),
    "tree_sizes-wrong": (lambda t: t.replace("tree_sizes=", "tree_sizes=1", 1), "tree_sizes"),
    "line-duplicated": (lambda t: resized(t.replace("num_cat=0\n", "num_cat=0\nnum_cat=0\n", 1)),
                        "tree 0"),
}


@pytest.mark.parametrize("objective, extra", [
    ("regression", {}), ("quantile", {"alpha": 0.05}), ("quantile", {"alpha": 0.95}),
    ("regression", {"init_score": True}), ("regression", {"constant": True})])
def test_the_canonical_text_predicts_bit_identically(objective: str,
                                                      extra: dict[str, Any]) -> None:
    """Trailer and LightGBM's number formats aside, nothing is lost: the same predictions to
    the bit on inputs with zeros and missing values, and the canonical text is a fixed point."""
    original = train(objective, **extra)
    canonical = parse_model_text(original, N_FEATURES).canonical()
    assert "parameters:" in original and "parameters:" not in canonical
    rng = np.random.default_rng(1)
    X = rng.normal(size=(2000, N_FEATURES)) * rng.choice([1e-3, 1.0, 1e3], (2000, N_FEATURES))
    X[rng.random(X.shape) < 0.1] = np.nan
    X[rng.random(X.shape) < 0.1] = 0.0
    ours, theirs = (lgb.Booster(model_str=t).predict(X) for t in (canonical, original))
    assert np.array_equal(ours, theirs)
    assert parse_model_text(canonical).canonical() == canonical


def test_the_real_surrogate_texts_parse(surrogate_folder: Path) -> None:
    """The point and quantile models that the surrogate stage writes parse, and their
    canonical texts predict as LightGBM's own."""
    n_features = len(feature_names(SPACE))
    X = np.random.default_rng(2).random((100, n_features))
    for path in sorted(surrogate_folder.glob("*.txt")):
        text = path.read_text()
        canonical = parse_model_text(text, n_features).canonical()
        assert np.array_equal(lgb.Booster(model_str=canonical).predict(X),
                              lgb.Booster(model_str=text).predict(X)), path


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_value_is_refused_naming_its_field(text: str, case: str) -> None:
    edit, field = HOSTILE[case]
    hostile = edit(text)
    assert hostile != text
    with pytest.raises(ValueError, match=re.escape(field)):
        parse_model_text(hostile)
    with pytest.raises(ModelTextError, match=rf"point\.txt is refused as a LightGBM model \(.*"
                                             rf"{re.escape(field)}.*\): refit"):
        booster_from_string(hostile, "point.txt", "refit")


CHILD = """
import json, sys
import numpy as np
from hwgptbench.lightgbm_core import ModelTextError, booster_from_string
for index, text in enumerate(json.load(sys.stdin)):
    print(f"@{index}", flush=True)  # the last index printed names the text of a crash
    try:
        booster = booster_from_string(text, "text", "fix")
    except ModelTextError:
        print("=refused", flush=True)
        continue
    X = np.random.default_rng(0).normal(size=(64, booster.num_feature()))
    X[::7, 0] = np.nan
    print("=finite" if np.isfinite(booster.predict(X)).all() else "=not finite", flush=True)
"""


def outcomes(texts: list[str]) -> list[str]:
    """What booster_from_string makes of each text, in a child process (a crash is a signal,
    not the end of this one): refused, finite or not finite."""
    result = subprocess.run([sys.executable, "-c", CHILD], input=json.dumps(texts),
                            capture_output=True, text=True, timeout=120)
    lines = [line for line in result.stdout.splitlines() if line[:1] in ("@", "=")]
    crashed = texts[int(lines[-1][1:])] if lines and lines[-1][0] == "@" else None
    assert result.returncode == 0, (f"rc {result.returncode} on\n{crashed}\n"
                                    f"{result.stderr[-2000:]}")
    return [line[1:] for line in lines if line[0] == "="]


def test_lightgbm_would_crash_on_two_hostile_texts(text: str) -> None:
    """Unparsed, these hostile values abort LightGBM or crash it (so the refusals above are
    what keeps a query alive)."""
    code = ("import sys; from hwgptbench.lightgbm_core import lgb; "
            "lgb.Booster(model_str=sys.stdin.read()).predict([[0.5] * 5])")
    for case in ("num_leaves=1_0", "num_leaves=full-width-12"):
        result = subprocess.run([sys.executable, "-c", code], input=HOSTILE[case][0](text),
                                capture_output=True, text=True, timeout=60)
        assert result.returncode < 0, (case, result.returncode, result.stderr[-500:])


NUMERALS = ["1_0", "\uff11\uff12", "\uff11", "nan", "NaN", "inf", "-inf", "-1", "0", "2", "5",
            "99999999999", "2147483648", "1e999", "1e+999", "1e308", "-0", "+1", "0x10",
            "1.5", "", " ", "=", "Tree=0"]
OBJECTIVES = ["multiclass num_class:5", "binary sigmoid:1", "regression sqrt", "lambdarank",
              "quantile", "huber", "regression_l1", ""]
CHARS = "0123456789-.e+=_ \n\t\r\x00\uff11\uff15aZ"


EDITS = ("char", "hostile", "number", "delete", "duplicate", "objective")


@st.composite
def mutated(draw: st.DrawFn, text: str, edits: tuple[str, ...] = EDITS) -> str:
    """text after one to three ``edits`` (in the header and trees, up to ``end of trees``): a
    character changed, a token replaced by a hostile numeral or by another number, a line
    deleted or duplicated, the objective changed."""
    lines = text.split("\n")
    end = lines.index("end of trees") + 1
    numbers = st.one_of(st.integers(-3, 2**31).map(str),
                        st.floats(allow_nan=False, allow_infinity=False).map(repr))
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, min(end, len(lines)) - 1))
        kind = draw(st.sampled_from(edits))
        if kind == "char":
            j = draw(st.integers(0, len(lines[i])))
            lines[i] = lines[i][:j] + draw(st.sampled_from(CHARS)) + lines[i][j + 1:]
        elif kind in ("hostile", "number"):
            key, sep, value = lines[i].partition("=")
            tokens = value.split(" ")
            tokens[draw(st.integers(0, len(tokens) - 1))] = draw(
                st.sampled_from(NUMERALS) if kind == "hostile" else numbers)
            lines[i] = key + sep + " ".join(tokens)
        elif kind == "delete":
            del lines[i]
        elif kind == "duplicate":
            lines.insert(i, lines[i])
        else:
            lines = [f"objective={draw(st.sampled_from(OBJECTIVES))}"
                     if line.startswith("objective=") else line for line in lines]
    return "\n".join(lines)


FUZZED = train(rounds=3)


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                 HealthCheck.data_too_large])
@given(st.lists(st.one_of(mutated(FUZZED), mutated(FUZZED).map(resized),
                          mutated(FUZZED, ("number",)).map(resized)),
                min_size=30, max_size=30))
def test_a_mutated_text_is_refused_or_predicts_finite_numbers(texts: list[str]) -> None:
    """Each batch runs in one child process, the unmutated text first: every outcome is a
    refusal or a model of finite predictions, and the child never dies of a signal (texts
    with tree_sizes recomputed, and with numbers changed alone, reach past the first checks
    more often)."""
    results = outcomes([FUZZED, *texts])
    assert results[0] == "finite"
    assert set(results) <= {"refused", "finite"}, results


# -- surrogate folders -------------------------------------------------------------------------

SPACE = SearchSpace.from_dict("tiny", {
    "embed_dim": [32, 64], "n_layer": [1, 2], "n_head": [2, 4], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 16, "block_size": 16, "rotary_fraction": 0.5})
ARCH = SPACE.sample(1, seed=3)[0]


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with a LightGBM perplexity surrogate."""
    root = tmp_path_factory.mktemp("fitted") / "results"
    table = toy_perplexity_table(SPACE)
    section = {"families": ["lightgbm"], "folds": 2, "min_rows": 10, "seed": 0,
               "coverage": 0.9, "lightgbm": {"num_iterations": 20, "num_leaves": 4,
                                             "min_data_in_leaf": 3}}
    fitting.fit_perplexity(surrogate_settings(section), SPACE, 64, table,
                           Path(layout.surrogates("tiny", str(root))) / "perplexity")
    return root


@pytest.fixture(scope="module")
def surrogate_folder(fitted: Path) -> Path:
    return Path(layout.surrogates("tiny", str(fitted))) / "perplexity" / "lightgbm"


@pytest.fixture
def results(fitted: Path, tmp_path: Path) -> Path:
    shutil.copytree(fitted, tmp_path / "results")
    return tmp_path / "results"


def _spoil(results: Path, case: str) -> Path:
    """point.txt of the copy under results with the hostile edit, its manifest resealed to
    match (a hostile folder); returns the file."""
    point = Path(layout.surrogates("tiny", str(results))) / "perplexity" / "lightgbm" / "point.txt"
    point.write_text(HOSTILE[case][0](point.read_text()))
    reseal(point.parent)
    return point


@pytest.mark.parametrize("case", ["num_leaves=1_0", "num_leaves=full-width-12",
                                  "internal_count=99999999999", "objective=multiclass",
                                  "leaf_value=nan", "threshold=nan"])
def test_the_surrogate_loader_refuses_a_hostile_text(results: Path, case: str) -> None:
    point = _spoil(results, case)
    with pytest.raises((SurrogateFileError, ModelTextError),
                       match=rf"{re.escape(str(point))} is refused as a LightGBM model "
                             rf"\(.*{re.escape(HOSTILE[case][1])}"):
        load_surrogate(point.parent, SPACE)


def test_query_refuses_a_hostile_text_with_one_message(results: Path) -> None:
    """In a process of its own: were the text handed to LightGBM, it would abort (rc 134)."""
    point = _spoil(results, "num_leaves=1_0")
    result = run(["hwgptbench", "query", "--results", str(results), "--metric", "perplexity",
                  "--arch", ARCH.id, "--family", "lightgbm"], results, check=False)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("error:") == 1 and "Traceback" not in result.stderr
    assert f"{point} is refused as a LightGBM model" in result.stderr
    assert "num_leaves holds '1_0'" in result.stderr


# metadata.json edit -> what the refusal says
METADATA_CASES: dict[str, tuple[dict[str, Any], str]] = {
    "vocab_size-negative": ({"feature_args": {"vocab_size": -5, "batch_size": 1,
                                              "seq_len": 16}}, "feature_args"),
    "vocab_size-text": ({"feature_args": {"vocab_size": "64", "batch_size": 1, "seq_len": 16}},
                        "feature_args"),
    "feature_args-list": ({"feature_args": [64, 1, 16]}, "feature_args"),
    "feature_args-incomplete": ({"feature_args": {"vocab_size": 64}}, "feature_args"),
    "seq_len-of-another-condition": ({"feature_args": {"vocab_size": 64, "batch_size": 1,
                                                       "seq_len": 128}}, "not those of its"),
    "metric-unknown": ({"metric": "bogus"}, "metric 'bogus'"),
    "metric-of-a-device": ({"metric": "latency_ms"}, "latency_ms surrogate's device 'any'"),
    "family-unknown": ({"family": "bogus"}, "unknown family 'bogus'"),
    "condition-of-a-device": ({"condition": "b1-t128-fp32-eager"}, "condition 'any'"),
    "condition-a-number": ({"condition": 5}, "condition 'any'"),
    "condition-null": ({"condition": None}, "condition 'any'"),
    "device-a-number": ({"device": 5}, "device 'any'"),
    "training_rows-zero": ({"training_rows": 0}, "training_rows"),
    "field-unknown": ({"extra": 1}, "unknown fields: extra"),
}


def _spoil_metadata(results: Path, case: str) -> Path:
    """metadata.json of the copy under results with the edit, its manifest resealed."""
    folder = Path(layout.surrogates("tiny", str(results))) / "perplexity" / "lightgbm"
    path = folder / "metadata.json"
    path.write_text(json.dumps(json.loads(path.read_text()) | METADATA_CASES[case][0]))
    reseal(folder)
    return path


@pytest.mark.parametrize("case", METADATA_CASES)
def test_the_surrogate_loader_refuses_metadata_it_did_not_write(results: Path,
                                                                 case: str) -> None:
    path = _spoil_metadata(results, case)
    with pytest.raises(SurrogateFileError, match=rf"{re.escape(str(path))} is not a "
                                                 rf"surrogate's metadata \(.*"
                                                 rf"{re.escape(METADATA_CASES[case][1])}.*\): "
                                                 r"refit the surrogates"):
        load_surrogate(path.parent, SPACE)


@pytest.mark.parametrize("case", ["vocab_size-negative", "metric-of-a-device",
                                  "condition-of-a-device", "feature_args-incomplete"])
def test_query_refuses_metadata_it_did_not_write_with_one_message(results: Path,
                                                                  case: str) -> None:
    """Answered before: a perplexity from a vocabulary of -5, or a traceback."""
    path = _spoil_metadata(results, case)
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main(["query", "--results", str(results), "--metric", "perplexity", "--arch",
                     ARCH.id, "--family", "lightgbm"])
    assert code == 2, err.getvalue()
    assert err.getvalue().count("error:") == 1 and "Traceback" not in err.getvalue()
    assert f"{path} is not a surrogate's metadata" in err.getvalue()
