"""Inputs from outside, mutated by class (hypothesis, derandomized, bounded; docs/security.md,
"Tested by class"): adapted device folders read by `hwgptbench query`, HAT's CSVs and the flags
of `hwgptbench transfer-external`, HELP's FBNet files, the markdown of `paper-docs --check`,
the resume parts of a measure campaign, ONNX graphs run by `hwgptbench evaluate` and params
overlays with YAML anchors and aliases run by `hwgptbench validate`.

Every case runs in a child process (one per module, its imports paid once; a case that kills
it shows as a negative exit status and the child is started again) and is held to the same
contract: exit status 2 with one line `hwgptbench CMD: error: ...`, or a correct answer with
exit status 0; never a signal, a traceback, a bug's exit status 1, or a write outside the
named output (the case's folder is compared file by file before and after); at most
:data:`PEAK_MB` of peak memory (VmHWM, reset before each case) and :data:`TIME_S` seconds
(times this machine's slowness, as every limit of the suite). The ``slow`` variants draw more
examples, each in a fresh ``hwgptbench`` process."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import re
import resource
import selectors
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import BIN, REPO_ROOT, slowness, tool_env
from hwgptbench import layout
from hwgptbench.metrics import UNIT_BOUNDS
from test_checked_answers import ADAPTED, CONDITION, SCALE, fitted, reseal  # noqa: F401
from test_resume_state import interrupted  # noqa: F401 (a fixture)
from test_transfer_external import _fbnet_folder, _hat_folder

PEAK_MB = 1536  # peak resident memory of one case (the child's imports included: ~0.5 GB)
TIME_S = 20.0  # seconds of one case on the reference machine (conftest.slowness)
TESTS = Path(__file__).resolve().parent
FAST = {"max_examples": 12, "deadline": None, "derandomize": True, "database": None,
        "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                  HealthCheck.data_too_large]}
SLOW = {**FAST, "max_examples": 60}

# -- the child -----------------------------------------------------------------------------------

CHILD = r'''
import json, os, sys, time, traceback
sys.path.insert(0, sys.argv[1])
from hwgptbench.cli import main

reply = os.fdopen(os.dup(1), "w")
quiet = os.open(os.devnull, os.O_WRONLY)

def peak_mb():
    with open("/proc/self/status") as status:
        return next(int(l.split()[1]) for l in status if l.startswith("VmHWM")) / 1024

for line in sys.stdin:
    case = json.loads(line)
    os.chdir(case["cwd"])
    with open(case["stdout"], "w") as out, open(case["stderr"], "w") as err:
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")  # the peak from here on
        start = time.perf_counter()
        try:
            if "argv" in case:
                code = main(case["argv"])
            else:
                exec(case["code"], {"__name__": "case", "ARGS": case.get("args")})
                code = 0
        except SystemExit as exc:  # argparse, and `sys.exit(message)` as Python exits
            code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except BaseException:
            traceback.print_exc()
            code = 99
        seconds = time.perf_counter() - start
        sys.stdout.flush(); sys.stderr.flush()
        os.dup2(quiet, 1); os.dup2(quiet, 2)
    reply.write(json.dumps({"code": code, "seconds": seconds, "peak_mb": peak_mb()}) + "\n")
    reply.flush()
'''


@dataclasses.dataclass
class Outcome:
    code: int  # the exit status; negative: the signal that ended the process
    stdout: str
    stderr: str
    seconds: float
    peak_mb: float


class Child:
    """The process that runs the cases (started again after a case that ends it)."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.process: subprocess.Popen[str] | None = None
        self.count = itertools.count()

    def _start(self) -> subprocess.Popen[str]:
        if self.process is None or self.process.poll() is not None:
            self.process = subprocess.Popen(
                [sys.executable, "-c", CHILD, str(TESTS)], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=tool_env())
        return self.process

    def run(self, cwd: Path, argv: list[str | Path] | None = None, code: str | None = None,
            args: Any = None) -> Outcome:
        process = self._start()
        n = next(self.count)
        out, err = self.logs / f"{n}.out", self.logs / f"{n}.err"
        case = {"cwd": str(cwd), "stdout": str(out), "stderr": str(err), "args": args}
        case |= {"argv": [str(a) for a in argv]} if argv is not None else {"code": code}
        assert process.stdin is not None and process.stdout is not None
        process.stdin.write(json.dumps(case) + "\n")
        process.stdin.flush()
        with selectors.DefaultSelector() as wait:
            wait.register(process.stdout, selectors.EVENT_READ)
            ready = wait.select(timeout=3 * TIME_S * slowness())
        line = process.stdout.readline() if ready else ""
        if not line:  # ended (a signal) or past three times the bound
            if process.poll() is None:
                process.kill()
            process.wait()
            self.process = None
            code_ = process.returncode if ready else -9
            return Outcome(code_, _text(out), _text(err), math.inf if not ready else 0, 0)
        report = json.loads(line)
        return Outcome(report["code"], _text(out), _text(err), report["seconds"],
                       report["peak_mb"])

    def close(self) -> None:
        if self.process is not None and self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            self.process.wait(timeout=30)


