"""The workflow's export (hwgptbench.export.pareto): which archs of the compression's fronts,
spread along a front, and the index table of a folder of exported archs."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest

from hwgptbench.errors import UserError
from hwgptbench.export.manifest import read
from hwgptbench.export.pareto import INDEX, chosen_archs, export_archs, spread
from hwgptbench.export.write import FORMATS
from hwgptbench.io import save_torch
from hwgptbench.settings.compress import TimingSettings
from hwgptbench.space import Arch
from hwgptbench.training.train import supernet_state
from test_export import NEOX, PER_LAYER, supernet

UNIFORM = Arch(64, 2, (4, 4), (2, 2), True)
TIMING = TimingSettings(batch_size=1, seq_len=8, threads=1, warmup=1, min_repeats=2,
                        max_repeats=3, target_rel_ci=0.02, max_seconds=0.5, estimator="median")


def test_spread_keeps_both_ends_evenly() -> None:
    assert spread(3, 5) == [0, 1, 2]
    assert spread(10, 3) == [0, 4, 9]
    assert spread(7, 1) == [0] and spread(7, 2) == [0, 6]
    assert spread(0, 3) == []


def subnets() -> pl.DataFrame:
    return pl.DataFrame({"arch_id": ["a", "b", "c", "d"], "params": [4, 1, 3, 2],
                         "pareto_ppl-params": [True, True, False, True],
                         "pareto_ppl-latency": [False, False, True, False]})


def test_chosen_archs_per_front_then_named_once() -> None:
    chosen = chosen_archs(subnets(), ["ppl-params", "ppl-latency"], 2, ["c", "z"])
    assert chosen == [("b", "Pareto front of ppl-params"), ("a", "Pareto front of ppl-params"),
                      ("c", "Pareto front of ppl-latency"), ("z", "export.archs")]
    assert [arch for arch, _ in chosen_archs(subnets(), ["ppl-params"], 3, [])] == ["b", "d", "a"]


def test_an_objective_set_the_search_did_not_run_is_named() -> None:
    with pytest.raises(UserError, match=r"export.pareto names objective set 'ppl-energy'.*"
                                        r"ppl-params"):
        chosen_archs(subnets(), ["ppl-energy"], 2, [])


def test_export_archs_writes_a_folder_each_and_the_index(tmp_path: Path) -> None:
    model = supernet(NEOX)
    save_torch(supernet_state(model, model.space, None, 0, "f"), tmp_path / "supernet.pt")
    archs = [(PER_LAYER.id, "front"), (UNIFORM.id, "named")]
    index = export_archs(tmp_path / "supernet.pt", archs, tmp_path / "out", list(FORMATS),
                         None, {"name": "test"}, TIMING)
    assert (tmp_path / "out" / INDEX).exists()
    assert index.sort("arch_id", "format").select("arch_id", "format").rows() == sorted(
        (arch, fmt) for arch, _ in archs for fmt in FORMATS)
    written = index.filter(pl.col("skipped").is_null())
    assert written["passed"].all() and (written["size_bytes"] > 0).all()
    # a per-layer arch has no Hugging Face folder: recorded, with the layers that differ
    skipped = index.filter(pl.col("skipped").is_not_null()).row(0, named=True)
    assert skipped["arch_id"] == PER_LAYER.id and "layers 0,2 have 4 heads" in skipped["skipped"]
    manifest = read(tmp_path / "out" / UNIFORM.id)
    assert manifest["source"]["name"] == "test" and manifest["source"]["kind"] == "supernet"
    assert set(manifest["formats"]) == set(FORMATS)
    onnx = index.filter(pl.col("format") == "onnx")  # timed against eager PyTorch
    assert (onnx["onnxruntime_ms"] > 0).all() and (onnx["torch_eager_ms"] > 0).all()
    assert onnx["onnxruntime_vs_eager"].to_list() == pytest.approx(
        (onnx["onnxruntime_ms"] / onnx["torch_eager_ms"]).to_list())
