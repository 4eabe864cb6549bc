"""Where every result lives: each path of the results tree, named once.

The workflow rules (through ``workflow/rules/common.smk``), the subcommands' defaults,
``Benchmark.load`` and the figures stage all take their paths from here, and
``tests/test_layout.py`` holds dvc.yaml's ``outs:`` against it, so that moving an output is
one edit. A function's arguments fill the path; the rules pass Snakemake wildcards
(``"{scale}"``), which the path then keeps. ``results`` is the results folder (``results``
from the project root).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from .errors import UserError

RESULTS = "results"
# a device label: the pattern of params' measure.device (the schema); a table's file name
# gives its label, and names the workflow's shell lines, so no other name is read as one
DEVICE_LABEL = re.compile(r"[a-z0-9][a-z0-9-]*")
# a scale: the pattern of the names of params' spaces (the schema)
SCALE_NAME = re.compile(r"[A-Za-z0-9_]+")
_NAMES = {DEVICE_LABEL: "a device label (lowercase letters, digits and -, not starting with -, "
                        "as measure.device)",
          SCALE_NAME: "a scale name (letters, digits and _, as the params' spaces)"}

_log = logging.getLogger(__name__)
_skipped: set[str] = set()  # files already named in a warning


class LabelError(UserError, ValueError):
    """A name that would become part of a path (a device label, a scale) is not one."""


def check_label(value: object, what: str, pattern: re.Pattern[str] = DEVICE_LABEL) -> str:
    """value, when it is a name of ``pattern`` (a device label; :data:`SCALE_NAME` for a
    scale), so that it may become part of a path; else :class:`LabelError` naming value and
    ``what`` (where it came from)."""
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:80] + "..."
    kind = _NAMES.get(pattern, f"a name matching {pattern.pattern}")
    raise LabelError(f"{what}: {shown} is not {kind}, and only such a name becomes part of a "
                     "path: rename it to one")


# -- the data stage and the params the workflow mirrors ------------------------------------

def data(name: str, results: str = RESULTS) -> str:
    """Token shards, tokenizer and manifest of the data params named ``name``."""
    return f"{results}/data/{name}"


def params_sections(results: str = RESULTS) -> str:
    """One JSON file per params section, written by the workflow for the jobs to read."""
    return f"{results}/.params"


def code_fingerprints(results: str = RESULTS) -> str:
    """One hash per rule of the code its commands run, written by the workflow: an input of
    the rule's jobs."""
    return f"{results}/.code"


def log(*parts: str, results: str = RESULTS) -> str:
    """A job's log: ``log("tiny", "supernet")`` is ``results/logs/tiny/supernet.log``."""
    return f"{results}/logs/{'/'.join(parts)}.log"


# -- one scale -----------------------------------------------------------------------------

def scale_dir(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}"