def _text(path: Path) -> str:
    return path.read_text(errors="replace") if path.exists() else ""


def fresh(argv: list[str | Path], cwd: Path) -> Outcome:
    """One case in a fresh `hwgptbench` process (the slow variants): its peak memory by
    /usr/bin/time (else the children's ru_maxrss, a bound over every child so far)."""
    timer = shutil.which("time", path="/usr/bin")
    report = Path(tempfile.mkstemp(suffix=".time")[1])
    prefix = [timer, "-q", "-f", "%M", "-o", str(report)] if timer else []
    start = time.perf_counter()
    done = subprocess.run([*prefix, str(BIN / "hwgptbench"), *map(str, argv)], cwd=cwd,
                          env=tool_env(), capture_output=True, text=True,
                          timeout=3 * TIME_S * slowness())
    seconds = time.perf_counter() - start
    code, text = done.returncode, report.read_text() if timer else ""
    report.unlink()
    if timer:
        signal_ = re.search(r"terminated by signal (\d+)", text)
        code = -int(signal_[1]) if signal_ else code
        peak_kb = float(text.split()[-1]) if text.split() else 0.0
    else:
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return Outcome(code, done.stdout, done.stderr, seconds, peak_kb / 1024)


@pytest.fixture(scope="module")
def child(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Child]:
    runner = Child(tmp_path_factory.mktemp("child-logs"))
    yield runner
    runner.close()


# -- the contract --------------------------------------------------------------------------------

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ (DEBUG|INFO|WARNING) ")


def tree(root: Path) -> dict[str, bytes]:
    """Every file (and link) under root with its content."""
    found = {}
    for path in sorted(root.rglob("*")):
        if path.is_symlink():
            found[str(path.relative_to(root))] = b"link:" + os.readlink(path).encode()
        elif path.is_file():
            found[str(path.relative_to(root))] = path.read_bytes()
        elif path.is_dir():
            found[str(path.relative_to(root)) + "/"] = b""
    return found


def held(outcome: Outcome, command: str, before: dict[str, bytes], root: Path,
         outputs: tuple[str, ...] = (), codes: tuple[int, ...] = (0, 2),
         lines: int = 1) -> None:
    """The contract of one case: no signal, an allowed exit status, no traceback, exit 2 with
    one error line (``lines``: at most that many for a command listing several problems),
    within the bounds, and nothing under root changed but ``outputs`` (paths relative to it,
    a folder with everything in it)."""
    shown = f"exit {outcome.code}\n--- stdout\n{outcome.stdout[-3000:]}\n--- stderr\n" \
            f"{outcome.stderr[-3000:]}"
    assert outcome.code >= 0, f"ended by signal {-outcome.code}: {shown}"
    assert outcome.code in codes, shown
    assert "Traceback" not in outcome.stderr, shown
    errors = [line for line in outcome.stderr.splitlines() if not LOG_LINE.match(line)]
    if outcome.code == 2:
        assert 1 <= len(errors) <= lines and errors[0].startswith(f"hwgptbench {command}: "
                                                                  "error: "), shown
    assert outcome.seconds < TIME_S * slowness(), f"{outcome.seconds:.1f} s: {shown}"
    assert outcome.peak_mb < PEAK_MB, f"peak {outcome.peak_mb:.0f} MB: {shown}"
    after = tree(root)
    changed = {p for p in set(before) | set(after) if before.get(p) != after.get(p)}
    outside = {p for p in changed
               if not any(p == o or p == o + "/" or p.startswith(o.rstrip("/") + "/")
                          for o in outputs)}
    assert not outside, f"written outside {outputs}: {sorted(outside)[:10]}\n{shown}"


class Cases:
    """A fresh folder for each example (hypothesis reuses a test's tmp_path)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path

    def new(self) -> Path:
        return Path(tempfile.mkdtemp(dir=self.tmp_path))


@pytest.fixture
def cases(tmp_path: Path) -> Cases:
    return Cases(tmp_path)


# -- mutations -----------------------------------------------------------------------------------

HOSTILE = [math.nan, math.inf, -math.inf, -1, 0, 1e308, -1e308, 2**63, 10**30, 0.5, "", "x",
           "../../x", None, True, [], {}, [[[[[[[[[[1]]]]]]]]]], "a" * 5000, {"a": [1, None]}]


def leaves(doc: Any, at: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The paths of every value of a JSON document (containers included)."""
    found = [at]
    if isinstance(doc, dict):
        for key, value in doc.items():
            found += leaves(value, (*at, key))
    elif isinstance(doc, list):
        for index, value in enumerate(doc[:20]):
            found += leaves(value, (*at, index))
    return found


