"""The SLURM profile (workflow/profiles/slurm): the jobs a dry run plans with their resources,
and (slow) the tiny workflow on a real one-node SLURM cluster on this machine (docs/cluster.md).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from pathlib import Path
from typing import NamedTuple

import pytest
import yaml

from conftest import MARGIN, REPO_ROOT, make_project, run, set_param, use_test_params

pytestmark = pytest.mark.e2e  # spawns snakemake or dvc

PROFILE_DIR = "workflow/profiles/slurm"
PROFILE = ["--workflow-profile", PROFILE_DIR]
LOCALHOST = Path(PROFILE_DIR, "localhost")
# The localhost cluster has no slurmdbd: job states come from squeue (with sacct, snakemake would
# wait forever), there is no account to give, and a job gets at most this machine's CPUs.
LOCALHOST_FLAGS = ["--slurm-status-command", "squeue", "--slurm-no-account",
                   "--slurm-init-seconds-before-status-checks", "2",
                   "--slurm-keep-successful-logs", "--max-threads", str(os.cpu_count())]
CLUSTER_DEVICES = {
    "gpu-a": {"partition": "gpu", "constraint": "a100", "gpus": 1, "runtime": 90, "mem_mb": 30000},
    "cpu-b": {"partition": "cpu", "constraint": "epyc"},
}
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+) \(log: (.+)\)\.")


class Job(NamedTuple):
    """One job of a dry run as Snakemake prints it."""

    rule: str
    wildcards: dict[str, str]
    threads: int
    resources: dict[str, str]
    shell: str


def planned_jobs(output: str) -> list[Job]:
    """The jobs Snakemake prints (with their shell commands): a dry run's plan or a run's log."""
    jobs = []
    for block in re.split(r"^\[[^\]\n]+\]\n", output, flags=re.M)[1:]:
        head = re.match(r"(?:local)?rule (\w+):", block)
        if head is None:
            continue
        fields = dict(re.findall(r"^    (\w+): (.*)$", block, flags=re.M))
        pairs = [p.split("=", 1) for p in fields.get("wildcards", "").split(", ") if p]
        resources = [p.split("=", 1) for p in fields["resources"].split(", ")]
        shell = re.search(r"^Shell command: (.*)$", block, flags=re.M)
        jobs.append(Job(head[1], dict(pairs), int(fields.get("threads", 1)), dict(resources),
                        shell[1] if shell else ""))
    return jobs


def profile() -> dict:
    """The settings of the SLURM profile."""
    return yaml.safe_load((REPO_ROOT / PROFILE_DIR / "config.yaml").read_text())


@pytest.fixture(scope="module")
def cluster_project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The project measuring three devices in two shards each: two placed by cluster.devices,
    one not; the supernet on two processes (device auto), perplexity on the CPU."""
    repo = make_project(tmp_path_factory.mktemp("cluster"))
    set_param(repo, ["cluster", "devices"], CLUSTER_DEVICES)
    set_param(repo, ["workflow", "devices"], ["gpu-a", "cpu-b", "other"])
    set_param(repo, ["search", "devices"], ["gpu-a"])
    set_param(repo, ["measure", "shards"], 2)
    set_param(repo, ["supernet", "processes"], 2)
    set_param(repo, ["perplexity", "device"], "cpu")
    return repo


@pytest.fixture(scope="module")
def cluster_plan(cluster_project: Path) -> list[Job]:
    """The jobs of a dry run through the SLURM profile."""
    return planned_jobs(run(["snakemake", *PROFILE, "-n"], cluster_project).stdout)


def test_measure_jobs_are_placed_by_cluster_devices(cluster_plan: list[Job]) -> None:
    measure = {(j.wildcards["device"], j.wildcards["shard"]): j.resources
               for j in cluster_plan if j.rule == "measure"}
    assert set(measure) == {(d, s) for d in ("gpu-a", "cpu-b", "other") for s in ("0", "1")}
    defaults = profile()["default-resources"]
    threads = str(yaml.safe_load((REPO_ROOT / "params.yaml").read_text())["measure"]["threads"])
    for shard in ("0", "1"):
        gpu, cpu, other = (measure[d, shard] for d in ("gpu-a", "cpu-b", "other"))
        assert {k: gpu[k] for k in ("slurm_partition", "constraint", "gpu", "runtime", "mem_mb")
                } == {"slurm_partition": "gpu", "constraint": "a100", "gpu": "1",
                      "runtime": "90", "mem_mb": "30000"}
        # fields a device entry leaves out come from the profile's default-resources
        assert (cpu["slurm_partition"], cpu["constraint"]) == ("cpu", "epyc")
        assert "gpu" not in cpu
        assert (cpu["runtime"], cpu["mem_mb"]) == (str(defaults["runtime"]),
                                                   str(defaults["mem_mb"]))
        # a device without an entry is placed like any job: no partition, constraint or GPU
        assert not {"slurm_partition", "constraint", "gpu"} & set(other)
        assert (other["runtime"], other["mem_mb"]) == (cpu["runtime"], cpu["mem_mb"])
        for resources in (gpu, cpu, other):
            assert resources["cpus_per_task"] == threads
            assert resources["slurm_extra"] == "--exclusive"
    # the runtime stage times on the same nodes as the measure stage
    runtime = {j.wildcards["device"]: j.resources for j in cluster_plan if j.rule == "runtime"}
    for device, resources in runtime.items():
        assert resources == measure[device, "0"], device


