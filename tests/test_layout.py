"""Every result path is named once, in hwgptbench.layout: dvc.yaml's outputs are its paths."""

from __future__ import annotations

import inspect

import yaml

from conftest import REPO_ROOT
from hwgptbench import layout

SCALE = "tiny"


def layout_paths(scale: str, data_name: str, compress_name: str) -> set[str]:
    """Every path of the layout that takes no more than a scale or a name: what a DVC stage
    can list as an output."""
    paths = set()
    for _, function in inspect.getmembers(layout, inspect.isfunction):
        if function.__module__ != layout.__name__:
            continue
        required = [p for p in inspect.signature(function).parameters.values()
                    if p.default is inspect.Parameter.empty]
        names = [p.name for p in required]
        if names == ["scale"]:
            paths.add(function(scale))
        elif names == ["name"]:
            paths |= {function(data_name), function(compress_name)}
        elif names == ["name", "table"]:
            paths |= {function(compress_name, t) for t in ("search", "subnets", "compress",
                                                            "finetune_methods")}
    return paths


def dvc_outputs() -> tuple[list[str], dict]:
    """dvc.yaml's outs, metrics and plots of every stage, for the scales of params.yaml."""
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    params = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())
    outputs = []
    for stage in stages.values():
        body = stage.get("do", stage)
        for entry in (*body.get("outs", []), *body.get("metrics", []), *body.get("plots", [])):
            path = entry if isinstance(entry, str) else next(iter(entry))
            outputs.append(path.replace("${item}", SCALE)
                           .replace("${data.name}", params["data"]["name"])
                           .replace("${compress.name}", params["compress"]["name"]))
    return outputs, params


def test_dvc_outputs_are_layout_paths() -> None:
    outputs, params = dvc_outputs()
    known = layout_paths(SCALE, params["data"]["name"], params["compress"]["name"])
    assert len(outputs) >= 20
    assert [path for path in outputs if path not in known] == []


def test_a_path_outside_the_layout_is_found() -> None:
    outputs, params = dvc_outputs()
    known = layout_paths(SCALE, params["data"]["name"], params["compress"]["name"])
    assert "results/tiny/measurements.parquet" in known
    assert "results/tiny/measurement.parquet" not in known


def test_rules_spell_no_result_path() -> None:
    """The rules take result paths from the layout: none spells one out."""
    for path in sorted((REPO_ROOT / "workflow").rglob("*.smk")):
        code = [line for line in path.read_text().splitlines()
                if not line.lstrip().startswith("#") and '"""' not in line]
        assert not [line for line in code if 'f"{RESULTS}' in line or '"results/' in line], path
