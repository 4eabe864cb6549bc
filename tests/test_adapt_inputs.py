"""`hwgptbench adapt` on measurement tables given by a user: every table that is not a valid one
(unreadable, a column missing or of the wrong type, a value that no device measures, a
condition or arch the scale does not have) is refused with one message naming the file, the
column and the first bad row; exit 2, no traceback. Lossless casts are accepted."""

from __future__ import annotations

import io
import itertools
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT
from hwgptbench import cli
from hwgptbench.errors import UserError
from hwgptbench.space import SearchSpace
from hwgptbench.transfer.measurements import (
    MeasurementsFileError,
    check_measurements,
    read_measurements,
)
from test_transfer import SPACE, VOCAB, synthetic_measurements

SHIPPED = sorted((REPO_ROOT / "src/hwgptbench/published/s/devices").glob("*.parquet"))
S_SPACE = SearchSpace.from_dict("s", yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
                                ["spaces"]["s"])
LABELS = (f"new-gpu-{i}" for i in itertools.count())


@pytest.fixture(scope="module")
def tables() -> pl.DataFrame:
    return synthetic_measurements()


@pytest.fixture(scope="module")
def new_device(tables: pl.DataFrame) -> pl.DataFrame:
    return tables.filter(pl.col("device") == "gpu-b")