@st.composite
def json_mutation(draw: st.DrawFn, text: str) -> str:
    """One hostile variant of a JSON document's text: a value replaced or removed, a key
    added, or its bytes cut."""
    kind = draw(st.sampled_from(["value", "value", "remove", "add", "cut", "type"]))
    if kind == "cut":
        return text[:draw(st.integers(0, len(text) - 1))]
    doc = json.loads(text)
    if kind == "type":
        return json.dumps(draw(st.sampled_from(HOSTILE)))
    path = draw(st.sampled_from(leaves(doc)[1:] or [()]))
    if not path:
        return json.dumps(draw(st.sampled_from(HOSTILE)))
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if kind == "remove":
        del parent[path[-1]]
    elif kind == "add" and isinstance(parent, dict):
        parent[draw(st.sampled_from(["extra", "device", "metric", "default_condition"]))
               + "_"] = draw(st.sampled_from(HOSTILE))
    else:
        parent[path[-1]] = draw(st.sampled_from(HOSTILE))
    return json.dumps(doc)


@st.composite
def bytes_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    kind = draw(st.sampled_from(["flip", "cut", "repeat", "empty"]))
    if kind == "empty" or not data:
        return b""
    if kind == "flip":
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + bytes([data[at] ^ draw(st.integers(1, 255))]) + data[at + 1:]
    if kind == "cut":
        return data[:draw(st.integers(0, len(data) - 1))]
    at = draw(st.integers(0, max(len(data) - 32, 0)))
    return data[:at] + data[at:at + 32] * draw(st.integers(2, 200)) + data[at:]


NUMBERS = [math.nan, math.inf, -1.0, 0.0, 1e308, 1e-300, 5234.9, 2.0**53]
STRINGS = ["", "x", "cpu-test-local-1t", "e1-l1-h1-r1-b1", "../x", "a" * 3000]


@st.composite
def table_mutation(draw: st.DrawFn, table: pl.DataFrame) -> pl.DataFrame:
    """A hostile variant of a table: a value, a column's type or name, its rows."""
    kind = draw(st.sampled_from(["value", "value", "drop", "cast", "rename", "rows", "empty"]))
    column = draw(st.sampled_from(table.columns))
    if kind == "drop":
        return table.drop(column)
    if kind == "cast":
        return table.with_columns(pl.col(column).cast(pl.String))
    if kind == "rename":
        return table.rename({column: column + "_"})
    if kind == "rows":
        return pl.concat([table] * draw(st.integers(2, 50)))
    if kind == "empty":
        return table.clear()
    row = draw(st.integers(0, table.height - 1))
    dtype = table.schema[column]
    value = (draw(st.sampled_from(NUMBERS)) if dtype.is_numeric()
             else draw(st.sampled_from([None, True, False])) if dtype == pl.Boolean
             else draw(st.sampled_from(STRINGS)))
    series = table[column].to_list()
    series[row] = value
    try:
        return table.with_columns(pl.Series(column, series, dtype=dtype, strict=False))
    except (pl.exceptions.PolarsError, OverflowError):
        return table.with_columns(pl.Series(column, series, strict=False))


# -- adapted device folders, through `hwgptbench query` ------------------------------------------

ADAPTED_FILES = ("adapted.json", "measurements.parquet", "SURROGATE/metadata.json",
                 "SURROGATE/options.json", "SURROGATE/manifest.json", "SURROGATE/sources/0.txt")


def adapted_folder(results: Path) -> Path:
    return Path(layout.adapted(SCALE, str(results))) / ADAPTED


def _latency_bounds() -> tuple[float, float]:
    bounds = UNIT_BOUNDS["ms"]
    return bounds.low, bounds.high


@st.composite
def adapted_case(draw: st.DrawFn, results: Path) -> dict[str, Any]:
    """Mutate one file of the adapted device's folder under ``results``; what was done."""
    folder = adapted_folder(results)
    surrogate = folder / "latency_ms" / CONDITION / "adapted"
    name = draw(st.sampled_from(ADAPTED_FILES))
    path = surrogate / name.removeprefix("SURROGATE/") if name.startswith("SURROGATE/") \
        else folder / name
    old = path.read_bytes()
    if path.suffix == ".json":
        new = draw(json_mutation(old.decode())).encode()
    elif path.suffix == ".parquet" and draw(st.booleans()):
        buffer = path.with_suffix(".tmp")
        draw(table_mutation(pl.read_parquet(path))).write_parquet(buffer)
        new = buffer.read_bytes()
        buffer.unlink()
    else:
        new = draw(bytes_mutation(old))
    path.write_bytes(new)
    sealed = name.startswith("SURROGATE/") and name != "SURROGATE/manifest.json" \
        and draw(st.booleans())
    if sealed:
        reseal(surrogate)
    return {"file": name, "path": path, "changed": new != old, "sealed": sealed,
            "mode": draw(st.sampled_from(["surrogate", "measured", "auto"])),
            "condition": draw(st.booleans())}


