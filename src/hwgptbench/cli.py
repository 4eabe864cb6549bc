"""The `hwgptbench` command line: one thin subcommand per workflow stage.

Snakemake rules call these subcommands, so a stage runs the same from the workflow, a
cluster job or a shell. Each stage package registers its own subcommands (its
``commands.py``); this module only names where each is (:data:`COMMANDS`), loads the one that
runs, and turns bad input into a message. Each command imports the stage modules it runs
(torch, LightGBM, BoTorch and DVC take seconds to load), so that a command starts with only what
it needs.

One message at the boundary (docs/security.md): bad input -- a :class:`UserError`, an
``OSError``, or an error of a library reading outside input -- is one line on stderr and exit
status 2; anything else is a bug: one line with a hint and exit status 1 (``--debug`` prints
the traceback).
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shlex
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import NoReturn

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
    **dict.fromkeys(("figures", "paper-surrogates", "paper-tables", "paper-docs", "explore"),
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
    as params/full.yaml) merged over it as `snakemake --configfile` merges it, and for what
    the workflow refuses before it plans a job (the Snakefile's check)."""
    from .workflow_checks import check_workflow

    paths = args.params or ["params.yaml"]
    check_workflow(params.load_typed(paths), " + ".join(paths))
    print(f"{' + '.join(paths)}: valid")


def cmd_params(args: argparse.Namespace) -> None:
    """Print the params reference generated from the params models (Markdown: every field,
    what it allows, its default and description), or their JSON schema; --check FILE fails
    when FILE is not the current reference (docs/params.md)."""
    from .params_reference import describe

    text = json.dumps(params.schema(), indent=2) + "\n" if args.schema else describe()
    if args.check is None:
        sys.stdout.write(text)
        return
    with open(args.check, encoding="utf-8") as file:
        if file.read() != text:
            raise UserError(f"{args.check} is not the current params reference: regenerate it "
                            f"with `hwgptbench params --describe > {args.check}`")
    print(f"{args.check}: current")


def registries(command: str | None = None) -> list[str]:
    """The modules that register ``command`` (every module for None or an unknown name: the
    help lists every command)."""
    if command in COMMANDS:
        return [COMMANDS[command]]
    return list(dict.fromkeys(COMMANDS.values()))


class Parser(argparse.ArgumentParser):
    """argparse's parser whose refusal of a command line is one line on stderr (exit 2): the
    flag, why, and where the flags are listed (instead of the usage text first)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (`{self.prog} --help` lists "
                     "the flags)\n")


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``command`` (loading only its module), or of every command."""
    parser = Parser(prog="hwgptbench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hwgptbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    parser.add_argument("--debug", action="store_true",
                        help="print the traceback of an error (to report a bug)")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], None], params: bool = True
            ) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=func.__doc__, description=func.__doc__)
        command.set_defaults(func=func)
        if params:
            params_arg(command)
        return command

    add("validate", cmd_validate)
    reference = add("params", cmd_params, params=False)
    reference.add_argument("--describe", action="store_true",
                           help="the Markdown reference (the default)")
    reference.add_argument("--schema", action="store_true", help="the JSON schema instead")
    reference.add_argument("--check", metavar="FILE", help="fail unless FILE is the current "
                                                          "output")
    for module in registries(command):
        importlib.import_module(f"{__package__}.{module}").register(add)
    return parser


def _command(argv: Sequence[str]) -> str | None:
    """The subcommand named on a command line (its first word that is not an option)."""
    return next((word for word in argv if not word.startswith("-")), None)


# Libraries whose errors come from the files and values they are given (outside input, exit
# 2): module -> the names of its error classes. Only modules already imported are looked at, so
# that the command line loads no library to classify an error.
OUTSIDE_ERRORS: dict[str, tuple[str, ...]] = {
    "polars.exceptions": ("PolarsError",),
    "pyarrow.lib": ("ArrowException",),
    "lightgbm.basic": ("LightGBMError",),
    "numpy.linalg": ("LinAlgError",),
    "onnxruntime.capi.onnxruntime_pybind11_state": (
        "Fail", "InvalidArgument", "NoSuchFile", "NoModel", "InvalidProtobuf", "InvalidGraph",
        "NotImplemented", "RuntimeException"),
    "dvc.exceptions": ("DvcException",),
    "yaml": ("YAMLError",),
    "zipfile": ("BadZipFile",),
    "csv": ("Error",),
}
MESSAGE_CHARS = 4000  # a message longer than this is cut
PATH_CHARS = 300  # an OSError's path longer than this (a name too long) is cut in the middle


def outside_errors() -> tuple[type[BaseException], ...]:
    """The exception types that mean bad outside input: the user's mistakes and
    :data:`OUTSIDE_ERRORS` of the libraries loaded."""
    found: list[type[BaseException]] = [UserError, OSError, UnicodeError, json.JSONDecodeError]
    for module, names in OUTSIDE_ERRORS.items():
        loaded = sys.modules.get(module)
        found += [kind for name in names
                  if isinstance(kind := getattr(loaded, name, None), type)
                  and issubclass(kind, BaseException)]
    return tuple(found)


def _one_line(text: str) -> str:
    """text on one line (its lines joined), at most :data:`MESSAGE_CHARS` characters."""
    line = " ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return line if len(line) <= MESSAGE_CHARS else f"{line[:MESSAGE_CHARS - 1]}…"


def _shortened(path: str) -> str:
    """path, its middle left out when it is longer than :data:`PATH_CHARS`."""
    if len(path) <= PATH_CHARS:
        return path
    half = PATH_CHARS // 2
    return f"{path[:half]}…({len(path) - 2 * half} characters)…{path[-half:]}"


def message(exc: BaseException) -> str:
    """What a refused input's error says: a UserError's message as written (params errors
    list each problem on a line of its own); on one line an OSError's reason and path (not its
    errno), a library's error with its type (its own text may not say which library)."""
    if isinstance(exc, OSError) and exc.strerror:
        paths = [_shortened(os.fsdecode(p)) if isinstance(p, (str, bytes)) else str(p)
                 for p in (exc.filename, exc.filename2) if p is not None]
        return _one_line(f"{exc.strerror}: {' -> '.join(paths)}" if paths else exc.strerror)
    if isinstance(exc, UserError):  # written for the user: a list of problems keeps its lines
        return str(exc)
    if isinstance(exc, OSError):  # an OSError of ours says what to do
        return _one_line(str(exc))
    return _one_line(f"{type(exc).__name__}: {exc}")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(_command(argv)).parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    prefix = f"hwgptbench {args.command}: error:"
    try:
        check_output_flags(vars(args))
        args.func(args)
    except subprocess.CalledProcessError as exc:
        if args.debug:
            traceback.print_exc()
        command = exc.cmd if isinstance(exc.cmd, str) else " ".join(map(str, exc.cmd))
        print(f"{prefix} {_one_line(command)} exited with {exc.returncode}", file=sys.stderr)
        return 1
    except Exception as exc:  # the boundary: every error becomes one line
        if args.debug:
            traceback.print_exc()
        if isinstance(exc, outside_errors()):
            print(f"{prefix} {message(exc)}", file=sys.stderr)
            return 2
        line = shlex.join(argv)
        rerun = line if len(line) <= 200 else f"{shlex.quote(args.command)} ..."
        hint = "" if args.debug else f"; `hwgptbench --debug {rerun}` prints the traceback"
        print(f"{prefix} {message(exc)} (a bug in hwgptbench: please report it{hint})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
