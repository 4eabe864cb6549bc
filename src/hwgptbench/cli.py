"""The `hwgptbench` command line: one thin subcommand per workflow stage.

Snakemake rules call these subcommands, so a stage runs the same from the workflow, a
cluster job or a shell. Each stage package registers its own subcommands (its
``commands.py``); this module only assembles them, in the order of the workflow, and turns bad
input into a message. Each command imports the stage modules it runs (torch, LightGBM,
BoTorch and DVC take seconds to load), so that a command starts with only what it needs.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence

from . import __version__, commands, params
from .compress import commands as compress_commands
from .data import commands as data_commands
from .errors import UserError
from .export import commands as export_commands
from .figures import commands as figures_commands
from .hwgpt_import import commands as hwgpt_import_commands
from .measure import commands as measure_commands
from .options import Add, params_arg
from .perplexity import commands as perplexity_commands
from .published import commands as published_commands
from .runtime import commands as runtime_commands
from .search import commands as search_commands
from .supernet import commands as supernet_commands
from .surrogate import commands as surrogate_commands
from .transfer import commands as transfer_commands

# register(add) of each stage, in the order of the workflow; then the commands of no stage
REGISTRIES: tuple[Callable[[Add], None], ...] = (
    data_commands.register, supernet_commands.register, perplexity_commands.register,
    hwgpt_import_commands.register, measure_commands.register, runtime_commands.register,
    surrogate_commands.register, transfer_commands.register, search_commands.register,
    figures_commands.register, compress_commands.register, export_commands.register,
    published_commands.register, commands.register)


def cmd_validate(args: argparse.Namespace) -> None:
    """Check params.yaml against the schema."""
    for path in args.params or ["params.yaml"]:
        params.load(path)
        print(f"{path}: valid")


def build_parser() -> argparse.ArgumentParser:
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
    for register in REGISTRIES:
        register(add)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
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