def check_answer(out: Path, case: dict[str, Any], arch: str, results: Path) -> None:
    """An answer of exit status 0 is the arch's, finite within the unit's bounds, within its
    interval; in measured mode one of the table's values of the arch (or null: none);
    and a surrogate folder changed without its manifest answers nothing."""
    answer = pl.read_parquet(out)
    assert answer["arch_id"].to_list() == [arch], answer
    value = answer["latency_ms"][0]
    low, high = _latency_bounds()
    if case["mode"] == "measured":
        if value is not None:
            table = pl.read_parquet(adapted_folder(results) / "measurements.parquet")
            assert value in table.filter(pl.col("arch_id") == arch)["latency_ms"].to_list()
    else:
        assert value is not None and low <= value <= high, answer
    if value is not None:
        assert math.isfinite(value) and low <= value <= high, answer
    if "latency_ms_lo" in answer.columns and answer["latency_ms_lo"][0] is not None:
        assert answer["latency_ms_lo"][0] <= value <= answer["latency_ms_hi"][0], answer
    if case["mode"] == "surrogate" and case["file"].startswith("SURROGATE/"):
        assert not case["changed"] or case["sealed"], (
            f"{case['file']} changed, its manifest not, and the query answered {value}")


def _adapted_run(results: Path, draw: st.DrawFn, run: Callable[[list[Any], Path], Outcome],
                 root: Path) -> None:
    measured = pl.read_parquet(adapted_folder(results) / "measurements.parquet")["arch_id"]
    case = draw(adapted_case(results))
    arch = draw(st.sampled_from([measured[0], measured[-1], "e192-l10-h4_4_4_4_4_4_4_4_4_4-"
                                 "r2_2_2_2_2_2_2_2_2_2-b1"]))
    before = tree(root)
    argv = ["query", "--scale", SCALE, "--results", results, "--device", ADAPTED, "--metric",
            "latency_ms", "--arch", arch, "--mode", case["mode"], "--out", "answer.parquet",
            *(["--interval"] if case["mode"] != "measured" else []),
            *(["--condition", CONDITION] if case["condition"] else [])]
    outcome = run(argv, root)
    held(outcome, "query", before, root, ("answer.parquet",))
    if outcome.code == 0:
        check_answer(root / "answer.parquet", case, arch, results)


def _copy_results(fitted_results: Path, root: Path) -> Path:
    shutil.copytree(fitted_results, root / "results")
    return root / "results"


@settings(**{**FAST, "max_examples": 20})
@given(data=st.data())
def test_mutated_adapted_folders_are_answered_right_or_refused(
        fitted: Path, child: Child, cases: Cases, data: st.DataObject) -> None:  # noqa: F811
    root = cases.new()
    results = _copy_results(fitted, root)
    _adapted_run(results, data.draw, lambda argv, cwd: child.run(cwd, argv), root)


@pytest.mark.slow
@settings(**SLOW)
@given(data=st.data())
def test_mutated_adapted_folders_in_fresh_processes(
        fitted: Path, cases: Cases, data: st.DataObject) -> None:  # noqa: F811
    root = cases.new()
    results = _copy_results(fitted, root)
    _adapted_run(results, data.draw, fresh, root)


# -- transfer-external: HAT's CSVs and the flags ---------------------------------------------------

@pytest.fixture(scope="module")
def hat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _hat_folder(tmp_path_factory.mktemp("hat"), n=24)


CSV_VALUES = ["nan", "NaN", "", "abc", "1e400", "-1", "0", "inf", "1e308", "1,5", "\"", "null"]
VALID = {"ks": ["2"], "seeds": "1", "report-k": "2", "methods": ["flops", "table_prior"],
         "only": ["hat_wmt14ende"]}


@st.composite
def csv_mutation(draw: st.DrawFn, data: bytes) -> bytes:
    lines = data.split(b"\n")
    kind = draw(st.sampled_from(["cell", "cell", "ragged", "header", "encoding", "bytes",
                                 "duplicate-header", "bom"]))
    if kind == "bytes":
        return draw(bytes_mutation(data))
    if kind == "bom":
        return b"\xef\xbb\xbf" + data
    if kind == "encoding":
        at = draw(st.integers(0, len(data) - 1))
        return data[:at] + b"\xff\xfe\x80" + data[at:]
    if kind == "duplicate-header":
        return b"\n".join([lines[0], *lines])
    row = draw(st.integers(0 if kind == "header" else 1, max(len(lines) - 2, 1)))
    cells = lines[row].split(b",")
    at = draw(st.integers(0, len(cells) - 1))
    if kind == "ragged":
        del cells[at]
    elif kind == "header":
        cells[at] = draw(st.sampled_from([b"", b"x", cells[at] + b"_", cells[0]]))
    else:
        cells[at] = draw(st.sampled_from(CSV_VALUES)).encode()
    lines[row] = b",".join(cells)
    return b"\n".join(lines)


