"""The figures stage's subcommand: ``hwgptbench figures``."""

from __future__ import annotations

import argparse

from ..options import Add, scale_and_results


def cmd_figures(args: argparse.Namespace) -> None:
    """Figures, tables and DVC plot files of a scale, from its result tables only."""
    from .report import render

    render(args.scale, args.results)


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("figures", cmd_figures, params=False)
    scale_and_results(command)
