"""Answers are checked before they are returned (docs/security.md): a surrogate folder, an
adapted device's folder, a measured table or a resume part planted with a value no device has,
or sitting where another device's sits, is refused with one message naming it, never answered
with a wrong number, through the API and the command line alike."""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import torch

from conftest import REPO_ROOT, surrogate_settings
from hwgptbench import cli, layout, published
from hwgptbench.api import ADAPTED_MEASUREMENTS, Benchmark, ImplausibleAnswer
from hwgptbench.errors import UserError
from hwgptbench.export.evaluate import ImplausibleScore, check_scores, perplexity_task
from hwgptbench.io import canonical_json, sha256_file
from hwgptbench.params import section_of
from hwgptbench.predictors import fitting
from hwgptbench.predictors.store import MANIFEST, SurrogateFileError, _files
from hwgptbench.settings.sections import TransferSettings
from hwgptbench.transfer import adapt
from hwgptbench.transfer.adapt import adapt_device
from test_query_union import SECTION, TRANSFER, device_table
from test_resume_state import (  # noqa: F401 (interrupted: a fixture)
    ARCH_ROWS,
    GROUP,
    interrupted,
    refused_in_one_line,
    resume,
)

SCALE = "t"  # a scale that ships no tables: its results alone answer
CPU, GPU, ADAPTED = "cpu-test-local-1t", "gpu-test-local", "cpu-test-adapted-1t"
CONDITION = "b1-t128-fp32-eager"


def _params() -> dict:
    from hwgptbench import params

    return params.load(REPO_ROOT / "params.yaml")


@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder of SCALE: two devices measured and fitted here (CPU slow, GPU fast)
    and one adapted from a few archs."""
    root = tmp_path_factory.mktemp("checked") / "results"
    space, vocab = published.space("s"), published.vocab_size("s")
    measured = pl.concat([device_table(space, CPU, 50.0), device_table(space, GPU, 2.0)])
    (root / SCALE).mkdir(parents=True)
    measured.write_parquet(layout.measurements(SCALE, str(root)))
    settings = surrogate_settings(SECTION)
    for label in (CPU, GPU):
        fitting.fit_device(settings, space, vocab, measured.filter(pl.col("device") == label),
                           Path(layout.device_surrogates(SCALE, label, str(root))))
    transfer = section_of(TransferSettings, {**_params()["transfer"], **TRANSFER})
    adapt_device(transfer, space, vocab, measured, device_table(space, ADAPTED, 20.0, 12, 1),
                 ADAPTED, 8, layout.adapted(SCALE, str(root)))
    return root


def surrogate(root: Path, device: str) -> Path:
    """The folder of the latency surrogate of a device under CONDITION."""
    if device == ADAPTED:
        return Path(layout.adapted(SCALE, str(root))) / device / "latency_ms" / CONDITION / (
            "adapted")
    return Path(layout.device_surrogates(SCALE, device, str(root))) / "latency_ms" / (
        CONDITION) / "lightgbm"


def reseal(folder: Path) -> None:
    """Rewrite a surrogate folder's manifest over its files as they are now: a tampered
    folder that the manifest check alone would not catch."""
    (folder / MANIFEST).write_text(canonical_json(
        {"format": "hwgptbench-surrogate/2",
         "files": {name: sha256_file(folder / name) for name in _files(folder)}}))


def edit_json(path: Path, change: Callable[[dict], None]) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))  # NaN and Infinity as Python writes them
    reseal(path.parent)


def adapted_state(key: str, value: float) -> Callable[[Path], str]:
    def plant(root: Path) -> str:
        def change(options: dict) -> None:
            state = options["method_state"]
            if isinstance(state[key], list):
                state[key][0] = value
            else:
                state[key] = value
        edit_json(surrogate(root, ADAPTED) / "options.json", change)
        return ADAPTED
    return plant


def leaves(value: str) -> Callable[[Path], str]:
    """The GPU's point model with every leaf of its first tree ``value`` (a log latency)."""
    def plant(root: Path) -> str:
        folder = surrogate(root, GPU)
        text = (folder / "point.txt").read_text().splitlines()
        line = next(i for i, row in enumerate(text) if row.startswith("leaf_value="))
        old = text[line].removeprefix("leaf_value=").split()
        # each leaf as long as the one it replaces, so the header's tree_sizes still hold
        text[line] = "leaf_value=" + " ".join(
            value if "." in value or len(value) >= len(leaf) else
            f"{value}.{'0' * (len(leaf) - len(value) - 1)}" for leaf in old)
        (folder / "point.txt").write_text("\n".join(text) + "\n")
        reseal(folder)
        return GPU
    return plant