@st.composite
def external_flags(draw: st.DrawFn) -> list[str]:
    """The flags of a run: the cheap valid ones, one of them (or none) made hostile."""
    flags = dict(VALID)
    which = draw(st.sampled_from([None, "ks", "seeds", "report-k", "methods", "only",
                                  "drop-first"]))
    ints = st.sampled_from(["-1", "0", "1", "2", "3", "23", "24", "100000", "10001", "x",
                            "2.5", "nan", "99999999999999999999"])
    if which in ("ks",):
        flags["ks"] = draw(st.lists(ints, min_size=1, max_size=3))
        flags["report-k"] = draw(st.sampled_from([*flags["ks"], "2"]))
    elif which in ("seeds", "report-k"):
        flags[which] = draw(ints)
    elif which == "methods":
        flags["methods"] = draw(st.lists(st.sampled_from(["flops", "nosuch", "table_prior",
                                                          "", "FLOPS"]), min_size=1,
                                         max_size=2))
    elif which == "only":
        flags["only"] = draw(st.lists(st.sampled_from(["hat_wmt14ende", "nosuch",
                                                       "help_fbnet", ""]), min_size=1,
                                      max_size=2))
    argv = ["--ks", *flags["ks"], "--seeds", flags["seeds"], "--report-k", flags["report-k"],
            "--methods", *flags["methods"], "--only", *flags["only"]]
    if which == "drop-first":
        argv += ["--drop-first", draw(st.sampled_from([
            "wmt14ende_cpu_xeon:3", "wmt14ende_cpu_xeon:24", "wmt14ende_cpu_xeon:-1",
            "nosuch:1", "wmt14ende_cpu_xeon", ":", "wmt14ende_cpu_xeon:x",
            "wmt14ende_cpu_xeon:99999999999999999999"]))]
    return argv


def check_external(out: Path) -> None:
    summary = pl.read_parquet(out / "summary.parquet")
    quality = pl.read_parquet(out / "quality.parquet")
    assert summary.height > 0 and quality.height > 0 and (out / "external.md").is_file()
    for column in [c for c in summary.columns if c.startswith("spearman")]:
        values = summary[column].drop_nulls()
        assert values.is_finite().all() and values.is_between(-1, 1).all(), summary


def _external_run(hat: Path, draw: st.DrawFn, run: Callable[[list[Any], Path], Outcome],
                  root: Path) -> None:
    shutil.copytree(hat, root / "hat")
    flags = ["--ks", "2", "--seeds", "1", "--report-k", "2", "--methods", "flops",
             "table_prior", "--only", "hat_wmt14ende"]
    if draw(st.booleans()):  # a mutated CSV, cheap flags
        path = draw(st.sampled_from(sorted((root / "hat").glob("*.csv"))))
        path.write_bytes(draw(csv_mutation(path.read_bytes())))
    else:
        flags = draw(external_flags())
    before = tree(root)
    outcome = run(["transfer-external", "--params", REPO_ROOT / "params.yaml", "--hat", "hat",
                   *flags, "--out-dir", "out"], root)
    held(outcome, "transfer-external", before, root, ("out",))
    if outcome.code == 0:
        check_external(root / "out")


@settings(**{**FAST, "max_examples": 10})
@given(data=st.data())
def test_transfer_external_on_mutated_csvs_and_flags(hat: Path, child: Child, cases: Cases,
                                                     data: st.DataObject) -> None:
    _external_run(hat, data.draw, lambda argv, cwd: child.run(cwd, argv), cases.new())


@pytest.mark.slow
@settings(**SLOW)
@given(data=st.data())
def test_transfer_external_in_fresh_processes(hat: Path, cases: Cases,
                                              data: st.DataObject) -> None:
    _external_run(hat, data.draw, fresh, cases.new())


# -- HELP's FBNet files, through the loader --------------------------------------------------------

@pytest.fixture(scope="module")
def fbnet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _fbnet_folder(tmp_path_factory.mktemp("help"), devices=2, n=30)


LOAD_HELP = r'''
import json, numpy as np
from hwgptbench.errors import UserError
from hwgptbench.transfer import external
try:
    data = external.load_help_fbnet("fbnet")
except UserError as err:
    print(json.dumps({"refused": type(err).__name__ + ": " + str(err)}))
else:
    tables = {}
    for name, table in data.tables.items():
        tables[name] = {"n": len(table.keys), "shape": list(table.features.shape),
                        "finite": bool(np.isfinite(table.values).all()
                                       and np.isfinite(table.features).all()),
                        "positive": bool((table.values > 0).all()),
                        "flops": bool((table.flops > 0).all())}
    print(json.dumps({"tables": tables}))
'''


@st.composite
def torch_object(draw: st.DrawFn, n: int) -> Any:
    kind = draw(st.sampled_from(["short", "nan", "negative", "strings", "nested", "dict",
                                 "tensor", "int-tensor", "stride0", "none", "huge-list"]))
    values = [1.0] * n
    if kind == "short":
        return values[: draw(st.integers(0, n - 1))]
    if kind in ("nan", "negative"):
        values[draw(st.integers(0, n - 1))] = math.nan if kind == "nan" else -1.0
        return values
    return {"strings": ["1.0"] * n, "nested": [[1.0]] * n, "dict": {"latency": values},
            "tensor": torch.ones(n), "int-tensor": torch.ones(n, dtype=torch.int64),
            "stride0": torch.zeros(1).expand(300_000_000), "none": None,
            "huge-list": [1.0] * 200_000}[kind]


