"""ship-tables and publish-device: names from data never become paths, and the shipped
tables refuse bad data (docs/security.md, "Names are data too").

Every test ships into a copy of the package's tables (never into src/hwgptbench/published/)
and checks that nothing appears outside the folder shipped into."""

from __future__ import annotations

import json
import math
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hwgptbench import layout, published
from hwgptbench.cli import main
from hwgptbench.errors import UserError
from hwgptbench.outputs import MARKER, OutputPathError, marker
from hwgptbench.pipeline.remote import publish_device

SPACE = published.space("s")
VOCAB = published.vocab_size("s")
CPU = "cpu-amd-epyc-1t"
HOSTILE_LABELS = ["../../../outside", "..", ".", "", "a/b", "x;touch MARKER", "A-upper",
                  "-x", "x\n", "x\\y", "$(touch MARKER)"]


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def _copy_shipped(dest: Path) -> Path:
    """A copy of the package's shipped tables (manifest, marker, tables; no code)."""
    shutil.copytree(published.FOLDER, dest, ignore=shutil.ignore_patterns("*.py",
                                                                          "__pycache__"))
    return dest


def _device_table(rows: int = 30) -> pl.DataFrame:
    return pl.read_parquet(published.FOLDER / published.device_file("s", CPU)).head(rows)


@pytest.fixture
def box(tmp_path: Path) -> Path:
    """tmp_path/box: the tree around the folder shipped into (box/a/b/published)."""
    root = tmp_path / "box"
    _copy_shipped(root / "a" / "b" / "published")
    return root


def _folder(box: Path) -> Path:
    return box / "a" / "b" / "published"


def _ship_device(box: Path, table: pl.DataFrame, **kwargs: Any) -> dict[str, Any]:
    source = box / "input.parquet"
    table.write_parquet(source)
    return published.ship("s", SPACE, VOCAB, None, [source], folder=_folder(box), **kwargs)


# -- labels and scales are checked before they become part of a path ------------------------

@pytest.mark.parametrize("label", [*HOSTILE_LABELS, "/ABSOLUTE/outside"])
def test_a_device_label_that_is_not_a_slug_is_refused(box: Path, label: str) -> None:
    label = label.replace("/ABSOLUTE", str(box))
    before = _files(box)
    with pytest.raises(published.PublishedTablesError, match="not a device label"):
        _ship_device(box, _device_table().with_columns(device=pl.lit(label)))
    assert _files(box) - before == {box / "input.parquet"}


@pytest.mark.parametrize("scale", ["../s", "s/x", "", "s;x", "/tmp"])
def test_a_scale_that_is_not_a_name_is_refused(box: Path, scale: str) -> None:
    before = _files(box)
    with pytest.raises(published.PublishedTablesError, match="not a scale name"):
        published.ship(scale, SPACE, VOCAB, None, folder=_folder(box))
    assert _files(box) == before


@pytest.mark.parametrize(("where", "value"), [
    (("scales", "s", "devices", CPU, "file"), "s/devices/../../../../victim.parquet"),
    (("scales", "s", "devices", CPU, "file"), "/ABSOLUTE/victim.parquet"),
    (("scales", "s", "devices", CPU, "file"), "s\\devices\\cpu-amd-epyc-1t.parquet"),
    (("scales", "s", "devices", CPU, "file"), "s/devices/cuda-nvidia-h100-80gb-hbm3.parquet"),
    (("scales", "s", "perplexity", "file"), "s/./perplexity.parquet"),
    (("scales", "s", "devices", CPU, "sha256"), 12),
    (("scales", "s", "devices", CPU, "sha256"), "not-a-digest"),
    (("scales", "s", "devices", CPU, "rows"), "30"),
    (("scales", "s", "devices", CPU, "rows"), True),
    (("scales", "s", "devices", CPU), "s/devices/x.parquet"),
    (("scales", "s", "devices"), []),
    (("scales", "s", "vocab_size"), None),
    (("scales", "s", "space"), "s"),
    (("scales", "s"), 1),
])
def test_a_manifest_with_a_bad_entry_is_refused(box: Path, where: tuple[str, ...],
                                                value: Any) -> None:
    folder = _folder(box)
    victim = box / "victim.parquet"
    victim.write_bytes(b"yours")
    document = json.loads((folder / published.MANIFEST).read_text())
    parent = document
    for key in where[:-1]:
        parent = parent[key]
    parent[where[-1]] = (value.replace("/ABSOLUTE", str(box)) if isinstance(value, str)
                         else value)
    (folder / published.MANIFEST).write_text(json.dumps(document))
    for read in (published.scales, lambda f: published.ship("s", SPACE, VOCAB, None,
                                                            folder=f, replace_devices=True)):
        with pytest.raises(published.PublishedTablesError, match="manifest.json"):
            read(folder)
    assert victim.read_bytes() == b"yours"


