"""The `hwgptbench` command line: one thin subcommand per workflow stage.

Snakemake rules call these subcommands, so a stage runs the same from the workflow, a
cluster job or a shell. Each stage package registers its own subcommands (its
``commands.py``); this module only names where each is (:data:`COMMANDS`), loads the one that
runs, and turns bad input into a message. Each command imports the stage modules it runs
(torch, LightGBM, BoTorch and DVC take seconds to load), so that a command starts with only what
it needs.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence

from . import __version__, params
from .errors import UserError
from .options import params_arg
from .outputs import check_output_flags

# subcommand -> the module whose register(add) adds it (with its siblings), in workflow order.
# A command imports only its own module: `hwgptbench data` loads no other stage's code, so a
# stage's DVC dependencies are its own commands (tests/test_cli.py holds the table to the
# modules' registrations).
COMMANDS: dict[str, str] = {
    "data": "data.commands",
    **dict.fromkeys(("train", "sample"), "supernet.commands"),
    "perplexity": "perplexity.commands",
    **dict.fromkeys(("fetch-hwgptbench", "import-perplexity"), "hwgpt_import.commands"),
    **dict.fromkeys(("measure", "measure-plan", "merge-shards", "merge-devices",
                     "merge-measurements", "devices"), "measure.commands"),
    **dict.fromkeys(("runtime", "merge-runtime"), "runtime.commands"),
    **dict.fromkeys(("fit-surrogates", "merge-quality"), "surrogate.commands"),
    **dict.fromkeys(("transfer", "adapt", "transfer-external"), "transfer.commands"),
    **dict.fromkeys(("search-reference", "search", "search-summary"), "search.commands"),
    **dict.fromkeys(("figures", "paper-surrogates", "paper-tables", "paper-docs"),
                    "figures.commands"),
    **dict.fromkeys(("compress-dense", "compress-finetune", "compress-search", "compress-table",
                     "compress-figures", "compress-finetune-methods", "compress-seed"),
                    "compress.commands"),
    **dict.fromkeys(("export", "export-pareto", "evaluate"), "export.commands"),
    "query": "commands",
    "ship-tables": "published.commands",
    **dict.fromkeys(("publish-device", "pull", "unlock-stale", "dvc-deps", "status"),
                    "pipeline.commands"),
}


def cmd_validate(args: argparse.Namespace) -> None:
    """Check params.yaml against the schema, with each further --params file (an overlay such
    as params/full.yaml) merged over it as `snakemake --configfile` merges it."""
    paths = args.params or ["params.yaml"]
    params.merge_files(paths)
    print(f"{' + '.join(paths)}: valid")


def registries(command: str | None = None) -> list[str]:
    """The modules that register ``command`` (every module for None or an unknown name: the
    help lists every command)."""
    if command in COMMANDS:
        return [COMMANDS[command]]
    return list(dict.fromkeys(COMMANDS.values()))


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``command`` (loading only its module), or of every command."""
    parser = argparse.ArgumentParser(prog="hwgptbench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hwgptbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], None], params: bool = True
            ) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=func.__doc__, description=func.__doc__)
        command.set_defaults(func=func)
        if params:
            params_arg(command)
        return command

    add("validate", cmd_validate)
    for module in registries(command):
        importlib.import_module(f"{__package__}.{module}").register(add)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on a command line (its first word that is not an option)."""
    return next((word for word in argv if not word.startswith("-")), None)


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command(argv)).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        check_output_flags(vars(args))
        args.func(args)
    except subprocess.CalledProcessError as exc:
        print(f"hwgptbench {args.command}: error: {' '.join(exc.cmd)} exited with "
              f"{exc.returncode}", file=sys.stderr)
        return 1
    except (UserError, FileNotFoundError) as exc:
        print(f"hwgptbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
