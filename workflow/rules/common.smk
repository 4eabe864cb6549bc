"""Paths and helpers shared by the rules. No logic beyond wiring paths and params."""

from functools import cache
from pathlib import Path

from hwgptbench.pipeline import fingerprints

PARAMS = hwparams.write_sections(config, layout.params_sections())
DATA_DIR = layout.data(SETTINGS.data.name)
SCALES = SETTINGS.workflow.scales  # each under spaces (workflow_checks.check_workflow)


MEASURE_SHARDS = SETTINGS.measure.shards

# perplexity.source hwgptbench: perplexities imported from HW-GPT-Bench, no data or supernet
# stage; the stages that build archs take the published networks' vocabulary size instead.
IMPORTED = SETTINGS.perplexity.source == "hwgptbench"
HWGPTBENCH = SETTINGS.perplexity.hwgptbench
DATA_INPUT = {} if IMPORTED else {"data": DATA_DIR}


def vocab_flag(wildcards, input):
    """Where a command takes the vocabulary size: the data stage, or the import's params (the
    arguments of a shell line, each quoted by `{params.vocab:q}`)."""
    return (["--vocab-size", str(HWGPTBENCH.vocab_size)] if IMPORTED
            else ["--data", input.data])


@cache
def local_device():
    """This machine's device label; `auto` is derived from the hardware here (a given label is
    checked against the hardware by the measure job itself, which may run on another node).
    Only asked for when params say `auto`: a cluster plan needs no torch on the login node, nor
    a machine where no GPU can be seen (torch is imported only to name a GPU)."""
    if SETTINGS.measure.device != "auto":
        return SETTINGS.measure.device
    from hwgptbench.meters.host import auto_label, cpu_only_label

    threads = SETTINGS.measure.threads
    label = cpu_only_label(threads)
    if label is None:
        from hwgptbench.meters.device import default_device, fingerprint

        label = auto_label(fingerprint(threads, default_device()))
    return label


def resolve_devices(labels):
    """Device labels with `auto` replaced by this machine's."""
    return [local_device() if label == "auto" else label for label in labels]


# The devices this run measures (workflow.devices); each other device table is an input that
# must already be there: published under devices/{scale}/ or pulled into results/{scale}/measure/.
MEASURED_DEVICES = sorted(set(resolve_devices(SETTINGS.workflow.devices)))


wildcard_constraints:
    scale="|".join(SCALES),
    device="[a-z0-9][a-z0-9-]*",
    shard=r"\d+",
    objectives="|".join(SETTINGS.search.objective_sets),
    algorithm="|".join(SETTINGS.search.algorithms),


def published_tables(scale):
    """Device tables published with `hwgptbench publish-device` (label -> path); a file whose
    name is no device label is skipped with a warning (layout.labelled_tables)."""
    return layout.labelled_tables(layout.published_tables(scale))


def device_table(scale, device):
    """Where the table of a device comes from: its published table, else the table this
    workflow measures (or one pulled or copied into results/{scale}/measure/)."""
    return published_tables(scale).get(device, layout.device_table(scale, device))


def device_labels(scale):
    """Every device of a scale: measured by this run, published, or already present."""
    present = set(layout.labelled_tables(layout.device_tables(scale)))
    return sorted(present | set(published_tables(scale)) | set(MEASURED_DEVICES))


def device_tables(scale):
    """The device tables of a scale, one per device."""
    return [device_table(scale, device) for device in device_labels(scale)]


def runtime_labels(scale):
    """Devices with a runtime table: measured by this run, or already present (pulled)."""
    present = set(layout.labelled_tables(layout.runtime_tables(scale)))
    return sorted(present | set(MEASURED_DEVICES))


def runtime_tables(scale, device=None):
    """The runtime tables of a scale (of one device: none, or its one)."""
    labels = runtime_labels(scale) if device is None else (
        [device] if device in runtime_labels(scale) else [])
    return [layout.runtime_table(scale, label) for label in labels]


def beside_runtime_tables(table_of, scale):
    """The tables of a scale that the runtime job writes beside each runtime table (breakdown,
    serving): ``table_of(scale, device)`` names one."""
    return [table_of(scale, label) for label in runtime_labels(scale)]


def results_folder(wildcards, input):
    """`--results` of a command that reads the tables of {scale} from the results folder: the
    folder above {scale} in the path of its input `perplexity`, taken from the input rather
    than hardcoded (so it is right wherever Snakemake puts the inputs)."""
    scale_dir = next(p for p in Path(input.perplexity).parents if p.name == wildcards.scale)
    return str(scale_dir.parent)


def code(rule):
    """A rule's code as an input: the fingerprint file of the files its commands load and read
    (listed in workflow/code/{rule}.txt by `make deps`), written as the rule is parsed and
    rewritten only when they change, so a code change reruns the rule's jobs as a params
    change does (docs/workflow.md)."""
    return fingerprints.code_input(rule)


def params_flags(wildcards, input):
    """`--params FILE` for each params-section file among a rule's inputs (arguments, each
    quoted by `{params.files:q}`)."""
    files = [input.params] if isinstance(input.params, str) else input.params
    return [arg for f in files for arg in ("--params", f)]


def corpus_files(corpus):
    """The local files a corpus reads (none for a Hugging Face dataset)."""
    if corpus.source == "text_files":
        return sorted(str(p) for p in Path(corpus.path).glob(corpus.pattern) if p.is_file())
    return []


def search_inputs(wildcards):
    """Params and the surrogates a search of (scale, device) reads."""
    return {
        "params": [PARAMS["search"], PARAMS["surrogate"]],  # the space: the surrogates'
        # the benchmark a search queries reads its default condition from the measure params
        # (hwgptbench.api.RunTables), beside the section files it is given
        "measure_params": PARAMS["measure"],
        "perplexity": rules.surrogates_perplexity.output[0].format(scale=wildcards.scale),
        "device": rules.surrogates_device.output[0].format(scale=wildcards.scale,
                                                           device=wildcards.device),
    }


# Report captions (workflow/report/), relative to the rule files.
CAPTIONS = "../report"


def figure_output(name):
    """A figure of a scale as a report item (caption workflow/report/{name}.rst)."""
    return report(layout.figure("{scale}", name), caption=f"{CAPTIONS}/{name}.rst",
                  category="Figures", subcategory="{scale}")


def table_output(name):
    """A table of a scale as a report item (caption workflow/report/table_{name}.rst)."""
    return report(layout.table("{scale}", name), caption=f"{CAPTIONS}/table_{name}.rst",
                  category="Tables", subcategory="{scale}")


def paper_report(path, caption, subcategory):
    """A file of the paper as an item of its report (caption workflow/report/{caption}.rst)."""
    return report(path, caption=f"{CAPTIONS}/{caption}.rst", category="Paper",
                  subcategory=subcategory)


def compress_params(*entries):
    """The params files of the given compress entries (results/.params/compress.{entry}.json)."""
    return [PARAMS[f"compress.{entry}"] for entry in entries]
