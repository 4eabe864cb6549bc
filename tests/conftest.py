"""Shared fixtures: the repository root, a scratch copy of the project as a git repo, a
subprocess runner whose PATH has this interpreter's console scripts (hwgptbench, snakemake,
dvc), and local servers (a moto S3 server) for the remote tests."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    import polars as pl

    from hwgptbench.settings.sections import SurrogateSettings
    from hwgptbench.space import SearchSpace

REPO_ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

# A GPU machine runs the suite on the CPU, as every machine does: default_device() honours
# HWGPTBENCH_DEVICE (so do the tools the tests spawn, which inherit it). `gpu` tests choose
# their device themselves; HWGPTBENCH_DEVICE set before pytest starts is kept for every test.
DEVICE_ENV = "HWGPTBENCH_DEVICE"
DEVICE_GIVEN = DEVICE_ENV in os.environ
os.environ.setdefault(DEVICE_ENV, "cpu")


@pytest.fixture(autouse=True)
def _gpu_tests_choose_their_device(request: pytest.FixtureRequest,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if not DEVICE_GIVEN and request.node.get_closest_marker("gpu") is not None:
        monkeypatch.setenv(DEVICE_ENV, "auto")


@pytest.fixture(autouse=True, scope="session")
def _user_cache_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The user cache folder (where a query outside a project checkout caches the shipped
    tables' surrogates, ``HWGPTBENCH_CACHE``) is the run's own: no test writes into the
    machine's ``~/.cache``, nor reads a cache a user left there."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("HWGPTBENCH_CACHE", str(tmp_path_factory.mktemp("user-cache")))
        yield


# Tests commit in scratch repositories: never depend on the machine's git identity.
GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "hwgptbench tests", "GIT_AUTHOR_EMAIL": "tests@hwgptbench.invalid",
    "GIT_COMMITTER_NAME": "hwgptbench tests", "GIT_COMMITTER_EMAIL": "tests@hwgptbench.invalid",
}


class Hostile:
    """An object whose unpickling would create ``marker``: code from a file, run by its reader
    (the hostile-file tests pickle it into checkpoints and tables)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.marker), "w")


def tool_env() -> dict[str, str]:
    env = {**os.environ, **GIT_IDENTITY, "DVC_NO_ANALYTICS": "1"}
    env["PATH"] = f"{BIN}{os.pathsep}{env.get('PATH', '')}"
    return env


# The time limits of what the tests spawn are derived from measured baselines, not fixed: a
# command's limit is its baseline (seconds on the quiet 2-vCPU VM of docs/workflow.md) times
# MARGIN, times how much slower this machine is now than that VM (`slowness`: a fixed
# single-threaded workload timed once per process against CALIBRATION_S, its time there), so
# that a machine twice as slow, or as loaded, still passes with the same margin.
# the workload's time on the reference VM: 0.30-0.33 s quiet (median 0.32 of 5, 2026-11-27);
# 0.63 s beside three processes spinning on its 2 cores
CALIBRATION_S = 0.32
MARGIN = 3.0
DEFAULT_BASELINE_S = 200.0  # a command without its own baseline: the tiny `dvc repro` (~170 s)


def _calibration_workload() -> None:
    """Pure-Python arithmetic, one thread: how fast a core is, and how shared."""
    total = 0
    for i in range(6_000_000):
        total += i * i % 7
    assert total > 0


def slowness_of(took_s: float, reference_s: float) -> float:
    """How much slower a machine that took ``took_s`` is than one that took ``reference_s``
    (at least 1: a faster machine keeps the reference limits)."""
    return max(1.0, took_s / reference_s)


@cache
def slowness() -> float:
    """This machine's slowness now: the calibration workload timed once per process."""
    start = time.perf_counter()
    _calibration_workload()
    return slowness_of(time.perf_counter() - start, CALIBRATION_S)


def limit(baseline_s: float) -> int:
    """The time limit (s) of something that took ``baseline_s`` on the reference VM."""
    return math.ceil(baseline_s * MARGIN * slowness())


