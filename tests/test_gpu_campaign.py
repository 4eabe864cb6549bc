"""benchmarks/gpu_campaign.py: its measure step on the CPU (a dry run of the eager conditions,
the same code the GPU runs), resuming from earlier loans' rows, and the device tables and
repeatability it turns the rows into; the measure step imports neither polars nor lightgbm."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

from conftest import REPO_ROOT
from hwgptbench.space import SearchSpace

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_campaign.py"
_spec = importlib.util.spec_from_file_location("gpu_campaign", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_campaign = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_campaign)

# a space as deep as the campaign's shapes need (1024 tokens) and small enough for 2 cores
SPACE = {"embed_dim": [16, 32], "n_layer": [1, 2], "n_head": [2], "mlp_ratio": [2],
         "bias": [True], "head_size": 8, "block_size": 1024, "rotary_fraction": 0.5}


def _archs(path: Path) -> dict:
    space = SearchSpace.from_dict("s", SPACE)
    ids = [a.id for a in space.sample(3, seed=0)]
    doc = {"seed": 0, "scales": {scale: {"space": SPACE, "vocab_size": 64, "archs": ids[:n]}
                                 for scale, n in (("s", 3), ("m", 2), ("l", 1))}}
    path.write_text(json.dumps(doc))
    return doc


def test_measure_resume_and_tables_on_the_cpu(tmp_path: Path) -> None:
    doc = _archs(tmp_path / "archs.json")
    out = tmp_path / "loan1"
    out.mkdir()
    summary = gpu_campaign.measure(tmp_path / "archs.json", out, seconds=120, device="cpu")
    assert {p: e["archs"] for p, e in summary["phases"].items()} == {
        "s": 3, "m": 2, "l": 1, "s-repeat": 3}
    rows = [json.loads(line) for line in (out / "rows_s.jsonl").read_text().splitlines()]
    assert len(rows) == 3 * 2  # the eager conditions: CUDA graphs need a GPU
    assert {r["status"] for r in rows} == {"ok"}
    assert all(r["campaign"] == 1 and r["device"] == summary["label"] for r in rows)
    assert json.loads((out / "campaign.json").read_text())["phases"] == summary["phases"]
    # a later loan measures only what the earlier ones did not
    left = gpu_campaign.remaining(doc, [out])
    assert all(not entry["archs"] for entry in left["scales"].values())

    report = gpu_campaign.tables([out], tmp_path / "results")
    assert {s: report[s]["archs"] for s in ("s", "m", "l")} == {"s": 3, "m": 2, "l": 1}
    table = pl.read_parquet(tmp_path / "results" / "s" / "measure" / f"{summary['label']}.parquet")
    assert table.height == 6 and "campaign" not in table.columns
    repeat = report["repeat b1-t128-eager"]
    assert repeat["archs"] == 3 and 0 <= repeat["within_2pct"] <= 1
    assert json.loads((tmp_path / "results" / "repeatability.json").read_text()) == report


def test_the_measure_step_needs_neither_polars_nor_lightgbm() -> None:
    hidden = "; ".join(f"sys.modules[{name!r}] = None" for name in
                       ("polars", "lightgbm", "pytest", "snakemake", "jsonschema"))
    code = (f"import runpy, sys; {hidden}; sys.argv = ['gpu_campaign.py', 'measure', '-h']; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    result = subprocess.run([sys.executable, "-c", code], env=dict(os.environ),
                            capture_output=True, text=True, timeout=120, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    assert "--done" in result.stdout


def test_a_later_session_completes_the_shipped_draw(tmp_path: Path) -> None:
    """The same draw without the archs the shipped H100 table holds: exactly the ones missing
    from the campaign's 500 / 200 / 100."""
    from hwgptbench import published

    label = "cuda-nvidia-h100-80gb-hbm3"
    full = gpu_campaign.draw_archs(tmp_path / "all.json")
    rest = gpu_campaign.draw_archs(tmp_path / "rest.json", exclude_shipped=label)
    for scale, count in gpu_campaign.COUNTS.items():
        shipped = set(published.device_tables(scale)[label]["arch_id"])
        drawn = full["scales"][scale]["archs"]
        assert len(drawn) == count and shipped <= set(drawn)
        assert rest["scales"][scale]["archs"] == [a for a in drawn if a not in shipped]
