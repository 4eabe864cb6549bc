"""Every file and name from outside is data (docs/security.md): each subcommand given a bad or
hostile input (built here) exits 2 with one message naming the input, no traceback, no file
written and no marker of code that ran; a table whose name would be shell code is skipped by
the workflow, and a value with a space runs; arch ids and params overlays of any string are
parsed or refused with a UserError (hypothesis)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pickle
import re
import shutil
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import polars as pl
import pytest
import torch
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from conftest import REPO_ROOT, Hostile, make_project, run, surrogate_settings, toy_perplexity_table
from hwgptbench import layout, params
from hwgptbench.cli import main
from hwgptbench.errors import UserError
from hwgptbench.export import pt2
from hwgptbench.export.write import export_arch, load_exported
from hwgptbench.io import TorchFileError, load_torch
from hwgptbench.model import SuperGPT
from hwgptbench.predictors import fitting as surrogates
from hwgptbench.space import Arch, InvalidArchError, SearchSpace
from hwgptbench.surrogate.stage import merge_quality
from test_hwgptbench_overlay import _upstream
from test_security import reseal

SPACE = SearchSpace.from_dict("tiny", {
    "embed_dim": [32, 64], "n_layer": [1, 2], "n_head": [2, 4], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 16, "block_size": 16, "rotary_fraction": 0.5})
VOCAB = 64
SECTION = {"families": ["lightgbm", "linear"], "folds": 2, "min_rows": 10, "seed": 0,
           "coverage": 0.9, "lightgbm": {"num_iterations": 20, "num_leaves": 4,
                                         "min_data_in_leaf": 3}}
ARCH = SPACE.sample(1, seed=3)[0]
PARAMS_DOC = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())


def cli(*argv: str | Path) -> tuple[int, str]:
    """hwgptbench's exit status and stderr for argv, run in this process."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = main([str(arg) for arg in argv])
    return code, err.getvalue()


def files(root: Path) -> dict[str, bytes]:
    """Every file under root with its content."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def refused(argv: list[str | Path], named: str | Path, root: Path) -> str:
    """Run argv and check: exit 2, one error message naming ``named``, no traceback, nothing
    under root written or changed; the message."""
    before = files(root)
    code, err = cli(*argv)
    assert code == 2, err
    assert err.count("error:") == 1 and err.startswith("hwgptbench "), err
    assert str(named) in err and "Traceback" not in err, err
    assert files(root) == before, "a refused command wrote or changed a file"
    return err


@pytest.fixture
def marker(tmp_path: Path) -> Iterator[Path]:
    """Where hostile files would leave a file, were their code run."""
    yield tmp_path / "marker"
    assert not (tmp_path / "marker").exists(), "a loader ran code from a file"


# -- surrogate folders -------------------------------------------------------------------------

@pytest.fixture(scope="module")
def fitted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with perplexity surrogates of two families and their blend."""
    root = tmp_path_factory.mktemp("fitted") / "results"
    table = toy_perplexity_table(SPACE)
    folder = Path(layout.surrogates("tiny", str(root)))
    surrogates.fit_perplexity(surrogate_settings(SECTION),
                              SPACE, VOCAB, table, folder / "perplexity")
    merge_quality([folder / "perplexity" / "quality.parquet"], "tiny",
                             folder / "quality.parquet", root / "tiny" / "q.json")
    return root


@pytest.fixture
def results(fitted: Path, tmp_path: Path) -> Path:
    """A copy of the fitted results to spoil."""
    shutil.copytree(fitted, tmp_path / "results")
    return tmp_path / "results"


def query(results: Path, *extra: str) -> list[str | Path]:
    return ["query", "--results", results, "--metric", "perplexity", *extra]


def surrogate(results: Path, family: str) -> Path:
    return next(p.parent for p in (results / "tiny" / "surrogates" / "perplexity").rglob(
        "metadata.json") if p.parent.name == family)


def _spoil(name: str, text: str | Callable[[str], str], seal: bool = True
           ) -> Callable[[Path], Path]:
    """An edit of the lightgbm (or blend) surrogate's file ``name``: its new text, the manifest
    resealed to match (a hostile folder) unless not ``seal``; returns the file."""
    def edit(results: Path) -> Path:
        folder = surrogate(results, "blend" if name == "members.json" else "lightgbm")
        path = folder / name
        path.write_text(text(path.read_text()) if callable(text) else text)
        if seal:
            reseal(folder)
        return path
    return edit