@pytest.mark.parametrize("key", ["../../victim", "x;touch MARKER", "/ABSOLUTE/victim"])
def test_a_manifest_device_key_that_is_not_a_label_is_refused(box: Path, key: str) -> None:
    folder = _folder(box)
    key = key.replace("/ABSOLUTE", str(box))
    victim = box / "victim.parquet"
    victim.write_bytes(b"yours")
    document = json.loads((folder / published.MANIFEST).read_text())
    devices = document["scales"]["s"]["devices"]
    devices[key] = {**devices[CPU], "file": f"s/devices/{key}.parquet"}
    (folder / published.MANIFEST).write_text(json.dumps(document))
    with pytest.raises(published.PublishedTablesError, match="not a device label"):
        published.ship("s", SPACE, VOCAB, None, folder=folder, replace_devices=True)
    assert victim.read_bytes() == b"yours"


def test_replace_devices_deletes_only_its_own_files(box: Path) -> None:
    """A listed table whose folder is a link out of the shipped folder is not deleted (nor
    written through): the ship is refused before anything changes."""
    folder = _folder(box)
    outside = box / "elsewhere"
    shutil.move(folder / "s" / "devices", outside)
    (folder / "s" / "devices").symlink_to(outside, target_is_directory=True)
    before = {p: p.read_bytes() for p in outside.iterdir()}
    with pytest.raises(published.PublishedTablesError, match="symbolic link"):
        published.ship("s", SPACE, VOCAB, None, folder=folder, replace_devices=True)
    assert {p: p.read_bytes() for p in outside.iterdir()} == before


def test_replace_devices_drops_the_devices_not_given(box: Path) -> None:
    folder = _folder(box)
    record = _ship_device(box, _device_table(), replace_devices=True)
    assert list(record["devices"]) == [CPU]
    assert sorted(p.name for p in (folder / "s" / "devices").iterdir()) == [f"{CPU}.parquet"]
    assert published.device_tables("s", folder)[CPU].equals(_device_table())


# -- anything that is not a table is refused with one message --------------------------------

@pytest.mark.parametrize("content", [b"", b"garbage", b"PAR1" + b"\0" * 40 + b"PAR1"])
def test_a_file_that_is_not_parquet_is_refused(box: Path, content: bytes) -> None:
    source = box / "bad.parquet"
    source.write_bytes(content)
    for devices, perplexity in (([source], None), ([], source)):
        with pytest.raises(published.PublishedTablesError, match="cannot be read as a parquet"):
            published.ship("s", SPACE, VOCAB, perplexity, devices, folder=_folder(box))


def test_a_truncated_table_is_refused(box: Path) -> None:
    source = box / "cut.parquet"
    _device_table().write_parquet(source)
    source.write_bytes(source.read_bytes()[:-100])
    with pytest.raises(published.PublishedTablesError, match="cannot be read"):
        published.ship("s", SPACE, VOCAB, None, [source], folder=_folder(box))


def test_text_that_is_not_utf8_is_refused(box: Path) -> None:
    """A string column whose bytes are not UTF-8 (polars panics on reading such a value)."""
    source = box / "latin.parquet"
    _device_table().write_parquet(source, compression="uncompressed")
    data = source.read_bytes()
    assert data.count(b"AMD EPYC") >= 1
    source.write_bytes(data.replace(b"AMD EPYC", b"AMD \xffPYC"))
    with pytest.raises(published.PublishedTablesError, match="cannot be read as a parquet"):
        published.ship("s", SPACE, VOCAB, None, [source], folder=_folder(box))


