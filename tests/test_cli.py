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



def test_the_command_table_names_every_registration() -> None:
    """cli.COMMANDS maps each subcommand to the module that registers it, and nothing else."""
    import argparse
    import importlib

    from hwgptbench import cli

    registered = {}
    for module in dict.fromkeys(cli.COMMANDS.values()):
        def add(name: str, func: object, params: bool = True, module: str = module
                ) -> argparse.ArgumentParser:
            registered[name] = module
            return argparse.ArgumentParser()
        importlib.import_module(f"hwgptbench.{module}").register(add)
    assert registered == cli.COMMANDS
    stage_modules = {p.parent.name for p in Path(cli.__file__).parent.glob("*/commands.py")}
    assert stage_modules == {m.split(".")[0] for m in cli.COMMANDS.values()} - {"commands"}


def test_a_command_loads_only_its_own_stage(tmp_path: Path) -> None:
    probe = ("import sys\n"
             "from hwgptbench import cli\n"
             "cli.build_parser('data')\n"
             "print(sorted({m.split('.')[1] for m in sys.modules\n"
             "              if m.startswith('hwgptbench.') and m.endswith('.commands')}))\n")
    assert run([sys.executable, "-c", probe], tmp_path).stdout.strip() == "['data']"