def widening(by: float) -> Callable[[Path], str]:
    def plant(root: Path) -> str:
        edit_json(surrogate(root, GPU) / "conformal.json",
                  lambda document: document.update(widening=by))
        return GPU
    return plant


def moved_folder(root: Path) -> str:
    """The CPU's surrogate copied into the GPU's place (its metadata still says CPU)."""
    shutil.rmtree(surrogate(root, GPU))
    shutil.copytree(surrogate(root, CPU), surrogate(root, GPU))
    return GPU


def relabelled_metadata(root: Path) -> str:
    """The CPU's surrogate, where it sits, relabelled to the GPU (resealed)."""
    edit_json(surrogate(root, CPU) / "metadata.json",
              lambda metadata: metadata.update(device=GPU))
    return GPU


def adapted_table_of_another_device(root: Path) -> str:
    table = pl.read_parquet(layout.measurements(SCALE, str(root)))
    table.filter(pl.col("device") == CPU).write_parquet(
        Path(layout.adapted(SCALE, str(root))) / ADAPTED / ADAPTED_MEASUREMENTS)
    return CPU


def measured_out_of_bounds(value: float) -> Callable[[Path], str]:
    def plant(root: Path) -> str:
        path = Path(layout.measurements(SCALE, str(root)))
        table = pl.read_parquet(path)
        first = pl.int_range(pl.len()) == 0
        table.with_columns(latency_ms=pl.when(first).then(value).otherwise("latency_ms")
                           ).write_parquet(path)
        return CPU
    return plant