def _split_feature(text: str) -> str:
    """A model text whose first split reads feature 10^9, its tree_sizes consistent (the one
    flaw): LightGBM's parser segfaults on it."""
    text = re.sub(r"^split_feature=\d+", "split_feature=1000000000", text, count=1,
                  flags=re.MULTILINE)
    trees = text[text.index("\nTree=") + 1:text.index("end of trees")]
    starts = [m.start() for m in re.finditer(r"^Tree=", trees, re.MULTILINE)] + [len(trees)]
    sizes = " ".join(str(end - start) for start, end in zip(starts, starts[1:], strict=False))
    return re.sub(r"^tree_sizes=.*$", f"tree_sizes={sizes}", text, count=1, flags=re.MULTILINE)


SURROGATE_CASES = {
    "garbage-lightgbm-text": (_spoil("point.txt", "not a model\n"), ()),
    "lightgbm-of-another-space": (_spoil("point.txt", lambda t: t.replace(
        "max_feature_idx=", "max_feature_idx=1", 1)), ()),
    "blend-members-naming-blend": (_spoil("members.json", '["blend", "lightgbm"]'),
                                   ("--family", "blend")),
    "conformal-json-malformed": (_spoil("conformal.json", "{widening"), ()),
    "metadata-json-malformed": (_spoil("metadata.json", "[1, 2"), ()),
    "file-changed-after-fitting": (_spoil("options.json", "{}", seal=False), ()),
    "manifest-missing": (lambda r: _unlink(surrogate(r, "lightgbm") / "manifest.json"), ()),
    "quality-table-junk": (lambda r: _write(r / "tiny/surrogates/perplexity/quality.parquet",
                                            b"PAR1 junk"), ("--family", "best")),
}


def _unlink(path: Path) -> Path:
    path.unlink()
    return path.parent


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", SURROGATE_CASES)
def test_query_refuses_a_spoiled_surrogate_folder(results: Path, case: str) -> None:
    spoil, extra = SURROGATE_CASES[case]
    named = spoil(results)
    family = () if "--family" in extra else ("--family", "lightgbm")
    err = refused(query(results, "--arch", ARCH.id, *family, *extra), named, results)
    assert "make run" in err or "rerun" in err or "refit" in err


def test_a_segfaulting_lightgbm_text_is_refused_before_lightgbm_reads_it(results: Path) -> None:
    """In a process of its own: were the text handed to LightGBM, it would crash (rc 139)."""
    point = _spoil("point.txt", _split_feature)(results)
    result = run(["hwgptbench", *map(str, query(results, "--arch", ARCH.id, "--family",
                                                "lightgbm"))], results, check=False)
    assert result.returncode == 2, result.stderr
    assert f"{point} is refused as a LightGBM model" in result.stderr
    assert "split_feature" in result.stderr and "Traceback" not in result.stderr


def test_query_refuses_bad_arch_ids_and_output_paths(results: Path, tmp_path: Path) -> None:
    refused(query(results, "--arch", "garbage"), "garbage", tmp_path)
    header_only = tmp_path / "archs.txt"
    header_only.write_text("arch_id\n")
    err = refused(query(results, "--archs-file", header_only), header_only, tmp_path)
    assert "line 1" in err
    (tmp_path / "out").mkdir()
    refused(query(results, "--arch", ARCH.id, "--out", tmp_path / "out"), tmp_path / "out",
            tmp_path)


# -- exported models ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, SuperGPT]:
    """ARCH's sub-network of a random supernet exported as model.pt2, and the supernet."""
    torch.manual_seed(0)
    model = SuperGPT(SPACE, VOCAB).eval()
    folder = tmp_path_factory.mktemp("export") / "out"
    export_arch(model.extract(ARCH).float().eval(), folder, ["pt2"])
    return folder, model


def test_our_export_passes_the_check_and_loads(exported: tuple[Path, SuperGPT]) -> None:
    folder, model = exported
    assert pt2.check_archive(folder / pt2.FILE)
    ids = torch.randint(VOCAB, (2, 9), generator=torch.Generator().manual_seed(1))
    model.set_arch(ARCH)
    with torch.no_grad():
        torch.testing.assert_close(load_exported(folder, "pt2")(ids), model(ids), atol=1e-5,
                                   rtol=0)


def _rewrite(path: Path, edit: Callable[[dict[str, bytes], str], None]) -> None:
    """Rewrite the zip archive at path with edit(entries, root) applied."""
    with zipfile.ZipFile(path) as archive:
        entries = {name: archive.read(name) for name in archive.namelist()}
    root = next(iter(entries)).split("/", 1)[0] + "/"
    edit(entries, root)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)


