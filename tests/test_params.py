"""params.yaml is validated by one schema, in the CLI and in the Snakefile, before anything
is written; every problem names the field and what is allowed."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from conftest import REPO_ROOT, run
from hwgptbench import params

DEFAULT = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def test_repository_params_are_valid() -> None:
    assert params.load(REPO_ROOT / "params.yaml") == DEFAULT


@pytest.mark.parametrize("overlay", sorted(p.name for p in (REPO_ROOT / "params").glob("*.yaml")))
def test_repository_overlays_are_valid(overlay: str) -> None:
    merged = params.load_overlaid(REPO_ROOT / "params.yaml", [REPO_ROOT / "params" / overlay])
    assert merged != DEFAULT


def test_full_overlay_only_scales_the_default_up() -> None:
    """params/full.yaml changes sizes (steps, counts, budgets, time limits), never what runs."""
    full = params.load_overlaid(REPO_ROOT / "params.yaml", [REPO_ROOT / "params" / "full.yaml"])

    def numbers(doc: object, path: str = "") -> dict[str, object]:
        if isinstance(doc, dict):
            return {k: v for key, value in doc.items()
                    for k, v in numbers(value, f"{path}.{key}" if path else key).items()}
        return {path: doc}

    default, larger = numbers(DEFAULT), numbers(full)
    assert default.keys() == larger.keys()
    changed = {k for k in default if default[k] != larger[k]}
    assert changed and "supernet.steps" in changed and "sample.n_archs" in changed
    for key in changed:
        if isinstance(default[key], list):  # snapshots and ks scale with steps and archs
            assert len(larger[key]) == len(default[key]) and larger[key] >= default[key], key
        else:
            assert isinstance(default[key], int | float) and larger[key] >= default[key], key


def test_test_overlay_only_scales_the_default_down() -> None:
    """params/test.yaml (the end-to-end tests' workflow) is valid and keeps every stage: sizes
    shrink, the stages' choices (algorithms, families, dtypes, options) are subsets."""
    test = params.load_overlaid(REPO_ROOT / "params.yaml", [REPO_ROOT / "params" / "test.yaml"])
    assert test["supernet"]["steps"] < DEFAULT["supernet"]["steps"]
    assert test["sample"]["n_archs"] < DEFAULT["sample"]["n_archs"]
    assert set(test["search"]["algorithms"]) < set(DEFAULT["search"]["algorithms"])
    assert set(test["surrogate"]["families"]) <= set(DEFAULT["surrogate"]["families"])
    assert test["workflow"] == DEFAULT["workflow"] and test["data"] == DEFAULT["data"]


def test_the_schema_is_generated_from_the_models() -> None:
    """No hand-written schema is left to keep in step: the JSON schema is the models', one
    property per section, with the bounds the models check."""
    assert not list(REPO_ROOT.glob("src/hwgptbench/**/*.schema.*"))
    assert not (REPO_ROOT / "workflow" / "schemas").exists()
    generated = params.schema()
    assert list(generated["properties"]) == list(params.SECTIONS) == list(DEFAULT)
    vocab = params.schema_at(["data", "tokenizer", "vocab_size"])
    assert params.allowed(vocab).startswith("integer >= 512, <= 1000000 or null")


def _broken(path: list[str], value: object) -> dict:
    doc = copy.deepcopy(DEFAULT)
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return doc


@pytest.mark.parametrize(("path", "value", "expected"), [
    (["data", "tokenizer", "vocab_size"], "big", ["data.tokenizer.vocab_size", "integer"]),
    (["data", "tokenizer", "vocab_size"], 100, ["data.tokenizer.vocab_size", ">= 512"]),
    (["data", "val_fraction"], 0.9, ["data.val_fraction", "<= 0.5"]),
    (["data", "corpus", "source"], "web", ["data.corpus.source", "'text_files'", "'huggingface'"]),
    (["data", "vocab"], 10, ["data: unknown key(s) 'vocab'", "allowed keys: corpus"]),
    (["data", "name"], "a/b", ["data.name", "matching"]),
])
def test_bad_value_names_field_and_allowed(path: list[str], value: object,
                                           expected: list[str]) -> None:
    with pytest.raises(params.ParamsError) as info:
        params.validate(_broken(path, value))
    for text in expected:
        assert text in str(info.value)


STEPS = DEFAULT["supernet"]["steps"]


@pytest.mark.parametrize(("value", "expected"), [
    ([40, STEPS], [f"supernet.snapshots: [40, {STEPS}]", f"< supernet.steps ({STEPS})",
                   f"drop [{STEPS}] or raise supernet.steps"]),
    ([80, 40], ["supernet.snapshots: [80, 40]", "increasing order, e.g. [40, 80]"]),
    ([0], ["supernet.snapshots.0", ">= 1"]),
    ([40, 40], ["supernet.snapshots: [40, 40]", "training steps at which a snapshot"]),
])
def test_snapshots_must_fit_the_training_steps(value: list[int], expected: list[str]) -> None:
    with pytest.raises(params.ParamsError) as info:
        params.validate(_broken(["supernet", "snapshots"], value))
    for text in expected:
        assert text in str(info.value)
    assert params.validate(_broken(["supernet", "snapshots"], []))


@pytest.mark.parametrize(("families", "family", "valid"), [
    (["lightgbm", "mlp_ensemble"], "blend", True), (["lightgbm"], "blend", False),
    (["lightgbm"], "mlp_ensemble", False), (["lightgbm"], "best", True)])
def test_default_family_must_be_fitted(families: list[str], family: str, valid: bool) -> None:
    doc = _broken(["surrogate", "families"], families)
    doc["surrogate"]["default_family"] = family
    if valid:
        assert params.validate(doc)
        return
    with pytest.raises(params.ParamsError, match=rf"surrogate.default_family: '{family}' is not "
                                                 r"fitted .* choose best"):
        params.validate(doc)


def test_missing_key_for_source_is_named() -> None:
    doc = copy.deepcopy(DEFAULT)
    doc["data"]["corpus"] = {"source": "huggingface", "split": "train", "text_field": "text"}
    with pytest.raises(params.ParamsError, match=r"data.corpus: missing key 'dataset'"):
        params.validate(doc)


def test_unknown_top_level_section() -> None:
    with pytest.raises(params.ParamsError, match=r"<top level>: unknown key\(s\) 'trian'"):
        params.validate({**DEFAULT, "trian": {}})


def test_section_file_validates_alone(tmp_path: Path) -> None:
    written = params.write_sections(DEFAULT, tmp_path)
    assert params.load(written["data"], sections=["data"]) == {"data": DEFAULT["data"]}
    mtime = written["data"].stat().st_mtime_ns
    params.write_sections(DEFAULT, tmp_path)  # unchanged values: file untouched
    assert written["data"].stat().st_mtime_ns == mtime
    params.write_sections(_broken(["data", "seed"], 7), tmp_path)
    assert written["data"].stat().st_mtime_ns != mtime


def _write_invalid(project: Path) -> None:
    doc = _broken(["data", "tokenizer", "vocab_size"], "big")
    (project / "params.yaml").write_text(yaml.safe_dump(doc))


def test_cli_rejects_invalid_params_and_writes_nothing(tmp_path: Path) -> None:
    _write_invalid(tmp_path)
    result = run(["hwgptbench", "data", "--params", "params.yaml"], tmp_path, check=False)
    assert result.returncode == 2
    assert "data.tokenizer.vocab_size" in result.stderr and "integer" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml"]


@pytest.mark.parametrize(("path", "value", "expected"), [
    (["data", "tokenizer", "vocab_size"], "big", ["data.tokenizer.vocab_size", ">= 512"]),
    (["supernet", "snapshots"], [100, 400], ["supernet.snapshots", "raise supernet.steps"]),
])
@pytest.mark.e2e
def test_snakemake_rejects_invalid_params_before_any_job(project: Path, path: list[str],
                                                         value: object, expected: list[str]
                                                         ) -> None:
    (project / "params.yaml").write_text(yaml.safe_dump(_broken(path, value)))
    result = run(["snakemake", "--cores", "1"], project, check=False)
    assert result.returncode != 0
    output = result.stdout + result.stderr
    assert all(text in output for text in expected)
    assert not (project / "results").exists()


def test_yaml_is_read_as_data_and_as_safe_load_reads_it() -> None:
    from hwgptbench.io import parse_yaml

    for text in ((REPO_ROOT / "params.yaml").read_text(),
                 "a: [1, 2.5e-3, .inf, null, 'x']\nb: {c: 2026-11-26, d: yes}\n"):
        assert parse_yaml(text) == yaml.safe_load(text)
    with pytest.raises(yaml.YAMLError, match="python/object"):
        parse_yaml("!!python/object/apply:os.system ['true']")
