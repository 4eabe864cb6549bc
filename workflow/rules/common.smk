"""Paths and helpers shared by the rules. No logic beyond wiring paths and params."""

from pathlib import Path

from hwgptbench.measure import auto_label, default_device, fingerprint
from hwgptbench.search import ALGORITHMS

RESULTS = "results"
PARAMS = hwparams.write_sections(config, f"{RESULTS}/.params")
DATA_DIR = f"{RESULTS}/data/{config['data']['name']}"
SCALES = config["workflow"]["scales"]

unknown = sorted(set(SCALES) - set(config["spaces"]))
if unknown:
    raise WorkflowError(f"workflow.scales: {unknown} not defined under spaces "
                        f"(defined: {', '.join(config['spaces'])})")


MEASURE_SHARDS = config["measure"]["shards"]
# This machine's device label; `auto` is derived from the hardware here (a given label is
# checked against the hardware by the measure job itself, which may run on another node).
LOCAL_DEVICE = (auto_label(fingerprint(config["measure"]["threads"], default_device()))
                if config["measure"]["device"] == "auto" else config["measure"]["device"])


wildcard_constraints:
    scale="|".join(SCALES),
    device="[a-z0-9][a-z0-9-]*",
    shard=r"\d+",
    objectives="|".join(config["search"]["objective_sets"]),
    algorithm="|".join(ALGORITHMS),


def device_tables(scale):
    """This machine's device table plus those of other devices already present."""
    folder = Path(RESULTS) / scale / "measure"
    present = {p.stem for p in folder.glob("*.parquet")}
    return [str(folder / f"{d}.parquet") for d in sorted(present | {LOCAL_DEVICE})]


def params_flags(wildcards, input):
    """`--params FILE` for each params-section file among a rule's inputs."""
    files = [input.params] if isinstance(input.params, str) else input.params
    return " ".join(f"--params {f}" for f in files)


def corpus_files(corpus):
    """The local files a corpus reads (none for a Hugging Face dataset)."""
    if corpus["source"] == "text_files":
        return sorted(str(p) for p in Path(corpus["path"]).glob(corpus["pattern"]) if p.is_file())
    return []