@st.composite
def help_mutation(draw: st.DrawFn, folder: Path) -> None:
    target = draw(st.sampled_from(["metainfo", "latency"]))
    path = folder / "metainfo.pt" if target == "metainfo" else draw(st.sampled_from(sorted(
        (folder / "latency").glob("*.pt"))))
    how = draw(st.sampled_from(["bytes", "object"]))
    if how == "bytes":
        path.write_bytes(draw(bytes_mutation(path.read_bytes())))
    elif target == "latency":
        torch.save(draw(torch_object(30)), path)
    else:
        meta = torch.load(path, weights_only=True)
        arch = meta["arch"][draw(st.integers(0, len(meta["arch"]) - 1))]
        key = draw(st.sampled_from(["op_idx_list", "arch_str", "arch"]))
        value = draw(st.sampled_from([[99] * 22, [-1] * 22, ["k7_e9"] * 22, [], None, "x",
                                      [0] * 1000]))
        if key == "arch":
            meta["arch"] = value if not isinstance(value, list) or not value else [arch] * 5
        else:
            arch[key] = value
        torch.save(meta, path)


@settings(**{**FAST, "max_examples": 15})
@given(data=st.data())
def test_mutated_help_files_are_read_right_or_refused(fbnet: Path, child: Child, cases: Cases,
                                                      data: st.DataObject) -> None:
    root = cases.new()
    shutil.copytree(fbnet, root / "fbnet")
    data.draw(help_mutation(root / "fbnet"))
    before = tree(root)
    outcome = child.run(root, code=LOAD_HELP)
    held(outcome, "-", before, root, codes=(0,))
    report = json.loads(outcome.stdout.splitlines()[-1])
    if "refused" in report:
        message = report["refused"]
        assert "\n" not in message and "fbnet" in message, message
    else:
        for name, table in report["tables"].items():
            assert table["finite"] and table["positive"] and table["flops"], (name, table)
            assert table["n"] == 30 and table["shape"][0] == 30, (name, table)


# -- paper-docs --check ----------------------------------------------------------------------------

TABLES = {"cost_vs_size": "| a | b |\n|---|---|\n| 1 | 2 |\n", "fronts": "| x |\n|---|\n| 3 |\n"}
DOC = ("# Paper\n\ntext\n\n<!-- paper:cost_vs_size -->\n" + TABLES["cost_vs_size"]
       + "<!-- /paper -->\n\nmore ![f](img/paper/front.png)\n\n<!-- paper:fronts -->\n"
       + TABLES["fronts"] + "<!-- /paper -->\n")
PIECES = ["<!-- paper:cost_vs_size -->\n", "<!-- paper:fronts -->\n", "<!-- /paper -->",
          "<!-- paper:nosuch -->\n", "<!-- paper:Bad -->\n", "<!-- paper:fronts -->",
          "| 9 |\n", "\r\n", "\x00", "\udcff", "x" * 100_000]


@st.composite
def doc_mutation(draw: st.DrawFn) -> bytes:
    text = DOC
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["insert", "insert", "delete", "many", "crlf"]))
        if kind == "crlf":
            text = text.replace("\n", "\r\n")
        elif kind == "many":
            text += draw(st.sampled_from(PIECES[:4])) * draw(st.sampled_from([2, 999, 1001,
                                                                              30_000]))
        elif kind == "delete":
            found = [m.span() for m in re.finditer(r"<!-- [^>]* -->\n?", text)]
            if found:
                start, end = draw(st.sampled_from(found))
                text = text[:start] + text[end:]
        else:
            at = draw(st.integers(0, len(text)))
            text = text[:at] + draw(st.sampled_from(PIECES)) + text[at:]
    return text.encode("utf-8", "surrogateescape")


def independent_blocks(text: str) -> list[tuple[str, str]]:
    """The (name, body) of each block, read without the package: a doc that passes has no
    block opened inside another, so the lazy match is the block."""
    return re.findall(r"<!-- paper:([a-z0-9_]+) -->\n(.*?)<!-- /paper -->", text, re.DOTALL)


@settings(**{**FAST, "max_examples": 25})
@given(doc=doc_mutation())
def test_paper_docs_check_on_mutated_markers(child: Child, cases: Cases, doc: bytes) -> None:
    root = cases.new()
    tables = root / layout.paper_tables("results")
    tables.mkdir(parents=True)
    for name, body in TABLES.items():
        (tables / f"{name}.md").write_text(body)
    (root / "doc.md").write_bytes(doc)
    before = tree(root)
    outcome = child.run(root, ["paper-docs", "--check", "--doc", "doc.md", "--results",
                               "results"])
    held(outcome, "paper-docs", before, root, codes=(0, 1, 2))
    if outcome.code == 2:
        return
    found = independent_blocks(doc.decode("utf-8", "surrogateescape"))
    differ = [name for name, body in found if TABLES.get(name) != body]
    if outcome.code == 0:
        assert not differ, (differ, outcome.stdout)
    else:  # the blocks that differ, named in one line
        assert outcome.stderr.strip().count("\n") == 0 and "differ" in outcome.stderr
        assert differ and all(name in outcome.stderr for name in differ), outcome.stderr


# -- resume parts of a measure campaign -----------------------------------------------------------

