"""The library from any folder: outside a project checkout a query caches the shipped tables'
surrogates in the user cache folder (``HWGPTBENCH_CACHE``, else platformdirs'), never in a
``results/`` of the working directory; inside a checkout, or for a results folder named
outright, under that results folder as before (``published.surrogates.cache_results``). The
end-to-end test installs the built wheel into a fresh environment and runs the README's query
and the ``HWGPT`` example from an empty folder, which stays empty."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT, limit
from hwgptbench import cli, outputs
from hwgptbench.api import Benchmark
from hwgptbench.compat import HWGPT
from hwgptbench.outputs import CACHE_ENV, OutputPathError, atomic_path, user_cache
from hwgptbench.published.surrogates import CACHE, cache_results

HWGPT_DOC = REPO_ROOT / "docs" / "hwgptbench_api.md"


def readme_query() -> list[str]:
    """The README's first query of the shipped tables, as its arguments after `hwgptbench`."""
    text = (REPO_ROOT / "README.md").read_text()
    found = re.search(r"^hwgptbench (query --scale s [^\n]*\\\n[^\n]*)$", text, re.MULTILINE)
    assert found, "the README's first query"
    return shlex.split(found.group(1).replace("\\\n", " "))


def hwgpt_example() -> str:
    """docs/hwgptbench_api.md's example of HW-GPT-Bench's API (the README links it)."""
    found = re.search(r"```python\n(from hwgptbench\.compat import HWGPT.*?)```",
                      HWGPT_DOC.read_text(), re.DOTALL)
    assert found, "the HWGPT example of docs/hwgptbench_api.md"
    return found.group(1)


def checkout(folder: Path) -> Path:
    """folder made the root of a project checkout, as far as the rule looks."""
    (folder / "workflow").mkdir(parents=True)
    (folder / "workflow" / "Snakefile").write_text("")
    (folder / "params.yaml").write_text("")
    return folder


@pytest.fixture
def empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty working directory outside any checkout, its user cache in tmp_path/cache."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "cache"))
    return work


def test_outside_a_checkout_the_user_cache_is_used(empty: Path, tmp_path: Path) -> None:
    assert cache_results() == cache_results("results") == tmp_path / "cache"
    assert cache_results(Path("./results")) == tmp_path / "cache"


