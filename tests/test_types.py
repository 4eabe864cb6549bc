"""The package's types are checked: py.typed promises them to users."""

from __future__ import annotations

import shutil
import subprocess

from conftest import REPO_ROOT


def test_mypy_is_clean() -> None:
    """mypy at the strictness of pyproject.toml's [tool.mypy] finds nothing in src/."""
    mypy = shutil.which("mypy")
    assert mypy is not None, "mypy comes with the test extra: pip install -e '.[test]'"
    result = subprocess.run([mypy], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