READ_PARTS = r'''
import json, math, sys
sys.path.insert(0, ARGS["tests"])
from pathlib import Path
from hwgptbench.campaign.parts import ShardParts
from hwgptbench.errors import UserError
from hwgptbench.metrics import measured_bounds
from test_measure_groups import ARCHS
from test_resume_state import CONDITION

def fail():
    raise AssertionError("the saved plan was not read")

report = {}
try:
    parts = ShardParts(Path(ARGS["parts"]), ARGS["key"])
    if not (parts.root / f"{CONDITION.id}.plan.json").is_file():
        print(json.dumps({"anew": True}))  # a stamp of other inputs: the folder is discarded
        raise SystemExit(0)
    plan = parts.plan(CONDITION, fail, len(ARCHS))
    rows = [row for index, group in enumerate(plan.groups)
            for row in (parts.rows(CONDITION, index, group, ARCHS) or [])]
    why = [parts.unfinished(CONDITION, index) for index in range(len(plan.groups))]
    rows += list(parts.arch_rows(CONDITION, [a.id for a in ARCHS]).values())
    rows += parts.finished(CONDITION, ARCHS) or []
except UserError as err:
    report["refused"] = f"{type(err).__name__}: {err}"
else:
    bounds = measured_bounds()
    report["bad"] = [[column, row[column]] for row in rows for column in bounds
                     if isinstance(row.get(column), (int, float))
                     and not (math.isfinite(row[column])
                              and bounds[column].low <= row[column] <= bounds[column].high)]
    report["rows"] = len(rows)
print(json.dumps(report))
'''


@settings(**{**FAST, "max_examples": 20})
@given(data=st.data())
def test_mutated_resume_parts_are_read_right_or_refused(
        interrupted: Path, child: Child, cases: Cases, data: st.DataObject) -> None:  # noqa: F811
    root = cases.new()
    parts = root / "shard.parquet.parts"
    shutil.copytree(interrupted, parts)
    key = json.loads((parts / "inputs.json").read_text())["key"]
    path = data.draw(st.sampled_from(sorted(p for p in parts.iterdir()
                                            if p.name != ".hwgptbench-output.json")))
    if path.suffix == ".parquet" and data.draw(st.booleans()):
        data.draw(table_mutation(pl.read_parquet(path))).write_parquet(path)
    elif path.suffix == ".json" and data.draw(st.booleans()):
        path.write_text(data.draw(json_mutation(path.read_text())))
    else:
        path.write_bytes(data.draw(bytes_mutation(path.read_bytes())))
    before = tree(root)
    outcome = child.run(root, code=READ_PARTS, args={"tests": str(TESTS), "parts": str(parts),
                                                     "key": key})
    # a stamp of other inputs discards the folder (its own marker): the folder is the output
    held(outcome, "-", before, root, ("shard.parquet.parts",), codes=(0,))
    report = json.loads(outcome.stdout.splitlines()[-1])
    if "refused" in report:
        assert "\n" not in report["refused"] and str(parts) in report["refused"], report
    elif "bad" in report:
        assert report["bad"] == [], report


# -- ONNX graphs, through `hwgptbench evaluate` ---------------------------------------------------

