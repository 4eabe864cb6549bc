"""Every reader of a file from outside is bounded by cost (docs/security.md, "Readers are
bounded by cost"): one hostile input per reader, each small on disk and each asking for far
more time or memory than its size, refused with a clear UserError in well under 5 s without
the process growing; FIFOs refused before they are opened; and the corrupt-ZSTD parquet that
aborted the process after its refusal, run in fresh processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hwgptbench.cli import main

# One child process runs every case (imports paid once) and reports, per case, the seconds its
# read took, how much its peak RSS grew and the error it ended in.
CHILD = textwrap.dedent('''
    import json, os, resource, sys, time
    from pathlib import Path

    import numpy as np
    import polars as pl
    import torch

    from hwgptbench import io
    from hwgptbench.errors import UserError

    tmp = Path(sys.argv[1])

    def peak_mb():
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

    def parquet_rows():
        path = tmp / "rows.parquet"  # 1.1e6 rows of one value: a few kB on disk
        pl.DataFrame({"latency_ms": np.ones(io.MAX_PARQUET_ROWS + 100_000)}).write_parquet(
            path, compression="zstd")
        assert path.stat().st_size < 100_000
        return lambda: io.read_outside_parquet(path, "fix")

    def parquet_decoded():
        # the bound lowered to 8 MiB, so that the table (20,000 rows of one 1 kB string: 20 MB
        # decoded from 20 kB) is quick to write; refused at the bound, whatever it is
        io.MAX_PARQUET_DECODED = 8 << 20
        path = tmp / "wide.parquet"
        pl.DataFrame({"arch_id": ["x" * 1000] * 20_000}).write_parquet(path,
                                                                       compression="zstd")
        assert path.stat().st_size < 100_000
        return lambda: io.read_outside_parquet(path, "fix")

    def lightgbm_trees():
        from hwgptbench.lightgbm_core import MAX_TREES, read_booster
        header = ["tree", "version=v4", "num_class=1", "num_tree_per_iteration=1",
                  "label_index=0", "max_feature_idx=0", "objective=regression",
                  "feature_names=f0", "feature_infos=none",
                  "tree_sizes=" + " ".join(["300"] * (MAX_TREES * 100)), "", ""]
        path = tmp / "trees.txt"
        path.write_text("\\n".join(header) + "Tree=0\\n")
        return lambda: read_booster(path, "fix")

    def lightgbm_bytes():
        from hwgptbench.lightgbm_core import MAX_TEXT, read_booster
        path = tmp / "big.txt"  # sparse: no bytes on disk
        with open(path, "wb") as handle:
            handle.truncate(MAX_TEXT + 1)
        return lambda: read_booster(path, "fix")

    def mlp_width():
        from hwgptbench.predictors.mlp import MLPEnsembleSurrogate
        rng = np.random.default_rng(0)
        model = MLPEnsembleSurrogate(hidden=4, layers=2, members=2, epochs=2,
                                     calibration_folds=0)
        model.fit(rng.random((20, 3)), rng.random(20) + 1)
        folder = tmp / "mlp"
        model.save(folder)
        MLPEnsembleSurrogate.load(folder)  # the untouched folder loads
        document = json.loads((folder / "options.json").read_text())
        document["options"]["hidden"] = 12000
        (folder / "options.json").write_text(json.dumps(document))
        return lambda: MLPEnsembleSurrogate.load(folder)

    def torch_stride0():
        from hwgptbench.transfer.external import _torch_load
        path = tmp / "latency.pt"  # one stored float viewed as 4e8 (3.2 GB as float64)
        torch.save(torch.zeros(1).expand(400_000_000), path)
        assert path.stat().st_size < 3_000
        return lambda: np.asarray(_torch_load(path), dtype=np.float64)

    def yaml_aliases():
        from hwgptbench import params
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"] + [
            f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
        path = tmp / "bomb.yaml"
        path.write_text("\\n".join(lines) + "\\n")
        assert path.stat().st_size < 600
        return lambda: params.load(path)

    def json_fifo():
        path = tmp / "fifo.json"
        os.mkfifo(path)
        return lambda: io.read_json(path, "fix")

    CASES = {name: f for name, f in globals().items() if callable(f) and name in sys.argv[2:]}
    report = {}
    for name in sys.argv[2:]:
        read = CASES[name]()  # the hostile file, written before the clock starts
        before, start = peak_mb(), time.perf_counter()
        try:
            read()
            outcome = "read"
        except UserError as err:
            outcome = f"{type(err).__name__}: {err}"
        except Exception as err:
            outcome = f"not a UserError: {type(err).__name__}: {err}"
        report[name] = [time.perf_counter() - start, peak_mb() - before, outcome[:300]]
    print(json.dumps(report))
''')

CASES = {  # case: words its refusal must hold
    "parquet_rows": "rows",
    "parquet_decoded": "decodes to more than 8 MiB",
    "lightgbm_trees": "more than 10,000 trees",
    "lightgbm_bytes": "bytes",
    "mlp_width": "does not hold the 2 networks of width 12000",
    "torch_stride0": "views 400,000,000 elements",
    "yaml_aliases": "expand to more than",
    "json_fifo": "(it is a FIFO)",
}
SECONDS, GROWTH_MB = 5.0, 200.0


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list]:
    tmp = tmp_path_factory.mktemp("bounds")
    done = subprocess.run([sys.executable, "-c", CHILD, str(tmp), *CASES], text=True,
                          capture_output=True, timeout=240)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(found, indent=1))
    return found


@pytest.mark.parametrize("case", CASES)
def test_reader_refuses_within_bounds(report: dict[str, list], case: str) -> None:
    seconds, growth, outcome = report[case]
    assert CASES[case] in outcome and "not a UserError" not in outcome, outcome
    assert seconds < SECONDS, (case, seconds)
    assert growth < GROWTH_MB, (case, growth)


def exit_code(argv: list[str]) -> int | str | None:
    """hwgptbench's exit status for argv, run in this process."""
    try:
        return main(argv)
    except SystemExit as exit_:
        return exit_.code


