"""The docs as outputs of `make paper`: a markdown file's marked blocks hold the paper's tables,
and its ``img/paper/`` figures are the paper's figures, copied from a run.

A block is the run's ``tables/{name}.md`` between two markers::

    <!-- paper:cost_vs_size -->
    | scale | device | ...
    <!-- /paper -->

`sync` rewrites every block and copies every figure the file links; `differences` names the
blocks that differ from a run's tables (what the docs test checks).
"""

from __future__ import annotations

import re
from pathlib import Path

from ..errors import UserError
from ..io import atomic_write_text
from ..outputs import copy_file

BLOCK = re.compile(r"(<!-- paper:(?P<name>[a-z0-9_]+) -->\n)(?P<body>.*?)(<!-- /paper -->)",
                   re.S)
FIGURE = re.compile(r"\]\((?P<path>img/paper/(?P<name>[a-z0-9_]+)\.png)\)")


class MissingPaperOutput(UserError, FileNotFoundError):
    """A block or figure of the docs that the run did not write."""


def blocks(text: str) -> dict[str, str]:
    """The body of every marked block of a markdown text, by table name."""
    return {m["name"]: m["body"] for m in BLOCK.finditer(text)}


def _table(tables: Path, name: str) -> str:
    path = tables / f"{name}.md"
    if not path.is_file():
        raise MissingPaperOutput(f"{path}: the docs hold a block `<!-- paper:{name} -->` that "
                                 "the run did not write; run `make paper` (or remove the "
                                 "block)")
    return path.read_text(encoding="utf-8")


def synced(text: str, tables: Path) -> str:
    """``text`` with every marked block replaced by the run's table of its name."""
    return BLOCK.sub(lambda m: m[1] + _table(tables, m["name"]) + m[4], text)


def differences(text: str, tables: Path) -> list[str]:
    """The names of the blocks whose body differs from the run's table."""
    return [name for name, body in blocks(text).items() if body != _table(tables, name)]


def sync(doc: Path, tables: Path, figures: Path) -> list[Path]:
    """Rewrite the doc's blocks from ``tables`` and copy each ``img/paper/{name}.png`` it links
    from ``figures`` (beside the doc); returns the files written."""
    text = doc.read_text(encoding="utf-8")
    written = []
    new = synced(text, tables)
    if new != text:
        atomic_write_text(doc, new, owned=True)  # the doc's own blocks, rewritten
        written.append(doc)
    for match in FIGURE.finditer(new):
        source = figures / f"{match['name']}.png"
        if not source.is_file():
            raise MissingPaperOutput(f"{source}: {doc} links {match['path']}, which the run "
                                     "did not draw; run `make paper` (or remove the link)")
        target = doc.parent / match["path"]
        copy_file(source, target, owned=True)  # a copy of the run's figure the doc links
        written.append(target)
    return written