def _pickled(obj: Any) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def _pickled_payload(config: str, marker: Path) -> Callable[[dict[str, bytes], str], None]:
    """A weight (or constant) stored as a pickle whose loading would create the marker."""
    def edit(entries: dict[str, bytes], root: str) -> None:
        name = f"{root}data/{config}"
        document = json.loads(entries[name])
        meta = next(iter(document["config"].values()))
        meta["use_pickle"] = True
        entries[name] = json.dumps(document).encode()
        entries[f"{root}data/{config.split('/')[0]}/{meta['path_name']}"] = _pickled(
            Hostile(marker))
    return edit


def _program(change: Callable[[dict[str, Any], str], None]) -> Callable[[dict[str, bytes], str],
                                                                        None]:
    def edit(entries: dict[str, bytes], root: str) -> None:
        program = json.loads(entries[f"{root}models/model.json"])
        change(program, json.dumps(program))
        entries[f"{root}models/model.json"] = json.dumps(program).encode()
    return edit


def _first_expression(program: dict[str, Any], marker: Path) -> None:
    stack: list[Any] = [program]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            if isinstance(item.get("expr_str"), str):
                item["expr_str"] = (f"__import__('pathlib').Path({str(marker)!r}).touch() or "
                                    + item["expr_str"])
                return
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    raise AssertionError("the program has no shape expression")


def _first_target(program: dict[str, Any], target: str) -> None:
    program["graph_module"]["graph"]["nodes"][0]["target"] = target


def _added(name: str, data: bytes) -> Callable[[dict[str, bytes], str], None]:
    def edit(entries: dict[str, bytes], root: str) -> None:
        entries[root + name] = data
    return edit


def pt2_cases(marker: Path) -> dict[str, tuple[Callable[[dict[str, bytes], str], None], str]]:
    """Hostile edits of an export's model.pt2 and what the refusal names."""
    return {
        "weight-stored-as-pickle": (_pickled_payload("weights/model_weights_config.json",
                                                     marker), "use_pickle"),
        "constant-stored-as-pickle": (_pickled_payload("constants/model_constants_config.json",
                                                       marker), "use_pickle"),
        "pickled-sample-inputs": (_added("data/sample_inputs/model.pt",
                                         _pickled((Hostile(marker),))), "sample inputs"),
        "pickled-custom-object": (_added("data/constants/custom_obj_0", pickle.dumps(
            Hostile(marker))), "custom_obj_0"),
        "compiled-library": (_added("data/aotinductor/model/model.so", b"\x7fELF"),
                             "aotinductor"),
        "guard-code": (_program(lambda p, _: p.update(guards_code=[
            f"__import__('pathlib').Path({str(marker)!r}).touch()"])), "guard code"),
        "shape-expression-with-code": (_program(lambda p, _: _first_expression(p, marker)),
                                       "shape expression"),
        "call-of-any-callable": (_program(lambda p, _: _first_target(p, "torch.os.system")),
                                 "torch.os.system"),
        "file-reading-operator": (_program(lambda p, _: _first_target(
            p, "torch.ops.aten.from_file.default")), "from_file"),
    }


def test_the_hostile_weight_would_run_code_without_the_check(
        exported: tuple[Path, SuperGPT], tmp_path: Path) -> None:
    """The threat is real: torch.export.load itself unpickles such a weight (torch 2.13)."""
    path = tmp_path / pt2.FILE
    shutil.copy(exported[0] / pt2.FILE, path)
    proof = tmp_path / "ran"
    _rewrite(path, _pickled_payload("weights/model_weights_config.json", proof))
    with contextlib.suppress(Exception):
        torch.export.load(path)
    assert proof.exists()


@pytest.mark.parametrize("case", list(pt2_cases(Path("m"))))
def test_evaluate_refuses_a_hostile_pt2(exported: tuple[Path, SuperGPT], tmp_path: Path,
                                        marker: Path, case: str) -> None:
    folder = tmp_path / "model"
    shutil.copytree(exported[0], folder)
    edit, why = pt2_cases(marker)[case]
    _rewrite(folder / pt2.FILE, edit)
    err = refused(["evaluate", "--model", folder, "--format", "pt2", "--data",
                   tmp_path / "no-data", "--out", tmp_path / "results.json"],
                  folder / pt2.FILE, tmp_path)
    assert why in err and "refused unread" in err and "hwgptbench export" in err


