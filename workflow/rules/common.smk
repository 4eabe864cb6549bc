"""Paths and helpers shared by the rules. No logic beyond wiring paths and params."""

from pathlib import Path

RESULTS = "results"
PARAMS = hwparams.write_sections(config, f"{RESULTS}/.params")
DATA_DIR = f"{RESULTS}/data/{config['data']['name']}"
SCALES = config["workflow"]["scales"]

unknown = sorted(set(SCALES) - set(config["spaces"]))
if unknown:
    raise WorkflowError(f"workflow.scales: {unknown} not defined under spaces "
                        f"(defined: {', '.join(config['spaces'])})")


wildcard_constraints:
    scale="|".join(SCALES),


def params_flags(wildcards, input):
    """`--params FILE` for each params-section file among a rule's inputs."""
    files = [input.params] if isinstance(input.params, str) else input.params
    return " ".join(f"--params {f}" for f in files)


def corpus_files(corpus):
    """The local files a corpus reads (none for a Hugging Face dataset)."""
    if corpus["source"] == "text_files":
        return sorted(str(p) for p in Path(corpus["path"]).glob(corpus["pattern"]) if p.is_file())
    return []
