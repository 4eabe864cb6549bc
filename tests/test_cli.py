"""The command line starts light: a subcommand loads only the stage modules it runs."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from conftest import run

HEAVY = ("torch", "lightgbm", "botorch", "dvc", "snakemake", "matplotlib")


def test_parser_loads_no_stage_library(tmp_path: Path) -> None:
    """Building the parser and printing help imports none of the heavy libraries (every
    workflow job pays the CLI's start-up)."""
    probe = ("import sys, contextlib, io\n"
             "from hwgptbench import cli\n"
             "with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
             "    cli.main(['search', '--help'])\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    loaded = run([sys.executable, "-c", probe], tmp_path).stdout.strip()
    assert loaded == "[]"


def test_unknown_registry_name_lists_the_choices(capsys: pytest.CaptureFixture[str]) -> None:
    from hwgptbench.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["search", "--objectives", "x", "--device", "d", "--out", "o", "--reference", "r",
              "--algorithm", "nsga3"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "'nsga3' is not one of" in err and "nsga2" in err and "ehvi" in err

