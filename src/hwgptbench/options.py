"""What the subcommands of every stage share: the params they read, the search space and
vocabulary they build archs for, and their common options.

Each stage package registers its subcommands in its ``commands.py`` through
``register(add)``; ``add`` (from :mod:`hwgptbench.cli`) creates a subcommand from its handler
and gives it ``--params`` unless told not to.
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable
from typing import TypeVar

from . import layout, params
from .settings.document import Params
from .settings.fields import Loadable
from .space import SearchSpace

S = TypeVar("S", bound=Loadable)

# add(name, handler, params=True) -> the subcommand's parser
Add = Callable[..., argparse.ArgumentParser]


def params_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--params", action="append",
                        help="params file: params.yaml, or section files written by the "
                             "workflow under results/.params/ (repeat to merge several); "
                             "default: params.yaml")


def load(args: argparse.Namespace, sections: list[str]) -> Params:
    """The typed params of a command, which must hold ``sections`` (the ones it reads)."""
    return params.load_typed(args.params or ["params.yaml"], sections)


def load_settings(args: argparse.Namespace, cls: type[S]) -> S:
    """The validated params section of the settings type ``cls``, as ``cls``: what a command
    reads is the ``SECTION`` of each type it loads."""
    return params.load_section(cls, args.params or ["params.yaml"])


def space_of(config: Params, scale: str) -> SearchSpace:
    """The search space of ``scale`` in the params' ``spaces`` section."""
    return config.space(scale).space(scale)


def vocab_size(args: argparse.Namespace) -> int:
    """--vocab-size, else that of --data (default: the data stage's folder of the params)."""
    if args.vocab_size is not None:
        return int(args.vocab_size)
    from .tokens.shards import TokenShards

    folder = args.data or layout.data(load(args, ["data"]).data.name)
    return TokenShards.open(folder).manifest["tokenizer"]["vocab_size"]


def one_of(module: str, registry: str) -> Callable[[str], str]:
    """An argparse type accepting a key of ``module.registry``, imported only when the option
    is given."""
    def check(name: str) -> str:
        choices = getattr(importlib.import_module(module), registry)
        if name not in choices:
            raise argparse.ArgumentTypeError(f"{name!r} is not one of "
                                             f"{', '.join(sorted(choices))}")
        return name
    return check


def params_int(*field: str) -> Callable[[str], int]:
    """An argparse type accepting a whole number within the bounds the params models give
    the field ``field`` (a path of field names; a list's bounds are its items'): a flag that
    stands for a param is checked like the param."""
    def check(text: str) -> int:
        node = params.schema_at(field)
        node = params.schema_at([*field, 0]) if node.get("type") == "array" else node
        low, high = node.get("minimum"), node.get("maximum")
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if (low is not None and value < low) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{value} is not in [{low}, {high}] (as params' {'.'.join(field)})")
        return value
    return check


def scale_arg(command: argparse.ArgumentParser) -> None:
    command.add_argument("--scale", default="tiny", help="search space (default: %(default)s)")


def scale_and_data(command: argparse.ArgumentParser) -> None:
    scale_arg(command)
    command.add_argument("--data", required=True, help="data-stage output folder")


def scale_and_vocab(command: argparse.ArgumentParser) -> None:
    scale_arg(command)
    vocab_source(command)


def vocab_source(command: argparse.ArgumentParser) -> None:
    """--data or --vocab-size: where a command that builds archs takes the vocabulary size."""
    source = command.add_mutually_exclusive_group()
    source.add_argument("--data", help="data-stage folder, for the vocabulary size "
                                       "(default: results/data/{data.name})")
    source.add_argument("--vocab-size", type=params_int("perplexity", "hwgptbench", "vocab_size"),
                        help="the vocabulary size instead of --data (perplexity.source "
                             "hwgptbench has no data stage: perplexity.hwgptbench.vocab_size)")


def scale_and_results(command: argparse.ArgumentParser) -> None:
    scale_arg(command)
    command.add_argument("--results", default="results", help="results folder (default: "
                                                              "%(default)s)")