@pytest.fixture(scope="module")
def results(tables: pl.DataFrame, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder whose measurements (the sources) are every device but gpu-b."""
    folder = tmp_path_factory.mktemp("adapt") / "results"
    (folder / "tiny").mkdir(parents=True)
    tables.filter(pl.col("device") != "gpu-b").write_parquet(
        folder / "tiny" / "measurements.parquet")
    return folder


def adapt(results: Path, measurements: Path, *extra: str) -> int:
    return cli.main(["adapt", "--params", str(REPO_ROOT / "params.yaml"), "--scale", "tiny",
                     "--results", str(results), "--device", next(LABELS), "--k", "10",
                     "--measurements", str(measurements), "--vocab-size", str(VOCAB), *extra])


def refusal(capture: pytest.CaptureFixture[str]) -> str:
    """The one error line of a refused command (and nothing that looks like a traceback or a
    panic)."""
    err = capture.readouterr().err
    assert "Traceback" not in err and "panicked" not in err
    lines = [line for line in err.splitlines() if line.startswith("hwgptbench adapt: error:")]
    assert len(lines) == 1, err
    return lines[0]


def at_row(column: str, row: int, value: object) -> Callable[[pl.DataFrame], pl.DataFrame]:
    """A mutation setting one cell."""
    def mutate(table: pl.DataFrame) -> pl.DataFrame:
        return table.with_columns(pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value))
                                  .otherwise(pl.col(column)).alias(column))
    return mutate


BAD = {
    "nan latency": (at_row("latency_ms", 3, float("nan")), "column latency_ms, row 3",
                    "not a finite number"),
    "inf latency": (at_row("latency_ms", 4, float("inf")), "column latency_ms, row 4",
                    "not a finite number"),
    "huge latency": (at_row("latency_ms", 5, 1e308), "column latency_ms, row 5",
                     "outside [0.001, 3.6e+06] ms"),
    "tiny latency": (at_row("latency_ms", 6, 1e-320), "column latency_ms, row 6",
                     "outside [0.001, 3.6e+06] ms"),
    "negative latency": (at_row("latency_ms", 0, -1.0), "column latency_ms, row 0", "outside"),
    "zero energy": (at_row("energy_mj", 2, 0.0), "column energy_mj, row 2",
                    "outside [0.001, 3.6e+10] mJ"),
    "huge memory": (lambda t: t.with_columns(memory_peak_mb=pl.lit(1e9)),
                    "column memory_peak_mb, row 0", "outside [0.001, 1e+08] MB"),
    "string batch_size": (lambda t: t.with_columns(pl.col("batch_size").cast(pl.String)),
                          "column batch_size holds String, not integers", "measure stage"),
    "fractional batch_size": (lambda t: t.with_columns(pl.col("batch_size") * 1.5),
                              "column batch_size, row 0", "not a whole number"),
    "batch_size 0": (at_row("batch_size", 7, 0), "column batch_size, row 7",
                     "not in [1, 1048576]"),
    "seq_len over block_size": (at_row("seq_len", 1, 4096), "column seq_len, row 1",
                                "block_size of space 'tiny'"),
    "bad dtype": (at_row("dtype", 8, "fp64"), "column dtype, row 8", "not one of fp32"),
    "bad launch": (at_row("launch", 9, "jit"), "column launch, row 9", "not one of eager"),
    "numeric dtype": (lambda t: t.with_columns(dtype=pl.lit(32)), "column dtype holds Int32",
                      "not text"),
    "string latency": (lambda t: t.with_columns(pl.col("latency_ms").cast(pl.String)),
                       "column latency_ms holds String, not numbers", "measure stage"),
    "no arch_id": (lambda t: t.drop("arch_id"), "no column arch_id", "this table needs"),
    "no seq_len": (lambda t: t.drop("seq_len"), "no column seq_len", "this table needs"),
    "no metric": (lambda t: t.drop("latency_ms", "energy_mj", "memory_peak_mb"),
                  "no column a metric", "latency_ms"),
    "null arch_id": (at_row("arch_id", 2, None), "column arch_id, row 2", "missing"),
    "bad arch id": (at_row("arch_id", 3, "e1-l1"), "column arch_id, row 3",
                    "not an arch of space 'tiny'"),
    "arch outside the space": (at_row("arch_id", 4, "e4096-l1-h4-r2-b1"),
                               "column arch_id, row 4", "not in choices"),
    "decode without gen_len": (lambda t: t.with_columns(workload=pl.lit("decode")),
                               "row 0 (counting from 0): its condition", "gen_len"),
    "numeric status": (lambda t: t.with_columns(status=pl.lit(1)), "column status holds",
                       "not text"),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_adapt_refuses_a_bad_measurements_table(
        case: str, new_device: pl.DataFrame, results: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    mutate, where, problem = BAD[case]
    path = tmp_path / "new.parquet"
    mutate(new_device.with_columns(memory_peak_mb=pl.lit(120.5), energy_mj=pl.lit(3.0))
           ).write_parquet(path)
    assert adapt(results, path) == 2
    line = refusal(capsys)
    assert line.startswith(f"hwgptbench adapt: error: --measurements {path}: ")
    assert where in line and problem in line, line


@pytest.mark.parametrize("content", [b"not a parquet file", b"PAR1" + b"\0" * 64 + b"PAR1",
                                     b""], ids=["text", "empty-parquet-shell", "empty"])
def test_adapt_refuses_a_file_that_is_not_parquet(
        content: bytes, results: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "new.parquet"
    path.write_bytes(content)
    assert adapt(results, path) == 2
    line = refusal(capsys)
    assert str(path) in line and "cannot be read as a parquet table" in line


def test_a_page_header_that_would_abort_polars_is_refused(
        results: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    """A data page whose header counts -1 values: polars' reader asks for 2^61 bytes and
    aborts the process; the table is read by pyarrow's, which refuses it."""
    buffer = io.BytesIO()
    pq.write_table(pa.table({"latency_ms": [float(i) for i in range(1, 11)]}), buffer,
                   compression="none", use_dictionary=False, write_statistics=False,
                   data_page_version="1.0")
    data = bytearray(buffer.getvalue())
    header = data.index(b"\x2c\x15", 4) + 2  # the data page header's num_values
    assert data[header] == 20  # 10, zigzag-encoded
    data[header] = 1  # -1
    path = tmp_path / "new.parquet"
    path.write_bytes(bytes(data))
    assert adapt(results, path) == 2
    line = refusal(capfd)
    assert f"{path} cannot be read as a parquet table (" in line and "negative" in line


def test_text_that_is_not_utf8_or_a_folder_is_refused(
        new_device: pl.DataFrame, results: Path, tmp_path: Path,
        capfd: pytest.CaptureFixture[str]) -> None:
    """A string column whose bytes are not UTF-8 (polars panics on reading such a value), and a
    folder given as the table."""
    path = tmp_path / "latin.parquet"
    new_device.write_parquet(path, compression="uncompressed")
    data = path.read_bytes()
    assert b"gpu-b" in data
    path.write_bytes(data.replace(b"gpu-b", b"gpu\xffb"))
    assert adapt(results, path) == 2
    assert f"--measurements {path} cannot be read as a parquet table (" in refusal(capfd)
    assert adapt(results, tmp_path) == 2
    assert f"--measurements {tmp_path} is not a regular file: give a parquet" in refusal(capfd)


def test_adapt_refuses_bad_sources_and_k(new_device: pl.DataFrame, results: Path,
                                         tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "new.parquet"
    new_device.write_parquet(path)
    sources = tmp_path / "sources.parquet"
    new_device.drop("device").with_columns(latency_ms=pl.lit(-1.0)).write_parquet(sources)
    assert adapt(results, path, "--sources", str(sources)) == 2
    assert f"--sources {sources}: no column device; this table needs" in refusal(capsys)
    new_device.with_columns(latency_ms=pl.lit(-1.0)).write_parquet(sources)
    assert adapt(results, path, "--sources", str(sources)) == 2
    assert f"--sources {sources}: column latency_ms, row 0" in refusal(capsys)
    with pytest.raises(SystemExit) as exit_:
        adapt(results, path, "--k", "1")
    assert exit_.value.code == 2
    assert "argument --k: 1 is not in [2, " in refusal(capsys)


def test_lossless_casts_and_the_bounds_are_accepted(new_device: pl.DataFrame) -> None:
    lossless = new_device.with_columns(
        pl.col("batch_size").cast(pl.Float64), pl.col("seq_len").cast(pl.UInt16),
        pl.col("dtype").cast(pl.Categorical), pl.col("latency_ms").cast(pl.Float32),
        energy_mj=pl.lit(None), status=pl.lit(None, pl.String))
    lossless = at_row("latency_ms", 0, 1e-3)(at_row("latency_ms", 1, 3.6e6)(lossless))
    checked = check_measurements(lossless, SPACE, "table")
    assert checked.schema["batch_size"] == pl.Int64 and checked.schema["seq_len"] == pl.Int64
    assert checked.schema["dtype"] == pl.String and checked.schema["energy_mj"] == pl.Float64
    assert checked["latency_ms"].head(2).to_list() == [pytest.approx(1e-3), 3.6e6]
    assert checked["batch_size"].to_list() == new_device["batch_size"].to_list()
    with pytest.raises(MeasurementsFileError, match=r"row 0 .*: 0\.000999\d* is outside"):
        check_measurements(at_row("latency_ms", 0, 0.999e-3)(lossless), SPACE, "table")


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_shipped_device_tables_are_valid(path: Path) -> None:
    table = pl.read_parquet(path)
    checked = read_measurements(path, S_SPACE)
    assert checked.shape == table.shape
    assert checked.select("arch_id", "latency_ms").equals(table.select("arch_id", "latency_ms"))


COLUMNS = ["arch_id", "batch_size", "seq_len", "dtype", "launch", "status", "latency_ms",
           "energy_mj", "memory_peak_mb", "device", "workload", "gen_len", "compile"]
VALUES = [float("nan"), float("inf"), -float("inf"), 1e308, 1e-320, -1.0, 0.0, 2**63 - 1, -5,
          1.5, "", "fp32", "x" * 300, True, None]
TYPES = [pl.String, pl.Int8, pl.UInt64, pl.Float32, pl.Boolean, pl.Categorical,
         pl.List(pl.Int64), pl.Date]


def mutation() -> st.SearchStrategy[Callable[[pl.DataFrame], pl.DataFrame]]:
    """One change to a valid table: a cell set to an odd value, a column cast (or nulled), a
    column dropped."""
    column = st.sampled_from(COLUMNS)

    def cast(name: str, dtype: pl.DataType) -> Callable[[pl.DataFrame], pl.DataFrame]:
        return lambda t: t.with_columns(pl.col(name).cast(dtype, strict=False))

    return st.one_of(
        st.builds(lambda c, r, v: lambda t: at_row(c, r, v)(t) if c in t.columns else t,
                  column, st.integers(0, 301), st.sampled_from(VALUES)),
        st.builds(lambda c, d: lambda t: cast(c, d)(t) if c in t.columns else t,
                  column, st.sampled_from(TYPES)),
        st.builds(lambda c: lambda t: t.drop(c, strict=False), column))


def changed(table: pl.DataFrame, changes: list[Callable[[pl.DataFrame], pl.DataFrame]]
            ) -> pl.DataFrame:
    """table with each change that polars can make (a value of another type than its column's
    may not be)."""
    for change in changes:
        try:
            table = change(table)
        except pl.exceptions.PolarsError:
            continue
    return table


def with_garbage(data: bytes, draw: st.DataObject) -> bytes:
    """The parquet bytes truncated or with a run of bytes overwritten, or as they are."""
    how = draw.draw(st.sampled_from(["keep", "truncate", "overwrite"]))
    if how == "truncate":
        return data[:draw.draw(st.integers(0, len(data) - 1))]
    if how == "overwrite":
        start = draw.draw(st.integers(0, len(data) - 1))
        junk = draw.draw(st.binary(min_size=1, max_size=16))
        return data[:start] + junk + data[start + len(junk):]
    return data


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(mutation(), min_size=1, max_size=3), data=st.data())
def test_fuzzed_device_tables_are_accepted_or_refused_in_one_message(
        changes: list[Callable[[pl.DataFrame], pl.DataFrame]], data: st.DataObject,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    """A shipped device table changed at random is read or refused with a UserError: never
    another exception (polars' panics on corrupt bytes included)."""
    table = changed(pl.read_parquet(SHIPPED[0]), changes)
    buffer = io.BytesIO()
    table.write_parquet(buffer)
    path = tmp_path_factory.mktemp("fuzz") / "device.parquet"
    path.write_bytes(with_garbage(buffer.getvalue(), data))
    try:
        checked = read_measurements(path, S_SPACE)
    except UserError as err:
        assert str(path) in str(err) and "\n" not in str(err)
        return
    assert checked.schema["batch_size"] == pl.Int64 and checked.schema["arch_id"] == pl.String


@settings(max_examples=15, deadline=None, suppress_health_check=[
    HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(changes=st.lists(mutation(), min_size=1, max_size=2), data=st.data())
def test_fuzzed_tables_through_the_adapt_command(
        changes: list[Callable[[pl.DataFrame], pl.DataFrame]], data: st.DataObject,
        new_device: pl.DataFrame, results: Path, tmp_path_factory: pytest.TempPathFactory,
        capfd: pytest.CaptureFixture[str]) -> None:
    """The command on a changed table: exit 0, or exit 2 with one message."""
    buffer = io.BytesIO()
    changed(new_device, changes).write_parquet(buffer)
    path = tmp_path_factory.mktemp("fuzz") / "new.parquet"
    path.write_bytes(with_garbage(buffer.getvalue(), data))
    code = adapt(results, path)
    if code == 0:
        capfd.readouterr()
        return
    assert code == 2
    refusal(capfd)
