"""`make pull`: REMOTE and ENDPOINT reach `hwgptbench pull` as one argument each, never as
shell code nor as make code (the real Makefile, with a stand-in `hwgptbench` that records its
arguments)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")


def make_pull(tmp_path: Path, *assignments: str) -> list[str]:
    """The arguments `make pull ASSIGNMENTS` hands to `hwgptbench` (a stand-in, first on the
    recipe's PATH through VENV; `-o` keeps make from installing into that VENV)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    record = tmp_path / "argv.json"
    fake = venv / "bin" / "hwgptbench"
    fake.write_text(f"#!{sys.executable}\nimport json, sys\n"
                    f"open({str(record)!r}, 'w').write(json.dumps(sys.argv[1:]))\n")
    fake.chmod(0o755)
    done = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT),
                           "-o", f"{venv}/.installed", "pull", f"VENV={venv}", *assignments],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    arguments: list[str] = json.loads(record.read_text())
    return arguments


def test_quotes_and_semicolons_stay_in_their_argument(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    remote = f"x'; touch {marker}; echo '"
    endpoint = f'https://h/"; touch {marker}; echo "$HOME $(touch {marker}) `touch {marker}` *'
    arguments = make_pull(tmp_path, f"REMOTE={remote}", f"ENDPOINT={endpoint}")
    assert arguments == ["pull", "--remote", remote, "--endpoint-url", endpoint]
    assert not marker.exists()


def test_without_values_pull_gets_no_flags(tmp_path: Path) -> None:
    assert make_pull(tmp_path) == ["pull"]
    assert make_pull(tmp_path / "url", "REMOTE=https://host/it's") == [
        "pull", "--remote", "https://host/it's"]


def test_make_functions_stay_in_their_argument(tmp_path: Path) -> None:
    """Make exports a command-line variable to recipes after expanding it: a `$(shell ...)` in
    REMOTE or ENDPOINT must not run, in `make pull` nor in another target's recipe."""
    marker = tmp_path / "marker"
    remote = f"https://h/$(shell touch {marker})x"
    endpoint = f"https://e/$(shell touch {marker})"
    arguments = make_pull(tmp_path, f"REMOTE={remote}", f"ENDPOINT={endpoint}")
    assert arguments == ["pull", "--remote", remote, "--endpoint-url", endpoint]
    assert not marker.exists()
    done = subprocess.run(["make", "--no-print-directory", "-s", "-C", str(ROOT), "help",
                           f"REMOTE={remote}", f"ENDPOINT={endpoint}"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert not marker.exists()
