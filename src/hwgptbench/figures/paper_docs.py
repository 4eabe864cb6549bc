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
from ..io import atomic_write_text, read_outside_text
from ..outputs import copy_file

# a block's opening and closing markers, found in one pass: a pattern matching a whole block
# lazily rescanned the rest of the text from every opening marker without a closing one (30,000
# of them: minutes)
MARKER = re.compile(r"<!-- paper:(?P<name>[a-z0-9_]+) -->\n|<!-- /paper -->")
MAX_BLOCKS = 1000  # blocks of one file (docs/paper_scale.md holds 10)
FIGURE = re.compile(r"\]\((?P<path>img/paper/(?P<name>[a-z0-9_]+)\.png)\)")


class MissingPaperOutput(UserError, FileNotFoundError):
    """A block or figure of the docs that the run did not write."""


class PaperDocError(UserError, ValueError):
    """A markdown file whose paper blocks are not closed, or too many."""


def read_doc(path: Path) -> str:
    """The text of a markdown file given to ``paper-docs``: a regular UTF-8 file of at most
    :data:`hwgptbench.io.MAX_TEXT` bytes (a FIFO or device is refused before it is opened)."""
    return read_outside_text(path, "give a markdown file with paper blocks",
                             error=PaperDocError)


def spans(text: str) -> list[tuple[str, int, int]]:
    """(name, start, end) of every marked block's body, in one pass over the markers; a block
    opened and not closed before the next opens or the text ends, or more than
    :data:`MAX_BLOCKS` blocks, is :class:`PaperDocError` (a closing marker outside a block is
    text)."""
    found: list[tuple[str, int, int]] = []
    opened: re.Match[str] | None = None
    for match in MARKER.finditer(text):
        if match["name"] is None:
            if opened is not None:
                found.append((opened["name"], opened.end(), match.start()))
                opened = None
            continue
        if opened is not None:
            break
        if len(found) >= MAX_BLOCKS:
            raise PaperDocError(f"the markdown file holds more than {MAX_BLOCKS} paper blocks")
        opened = match
    if opened is not None:
        line = text.count("\n", 0, opened.start()) + 1
        raise PaperDocError(f"the block `<!-- paper:{opened['name']} -->` of line {line} is "
                            "not closed by `<!-- /paper -->` before the next block or the end")
    return found


def blocks(text: str) -> dict[str, str]:
    """The body of every marked block of a markdown text, by table name."""
    return {name: text[start:end] for name, start, end in spans(text)}


def _table(tables: Path, name: str) -> str:
    path = tables / f"{name}.md"
    if not path.is_file():
        raise MissingPaperOutput(f"{path}: the docs hold a block `<!-- paper:{name} -->` that "
                                 "the run did not write; run `make paper` (or remove the "
                                 "block)")
    return path.read_text(encoding="utf-8")


def synced(text: str, tables: Path) -> str:
    """``text`` with every marked block replaced by the run's table of its name."""
    pieces, done = [], 0
    for name, start, end in spans(text):
        pieces += [text[done:start], _table(tables, name)]
        done = end
    return "".join(pieces) + text[done:]


def differences(text: str, tables: Path) -> list[str]:
    """The names of the blocks whose body differs from the run's table."""
    return [name for name, body in blocks(text).items() if body != _table(tables, name)]


def sync(doc: Path, tables: Path, figures: Path) -> list[Path]:
    """Rewrite the doc's blocks from ``tables`` and copy each ``img/paper/{name}.png`` it links
    from ``figures`` (beside the doc); returns the files written."""
    text = read_doc(doc)
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