def run(args: list[str], cwd: Path, check: bool = True,
        baseline_s: float = DEFAULT_BASELINE_S,
        env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run a command (in ``env``, default :func:`tool_env`) within :func:`limit` of its
    ``baseline_s``; on an unexpected exit show its output in the assertion."""
    result = subprocess.run(args, cwd=cwd, env=dict(env) if env is not None else tool_env(),
                            text=True, capture_output=True, timeout=limit(baseline_s))
    if check and result.returncode != 0:
        raise AssertionError(f"{' '.join(args)} exited {result.returncode}\n"
                             f"--- stdout\n{result.stdout}\n--- stderr\n{result.stderr}")
    return result


def project_files() -> list[str]:
    """Files of the project as git sees them (tracked and untracked-but-not-ignored)."""
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO_ROOT,
                         text=True, capture_output=True, check=True).stdout
    return [f for f in out.splitlines() if (REPO_ROOT / f).exists()]


def make_project(tmp: Path) -> Path:
    """A copy of the project at ``tmp/project``, as a fresh git repository with one commit,
    whose default DVC remote is ``local``, pointed at the scratch folder ``tmp/remote``. (The
    project's own ``.dvc/config`` makes no remote the default; a team on a shared disk commits
    ``dvc remote default local``, as this copy does, and clones of the copy inherit it.)"""
    from dvc.config import Config  # what `dvc remote default` and `modify --local` write,
    # without starting dvc twice for every copy (about a second each)

    dest = tmp / "project"
    for name in project_files():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO_ROOT / name, target, follow_symlinks=False)
    # the copy's Snakemake takes one core: Snakemake sets a job's OMP_NUM_THREADS to its
    # threads (all cores, for the torch stages), which beside the other test worker would
    # outnumber the two cores and leave torch's threads waiting on each other
    profile = dest / "workflow" / "profiles" / "default" / "config.yaml"
    profile.write_text(profile.read_text().replace("cores: all", "cores: 1"))
    run(["git", "init", "-q", "-b", "main"], dest)
    config = Config(dvc_dir=str(dest / ".dvc"))
    with config.edit("repo") as repo_level:
        repo_level["core"]["remote"] = "local"
    run(["git", "add", "-A"], dest)
    run(["git", "commit", "-qm", "scratch copy"], dest)
    with config.edit("local") as local_level:
        local_level["remote"].setdefault("local", {})["url"] = str(tmp / "remote")
    return dest


def set_param(repo: Path, path: list[str], value: object) -> None:
    """Set one params.yaml entry of a project copy (``path``: its keys, outermost first)."""
    import yaml

    doc = yaml.safe_load((repo / "params.yaml").read_text())
    node = doc
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    (repo / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def surrogate_settings(section: dict[str, Any]) -> SurrogateSettings:
    """A surrogate section written in a test (only what it sets) as settings: params.yaml's
    surrogate section under it, with one worker unless it says otherwise."""
    import yaml

    from hwgptbench.params import section_of
    from hwgptbench.settings.sections import SurrogateSettings

    base = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["surrogate"]
    return section_of(SurrogateSettings, base | {"workers": 1} | section)


def toy_perplexity_table(space: SearchSpace, n: int = 30, seed: int = 0) -> pl.DataFrame:
    """A perplexity table of n archs of space whose perplexity falls with their size: what a
    test fits surrogates on."""
    import numpy as np
    import polars as pl

    archs = space.sample(n, seed=seed)
    size = np.array([a.embed_dim * a.n_layer for a in archs], dtype=float)
    return pl.DataFrame({"arch_id": [a.id for a in archs], "train_steps": 10,
                         "perplexity": 100 / np.log(size + 2)})


def use_test_params(repo: Path) -> None:
    """Merge params/test.yaml (the test-sized workflow) into a project copy's params.yaml, as
    ``snakemake --configfile params/test.yaml`` merges it: DVC tracks params.yaml only."""
    import yaml

    from hwgptbench.params import overlay

    doc = overlay(yaml.safe_load((repo / "params.yaml").read_text()),
                  yaml.safe_load((repo / "params" / "test.yaml").read_text()))
    (repo / "params.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def no_contention_wait(measure: dict) -> dict:
    """The measure section's contention entry without the pause before each visit: the tests
    time beside each other, so their rows are often contended, and the visits still run (the
    pause itself is tests/test_contention.py's)."""
    return {"contention": {**measure["contention"], "wait_s": 0.0}}


@pytest.fixture(scope="session")
def shakespeare(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The data stage's output for the repository's data params (built once per session)."""
    import yaml

    from hwgptbench.data.build import build
    from hwgptbench.params import section_of
    from hwgptbench.settings.sections import DataSettings

    config = yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["data"]
    config["corpus"]["path"] = str(REPO_ROOT / config["corpus"]["path"])
    out = tmp_path_factory.mktemp("data") / config["name"]
    build(section_of(DataSettings, config), out)
    return out


@pytest.fixture(scope="session")
def published_s(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Path:
    """A results folder holding the surrogates of the shipped s tables, fitted as a fresh
    clone's first query fits them, once per test run: under pytest-xdist the first worker
    that needs them fits them in the run's shared folder and the others wait and read them
    (the tests only read them)."""
    from filelock import FileLock

    from hwgptbench.api import Benchmark

    if worker_id == "master":  # not under xdist
        results = tmp_path_factory.mktemp("base") / "results"
        Benchmark.from_published("s", results)
        return results
    shared = tmp_path_factory.getbasetemp().parent  # this run's, above each worker's own
    results, fitted = shared / "published-s" / "results", shared / "published-s" / "fitted"
    with FileLock(str(shared / "published-s.lock")):
        if not fitted.exists():
            results.parent.mkdir(exist_ok=True)
            Benchmark.from_published("s", results)
            fitted.touch()
    return results


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A scratch copy of the project (see :func:`make_project`)."""
    return make_project(tmp_path)


# Dummy AWS credentials for the local S3 server: moto accepts any; they live only in the
# environment of the tests that use it, never in a config.
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "hwgptbench-test-key",
               "AWS_SECRET_ACCESS_KEY": "hwgptbench-test-secret",
               "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    """A TCP port of 127.0.0.1 that nothing listens on now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def serving(args: list[str], url: str, log: Path, timeout: float = 30) -> Iterator[str]:
    """Run the server command ``args`` until the context ends; enter once ``url`` answers."""
    with log.open("w") as sink:
        server = subprocess.Popen(args, stdout=sink, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + timeout
            while True:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"{args[0]} did not answer on {url}:\n{log.read_text()}")
                try:
                    urllib.request.urlopen(url, timeout=1).close()
                    break
                except OSError:
                    time.sleep(0.2)
            yield url
        finally:
            server.terminate()
            try:
                server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()


def local_no_proxy(env: pytest.MonkeyPatch) -> None:
    """Let requests to 127.0.0.1 bypass any proxy of the environment."""
    env.setenv("NO_PROXY", ",".join(filter(None, ["127.0.0.1", os.environ.get("NO_PROXY")])))


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A moto S3 server on a free local port (one per test module), with :data:`CREDENTIALS`
    in the environment."""
    port = free_port()
    log = tmp_path_factory.mktemp("moto") / "moto.log"
    with pytest.MonkeyPatch.context() as env:
        for name, value in CREDENTIALS.items():
            env.setenv(name, value)
        env.delenv("AWS_PROFILE", raising=False)
        env.delenv("AWS_SESSION_TOKEN", raising=False)
        local_no_proxy(env)
        with serving([str(BIN / "moto_server"), "-H", "127.0.0.1", "-p", str(port)],
                     f"http://127.0.0.1:{port}", log) as endpoint:
            yield endpoint


# Modules that take minutes: collected first, so that under `make test` (pytest-xdist,
# --dist loadfile) a worker starts each of them at once while the others share the rest.
LONG_MODULES = ("test_workflow.py", "test_runtime.py", "test_types.py", "test_measurements.py")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Long modules first, each in its own order; the rest as collected. Every test's own limit
    (pytest-timeout's, from pyproject.toml or its marker) grows with this machine's
    :func:`slowness` as the spawned commands' limits do."""
    def rank(item: pytest.Item) -> int:
        name = item.path.name
        return LONG_MODULES.index(name) if name in LONG_MODULES else len(LONG_MODULES)

    items.sort(key=rank)
    try:
        default = float(config.getini("timeout") or 0)
    except ValueError:  # pytest-timeout not loaded (-p no:timeout): no limits to scale
        return
    for item in items:
        marker = item.get_closest_marker("timeout")
        seconds = float(marker.args[0]) if marker and marker.args else default
        if seconds > 0:
            item.add_marker(pytest.mark.timeout(math.ceil(seconds * slowness())), append=False)