def test_gpus_and_threads_of_the_other_jobs(cluster_plan: list[Job]) -> None:
    jobs = {j.rule: j for j in cluster_plan}
    threads = profile()["set-threads"]
    assert jobs["supernet"].resources["gpu"] == "2"  # supernet.processes, device auto
    assert "gpu" not in jobs["perplexity"].resources  # perplexity.device cpu
    for rule in ("data", "supernet", "perplexity", "surrogates_perplexity", "surrogates_device"):
        assert jobs[rule].threads == threads[rule]
    for job in cluster_plan:
        if job.rule != "all":
            assert {"runtime", "mem_mb"} <= set(job.resources), job
        if job.rule not in ("measure", "runtime"):  # only params place jobs: the profile
            assert "slurm_partition" not in job.resources, job  # names no partition


def test_unplaced_fields_follow_the_default_resources(cluster_project: Path) -> None:
    targets = [f"results/tiny/measure/{d}.parquet" for d in ("cpu-b", "other")]
    out = run(["snakemake", *PROFILE, "-n", *targets, "--default-resources",
               "slurm_partition='main'", "runtime=11*attempt", "mem_mb=1234"],
              cluster_project).stdout
    measure = {j.wildcards["device"]: j.resources for j in planned_jobs(out) if j.rule == "measure"}
    assert set(measure) == {"cpu-b", "other"}
    assert [measure["cpu-b"][k] for k in ("slurm_partition", "runtime", "mem_mb")] == [
        "cpu", "11", "1234"]
    assert [measure["other"][k] for k in ("slurm_partition", "runtime", "mem_mb")] == [
        "main", "11", "1234"]


def test_the_cluster_runs_the_jobs_and_commands_of_a_local_run(
        cluster_project: Path, cluster_plan: list[Job]) -> None:
    local = planned_jobs(run(["snakemake", "-n"], cluster_project).stdout)

    def plan(jobs: list[Job]) -> list[tuple[str, str, str]]:
        return sorted((j.rule, repr(sorted(j.wildcards.items())), j.shell) for j in jobs)

    assert plan(local) == plan(cluster_plan)


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_tiny_workflow_on_a_localhost_slurm_cluster(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if shutil.which("slurmctld") is None or shutil.which("munged") is None:
        pytest.skip("no SLURM on this machine (Debian: apt-get install -y slurm-wlm munge)")
    if os.geteuid() != 0:
        pytest.skip("the localhost SLURM cluster needs root (slurmd starts jobs as their users)")
    repo = make_project(tmp_path)
    use_test_params(repo)
    monkeypatch.setenv("HWGPT_SLURM_DIR", str(tmp_path / "slurm"))
    run([str(repo / LOCALHOST / "start.sh")], repo)
    try:
        started = time.monotonic()
        result = run(["snakemake", *PROFILE, *LOCALHOST_FLAGS], repo,
                     baseline_s=1400 / MARGIN)  # its former fixed limit: a slow test
        print(f"workflow through SLURM: {time.monotonic() - started:.0f} s")
    finally:
        run([str(repo / LOCALHOST / "stop.sh")], repo)

    tiny = repo / "results" / "tiny"
    for output in ("measurements.parquet", "surrogate_quality.json", "search_metrics.json",
                   "figures/hypervolume.svg"):
        assert (tiny / output).stat().st_size > 0, output
    log = result.stdout + result.stderr
    submitted = SUBMITTED.findall(log)
    jobs = planned_jobs(log)
    assert len(submitted) == len([j for j in jobs if j.rule != "all"]) > 10
    assert len({slurm_id for _, slurm_id, _ in submitted}) == len(submitted)
    for _, slurm_id, slurm_log in submitted:  # what each job printed on the node
        assert Path(slurm_log).name == f"{slurm_id}.log"
        assert "--executor slurm-jobstep" in Path(slurm_log).read_text()
    assert "Nothing to be done" in run(["snakemake", *PROFILE, "-n"], repo).stdout