@pytest.fixture(scope="module")
def onnx_export(shakespeare: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random model exported by the CLI as ONNX."""
    pytest.importorskip("onnxscript")
    pytest.importorskip("onnxruntime")
    from hwgptbench.cli import main
    from hwgptbench.io import save_torch
    from hwgptbench.model import SuperGPT
    from hwgptbench.space import SearchSpace
    from hwgptbench.tokens.shards import TokenShards
    from hwgptbench.training.train import supernet_state
    from test_export_cli import ARCH as EXPORT_ARCH
    from test_export_cli import SPACE as EXPORT_SPACE

    torch.manual_seed(0)
    vocab = TokenShards.open(shakespeare).manifest["tokenizer"]["vocab_size"]
    model = SuperGPT(SearchSpace.from_dict("t", EXPORT_SPACE), vocab)
    folder = tmp_path_factory.mktemp("onnx")
    save_torch(supernet_state(model, model.space, None, 0, "f"), folder / "supernet.pt")
    assert main(["export", "--checkpoint", str(folder / "supernet.pt"), "--arch",
                 EXPORT_ARCH.id, "--out", str(folder / "out"), "--formats", "onnx",
                 "--source-name", "tiny"]) == 0
    return folder / "out"


@st.composite
def onnx_mutation(draw: st.DrawFn, path: Path) -> None:
    import onnx
    from onnx import numpy_helper

    if draw(st.integers(0, 3)) == 0:
        path.write_bytes(draw(bytes_mutation(path.read_bytes())))
        return
    model = onnx.load(str(path))
    graph = model.graph
    kind = draw(st.sampled_from(["weights", "dims", "op", "domain", "remove-node", "opset",
                                 "external", "input-shape"]))
    if kind in ("weights", "dims", "external"):
        tensor = draw(st.sampled_from([t for t in graph.initializer if len(t.dims) >= 1]))
        if kind == "weights":
            array = numpy_helper.to_array(tensor).copy()
            array.flat[draw(st.integers(0, array.size - 1))] = draw(st.sampled_from(
                [np.nan, np.inf, -np.inf, 3e38]))
            tensor.CopyFrom(numpy_helper.from_array(array, tensor.name))
        elif kind == "dims":
            tensor.dims[0] = draw(st.sampled_from([0, 1, 2**31 - 1, 2**40]))
        else:
            tensor.ClearField("raw_data")
            tensor.data_location = onnx.TensorProto.EXTERNAL
            for key, value in (("location", draw(st.sampled_from(
                    ["../secret.bin", "/etc/hostname", "missing.bin"]))), ("offset", "0"),
                    ("length", str(draw(st.sampled_from([4, 2**40]))))):
                entry = tensor.external_data.add()
                entry.key, entry.value = key, value
    elif kind in ("op", "domain", "remove-node"):
        index = draw(st.integers(0, len(graph.node) - 1))
        if kind == "op":
            graph.node[index].op_type = draw(st.sampled_from(["NoSuchOp", "Loop", "Identity"]))
        elif kind == "domain":
            graph.node[index].domain = "com.example.custom"
        else:
            del graph.node[index]
    elif kind == "opset":
        model.opset_import[0].version = draw(st.sampled_from([1, 9999]))
    else:
        dims = graph.input[0].type.tensor_type.shape.dim
        dims[0].dim_value = draw(st.sampled_from([0, 1, 2**40]))
    path.write_bytes(model.SerializeToString())


def _onnx_ok(out: Path) -> None:
    result = json.loads(out.read_text())
    ppl = result["tasks"]["perplexity"]
    assert math.isfinite(ppl["perplexity"]) and ppl["perplexity"] >= 1, result
    assert math.isfinite(ppl["val_loss"]) and ppl["val_loss"] >= 0, result


@settings(**FAST)
@given(data=st.data())
def test_evaluate_on_mutated_onnx_graphs(onnx_export: Path, shakespeare: Path, child: Child,
                                         cases: Cases, data: st.DataObject) -> None:
    root = cases.new()
    shutil.copytree(onnx_export, root / "model")
    (root / "secret.bin").write_bytes(b"\x00" * 64)
    data.draw(onnx_mutation(root / "model" / "model.onnx"))
    before = tree(root)
    outcome = child.run(root, ["evaluate", "--model", "model", "--format", "onnx", "--data",
                               shakespeare, "--tasks", "perplexity", "--ppl-batches", "1",
                               "--ppl-batch-size", "2", "--out", "results.json"])
    held(outcome, "evaluate", before, root, ("results.json",))
    if outcome.code == 0:
        _onnx_ok(root / "results.json")


# -- params overlays with YAML anchors and aliases, through `hwgptbench validate` ---------------

@st.composite
def alias_overlay(draw: st.DrawFn) -> str:
    """An overlay whose anchors (defined where they are first used) nest ``depth`` levels,
    each alias repeated ``fanout`` times, placed where params.yaml has a list or a mapping;
    an alias of a number (valid or not), or a node that holds its own alias."""
    depth, fanout = draw(st.integers(1, 12)), draw(st.integers(1, 12))
    kind = draw(st.sampled_from(["list", "mapping", "merge", "scalar", "recursive"]))
    if kind == "recursive":
        return draw(st.sampled_from(["search:\n  devices: &r [*r]\n",
                                     "workflow: &r {devices: *r}\n"]))
    if kind == "scalar":
        value = draw(st.sampled_from(["3", "2", ".nan", "-.inf", "1e400", "x", "~"]))
        return f"search:\n  seeds: &a {value}\nsurrogate:\n  folds: *a\n"
    if kind == "merge":
        return ("search: &m {seeds: 3}\nsurrogate:\n  <<: *m\n" if depth < 6 else
                "search: &m {seeds: 3}\ntransfer: {<<: [*m, *m, *m]}\n")
    nodes = ["&a0 [" + ", ".join(["cpu-x"] * fanout) + "]"]
    for level in range(1, depth):
        nodes.append(f"&a{level} [" + ", ".join([f"*a{level - 1}"] * fanout) + "]")
    if kind == "list":
        return "search:\n  devices: [" + ", ".join(nodes) + "]\n"
    return "workflow:\n" + "".join(f"  k{i}: {node}\n" for i, node in enumerate(nodes))


@settings(**{**FAST, "max_examples": 20})
@given(overlay=alias_overlay())
def test_validate_on_overlays_with_aliases(child: Child, cases: Cases, overlay: str) -> None:
    root = cases.new()
    shutil.copy(REPO_ROOT / "params.yaml", root / "params.yaml")
    (root / "overlay.yaml").write_text(overlay)
    before = tree(root)
    outcome = child.run(root, ["validate", "--params", "params.yaml", "--params",
                               "overlay.yaml"])
    held(outcome, "validate", before, root, lines=50)
    if outcome.code == 2:
        assert "overlay.yaml" in outcome.stderr or "params" in outcome.stderr, outcome.stderr
