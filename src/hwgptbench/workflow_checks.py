"""What the workflow refuses in a valid params document before it plans a job: scales it runs
that no space defines, paper scales and devices the package ships no table of, paper.external
folders that are not there. The Snakefile and `hwgptbench validate` both ask
:func:`check_workflow`, so `validate` refuses what the workflow refuses."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from . import params
from .settings.document import Params

SHIPPED_MANIFEST = "published/manifest.json"  # the scales and devices shipped in the package
# the package files read by path (pipeline.dvc_deps lists them in the deps of the stages)
PACKAGE_FILES = ("published/manifest.json",)


def shipped_scales() -> dict[str, list[str]]:
    """The scales whose tables ship with the package, each with its device labels (the
    package's manifest, read as data: no published table is loaded)."""
    text = resources.files("hwgptbench").joinpath(SHIPPED_MANIFEST).read_text(encoding="utf-8")
    return {scale: list(entry["devices"])
            for scale, entry in json.loads(text)["scales"].items()}


def workflow_problems(doc: Params) -> list[str]:
    """What the workflow refuses in a valid params document before it plans a job, one line
    each: scales it runs that no space defines, paper scales and devices that the package
    ships no table of, and paper.external folders that are not there (relative paths from
    the project folder). The Snakefile and `hwgptbench validate` both ask this."""
    problems = []
    unknown = [scale for scale in doc.workflow.scales if scale not in doc.spaces]
    if unknown:
        problems.append(f"workflow.scales: {unknown} not defined under spaces "
                        f"(defined: {', '.join(doc.spaces)})")
    paper = doc.paper
    shipped = shipped_scales()
    unshipped = sorted({*paper.scales, paper.search_scale} - set(shipped))
    if unshipped:
        problems.append(f"paper.scales / paper.search_scale: {unshipped} ship no tables with "
                        f"the package (shipped: {', '.join(shipped)})")
    devices = shipped.get(paper.search_scale)
    missing = sorted(set(paper.search.devices) - set(devices or []))
    if devices is not None and missing:
        problems.append(f"paper.search.devices: {missing} have no shipped table of scale "
                        f"{paper.search_scale} (shipped: {', '.join(devices)})")
    for name, path in (("help_fbnet", paper.external.help_fbnet),
                       ("hat", paper.external.hat)):
        if path is not None and not Path(path).is_dir():
            problems.append(f"paper.external.{name}: {path} is not a folder here: point it "
                            "at the data set's folder (docs/transfer.md) or set it to null")
    return problems


def check_workflow(doc: Params, source: str = "params") -> Params:
    """doc, or one :class:`ParamsError` listing :func:`workflow_problems`."""
    problems = workflow_problems(doc)
    if problems:
        lines = "\n".join(f"  - {problem}" for problem in problems)
        raise params.ParamsError(f"invalid {source}:\n{lines}\nFix these fields and run "
                                 "again; nothing was written.")
    return doc
