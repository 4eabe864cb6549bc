"""One message at the boundary (docs/security.md): every class of bad input, across commands,
is one message on stderr and exit status 2, never a traceback; a bug is one line with the
`--debug` hint and exit status 1, and `--debug` prints its traceback. Flags that stand for
params are checked like them; `validate` refuses what the workflow refuses."""

from __future__ import annotations

import contextlib
import io
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest
import yaml

from conftest import REPO_ROOT
from hwgptbench import cli, compat
from hwgptbench.compat import QueryError
from hwgptbench.space import SearchSpace
from test_transfer_external import _hat_folder

PARAMS = REPO_ROOT / "params.yaml"
LONG = "x" * 5000  # a path component longer than any file system allows


def run(*argv: str | Path) -> tuple[int, str]:
    """hwgptbench's exit status and stderr for argv, in this process (argparse's exit too)."""
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(arg) for arg in argv])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
    return code, err.getvalue()


def refused(argv: list[str | Path], named: str, lines: int | None = 1) -> str:
    """Run argv: exit 2, one error message that names ``named``, no traceback (``lines``: the
    lines of stderr, None for a params error's list of problems)."""
    code, err = run(*argv)
    assert code == 2, err
    assert err.startswith("hwgptbench ") and err.count(": error:") == 1, err
    assert "Traceback" not in err and "panicked" not in err, err
    if lines is not None:
        assert len(err.splitlines()) == lines, err
    assert named in err, err
    return err


