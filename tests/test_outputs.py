"""The one output policy (hwgptbench.outputs): every command that writes a path a user named
refuses what it did not write before, in one table over the commands."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import polars as pl
import pytest

from conftest import REPO_ROOT
from hwgptbench import cli
from hwgptbench.outputs import (
    MARKER,
    OutputPathError,
    check_output_dir,
    check_output_file,
    check_output_flags,
    replace_dir,
    write_json_output,
    write_table,
)

PARAMS = ["--params", str(REPO_ROOT / "params.yaml")]
ARCH = "e128-l3-h4_2_4-r4_3_2-b1"
# command -> (argv before its output flag, the flag): every command that writes a path a user
# names (publish-device and adapt write inside the project's own folders, named by a checked
# label)
COMMANDS: dict[str, tuple[list[str], str]] = {
    "data": ([*PARAMS], "--out"),
    "fit-surrogates": ([*PARAMS, "--perplexity", "p.parquet"], "--out"),
    "search-reference": ([*PARAMS, "--objectives", "x", "--device", "d"], "--out"),
    "search": ([*PARAMS, "--objectives", "x", "--device", "d", "--algorithm", "rs",
                "--reference", "r"], "--out"),
    "export": (["--checkpoint", "c.pt", "--arch", ARCH], "--out"),
    "export-pareto": ([*PARAMS, "--data", "d", "--supernet", "s.pt", "--subnets", "s.parquet"],
                      "--out"),
    "evaluate": ([*PARAMS, "--model", "m", "--data", "d"], "--out"),
    "query": (["--metric", "latency_ms", "--arch", ARCH], "--out"),
    "explore": (["--scale", "s"], "--out"),
    "ship-tables": ([*PARAMS, "--scale", "s"], "--folder"),
}


def _user_folder(root: Path) -> Path:
    folder = root / "notes"
    folder.mkdir(parents=True)
    (folder / "thesis.txt").write_text("mine")
    return folder


def _fifo(root: Path) -> Path:
    path = root / "pipe.parquet"
    os.mkfifo(path)
    return path


def _link_out(root: Path) -> Path:
    outside = root.parent / f"{root.name}-outside"
    outside.mkdir(exist_ok=True)
    link = root / "link.json"
    link.symlink_to(outside)
    return link


def _foreign_file(suffix: str) -> Callable[[Path], Path]:
    def make(root: Path) -> Path:
        path = root / f"data{suffix}"
        path.write_text("not written by hwgptbench")
        return path
    return make


# hostile --out values, each with a substring of the message that refuses it
TARGETS: dict[str, tuple[Callable[[Path], Path], str]] = {
    "working directory": (lambda root: Path("."), "working directory"),
    "parent": (lambda root: Path(".."), "working directory or one of its parents"),
    "home": (lambda root: Path.home(), "home folder"),
    "root": (lambda root: Path("/"), "parents"),
    "folder of user files": (_user_folder, ""),
    "pipe": (_fifo, "not a regular file or folder"),
    "link out of the project": (_link_out, "symbolic link out of the project"),
    "text file": (_foreign_file(".txt"), ""),
    "foreign parquet": (_foreign_file(".parquet"), ""),
    "foreign json": (_foreign_file(".json"), ""),
}


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None)
            for p in sorted(root.rglob("*")) if not p.is_fifo()}


@pytest.mark.parametrize("target", sorted(TARGETS))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_refuses_what_it_did_not_write(
        command: str, target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    project = tmp_path / "project"
    project.mkdir()
    monkeypatch.chdir(project)
    make, words = TARGETS[target]
    out = make(project)
    before = _snapshot(tmp_path)
    argv, flag = COMMANDS[command]
    assert cli.main([command, *argv, flag, str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"hwgptbench {command}: error: {flag} {out}"), err
    assert words in err and len(err.splitlines()) == 1
    assert _snapshot(tmp_path) == before


def test_suffix_must_name_the_format(tmp_path: Path) -> None:
    with pytest.raises(OutputPathError, match="suffix"):
        check_output_file(tmp_path / "x.txt", "query", (".parquet", ".csv"))
    with pytest.raises(OutputPathError, match="suffix"):
        check_output_file(tmp_path / "results", "evaluate", (".json",))


def test_a_file_is_replaced_only_when_the_same_command_wrote_it(tmp_path: Path) -> None:
    table = pl.DataFrame({"a": [1, 2]})
    out = write_table(table, tmp_path / "q.parquet", "query")
    write_table(table.with_columns(a=pl.col("a") * 2), out, "query")
    assert pl.read_parquet(out)["a"].to_list() == [2, 4]
    with pytest.raises(OutputPathError, match="not written by hwgptbench merge"):
        write_table(table, out, "merge")
    csv = write_table(table, tmp_path / "q.csv", "query")
    with pytest.raises(OutputPathError, match="exists"):  # a CSV holds no marker: never replaced
        write_table(table, csv, "query")
    document = write_json_output({"score": 1.0}, tmp_path / "r.json", "evaluate")
    write_json_output({"score": 2.0}, document, "evaluate")
    assert json.loads(document.read_text())["score"] == 2.0


def test_a_folder_is_replaced_only_when_the_same_command_wrote_it(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with replace_dir(out, "data") as staging:
        (staging / "a").write_text("1")
    with replace_dir(out, "data") as staging:
        (staging / "b").write_text("2")
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "b"]
    with pytest.raises(OutputPathError, match="hwgptbench export did not write"):
        check_output_dir(out, "export")
    (out / MARKER).write_text("{not json")
    with pytest.raises(OutputPathError):
        check_output_dir(out, "data")
    assert (out / "b").read_text() == "2"


def test_a_failed_write_leaves_the_earlier_output(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with replace_dir(out, "data") as staging:
        (staging / "a").write_text("1")
    with pytest.raises(RuntimeError), replace_dir(out, "data") as staging:
        (staging / "a").write_text("partial")
        raise RuntimeError("killed")
    assert (out / "a").read_text() == "1"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_a_link_inside_the_project_is_replaced_not_followed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real.parquet").write_bytes(b"x")
    link = tmp_path / "link.parquet"
    link.symlink_to(tmp_path / "real.parquet")
    with pytest.raises(OutputPathError, match="not written by"):  # the target is not ours
        write_table(pl.DataFrame({"a": [1]}), link, "query")
    assert (tmp_path / "real.parquet").read_bytes() == b"x"


def _out_flags() -> list[tuple[str, str]]:
    """(command, flag) of every output flag of every subcommand."""
    flags = []
    for command in sorted(cli.COMMANDS):
        sub = next(a for a in cli.build_parser(command)._actions
                   if a.dest == "command").choices[command]  # type: ignore[union-attr]
        flags += [(command, option) for action in sub._actions
                  for option in action.option_strings
                  if option == "--out" or option.endswith("-out")]
    return flags


def test_every_output_flag_is_checked_before_its_command_runs(tmp_path: Path) -> None:
    flags = _out_flags()
    assert len(flags) >= 30 and ("merge-quality", "--metrics-out") in flags
    os.mkfifo(tmp_path / "pipe")
    for _, option in flags:
        name = option.removeprefix("--").replace("-", "_")
        for path, words in ((Path("/"), "parents"), (tmp_path / "pipe", "not a regular")):
            with pytest.raises(OutputPathError, match=words):
                check_output_flags({name: str(path)})
        check_output_flags({name: str(tmp_path / "new.parquet")})


def test_a_stage_command_refuses_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["merge-quality", "--out", "q.parquet", "--metrics-out", ".",
                     "a.parquet"]) == 2
    assert "--metrics-out .: is the working directory" in capsys.readouterr().err


def test_adapt_refuses_a_device_folder_it_did_not_write(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = _user_folder(tmp_path / "results" / "tiny" / "adapted")
    device = folder.name
    assert cli.main(["adapt", *PARAMS, "--results", str(tmp_path / "results"), "--device",
                     device, "--measurements", "m.parquet"]) == 2
    err = capsys.readouterr().err
    assert f"--device {folder}: holds files that hwgptbench adapt did not write" in err
    assert (folder / "thesis.txt").read_text() == "mine"


def test_a_folder_made_whole_before_ledgers_keeps_its_files_replaceable(tmp_path: Path) -> None:
    """A resume folder a command made before markers listed files (version 1) is still that
    command's: an interrupted run's rows are replaced by its rerun; a file in a folder with no
    marker is not."""
    from hwgptbench.io import write_parquet

    made = tmp_path / "parts"
    made.mkdir()
    (made / ".hwgptbench-output.json").write_text(json.dumps(
        {"command": "adapt", "format": "hwgptbench-output", "version": 1}))
    table = pl.DataFrame({"a": [1]})
    table.write_parquet(made / "rows.parquet")
    write_parquet(table, made / "rows.parquet")
    mine = tmp_path / "mine"
    mine.mkdir()
    table.write_parquet(mine / "rows.parquet")
    with pytest.raises(OutputPathError, match="was not written by hwgptbench"):
        write_parquet(table, mine / "rows.parquet")
