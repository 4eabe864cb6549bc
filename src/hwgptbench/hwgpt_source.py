"""Where HW-GPT-Bench's perplexity files are: its repository, the one revision that holds
them, and the files of each scale (paths inside the repository)."""

from __future__ import annotations

from .errors import UserError

URL = "https://github.com/automl/HW-GPT-Bench"
# the only commit with the files (they were removed the next day)
REV = "795cba8124826acc600df1bd2bb516b22f207671"
# the published supernets' embedding rows: GPT-2's tokenizer and a pad token (50,258 tokens),
# padded to a multiple of 128
VOCAB_SIZE = 50304

_TRACKERS = tuple(f"ppl_observations_tracker_{a}_{a + 1000}.pkl" for a in range(0, 10_000, 1000))
# s: ppl.pkl holds all 10,000 rows (the s tracker files beside it repeat them exactly)
FILES: dict[str, tuple[str, ...]] = {
    "s": ("arch_ppl_bench_s/ppl.pkl",),
    "m": tuple(f"arch_ppl_bench_m/{name}" for name in _TRACKERS),
    "l": tuple(f"arch_ppl_bench_l/{name}" for name in _TRACKERS),
}


class PublishedDataError(UserError, RuntimeError):
    """HW-GPT-Bench's files could not be fetched, or are not what the import reads."""


def files(scale: str) -> tuple[str, ...]:
    """The repository paths of a scale's perplexity files."""
    if scale not in FILES:
        raise PublishedDataError(f"--scale {scale!r}: HW-GPT-Bench published perplexities of "
                                 f"the scales {', '.join(FILES)} only")
    return FILES[scale]


def label(url: str, rev: str) -> str:
    """``host/owner/name@rev`` of a repository URL (a local path stays a path)."""
    bare = url.split("://", 1)[-1].rstrip("/")
    return f"{bare.removesuffix('.git')}@{rev}"