@pytest.mark.parametrize("content", [b"\xff\xfe{}", b"{\"scales\": {\"s\": \"\xe9\"}}",
                                     b"[" * 100_000, b"\0\0\0"])
def test_a_manifest_that_is_not_json_text_is_refused(box: Path, content: bytes) -> None:
    (_folder(box) / published.MANIFEST).write_bytes(content)
    with pytest.raises(published.PublishedTablesError, match="manifest.json"):
        published.scales(_folder(box))


# -- the data: types, values, ranges ---------------------------------------------------------

NAN, INF = float("nan"), float("inf")
DEVICE_FAULTS: list[tuple[str, Callable[[pl.DataFrame], pl.DataFrame], str]] = [
    ("all-NaN latency", lambda t: t.with_columns(latency_ms=pl.lit(NAN)), "latency_ms"),
    ("inf energy", lambda t: t.with_columns(energy_mj=pl.lit(INF)), "energy_mj"),
    ("NaN elsewhere", lambda t: t.with_columns(latency_std_ms=pl.lit(NAN)), "latency_std_ms"),
    ("latency of a year", lambda t: t.with_columns(latency_ms=pl.lit(3.2e10)), "latency_ms"),
    ("zero latency", lambda t: t.with_columns(latency_ms=pl.lit(0.0)), "latency_ms"),
    ("negative energy", lambda t: t.with_columns(energy_mj=pl.lit(-1.0)), "energy_mj"),
    ("petabytes", lambda t: t.with_columns(memory_peak_mb=pl.lit(1e12)), "memory_peak_mb"),
    ("ok without latency", lambda t: t.with_columns(latency_ms=pl.lit(None, pl.Float64)),
     "latency_ms"),
    ("latency as text", lambda t: t.with_columns(pl.col("latency_ms").cast(pl.String)),
     "latency_ms"),
    ("batch as float", lambda t: t.with_columns(pl.col("batch_size").cast(pl.Float64)),
     "batch_size"),
    ("batch of 0", lambda t: t.with_columns(batch_size=pl.lit(0, pl.Int64)), "batch_size"),
    ("negative length", lambda t: t.with_columns(seq_len=pl.lit(-128, pl.Int64)), "seq_len"),
    ("no latency", lambda t: t.drop("latency_ms"), "latency_ms"),
    ("no status", lambda t: t.drop("status"), "status"),
    ("null status", lambda t: t.with_columns(status=pl.lit(None, pl.String)), "status"),
    ("bad arch", lambda t: t.with_columns(arch_id=pl.lit("e1-l1")), "arch_id"),
    ("arch of another space", lambda t: t.with_columns(
        arch_id=pl.lit("e999-l1-h4-r2-b0")), "arch_id"),
    ("unknown dtype", lambda t: t.with_columns(dtype=pl.lit("fp8")), "dtype"),
    ("duplicate rows", lambda t: pl.concat([t, t.head(1)]), "arch_id"),
    ("cores as text", lambda t: t.with_columns(pl.col("cpu_cores_logical").cast(pl.String)),
     "cpu_cores_logical"),
    ("no rows", lambda t: t.head(0), "rows"),
]


@pytest.mark.parametrize(("fault", "column"), [(f, c) for _, f, c in DEVICE_FAULTS],
                         ids=[name for name, _, _ in DEVICE_FAULTS])
def test_a_device_table_with_bad_data_is_refused(
        box: Path, fault: Callable[[pl.DataFrame], pl.DataFrame], column: str) -> None:
    folder = _folder(box)
    manifest = (folder / published.MANIFEST).read_bytes()
    with pytest.raises(published.PublishedTablesError) as refused:
        _ship_device(box, fault(_device_table()))
    assert "input.parquet" in str(refused.value) and column in str(refused.value)
    assert (folder / published.MANIFEST).read_bytes() == manifest


def test_the_error_names_the_file_column_first_row_and_fix(box: Path) -> None:
    table = _device_table().with_columns(
        latency_ms=pl.when(pl.int_range(pl.len()) >= 7).then(NAN).otherwise(pl.col("latency_ms")))
    with pytest.raises(published.PublishedTablesError) as refused:
        _ship_device(box, table)
    message = str(refused.value)
    assert f"{box / 'input.parquet'}: column 'latency_ms', row 7 (nan)" in message
    assert "hwgptbench measure" in message


