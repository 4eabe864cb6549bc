"""Locks of an interrupted run: removed when no Snakemake or DVC process works in the project,
kept (with one line saying what to do) when one does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hwgptbench import cli
from hwgptbench.pipeline import locks

SNAKEFILE = """\
rule slow:
    output: "done.txt"
    shell: "sleep {config[wait]} && touch {output}"
"""


def _locked_project(root: Path) -> Path:
    project = root / "project"
    (project / locks.SNAKEMAKE_LOCKS).mkdir(parents=True)
    (project / locks.SNAKEMAKE_LOCKS / "0.input.lock").write_text("x")
    (project / locks.DVC_RWLOCK).parent.mkdir(parents=True)
    (project / locks.DVC_RWLOCK).write_text(json.dumps(
        {"write": {"out": {"pid": 99999, "cmd": "dvc repro"}}, "read": {}}))
    return project


def _fake_proc(root: Path, processes: dict[int, tuple[list[str], Path]]) -> Path:
    proc = root / "proc"
    proc.mkdir()
    for pid, (argv, cwd) in processes.items():
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "cmdline").write_bytes(b"\0".join(a.encode() for a in argv) + b"\0")
        (proc / str(pid) / "cwd").symlink_to(cwd.resolve())
    return proc


def test_locks_of_a_run_that_no_longer_runs_are_removed(tmp_path: Path) -> None:
    project = _locked_project(tmp_path)
    elsewhere = tmp_path / "other"
    elsewhere.mkdir()
    proc = _fake_proc(tmp_path, {
        10: (["/usr/bin/python3", "/x/.venv/bin/snakemake", "all"], elsewhere),
        11: (["bash"], project)})
    removed = locks.clear_stale_locks(project, proc)
    assert {p.name for p in removed} == {"0.input.lock", "rwlock"}
    assert not list((project / locks.SNAKEMAKE_LOCKS).iterdir())
    assert json.loads((project / locks.DVC_RWLOCK).read_text()) == {"read": {}, "write": {}}
    assert locks.clear_stale_locks(project, proc) == []  # nothing left to do


def test_locks_of_a_running_snakemake_are_kept_with_what_to_do(tmp_path: Path) -> None:
    project = _locked_project(tmp_path)
    proc = _fake_proc(tmp_path, {
        4242: (["/usr/bin/python3", "/x/.venv/bin/snakemake", "--cores", "2"], project)})
    with pytest.raises(locks.LockHeldError, match="PID 4242 .*snakemake --cores 2.*kill 4242"):
        locks.clear_stale_locks(project, proc)
    assert (project / locks.SNAKEMAKE_LOCKS / "0.input.lock").exists()
    assert "dvc repro" in (project / locks.DVC_RWLOCK).read_text()


def test_without_a_process_table_locks_are_kept_with_the_manual_way(tmp_path: Path) -> None:
    project = _locked_project(tmp_path)
    with pytest.raises(locks.LockHeldError, match="snakemake --unlock"):
        locks.clear_stale_locks(project, tmp_path / "no-proc")


@pytest.mark.e2e
@pytest.mark.skipif(not Path("/proc/self/cwd").exists(), reason="needs /proc (Linux)")
def test_a_killed_snakemake_run_is_unlocked_and_reruns(tmp_path: Path,
                                                       capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    """The real case: snakemake killed with SIGKILL mid-job, then the next run."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "Snakefile").write_text(SNAKEFILE)
    snakemake = [sys.executable, str(Path(sys.executable).parent / "snakemake"), "--cores", "1"]
    run = subprocess.Popen([*snakemake, "--config", "wait=60"], cwd=project,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while not list((project / locks.SNAKEMAKE_LOCKS).glob("*.lock")):
            assert time.monotonic() < deadline, "snakemake never locked the project"
            time.sleep(0.2)
        assert cli.main(["unlock-stale", "--project", str(project)]) == 2  # it still runs
        assert f"PID {run.pid}" in capsys.readouterr().err
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    again = [*snakemake, "--config", "wait=0"]
    blocked = subprocess.run(again, cwd=project, capture_output=True, text=True)
    assert blocked.returncode != 0 and "LockException" in blocked.stdout + blocked.stderr
    assert cli.main(["unlock-stale", "--project", str(project)]) == 0
    rerun = subprocess.run(again, cwd=project, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert (project / "done.txt").exists()
