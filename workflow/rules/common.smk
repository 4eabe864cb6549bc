"""Paths and helpers shared by the rules. No logic beyond wiring paths and params."""

from pathlib import Path

RESULTS = "results"
PARAMS = hwparams.write_sections(config, f"{RESULTS}/.params")
DATA_DIR = f"{RESULTS}/data/{config['data']['name']}"


def corpus_files(corpus):
    """The local files a corpus reads (none for a Hugging Face dataset)."""
    if corpus["source"] == "text_files":
        return sorted(str(p) for p in Path(corpus["path"]).glob(corpus["pattern"]) if p.is_file())
    return []