def test_failed_rows_need_no_latency(box: Path) -> None:
    """A row whose status is not ok (an out-of-memory arch) ships with a null latency."""
    table = _device_table().with_columns(
        status=pl.when(pl.int_range(pl.len()) == 3).then(pl.lit("oom")).otherwise("status"),
        latency_ms=pl.when(pl.int_range(pl.len()) == 3).then(None).otherwise("latency_ms"))
    record = _ship_device(box, table)
    assert record["devices"][CPU]["rows"] == 30


PERPLEXITY_FAULTS: list[tuple[str, Callable[[pl.DataFrame], pl.DataFrame], str]] = [
    ("NaN perplexity", lambda t: t.with_columns(perplexity=pl.lit(NAN)), "perplexity"),
    ("perplexity below 1", lambda t: t.with_columns(perplexity=pl.lit(0.5)), "perplexity"),
    ("accuracy in percent", lambda t: t.with_columns(accuracy=pl.lit(41.0)), "accuracy"),
    ("negative accuracy", lambda t: t.with_columns(accuracy=pl.lit(-0.1)), "accuracy"),
    ("inf loss", lambda t: t.with_columns(val_loss=pl.lit(INF)), "val_loss"),
    ("params as float", lambda t: t.with_columns(pl.col("params").cast(pl.Float64)), "params"),
    ("no source", lambda t: t.drop("source"), "source"),
    ("null arch", lambda t: t.with_columns(arch_id=pl.lit(None, pl.String)), "arch_id"),
    ("arch twice", lambda t: pl.concat([t, t.head(1)]), "arch_id"),
    ("arch of l", lambda t: t.with_columns(
        arch_id=pl.lit(published.perplexity_table("l")["arch_id"][0])), "arch_id"),
]


@pytest.mark.parametrize(("fault", "column"), [(f, c) for _, f, c in PERPLEXITY_FAULTS],
                         ids=[name for name, _, _ in PERPLEXITY_FAULTS])
def test_a_perplexity_table_with_bad_data_is_refused(
        box: Path, fault: Callable[[pl.DataFrame], pl.DataFrame], column: str) -> None:
    source = box / "perplexity.parquet"
    fault(published.perplexity_table("s").head(40)).write_parquet(source)
    with pytest.raises(published.PublishedTablesError, match=column):
        published.ship("s", SPACE, VOCAB, source, folder=_folder(box))


@pytest.mark.parametrize("scale", ["s", "m", "l"])
def test_every_shipped_table_passes_the_checks(scale: str) -> None:
    """The tables in the package pass the checks that ship() applies."""
    entry = published.entry(scale)
    space = published.space(scale)
    folder = published.FOLDER
    published.check_perplexity_table(published.perplexity_table(scale),
                                     folder / entry["perplexity"]["file"], space)
    for label, table in published.device_tables(scale).items():
        assert published.check_device_table(
            table, folder / entry["devices"][label]["file"], space) == label


# -- the folder shipped into -----------------------------------------------------------------

def test_the_package_folder_carries_the_ship_tables_marker() -> None:
    text = (published.FOLDER / MARKER).read_text()
    assert text == json.dumps(marker("ship-tables"), sort_keys=True) + "\n"