def supernet_dir(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/supernet"


def supernet(scale: str, results: str = RESULTS) -> str:
    """The trained supernet; its snapshots and loss table lie beside it."""
    return f"{supernet_dir(scale, results)}/supernet.pt"


def snapshot(scale: str, step: int | str, results: str = RESULTS) -> str:
    return f"{supernet_dir(scale, results)}/supernet-step-{step}.pt"


def loss_table(scale: str, results: str = RESULTS) -> str:
    return f"{supernet_dir(scale, results)}/loss.parquet"


def train_work(scale: str, results: str = RESULTS) -> str:
    """Resumable training checkpoints (not versioned)."""
    return f"{results}/{scale}/.train"


def archs(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/archs.parquet"


def perplexity(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/perplexity.parquet"


def import_report(scale: str, results: str = RESULTS) -> str:
    """What the HW-GPT-Bench import counted (duplicates, archs outside the space)."""
    return f"{results}/{scale}/perplexity.import.json"


def shard(scale: str, device: str, index: int | str, count: int | str,
          results: str = RESULTS) -> str:
    """Shard ``index`` of ``count`` of one device's measurements."""
    return f"{results}/{scale}/.measure/{device}/shard-{index}-of-{count}.parquet"


def device_tables(scale: str, results: str = RESULTS) -> str:
    """The folder of the device tables measured (or pulled) here."""
    return f"{results}/{scale}/measure"


def device_table(scale: str, device: str, results: str = RESULTS) -> str:
    return f"{device_tables(scale, results)}/{device}.parquet"


PUBLISHED = "devices"  # tables published from other machines, beside results/ (versioned)


def labelled_tables(folder: str) -> dict[str, str]:
    """The ``*.parquet`` tables in folder by device label (their file names' stems). A file
    whose stem is not a device label (:data:`DEVICE_LABEL`) is named in a warning and skipped,
    so that a name from outside never becomes a device, a job or an argument."""
    tables = {}
    for path in sorted(Path(folder).glob("*.parquet")):
        if DEVICE_LABEL.fullmatch(path.stem):
            tables[path.stem] = str(path)
        elif str(path) not in _skipped:
            _skipped.add(str(path))
            _log.warning("skipping %r: its name is not a device label (lowercase letters, "
                        "digits and -, as measure.device), so it is no device's table; rename "
                        "it to LABEL.parquet to use it", str(path))
    return tables


def published_tables(scale: str, published: str = PUBLISHED) -> str:
    return f"{published}/{scale}"


def published_table(scale: str, device: str, published: str = PUBLISHED) -> str:
    """A device table published with ``hwgptbench publish-device`` (its own DVC pointer)."""
    return f"{published_tables(scale, published)}/{device}.parquet"


def measurements(scale: str, results: str = RESULTS) -> str:
    """Every device's table of a scale, merged."""
    return f"{results}/{scale}/measurements.parquet"


def measure_metrics(scale: str, results: str = RESULTS) -> str:
    """The contention of each device and condition of the merged table (`dvc metrics`)."""
    return f"{results}/{scale}/measure_contention.json"


def runtime_tables(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/runtime"


def runtime_table(scale: str, device: str, results: str = RESULTS) -> str:
    return f"{runtime_tables(scale, results)}/{device}.parquet"


def runtime(scale: str, results: str = RESULTS) -> str:
    """Every device's runtime table, merged."""
    return f"{results}/{scale}/runtime.parquet"


def breakdown_tables(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/breakdown"


def breakdown_table(scale: str, device: str, results: str = RESULTS) -> str:
    return f"{breakdown_tables(scale, results)}/{device}.parquet"


def breakdown(scale: str, results: str = RESULTS) -> str:
    """Every device's per-module breakdown, merged."""
    return f"{results}/{scale}/breakdown.parquet"


def serving_tables(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/serving"


def serving_table(scale: str, device: str, results: str = RESULTS) -> str:
    """One device's serving sweep (TTFT, TPOT, throughput per batch size)."""
    return f"{serving_tables(scale, results)}/{device}.parquet"


def serving(scale: str, results: str = RESULTS) -> str:
    """Every device's serving sweep, merged."""
    return f"{results}/{scale}/serving.parquet"


def parallel_tables(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/parallel"


def parallel_table(scale: str, device: str, results: str = RESULTS) -> str:
    """One device's data-parallel train steps (DDP, ZeRO), one row per rank."""
    return f"{parallel_tables(scale, results)}/{device}.parquet"


def parallel(scale: str, results: str = RESULTS) -> str:
    """Every device's parallel train steps, merged."""
    return f"{results}/{scale}/parallel.parquet"


def surrogates(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/surrogates"


def perplexity_surrogates(scale: str, results: str = RESULTS) -> str:
    return f"{surrogates(scale, results)}/perplexity"


def device_surrogates(scale: str, device: str, results: str = RESULTS) -> str:
    return f"{surrogates(scale, results)}/devices/{device}"


def quality(scale: str, results: str = RESULTS) -> str:
    """The surrogates' quality table, one row per (metric, device, condition, family)."""
    return f"{surrogates(scale, results)}/quality.parquet"


def predictions(scale: str, results: str = RESULTS) -> str:
    """The surrogates' out-of-fold predictions (beside the quality table)."""
    return f"{surrogates(scale, results)}/predictions.parquet"


def surrogate_metrics(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/surrogate_quality.json"


def adapted(scale: str, results: str = RESULTS) -> str:
    """Surrogates adapted to new devices by ``hwgptbench adapt``."""
    return f"{results}/{scale}/adapted"


def adapt_progress(scale: str, device: str, results: str = RESULTS) -> str:
    """The rows ``hwgptbench adapt`` measured on ``device``, kept until every condition is
    adapted (a rerun resumes from them)."""
    return f"{results}/{scale}/.adapt/{device}"


def transfer(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/transfer"


def transfer_quality(scale: str, results: str = RESULTS) -> str:
    return f"{transfer(scale, results)}/quality.parquet"


def transfer_summary(scale: str, results: str = RESULTS) -> str:
    return f"{transfer(scale, results)}/summary.parquet"


def search(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/search"


def search_reference(scale: str, objectives: str, device: str, results: str = RESULTS) -> str:
    return f"{search(scale, results)}/{objectives}/{device}/reference"


def search_runs(scale: str, objectives: str, device: str, algorithm: str,
                results: str = RESULTS) -> str:
    """One algorithm's runs, a table per seed."""
    return f"{search(scale, results)}/{objectives}/{device}/{algorithm}"


def search_table(scale: str, name: str, results: str = RESULTS) -> str:
    """A summary table of every search of a scale: ``runs`` (rescored against the final
    reference fronts), ``reference`` (how each front was built), ``front``, ``final``,
    ``summary`` or ``attainment``."""
    return f"{search(scale, results)}/{name}.parquet"


def search_metrics(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/search_metrics.json"


def figures(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/figures"


def tables(scale: str, results: str = RESULTS) -> str:
    return f"{results}/{scale}/tables"


def plots(scale: str, results: str = RESULTS) -> str:
    """The data of the DVC plots."""
    return f"{results}/{scale}/plots"


def figure(scale: str, name: str, results: str = RESULTS) -> str:
    """A figure (``.png``; its ``.svg`` lies beside it)."""
    return f"{figures(scale, results)}/{name}.png"


def table(scale: str, name: str, results: str = RESULTS) -> str:
    """A table (``.csv``; its ``.md`` lies beside it)."""
    return f"{tables(scale, results)}/{name}.csv"


def plot(scale: str, name: str, results: str = RESULTS) -> str:
    return f"{plots(scale, results)}/{name}.csv"


# -- compression of a dense model ----------------------------------------------------------

def compress(name: str, results: str = RESULTS) -> str:
    return f"{results}/compress/{name}"


def dense(name: str, results: str = RESULTS) -> str:
    """The dense model, pretrained here or imported."""
    return f"{compress(name, results)}/dense.pt"


def compress_supernet_dir(name: str, results: str = RESULTS) -> str:
    return f"{compress(name, results)}/supernet"


def compress_supernet(name: str, results: str = RESULTS) -> str:
    """The dense model's fine-tuned supernet (its loss table beside it)."""
    return f"{compress_supernet_dir(name, results)}/supernet.pt"


def compress_loss(name: str, results: str = RESULTS) -> str:
    return f"{compress_supernet_dir(name, results)}/loss.parquet"


def compress_work(name: str, step: str, results: str = RESULTS) -> str:
    """Resumable checkpoints of the ``dense`` pretraining or the ``finetune``."""
    return f"{compress(name, results)}/.{step}"


def compress_result(name: str, table: str, results: str = RESULTS) -> str:
    """A table of the compression: ``search`` (runs), ``subnets``, ``compress`` or
    ``finetune_methods``."""
    return f"{compress(name, results)}/{table}.parquet"


def compress_export(name: str, results: str = RESULTS) -> str:
    """The compression's exported archs: one folder each (model files, manifest.json) and the
    index table ``exports.parquet``."""
    return f"{compress(name, results)}/export"


def compress_seed(name: str, index: str, results: str = RESULTS) -> str:
    """The compression table of another fine-tune seed (compress.seeds), its work beside it."""
    return f"{compress(name, results)}/seeds/{index}/compress.parquet"


def compress_seed_work(name: str, index: str, results: str = RESULTS) -> str:
    """The supernet, search runs and sub-networks of another fine-tune seed (resumable)."""
    return f"{compress(name, results)}/seeds/{index}/.work"


def compress_figures(name: str, results: str = RESULTS) -> str:
    return f"{compress(name, results)}/figures"


def report(results: str = RESULTS) -> str:
    return f"{results}/report.html"


# -- the paper's figures and tables (`make paper`: the shipped tables only) ------------------

def paper(results: str = RESULTS) -> str:
    return f"{results}/paper"


def paper_params(results: str = RESULTS) -> str:
    """The section files of the paper's own search settings (``paper.search`` as ``search``)."""
    return f"{params_sections(results)}/paper"


def paper_surrogates(scale: str, results: str = RESULTS) -> str:
    """The receipt of the shipped tables' surrogates of a scale, fitted under the paper folder
    (``{paper}/published/``, the cache of :mod:`hwgptbench.published.surrogates`)."""
    return f"{paper(results)}/surrogates/{scale}.json"


def paper_search(results: str = RESULTS) -> str:
    return f"{paper(results)}/search"


def paper_search_reference(objectives: str, device: str, results: str = RESULTS) -> str:
    return f"{paper_search(results)}/reference/{objectives}/{device}"


def paper_search_runs(objectives: str, device: str, algorithm: str,
                      results: str = RESULTS) -> str:
    return f"{paper_search(results)}/runs/{objectives}/{device}/{algorithm}"


def paper_search_table(name: str, results: str = RESULTS) -> str:
    return f"{paper_search(results)}/tables/{name}.parquet"


def paper_tables(results: str = RESULTS) -> str:
    return f"{paper(results)}/tables"


def paper_table(name: str, results: str = RESULTS) -> str:
    """A markdown table of the paper (a parquet copy beside it)."""
    return f"{paper_tables(results)}/{name}.md"


def paper_figures(results: str = RESULTS) -> str:
    return f"{paper(results)}/figures"


def paper_figure(name: str, results: str = RESULTS) -> str:
    return f"{paper_figures(results)}/{name}.png"


def paper_external(results: str = RESULTS) -> str:
    """Few-shot transfer on other projects' public data (skipped, with a note, without it)."""
    return f"{paper(results)}/external"


def paper_report(results: str = RESULTS) -> str:
    return f"{results}/report-paper.html"


def explorer(results: str = RESULTS) -> str:
    """The explorer page of `hwgptbench explore` (one self-contained HTML file)."""
    return f"{results}/explorer.html"


def paper_explorer(results: str = RESULTS) -> str:
    """The explorer page of the shipped tables, written by `make paper`."""
    return f"{paper(results)}/explorer.html"


def paper_search_metrics(results: str = RESULTS) -> str:
    return f"{paper_search(results)}/metrics.json"