@pytest.fixture(scope="module")
def hat(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """HAT's latency folder of 30 archs per table."""
    return _hat_folder(tmp_path_factory.mktemp("hat"), n=30)


def _external(hat: Path, out: Path, *flags: str) -> list[str | Path]:
    """transfer-external on one HAT split with one baseline (a second), then ``flags``."""
    defaults = {"--ks": ["5"], "--seeds": ["1"], "--report-k": ["5"], "--methods": ["flops"],
                "--only": ["hat_wmt14ende"]}
    given = {flag for flag in flags if flag.startswith("--")}
    argv: list[str | Path] = ["transfer-external", "--params", PARAMS, "--hat", hat,
                              "--out-dir", out]
    for flag, values in defaults.items():
        if flag not in given:
            argv += [flag, *values]
    return argv + list(flags)


# (name, extra flags, what the message names)
FLAG_CASES = [
    ("seeds-0", ["--seeds", "0"], "--seeds"),
    ("seeds-word", ["--seeds", "ten"], "--seeds"),
    ("ks-0", ["--ks", "0"], "--ks"),
    ("ks-over-the-archs", ["--ks", "100000", "--report-k", "100000"], "--ks 100000"),
    ("report-k-not-in-ks", ["--report-k", "7"], "--report-k 7"),
    ("methods-unknown", ["--methods", "nosuch"], "--methods"),
    ("only-unknown", ["--only", "nosuch"], "--only nosuch"),
    ("drop-first-not-a-count", ["--drop-first", "x:abc"], "--drop-first"),
    ("drop-first-unknown-table", ["--drop-first", "x:3"], "--drop-first x:3"),
    ("drop-first-every-arch", ["--drop-first", "wmt14ende_cpu_xeon:30"], "the table has 30"),
]


@pytest.mark.parametrize(("extra", "named"), [case[1:] for case in FLAG_CASES],
                         ids=[case[0] for case in FLAG_CASES])
def test_transfer_external_flags_are_checked_like_params(
        hat: Path, tmp_path: Path, extra: list[str], named: str) -> None:
    refused(_external(hat, tmp_path / "out", *extra), named)
    assert not (tmp_path / "out").exists()


def _nan_row(text: bytes) -> bytes:
    return text.rstrip(b"\n") + b"\n" + b",".join([b"nan"] * 14) + b"\n"


def _empty_cell(text: bytes) -> bytes:
    return text.rstrip(b"\n") + b"\n1,2\n"


def _not_utf8(text: bytes) -> bytes:
    return text + b"\xff\xfe,1\n"


def _ragged(text: bytes) -> bytes:
    return text.replace(b"\n", b"\n1,", 1)


def _words(text: bytes) -> bytes:
    header, first, rest = text.split(b"\n", 2)
    return b"\n".join([header, b"big," + first.split(b",", 1)[1], rest])


def _negative_latency(text: bytes) -> bytes:
    header, first, rest = text.split(b"\n", 2)
    cells = first.split(b",")
    column = header.split(b",").index(b"latency_mean_encoder")
    cells[column] = b"-3"
    return b"\n".join([header, b",".join(cells), rest])


CSV_CASES: list[tuple[str, Callable[[bytes], bytes], str]] = [
    ("nan-row", _nan_row, "is not a finite"),
    ("empty-cells", _empty_cell, "is not a finite"),
    ("not-utf8", _not_utf8, "not a CSV table"),
    ("ragged", _ragged, "not a CSV table"),
    ("words", _words, "is not numbers"),
    ("negative-latency", _negative_latency, "latency_mean_encoder"),
]


@pytest.mark.parametrize(("mutate", "named"), [case[1:] for case in CSV_CASES],
                         ids=[case[0] for case in CSV_CASES])
def test_a_bad_hat_csv_is_one_message(hat: Path, tmp_path: Path,
                                      mutate: Callable[[bytes], bytes], named: str) -> None:
    folder = tmp_path / "latency_dataset"
    folder.mkdir()
    for path in hat.glob("*_all.csv"):
        (folder / path.name).write_bytes(path.read_bytes())
    victim = folder / "wmt14ende_cpu_xeon_all.csv"
    victim.write_bytes(mutate(victim.read_bytes()))
    err = refused(_external(folder, tmp_path / "out"), named)
    assert str(victim) in err


def test_a_device_label_that_is_no_slug_is_one_message(tmp_path: Path) -> None:
    refused(["measure", "--params", PARAMS, "--scale", "tiny", "--device", "../x",
             "--archs", tmp_path / "archs.parquet", "--out", tmp_path / "shard.parquet",
             "--vocab-size", "64"], "'../x'")


def test_paths_the_file_system_refuses_are_one_message(tmp_path: Path) -> None:
    parent = tmp_path / "a-file"
    parent.write_text("not a folder")
    refused(["transfer-external", "--params", PARAMS, "--out-dir", parent / "out"],
            str(parent))
    err = refused(["validate", "--params", tmp_path / LONG], "File name too long")
    assert len(err) < 1500  # the name is cut in the middle
    refused(["transfer-external", "--params", PARAMS, "--hat", tmp_path / LONG,
             "--out-dir", tmp_path / "out"], "File name too long")
    assert parent.read_text() == "not a folder"


@pytest.mark.parametrize("flags", [["--vocab-size", "0"], ["--vocab-size", "-5"],
                                   ["--vocab-size", "10000000000"]])
def test_a_vocabulary_flag_has_the_params_bounds(tmp_path: Path, flags: list[str]) -> None:
    refused(["ship-tables", "--params", PARAMS, "--scale", "s", "--folder",
             tmp_path / "tables", *flags], "--vocab-size")
    assert not (tmp_path / "tables").exists()


def _overlay(tmp_path: Path, doc: dict) -> Path:
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


VALIDATE_CASES = [
    ("unknown-scale", {"workflow": {"scales": ["s-1"]}}, "workflow.scales"),
    ("unshipped-paper-scale", {"paper": {"scales": ["tiny"]}}, "ship no tables"),
    ("unshipped-search-scale", {"paper": {"search_scale": "tiny"}}, "ship no tables"),
    ("unshipped-device", {"paper": {"search": {"devices": ["nosuch-gpu"]}}},
     "paper.search.devices"),
    ("missing-help-folder", {"paper": {"external": {"help_fbnet": "no/such/fbnet"}}},
     "paper.external.help_fbnet"),
    ("missing-hat-folder", {"paper": {"external": {"hat": "no/such/latency_dataset"}}},
     "paper.external.hat"),
]


@pytest.mark.parametrize(("overlay", "named"), [case[1:] for case in VALIDATE_CASES],
                         ids=[case[0] for case in VALIDATE_CASES])
def test_validate_refuses_what_the_workflow_refuses(tmp_path: Path, overlay: dict,
                                                    named: str) -> None:
    refused(["validate", "--params", PARAMS, "--params", _overlay(tmp_path, overlay)],
            named, lines=None)


def test_validate_accepts_the_shipped_overlays() -> None:
    for overlay in sorted((REPO_ROOT / "params").glob("*.yaml")):
        code, err = run("validate", "--params", PARAMS, "--params", overlay)
        assert code == 0, err


def test_set_arch_refuses_a_layer_count_outside_the_space_before_building_it() -> None:
    space = SearchSpace.from_dict("tiny", {
        "embed_dim": [32, 64], "n_layer": [1, 2], "n_head": [2, 4], "mlp_ratio": [2, 4],
        "bias": [True, False], "head_size": 16, "block_size": 16, "rotary_fraction": 0.5})
    config = {"sample_embed_dim": 32, "sample_n_layer": 10**18, "sample_n_head": [2, 2],
              "sample_mlp_ratio": [2, 2], "sample_bias": True}
    with pytest.raises(QueryError, match="not a layer count of the tiny space"):
        compat.arch_of(config, space)
    assert compat.arch_of({**config, "sample_n_layer": 2}, space).n_layer == 2


# -- errors raised inside a command --------------------------------------------------------------

def _raising(error: BaseException) -> Callable[[object], None]:
    def command(args: object) -> None:
        raise error
    return command


OUTSIDE = [
    ("name-too-long", OSError(36, "File name too long", LONG)),
    ("not-a-folder", NotADirectoryError(20, "Not a directory", "/tmp/file/out")),
    ("exists", FileExistsError(17, "File exists", "/tmp/file")),
    ("permission", PermissionError(13, "Permission denied", "/root/x")),
    ("folder", IsADirectoryError(21, "Is a directory", "/tmp")),
    ("polars", pl.exceptions.ComputeError("invalid utf-8 sequence\n\nHint: look at row 3")),
    ("utf8", UnicodeDecodeError("utf-8", b"\xff", 0, 1, "invalid start byte")),
    ("yaml", yaml.YAMLError("found character '\\t'\n  in line 2")),
]


@pytest.mark.parametrize("error", [case[1] for case in OUTSIDE],
                         ids=[case[0] for case in OUTSIDE])
def test_errors_of_outside_input_are_one_line_and_exit_2(
        monkeypatch: pytest.MonkeyPatch, error: BaseException) -> None:
    monkeypatch.setattr(cli, "cmd_validate", _raising(error))
    err = refused(["validate"], "hwgptbench validate: error:")
    assert len(err) < 1500


def test_a_bug_is_one_line_with_the_debug_hint_and_exit_1(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "cmd_validate", _raising(RuntimeError("planted\nbug")))
    code, err = run("validate")
    assert code == 1
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert "RuntimeError: planted bug" in err and "hwgptbench --debug validate" in err
    code, err = run("--debug", "validate")
    assert code == 1
    assert "Traceback" in err and "RuntimeError: planted" in err
    assert err.splitlines()[-1].startswith("hwgptbench validate: error: RuntimeError")
    monkeypatch.setattr(cli, "cmd_validate", _raising(ValueError("a plain ValueError")))
    assert run("validate")[0] == 1  # a plain ValueError is not input: input errors are typed