def test_ship_refuses_a_folder_of_other_files(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    source = tmp_path / "perplexity.parquet"
    published.perplexity_table("s").head(20).write_parquet(source)
    with pytest.raises(OutputPathError, match="--folder"):
        published.ship("s", SPACE, VOCAB, source, folder=folder)
    assert [p.name for p in folder.iterdir()] == ["notes.txt"]
    new = tmp_path / "new"
    published.ship("s", SPACE, VOCAB, source, folder=new)
    document = json.loads((new / MARKER).read_text())
    assert {**document, "version": 1, "files": None} == {**marker("ship-tables"), "files": None}
    assert document["files"] == sorted(p.relative_to(new).as_posix() for p in new.rglob("*")
                                       if p.is_file() and p.name != MARKER)
    published.ship("s", SPACE, VOCAB, None, folder=new)  # its own folder: shipped into again


# -- publish-device --------------------------------------------------------------------------

@pytest.mark.parametrize(("scale", "label"), [("s", "../../x"), ("s", "/tmp/x"),
                                              ("s", "x;touch MARKER"), ("../s", CPU)])
def test_publish_device_checks_names_before_any_path(tmp_path: Path, scale: str,
                                                     label: str) -> None:
    results = tmp_path / "results"
    (results / "s" / "measure").mkdir(parents=True)
    before = _files(tmp_path)
    with pytest.raises(UserError, match="not a (device label|scale name)"):
        publish_device(scale, label, results, folder=tmp_path / "devices", push=False)
    assert _files(tmp_path) == before


def test_publish_device_refuses_a_table_that_is_not_parquet(tmp_path: Path) -> None:
    table = tmp_path / "results" / "s" / "measure" / f"{CPU}.parquet"
    table.parent.mkdir(parents=True)
    table.write_bytes(b"not parquet")
    with pytest.raises(UserError, match="cannot be read as a parquet table"):
        publish_device("s", CPU, tmp_path / "results", folder=tmp_path / "devices", push=False)
    assert not (tmp_path / "devices").exists()


def test_cli_refuses_hostile_names_and_tables_with_one_message(
        tmp_path: Path, box: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """publish-device --device ../../x and ship-tables of a non-parquet table: exit 2, one
    line, no traceback, nothing written."""
    params = str(Path(__file__).resolve().parents[1] / "params.yaml")
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    bad = tmp_path / "bad.parquet"
    bad.write_bytes(b"not parquet")
    before = _files(tmp_path)
    runs = [
        (["publish-device", "--scale", "s", "--device", "../../x", "--no-push",
          "--params", params], "not a device label"),
        (["ship-tables", "--scale", "s", "--device", str(bad), "--folder", str(_folder(box)),
          "--params", params], "cannot be read as a parquet table"),
    ]
    for args, expected in runs:
        assert main(args) == 2
        error = capsys.readouterr().err
        assert error.startswith(f"hwgptbench {args[0]}: error: ") and expected in error
    assert _files(tmp_path) == before


# -- fuzz: whatever the table or manifest, a refusal or a correct ship -----------------------

FLOAT_COLUMNS = ["latency_ms", "energy_mj", "memory_peak_mb", "memory_weights_mb",
                 "latency_std_ms", "latency_repeat_ms", "memory_gb"]
ODD_FLOATS = st.sampled_from([NAN, INF, -INF, 1e308, -1.0, 0.0, 5e-324]) | st.floats()
LABELS = st.sampled_from([*HOSTILE_LABELS, "{root}/abs", "cpu-x", "ok-label"]) | st.text(
    max_size=12)


def _table_mutation() -> st.SearchStrategy[tuple[str, Any, Any]]:
    return st.one_of(
        st.tuples(st.just("label"), LABELS, st.none()),
        st.tuples(st.just("value"), st.sampled_from(FLOAT_COLUMNS),
                  st.tuples(st.integers(0, 29), ODD_FLOATS)),
        st.tuples(st.just("cast"), st.sampled_from(["latency_ms", "batch_size", "seq_len",
                                                    "energy_mj", "threads"]),
                  st.sampled_from([pl.String, pl.Float32, pl.Int8, pl.Boolean, pl.Binary])),
        st.tuples(st.just("cast"), st.sampled_from(["arch_id", "device", "status",
                                                    "cpu_model"]),
                  st.sampled_from([pl.Float32, pl.Int8, pl.Binary])),
        st.tuples(st.just("drop"), st.sampled_from(["latency_ms", "device", "arch_id",
                                                    "batch_size", "energy_mj", "dtype",
                                                    "cpu_model", "memory_peak_mb"]), st.none()),
        st.tuples(st.just("null"), st.sampled_from(["latency_ms", "device", "arch_id",
                                                    "seq_len", "launch", "status"]),
                  st.integers(0, 29)),
        st.tuples(st.just("arch"), st.text(max_size=30) | st.from_regex(
            r"e[0-9]{1,4}-l[0-9]{1,2}-h[0-9_]{1,8}-r[0-9_]{1,8}-b[01]", fullmatch=True),
                  st.integers(0, 29)),
        st.tuples(st.just("bytes"), st.binary(max_size=300), st.none()),
        st.tuples(st.just("truncate"), st.integers(0, 10_000), st.none()),
        st.tuples(st.just("flip"), st.integers(0, 10_000), st.integers(1, 255)),
    )


def _manifest_mutation() -> st.SearchStrategy[tuple[str, Any, Any]]:
    paths = st.sampled_from([("s", "devices", CPU, "file"), ("s", "perplexity", "file"),
                             ("s", "devices", CPU, "sha256"), ("s", "devices", CPU, "rows"),
                             ("s", "devices", CPU), ("s", "devices"), ("s", "space"),
                             ("s", "vocab_size"), ("s",)])
    values = (st.none() | st.booleans() | st.integers() | ODD_FLOATS | LABELS
              | st.sampled_from(["s/devices/../../victim.parquet", "{root}/victim.parquet",
                                 "s/devices/x.parquet", "s//perplexity.parquet",
                                 f"s/devices/{CPU}.parquet", "s/perplexity.parquet"])
              | st.lists(st.integers(), max_size=2) | st.dictionaries(LABELS, st.none(),
                                                                      max_size=2))
    return st.one_of(st.tuples(st.just("keep"), st.none(), st.none()),
                     st.tuples(st.just("set"), paths, values),
                     st.tuples(st.just("key"), LABELS, st.none()),
                     st.tuples(st.just("bytes"), st.binary(max_size=200), st.none()),
                     st.tuples(st.just("latin1"), st.none(), st.none()))


def _mutate_table(table: pl.DataFrame, source: Path, root: Path,
                  mutation: tuple[str, Any, Any]) -> None:
    kind, what, how = mutation
    if kind == "label":
        table = table.with_columns(device=pl.lit(what.replace("{root}", str(root))))
    elif kind == "value":
        row, value = how
        table = table.with_columns(pl.when(pl.int_range(pl.len()) == row).then(pl.lit(value))
                                   .otherwise(pl.col(what)).alias(what))
    elif kind == "cast":
        table = table.with_columns(pl.col(what).cast(how, strict=False))
    elif kind == "drop":
        table = table.drop(what)
    elif kind in ("null", "arch"):
        column, value = ("arch_id", what) if kind == "arch" else (what, None)
        table = table.with_columns(pl.when(pl.int_range(pl.len()) == how).then(pl.lit(value))
                                   .otherwise(pl.col(column)).alias(column))
    table.write_parquet(source)
    data = source.read_bytes()
    if kind == "bytes":
        source.write_bytes(what)
    elif kind == "truncate":
        source.write_bytes(data[:what % len(data)])
    elif kind == "flip":
        at = what % len(data)
        source.write_bytes(data[:at] + bytes([data[at] ^ how]) + data[at + 1:])


def _mutate_manifest(path: Path, root: Path, mutation: tuple[str, Any, Any]) -> None:
    kind, what, how = mutation
    document = json.loads(path.read_text())
    if kind == "set":
        parent = document["scales"]
        for key in what[:-1]:
            parent = parent[key]
        parent[what[-1]] = how.replace("{root}", str(root)) if isinstance(how, str) else how
    elif kind == "key":
        devices = document["scales"]["s"]["devices"]
        devices[what.replace("{root}", str(root))] = devices.pop(CPU)
    if kind == "bytes":
        path.write_bytes(what)
    elif kind == "latin1":
        path.write_bytes(json.dumps(document, ensure_ascii=False).replace(
            "Processor", "Prozessor\u00e9").encode("latin-1"))
    else:
        path.write_text(json.dumps(document, allow_nan=True))


def _ship_or_refuse(root: Path, folder: Path, source: Path, replace: bool) -> None:
    """ship() ends in a UserError or a correct ship, and writes nothing outside folder."""
    outside = _files(root) - _files(folder)
    try:
        record = published.ship("s", SPACE, VOCAB, None, [source], folder=folder,
                                replace_devices=replace)
    except UserError as err:
        event(f"refused: {type(err).__name__}")
    else:
        event("shipped")
        shipped = published.device_tables("s", folder)
        assert set(shipped) == set(record["devices"])
        for label, table in shipped.items():
            path = folder / published.device_file("s", label)
            assert layout.DEVICE_LABEL.fullmatch(label) and path.is_file()
            assert published.check_device_table(table, path, SPACE) == label
    assert _files(root) - _files(folder) == outside


@settings(max_examples=120, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_table_mutation(), st.booleans())
def test_fuzzed_device_tables_are_shipped_or_refused(mutation: tuple[str, Any, Any],
                                                     replace: bool) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        folder = _copy_shipped(root / "a" / "b" / "c" / "published")
        source = root / "input" / "table.parquet"
        source.parent.mkdir()
        _mutate_table(_device_table(), source, root, mutation)
        _ship_or_refuse(root, folder, source, replace)


@settings(max_examples=80, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_manifest_mutation(), st.booleans())
def test_fuzzed_manifests_are_used_or_refused(mutation: tuple[str, Any, Any],
                                              replace: bool) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        folder = _copy_shipped(root / "a" / "b" / "c" / "published")
        (root / "victim.parquet").write_bytes(b"yours")
        _mutate_manifest(folder / published.MANIFEST, root, mutation)
        source = root / "input" / "table.parquet"
        source.parent.mkdir()
        _device_table().write_parquet(source)
        _ship_or_refuse(root, folder, source, replace)
        assert (root / "victim.parquet").read_bytes() == b"yours"


def test_fuzz_helpers_build_what_they_claim(tmp_path: Path) -> None:
    """The mutations above change the table and manifest as named (so a fuzz run that only
    ever shipped the unchanged table could not pass unnoticed)."""
    source = tmp_path / "t.parquet"
    _mutate_table(_device_table(), source, tmp_path, ("value", "latency_ms", (2, NAN)))
    assert math.isnan(pl.read_parquet(source)["latency_ms"][2])
    _mutate_table(_device_table(), source, tmp_path, ("label", "{root}/abs", None))
    assert pl.read_parquet(source)["device"][0] == f"{tmp_path}/abs"
    folder = _copy_shipped(tmp_path / "published")
    _mutate_manifest(folder / published.MANIFEST, tmp_path,
                     ("set", ("s", "devices", CPU, "file"), "{root}/victim.parquet"))
    document = json.loads((folder / published.MANIFEST).read_text())
    assert document["scales"]["s"]["devices"][CPU]["file"] == f"{tmp_path}/victim.parquet"


# -- a later campaign adds to a shipped table; a contended latency never ships ---------------

def test_union_adds_a_campaign_to_the_shipped_table(box: Path) -> None:
    """--union: the given rows join the device's shipped table (a given row replaces the
    shipped one of its arch and condition), and the record names both campaigns' commits."""
    folder = _folder(box)
    shipped = published.device_tables("s", folder)[CPU]
    later = shipped.head(5).with_columns(dtype=pl.lit("bf16"))  # a new condition
    again = shipped.slice(5, 2).with_columns(latency_ms=pl.col("latency_ms") * 2)  # measured anew
    old_commit = published.entry("s", folder)["devices"][CPU]["measured_by"]
    record = _ship_device(box, pl.concat([later, again]), union=True, measured_by="abc1234")
    table = published.device_tables("s", folder)[CPU]
    assert table.height == shipped.height + 5 == record["devices"][CPU]["rows"]
    assert table.filter(pl.col("dtype") == "bf16").height == 5
    doubled = table.filter(pl.col("arch_id").is_in(again["arch_id"].to_list())
                           & (pl.col("dtype") == "fp32"))
    assert sorted(doubled["latency_ms"]) == sorted(again["latency_ms"])
    assert record["devices"][CPU]["measured_by"] == f"{old_commit}, abc1234"
    replaced = _ship_device(box, later, measured_by="def5678")  # without --union: replaced
    assert replaced["devices"][CPU]["rows"] == 5


def test_a_contended_latency_is_not_shipped(box: Path) -> None:
    """A row still contended after its visits is timed again on a quiet machine first."""
    table = _device_table().with_columns(
        latency_contended=pl.int_range(pl.len()) == 4)
    with pytest.raises(published.PublishedTablesError) as refused:
        _ship_device(box, table)
    assert "column 'latency_contended', row 4" in str(refused.value)
    assert "quiet" in str(refused.value)