def test_the_user_cache_is_platformdirs_unless_named(empty: Path, tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert user_cache() == tmp_path / "xdg" / "hwgptbench"
    monkeypatch.setenv(CACHE_ENV, "")  # empty: not set
    assert user_cache() == tmp_path / "xdg" / "hwgptbench"
    monkeypatch.setenv(CACHE_ENV, "relative/cache")
    assert user_cache() == empty / "relative" / "cache"


def test_inside_a_checkout_or_with_results_the_results_folder_is_used(
        empty: Path, tmp_path: Path) -> None:
    (empty / "results").mkdir()
    assert cache_results() == Path("results")  # a results folder exists here
    (empty / "results").rmdir()
    checkout(empty)
    assert cache_results() == Path("results")  # the checkout's, made by the first query
    (empty / "notebooks").mkdir()
    os.chdir(empty / "notebooks")  # below a checkout's root: not its results folder
    assert cache_results() == tmp_path / "cache"


def test_a_results_folder_named_outright_is_used(empty: Path, tmp_path: Path) -> None:
    for named in (tmp_path / "mine", "mine", empty / "results"):
        assert cache_results(named) == Path(named)


def test_a_link_on_the_user_cache_path_is_allowed_as_the_results_folder(
        empty: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The user cache folder may lie behind a link (a home on other storage); a link out of
    it, the project, the results and the temporary folder is still refused."""
    monkeypatch.setattr(outputs.tempfile, "gettempdir", lambda: str(tmp_path / ".tmp"))
    (tmp_path / "storage").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "storage")
    (tmp_path / "other").symlink_to(tmp_path / "elsewhere")
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "link" / "hwgptbench"))
    with atomic_path(tmp_path / "link" / "hwgptbench" / "published" / "a.json") as tmp:
        tmp.write_text("{}")
    assert (tmp_path / "storage" / "hwgptbench" / "published" / "a.json").read_text() == "{}"
    with pytest.raises(OutputPathError, match="symbolic link out of the project"):
        with atomic_path(tmp_path / "other" / "a.json") as tmp:
            tmp.write_text("{}")
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_queries_from_an_empty_folder_leave_it_empty(
        empty: Path, tmp_path: Path, published_s: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Benchmark.load, HWGPT and `hwgptbench query` read the cache in the user cache folder
    (copied from the fitted one, so nothing is fitted here) and write nothing here."""
    shutil.copytree(published_s / "published", tmp_path / "cache" / "published")
    bench = Benchmark.load("s")
    assert "cuda-nvidia-h100-80gb-hbm3" in bench.devices
    api = HWGPT(search_space="s", use_supernet_surrogate=False)
    assert api.device_list
    assert cli.main(readme_query()) == 0
    assert "latency_ms" in capsys.readouterr().out
    assert list(empty.iterdir()) == []


def test_a_checkout_keeps_its_cache_under_results(empty: Path, tmp_path: Path,
                                                   published_s: Path) -> None:
    """Inside a checkout the cache stays under results/ (a user cache holding none is not
    read)."""
    checkout(empty)
    shutil.copytree(published_s / "published", empty / "results" / "published")
    Benchmark.load("s")
    assert not (tmp_path / "cache").exists()


def _wheel_env(tmp_path: Path, venv: Path) -> dict[str, str]:
    """A user's environment: the fresh venv's commands first, a home and XDG cache of the
    test's own, no cache folder named."""
    env = {key: value for key, value in os.environ.items()
           if key not in (CACHE_ENV, "VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")}
    (tmp_path / "home").mkdir()
    env.update(HOME=str(tmp_path / "home"), XDG_CACHE_HOME=str(tmp_path / "xdg"),
               PATH=f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    return env


@pytest.mark.e2e
def test_the_wheel_answers_from_an_empty_folder(tmp_path: Path) -> None:
    """The wheel, built from a copy of the sources and installed into a fresh venv, answers the
    README's query and runs the HWGPT example from an empty folder outside any checkout: the
    surrogates are fitted into the user cache folder, and the folder stays empty.

    No download: the wheel is built without build isolation (this venv's setuptools) and
    installed with ``--no-deps --no-index``; the fresh venv sees the locked dependencies
    through a ``.pth`` file naming this venv's site-packages (which `make install` filled
    from requirements.lock), appended after its own, so the wheel's package is the one
    imported (this venv's editable install is a ``.pth`` of its own, which a path in a ``.pth``
    does not process)."""
    started = time.monotonic()
    source, wheels, venv = tmp_path / "source", tmp_path / "wheels", tmp_path / "venv"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO_ROOT / name, source / name)
    shutil.copytree(REPO_ROOT / "src", source / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", str(source), "--no-deps",
                    "--no-build-isolation", "--no-index", "--quiet", "-w", str(wheels)],
                   check=True, capture_output=True, cwd=tmp_path)
    [wheel] = wheels.glob("hwgptbench-*.whl")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "--no-index", "--quiet", str(wheel)],
                   check=True, capture_output=True)
    site = subprocess.run([str(python), "-c", "import sysconfig; "
                           "print(sysconfig.get_paths()['purelib'])"],
                          check=True, capture_output=True, text=True).stdout.strip()
    ours = dict.fromkeys(sysconfig.get_paths()[key] for key in ("purelib", "platlib"))
    (Path(site) / "hwgptbench-locked-dependencies.pth").write_text("\n".join(ours) + "\n")

    work = tmp_path / "work"
    work.mkdir()
    env = _wheel_env(tmp_path, venv)
    query = subprocess.run([str(venv / "bin" / "hwgptbench"), *readme_query()], cwd=work,
                           env=env, capture_output=True, text=True, timeout=limit(60))
    assert query.returncode == 0, query.stderr
    assert all(name in query.stdout for name in ("perplexity", "latency_ms", "energy_mj"))
    script = tmp_path / "example.py"
    script.write_text("import hwgptbench\nprint('package', hwgptbench.__file__)\n"
                      f"{hwgpt_example()}print('devices', api.device_list)\n")
    example = subprocess.run([str(python), str(script)], cwd=work, env=env,
                             capture_output=True, text=True, timeout=limit(60))
    assert example.returncode == 0, example.stderr
    assert f"package {venv}" in example.stdout  # the wheel's package, not the checkout's
    assert "cuda-nvidia-h100-80gb-hbm3" in example.stdout

    assert list(work.iterdir()) == []
    [cache] = (tmp_path / "xdg" / "hwgptbench" / "published").glob(f"s-*/{CACHE}")
    assert "fitting their surrogates into" in query.stderr and str(cache.parent) in query.stderr
    assert time.monotonic() - started < limit(90)  # 90 s on the 2-vCPU VM
