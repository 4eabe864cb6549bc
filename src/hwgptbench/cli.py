"""The `hwgptbench` command line: one thin subcommand per workflow stage.

Snakemake rules call these subcommands, so a stage runs the same from the workflow, a
cluster job or a shell.
"""

from __future__ import annotations

import argparse
import logging
import subprocess
import sys
from collections.abc import Callable, Sequence

from . import __version__, data, params, sync

log = logging.getLogger("hwgptbench")

_USER_ERRORS = (params.ParamsError, data.CorpusUnavailableError, FileNotFoundError,
                sync.StaleResultsError)


def _params_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", default="params.yaml",
                        help="params file (params.yaml, or a section file written by the "
                             "workflow under results/.params/); default: %(default)s")


def cmd_validate(args: argparse.Namespace) -> None:
    """Check params.yaml against the schema."""
    params.load(args.params)
    print(f"{args.params}: valid")


def cmd_data(args: argparse.Namespace) -> None:
    """Tokenize the corpus into token shards."""
    config = params.load(args.params, sections=["data"])["data"]
    out = args.out or f"results/data/{config['name']}"
    manifest = data.build(config, out)
    log.info("wrote %s: %d train / %d val tokens", out, manifest["splits"]["train"]["tokens"],
             manifest["splits"]["val"]["tokens"])


def cmd_pull(args: argparse.Namespace) -> None:
    """Fetch results from the DVC remote; mark them up to date for Snakemake if current."""
    sync.pull(args.targets, remote=args.remote)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hwgptbench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"hwgptbench {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Callable[[argparse.Namespace], None]) -> argparse.ArgumentParser:
        command = sub.add_parser(name, help=func.__doc__, description=func.__doc__)
        command.set_defaults(func=func)
        _params_arg(command)
        return command

    add("validate", cmd_validate)
    command = add("data", cmd_data)
    command.add_argument("--out", help="output folder (default: results/data/{data.name})")
    command = sub.add_parser("pull", help=cmd_pull.__doc__, description=cmd_pull.__doc__)
    command.set_defaults(func=cmd_pull)
    command.add_argument("targets", nargs="*", help="stages to pull (default: all)")
    command.add_argument("--remote", help="DVC remote name (default: the configured default)")
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
    except _USER_ERRORS as exc:
        print(f"hwgptbench {args.command}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