def test_evaluate_refuses_a_pt2_that_is_no_archive(exported: tuple[Path, SuperGPT],
                                                   tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(exported[0], folder)
    (folder / pt2.FILE).write_bytes(b"not a zip")
    refused(["evaluate", "--model", folder, "--format", "pt2", "--data", tmp_path,
             "--out", tmp_path / "r.json"], folder / pt2.FILE, tmp_path)


# -- export --------------------------------------------------------------------------------------

def test_export_refuses_bad_arch_ids_user_folders_and_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoint = tmp_path / "no-such-supernet.pt"
    refused(["export", "--checkpoint", checkpoint, "--arch", "garbage", "--out",
             tmp_path / "new"], "garbage", tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "thesis.tex").write_text("a user's file")
    err = refused(["export", "--checkpoint", checkpoint, "--arch", ARCH.id, "--out", mine],
                  mine, tmp_path)
    assert "export did not write" in err
    (mine / "manifest.json").write_text("{}")  # a user's site: a manifest is not a marker
    (mine / "img").mkdir()
    refused(["export", "--checkpoint", checkpoint, "--arch", ARCH.id, "--out", mine], mine,
            tmp_path)
    assert sorted(p.name for p in mine.iterdir()) == ["img", "manifest.json", "thesis.tex"]
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    for out in (".", "..", str(tmp_path)):
        refused(["export", "--checkpoint", checkpoint, "--arch", ARCH.id, "--out", out],
                f"--out {out}", tmp_path)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_a_torch_file_asking_for_a_blocked_module_is_refused_not_corrupt(
        tmp_path: Path, marker: Path) -> None:
    """torch 2.13 words a blocked module's global "unsupported GLOBAL posix.system ...";
    export reads the checkpoint through io.load_torch."""

    class System:
        def __reduce__(self) -> tuple[Any, ...]:
            return os.system, (f"touch {marker}",)

    checkpoint = tmp_path / "supernet.pt"
    torch.save({"format": "x", "model": System()}, checkpoint)
    with pytest.raises(TorchFileError, match=r"asks for (posix|os|nt)\.system, .*refused unread"):
        load_torch(checkpoint, "fix")
    err = refused(["export", "--checkpoint", checkpoint, "--arch", ARCH.id, "--out",
                   tmp_path / "new"], checkpoint, tmp_path)
    assert "refused unread" in err and "corrupt" not in err


# -- imported pickles, params ------------------------------------------------------------------

def test_import_refuses_a_pickle_nested_200000_deep(tmp_path: Path) -> None:
    path = tmp_path / "files" / "arch_ppl_bench_s" / "ppl.pkl"
    path.parent.mkdir(parents=True)
    depth = 200_000
    path.write_bytes(b"\x80\x02" + b"]" * depth + b"a" * (depth - 1) + b".")
    err = refused(["import-perplexity", "--params", REPO_ROOT / "params.yaml", "--scale", "s",
                   "--files", tmp_path / "files", "--source-url", "https://example.org/x",
                   "--rev", "r1", "--out", tmp_path / "ppl.parquet"], path, tmp_path)
    assert "deeper than" in err


PARAMS_CASES = {
    "surrogate.coverage": ("surrogate", "coverage", math.nan),
    "supernet.lr": ("supernet", "lr", math.nan),
    "measure.max_seconds": ("measure", "max_seconds", math.inf),
    "sample.n_archs": ("sample", "n_archs", 10**12),
    "compress.name": ("compress", "name", ".."),
    "perplexity.hwgptbench.rev": ("perplexity", "hwgptbench", {
        **PARAMS_DOC["perplexity"]["hwgptbench"], "rev": "795cba8; touch M #"}),
    "perplexity.hwgptbench.url": ("perplexity", "hwgptbench", {
        **PARAMS_DOC["perplexity"]["hwgptbench"], "url": "x$(touch M)"}),
}


@pytest.mark.parametrize("field", PARAMS_CASES)
def test_validate_refuses_bad_numbers_names_and_values(tmp_path: Path, field: str) -> None:
    section, key, value = PARAMS_CASES[field]
    doc = json.loads(json.dumps(PARAMS_DOC))
    doc[section][key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(doc))
    err = refused(["validate", "--params", path], field, tmp_path)
    assert "nothing was written" in err and not (tmp_path / "M").exists()


def test_a_value_with_a_space_is_valid() -> None:
    doc = json.loads(json.dumps(PARAMS_DOC))
    doc["perplexity"]["hwgptbench"]["files"] = "data/hw gpt"
    params.validate(doc)


# -- the workflow ----------------------------------------------------------------------------

def test_layout_reads_device_labels_as_the_schema_does(tmp_path: Path,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    measure = params.schema_at(["measure", "device"])
    assert f"^{layout.DEVICE_LABEL.pattern}$" == measure["pattern"]
    for name in ("cpu-a.parquet", "x||touch MARKER||.parquet", "A B.parquet", "-x.parquet"):
        (tmp_path / name).write_bytes(b"")
    assert layout.labelled_tables(str(tmp_path)) == {"cpu-a": str(tmp_path / "cpu-a.parquet")}
    assert "x||touch MARKER||.parquet" in caplog.text and "A B.parquet" in caplog.text


@pytest.mark.e2e
def test_the_workflow_skips_a_table_named_as_shell_code_and_quotes_a_space(
        tmp_path: Path) -> None:
    """A table copied into results/s/measure/ named ``x||touch MARKER||.parquet`` is skipped
    with a warning (it became a device and a shell argument), and perplexity.hwgptbench.files
    with a space imports into that folder: `dvc import` and the conversion, run by Snakemake."""
    project = make_project(tmp_path)
    commit = _upstream(tmp_path / "upstream", 12)
    overlay = {"workflow": {"devices": []}, "search": {"devices": ["cpu-a"]},
               "perplexity": {"hwgptbench": {"url": str(tmp_path / "upstream"), "rev": commit,
                                             "files": "data/hw gpt",
                                             "source_url": "https://example.org/HW-GPT-Bench"}}}
    (project / "overlay.yaml").write_text(yaml.safe_dump(overlay))
    measure = project / "results" / "s" / "measure"
    measure.mkdir(parents=True)
    table = next((REPO_ROOT / "src/hwgptbench/published/s/devices").glob("*.parquet"))
    shutil.copy(table, measure / "cpu-a.parquet")
    shutil.copy(table, measure / "x||touch MARKER||.parquet")
    result = run(["snakemake", "results/s/perplexity.parquet", "results/s/measurements.parquet",
                  "--cores", "1", "--resources", "dvc=1", "--configfile",
                  "params/hwgptbench.yaml", "overlay.yaml"], project)
    log = result.stdout + result.stderr
    assert "skipping 'results/s/measure/x||touch MARKER||.parquet'" in log
    assert not list(project.rglob("MARKER")) and not list(tmp_path.rglob("MARKER"))
    assert "--files 'data/hw gpt'" in log
    assert (project / "data" / "hw gpt" / "arch_ppl_bench_s" / "ppl.pkl").is_file()
    assert pl.read_parquet(project / "results/s/perplexity.parquet").height == 12
    assert set(pl.read_parquet(project / "results/s/measurements.parquet")["device"]) == set(
        pl.read_parquet(table)["device"])


# -- any string ------------------------------------------------------------------------------

ID_LIKE = st.from_regex(r"e[0-9]{1,5}-l[0-9]{1,3}-h[0-9_]{1,12}-r[0-9._]{1,12}-b[0-9]",
                        fullmatch=True)


@settings(max_examples=300, deadline=None, database=None)
@given(st.one_of(st.text(max_size=60), ID_LIKE))
def test_any_string_is_an_arch_id_or_refused(text: str) -> None:
    try:
        arch = Arch.from_id(text)
    except InvalidArchError as err:
        assert isinstance(err, UserError) and isinstance(err, ValueError)
    else:
        assert arch.id == text


SECTIONS = sorted(PARAMS_DOC)
VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
        st.text(max_size=10) | st.integers() | st.booleans() | st.none(), inner, max_size=3),
    max_leaves=8)


