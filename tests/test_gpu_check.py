"""benchmarks/gpu_check.py: its checks as `gpu` tests (skipped without CUDA; `pytest -m gpu -s
tests/test_gpu_check.py` prints what each measured), and the script on a machine with torch
and numpy alone."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from collections.abc import Callable

import pytest
import torch

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_check.py"
_spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
assert _spec is not None and _spec.loader is not None
gpu_check = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gpu_check)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("check", gpu_check.CHECKS, ids=gpu_check.check_name)
def test_gpu_check(check: Callable[[], str]) -> None:
    print(f"{gpu_check.check_name(check)}: {check()}")


def test_the_script_needs_neither_polars_nor_lightgbm_nor_pytest() -> None:
    hidden = "; ".join(f"sys.modules[{name!r}] = None" for name in
                       ("polars", "lightgbm", "pytest", "snakemake"))
    code = (f"import runpy, sys; {hidden}; sys.argv = ['gpu_check.py']; "
            f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}  # every check skipped, GPU or not
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                            text=True, timeout=300, cwd=REPO_ROOT)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("no CUDA device")
    assert lines[1:] == [f"SKIP {gpu_check.check_name(c)}: no CUDA device"
                         for c in gpu_check.CHECKS]