def fifo(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    os.mkfifo(path)
    return path


@pytest.mark.timeout(60)
@pytest.mark.parametrize("argv", [
    ["query", "--scale", "s", "--metric", "latency_ms", "--archs-file", "{fifo}"],
    ["paper-docs", "--check", "--doc", "{fifo}"],
    ["validate", "--params", "{fifo}"],
])
def test_fifos_are_refused_before_opening(tmp_path: Path, argv: list[str],
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(Path(__file__).parents[1])
    path = fifo(tmp_path, "input")
    assert exit_code([arg.replace("{fifo}", str(path)) for arg in argv]) == 2
    assert "FIFO" in capsys.readouterr().err


def test_unclosed_paper_markers_are_refused_at_once(tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    import time

    doc = tmp_path / "doc.md"
    doc.write_text("<!-- paper:cost_vs_size -->\nrow\n" * 30_000)
    start = time.perf_counter()
    code = exit_code(["paper-docs", "--check", "--doc", str(doc), "--results", str(tmp_path)])
    assert code == 2 and time.perf_counter() - start < 5
    assert "not closed" in capsys.readouterr().err


def corrupt_zstd_table(path: Path) -> None:
    """A device table compressed with ZSTD, a byte flipped inside each column's pages."""
    import numpy as np
    import polars as pl
    import pyarrow.parquet as pq

    n = 20_000
    rng = np.random.default_rng(0)
    pl.DataFrame({"arch_id": [f"a{i}" for i in range(n)], "latency_ms": rng.random(n),
                  "batch_size": [1] * n}).write_parquet(path, compression="zstd")
    data = bytearray(path.read_bytes())
    group = pq.read_metadata(path).row_group(0)
    for column in range(group.num_columns):
        chunk = group.column(column)
        data[chunk.data_page_offset + chunk.total_compressed_size // 2] ^= 0xFF
    path.write_bytes(bytes(data))


@pytest.mark.timeout(120)
def test_corrupt_zstd_page_is_refused_without_abort(tmp_path: Path) -> None:
    """A reader thread released the last reference to a Python-owned buffer during the
    interpreter's exit and the process aborted after its refusal (rc 134 in 1 to 14 of 30
    runs): each run now ends in exit 2."""
    table = tmp_path / "device.parquet"
    corrupt_zstd_table(table)
    for run in range(5):
        done = subprocess.run(
            [sys.executable, "-m", "hwgptbench.cli", "ship-tables", "--scale", "s",
             "--device", str(table), "--folder", str(tmp_path / f"out{run}")],
            capture_output=True, text=True, timeout=60, cwd=Path(__file__).parents[1])
        assert done.returncode == 2, (run, done.returncode,
                                      -done.returncode in set(signal.Signals), done.stderr)
        assert "cannot be read as a parquet table" in done.stderr
        assert "terminate called" not in done.stderr and "Traceback" not in done.stderr