def _overlays() -> st.SearchStrategy[dict[str, Any]]:
    """Overlays of params.yaml: some of its sections' keys (or others) set to any value."""
    keys = st.sampled_from(SECTIONS).flatmap(lambda section: st.tuples(
        st.just(section), st.sampled_from(sorted(PARAMS_DOC[section]) + ["unknown"])
        if isinstance(PARAMS_DOC[section], dict) else st.just("unknown")))
    return st.lists(st.tuples(keys, VALUES), min_size=1, max_size=3).map(
        lambda changes: {section: {key: value} for (section, key), value in changes})


@settings(max_examples=150, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(_overlays())
def test_any_params_overlay_is_valid_or_one_params_error(over: dict[str, Any]) -> None:
    try:
        params.validate(params.overlay(PARAMS_DOC, over))
    except params.ParamsError as err:
        assert isinstance(err, UserError) and "nothing was written" in str(err)


@settings(max_examples=100, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(max_size=80))
@example("workflow: {1: 2, b: 3}")  # keys of two types
@example("? [1, 2]\n: 3")
def test_any_overlay_file_is_read_or_one_params_error(tmp_path: Path, text: str) -> None:
    path = tmp_path / "overlay.yaml"
    path.write_text(text, encoding="utf-8")
    try:
        params.load_overlaid(REPO_ROOT / "params.yaml", [path])
    except params.ParamsError as err:
        assert isinstance(err, UserError)
