"""The figures stage's subcommand: ``hwgptbench figures``."""

from __future__ import annotations

import argparse
from pathlib import Path

from ..options import Add, load_settings, scale_and_results
from ..settings.sections import PaperSettings


def cmd_figures(args: argparse.Namespace) -> None:
    """Figures, tables and DVC plot files of a scale, from its result tables only."""
    from .report import render

    render(args.scale, args.results)


def cmd_paper_surrogates(args: argparse.Namespace) -> None:
    """Fit the surrogates of a scale's shipped tables under --results/published/ (once: a
    current fit is read, not refitted) and write a receipt naming the folder."""
    from .. import published
    from ..io import atomic_write_json
    from ..published.surrogates import ensure_surrogates

    folder = ensure_surrogates(args.scale, args.results)
    atomic_write_json(args.out, {"scale": args.scale, "folder": folder.name,
                                 "devices": sorted(published.device_tables(args.scale))})


def cmd_paper_tables(args: argparse.Namespace) -> None:
    """The paper's tables and figures from the shipped tables (paper.scales), the search
    summary of the paper's budget and the external transfer's markdown."""
    from .paper import render

    settings = load_settings(args, PaperSettings)
    render(settings.scales, args.results, Path(args.search), Path(args.external))


def cmd_paper_docs(args: argparse.Namespace) -> None:
    """Copy a run's paper tables into the marked blocks of a markdown file and its linked
    img/paper/ figures beside it; --check: only say which blocks differ (exit 1 if any)."""
    from .. import layout
    from .paper_docs import differences, read_doc, sync

    doc, tables = Path(args.doc), Path(layout.paper_tables(args.results))
    if args.check:
        differ = differences(read_doc(doc), tables)
        if differ:
            raise SystemExit(f"{doc}: blocks {', '.join(differ)} differ from {tables}; "
                             "`hwgptbench paper-docs` copies them")
        print(f"{doc}: every block equals {tables}")
        return
    for path in sync(doc, tables, Path(layout.paper_figures(args.results))):
        print(f"wrote {path}")


def cmd_explore(args: argparse.Namespace) -> None:
    """One self-contained HTML page (offline, every script inlined) to explore the shipped
    tables and the devices measured or adapted under --results in a browser: perplexity
    against a metric per device with its Pareto front, two devices compared, Kendall τ."""
    import time

    from .. import layout, published
    from ..api import scale_name
    from .explorer import explore

    started = time.monotonic()
    scales = [scale_name(s, "--scale") for s in args.scale] or published.scales()
    out = explore(scales, args.results, args.out or layout.explorer(args.results),
                  args.predicted)
    print(f"wrote {out} ({out.stat().st_size / 1e6:.1f} MB, {', '.join(scales)}) in "
          f"{time.monotonic() - started:.0f} s")


def register(add: Add) -> None:
    """Add the subcommands through the CLI's ``add``."""
    command = add("figures", cmd_figures, params=False)
    scale_and_results(command)
    command = add("paper-surrogates", cmd_paper_surrogates, params=False)
    scale_and_results(command)
    command.add_argument("--out", required=True, help="receipt (JSON) of the fitted folder")
    command = add("paper-tables", cmd_paper_tables)
    command.add_argument("--results", default="results", help="results folder (the paper's "
                         "outputs go to its paper/; default: results)")
    command.add_argument("--search", required=True,
                         help="folder of the paper search's summary tables (search-summary)")
    command.add_argument("--external", required=True,
                         help="markdown of `hwgptbench transfer-external` (or its skip note)")
    command = add("explore", cmd_explore, params=False)
    command.add_argument("--scale", action="append", default=[],
                         help="a scale to show (repeatable; default: every shipped scale)")
    command.add_argument("--results", default="results", help="results folder: its measured "
                         "and adapted devices join the shipped ones (default: results)")
    command.add_argument("--out", help="the page (.html; default: RESULTS/explorer.html)")
    command.add_argument("--predicted", type=int, default=200, help="archs of each scale "
                         "predicted on every device beside its measured ones (default: 200)")
    command = add("paper-docs", cmd_paper_docs, params=False)
    command.add_argument("--results", default="results", help="results folder (default: "
                         "results)")
    command.add_argument("--doc", default="docs/paper_scale.md", help="markdown file with "
                         "`<!-- paper:NAME -->` blocks (default: docs/paper_scale.md)")
    command.add_argument("--check", action="store_true",
                         help="say which blocks differ from the run's tables; change nothing")