# planted corruption -> (the query's mode, what the refusal names: an error type and words)
PLANTED: dict[str, tuple[Callable[[Path], str], str, type[UserError], str]] = {
    "adapted weight NaN": (adapted_state("coef", math.nan), "surrogate", UserError,
                           "adapted"),
    "adapted intercept 1e308": (adapted_state("intercept", 1e308), "surrogate",
                                ImplausibleAnswer, "is not a finite number"),
    # refused by the model text's parser (docs/security.md, "LightGBM model texts")
    "LightGBM leaves of 1.6e307": (leaves("1.6e307"), "surrogate", UserError,
                                   "refused as a LightGBM model"),
    "LightGBM leaves of 1.6e307 in decimals": (leaves("16" + "0" * 306), "surrogate",
                                               UserError, "refused as a LightGBM model"),
    # parsed, but exp(1000) ms is inf and exp(30) ms a day per forward
    "LightGBM leaves of 1000": (leaves("1000"), "surrogate", ImplausibleAnswer,
                                "is not a finite number"),
    "LightGBM leaves of 30": (leaves("30"), "surrogate", ImplausibleAnswer,
                              "answered"),
    "conformal widening 1e308": (widening(1e308), "surrogate", SurrogateFileError,
                                 "widening 1e+308"),
    "conformal widening -50": (widening(-50.0), "surrogate", SurrogateFileError,
                               "widening -50"),
    "a folder moved to another device": (moved_folder, "surrogate", SurrogateFileError,
                                         "not here"),
    "metadata relabelled to another device": (relabelled_metadata, "surrogate",
                                              SurrogateFileError, "not here"),
    "an adapted table of another device": (adapted_table_of_another_device, "measured",
                                           UserError, ADAPTED_MEASUREMENTS),
    "a measured latency of -1": (measured_out_of_bounds(-1.0), "measured", ImplausibleAnswer,
                                 "is outside"),
    "a measured latency of NaN": (measured_out_of_bounds(math.nan), "auto", ImplausibleAnswer,
                                  "is not a finite number"),
}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("case", list(PLANTED), ids=list(PLANTED))
def test_a_planted_answer_is_refused(case: str, fitted: Path, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "results"
    shutil.copytree(fitted, root)
    arch = pl.read_parquet(layout.measurements(SCALE, str(root)))["arch_id"][0]
    plant, mode, error, words = PLANTED[case]
    device = plant(root)
    with pytest.raises(error) as refused:
        Benchmark.load(SCALE, root).query([arch], "latency_ms", device=device,
                                          condition=CONDITION, mode=mode,
                                          return_interval=mode != "measured")
    message = str(refused.value)
    assert words in message and "\n" not in message
    if isinstance(refused.value, ImplausibleAnswer):  # the arch and what to do
        assert arch in message and ("delete" in message or "drop the row" in message)
    out = tmp_path / "answer.csv"
    capsys.readouterr()
    code = cli.main(["query", "--scale", SCALE, "--results", str(root), "--device", device,
                     "--metric", "latency_ms", "--condition", CONDITION, "--arch", arch,
                     "--mode", mode, *(["--interval"] if mode != "measured" else []),
                     "--out", str(out)])
    stderr = capsys.readouterr().err
    assert code == 2 and not out.exists() and "Traceback" not in stderr


def test_the_fixture_answers_before_a_plant(fitted: Path) -> None:
    """Each device answers its own latency, within its interval (the plants above are what
    makes them refused)."""
    bench = Benchmark.load(SCALE, fitted)
    table = pl.read_parquet(layout.measurements(SCALE, str(fitted)))
    for device in (CPU, GPU, ADAPTED):
        arch = table["arch_id"][0]
        answer = bench.query([arch], "latency_ms", device=device, condition=CONDITION,
                             return_interval=True)
        assert answer["latency_ms_lo"][0] <= answer["latency_ms"][0] <= answer["latency_ms_hi"][0]
    cpu, gpu = (bench.query([table["arch_id"][0]], "latency_ms", device=d)["latency_ms"][0]
                for d in (CPU, GPU))
    assert cpu > 10 * gpu


def test_a_stray_table_in_an_adapted_folder_is_never_read(fitted: Path, tmp_path: Path) -> None:
    """Only the table `adapt` writes (transfer.adapt.MEASURED) is read from an adapted
    device's folder: a parquet file dropped beside it, of any device, is not a measurement."""
    assert ADAPTED_MEASUREMENTS == adapt.MEASURED
    root = tmp_path / "results"
    shutil.copytree(fitted, root)
    table = pl.read_parquet(layout.measurements(SCALE, str(root)))
    arch = table["arch_id"][0]
    stray = table.head(1).with_columns(latency_ms=pl.lit(5234.9))
    for device in (CPU, ADAPTED):
        stray.with_columns(device=pl.lit(device)).write_parquet(
            Path(layout.adapted(SCALE, str(root))) / ADAPTED / f"stray-{device}.parquet")
    answer = Benchmark.load(SCALE, root).query([arch], "latency_ms", device=CPU,
                                               condition=CONDITION, mode="measured")
    assert answer["latency_ms"][0] == table["latency_ms"][0]


RESUMED = {"-1": -1.0, "NaN": math.nan, "1e308": 1e308}


@pytest.mark.parametrize("part", [GROUP, ARCH_ROWS])
@pytest.mark.parametrize("value", list(RESUMED), ids=list(RESUMED))
def test_a_resume_part_with_implausible_latencies_names_the_file(
        part: str, value: str, interrupted: Path, tmp_path: Path) -> None:  # noqa: F811
    out, parts = resume(interrupted, tmp_path)
    path = parts / part
    table = pl.read_parquet(path)
    column = "latency_ms" if part == GROUP else "memory_peak_mb"
    table.with_columns(pl.lit(RESUMED[value]).cast(pl.Float64).alias(column)).write_parquet(path)
    refused_in_one_line(out, path, "its group is measured again" if part == GROUP
                        else "its archs are measured again")


def test_evaluate_refuses_a_nan_score(tmp_path: Path) -> None:
    """NaN logits (a tampered ONNX graph) give a NaN loss: refused, never written."""
    from hwgptbench.export.evaluate import DEFAULTS

    val = [np.arange(4096, dtype=np.uint16) % 50]

    def nan_logits(x: torch.Tensor) -> torch.Tensor:
        return torch.full((*x.shape, 64), math.nan)

    scores = perplexity_task(nan_logits, val, DEFAULTS, 32)
    assert math.isnan(scores["perplexity"])
    with pytest.raises(ImplausibleScore, match=r"model\.onnx \(onnx\): task perplexity "
                                                r"scored val_loss nan"):
        check_scores({"perplexity": scores}, tmp_path / "model.onnx", "onnx")
    check_scores({"perplexity": {**scores, "val_loss": 3.0, "perplexity": 20.1}},
                 tmp_path, "onnx")
