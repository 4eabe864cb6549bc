"""The measurement core: latency statistics, energy meters, memory, FLOPs, device labels and
the per-arch runner. GPU tests are marked `gpu` and skip without CUDA (`pytest -m gpu`)."""

from __future__ import annotations

import dataclasses
import gc
import math
import os
import re
import subprocess
import sys
import threading
import time
import weakref
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from hwgptbench.meters import energy, host, latency, runner
from hwgptbench.meters.condition import CONDITION_KEYS, Condition
from hwgptbench.meters.device import (
    dtype_unsupported_reason,
    fingerprint,
    freeze_survivors,
    release,
)
from hwgptbench.meters.energy import (
    ENERGY_VALUES,
    EnergyMeter,
    PowerSamplingMeter,
    RaplMeter,
    measure_energy,
    open_energy_meter,
)
from hwgptbench.meters.flops import forward_flops
from hwgptbench.meters.host import DeviceMismatchError, auto_label, resolve_label
from hwgptbench.meters.latency import (
    LATENCY_FIELDS,
    cuda_graph_callable,
    latency_stats,
    measure_latency,
    measure_latency_interleaved,
    median_ci_halfwidth,
    median_ci_ranks,
)
from hwgptbench.meters.memory import cpu_memory, cuda_memory, tensor_bytes
from hwgptbench.meters.runner import Settings, condition_grid, measure_arch
from hwgptbench.model import GPT, GPTConfig, SuperGPT
from hwgptbench.space import SearchSpace

CPU = torch.device("cpu")
VOCAB = 256
SMALL = SearchSpace.from_dict("small", {
    "embed_dim": [32, 48], "n_layer": [1, 2], "n_head": [2, 3], "mlp_ratio": [2, 4],
    "bias": [True, False], "head_size": 8, "block_size": 32, "rotary_fraction": 0.5})
TINY = SearchSpace.from_dict("tiny", {
    "embed_dim": [64, 96, 128], "n_layer": [2, 3, 4], "n_head": [2, 4], "mlp_ratio": [2, 3, 4],
    "bias": [True, False], "head_size": 16, "block_size": 128, "rotary_fraction": 0.5})
S = SearchSpace.from_dict("s", {
    "embed_dim": [192, 384, 768], "n_layer": [10, 11, 12], "n_head": [4, 8, 12],
    "mlp_ratio": [2, 3, 4], "bias": [True, False], "head_size": 64, "block_size": 1024,
    "rotary_fraction": 0.5})
ROW_COLUMNS = [
    "arch_id", *CONDITION_KEYS, "params", "flops", "threads",
    "status", "reason", *LATENCY_FIELDS, *ENERGY_VALUES,
    "energy_source", "energy_reason", "memory_weights_mb", "memory_peak_mb",
    "memory_activations_mb", "memory_reason",
]
FAST = Settings(threads=2, warmup=2, min_repeats=10, max_repeats=40, target_rel_ci=0.02,
                max_seconds=1.0, energy_seconds=0.2, memory=True, seed=0, estimator="median")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(scope="module")
def tiny_supernet() -> SuperGPT:
    torch.manual_seed(0)
    return SuperGPT(TINY, VOCAB).eval()


# latency


def _binomial_cdf(k: int, n: int) -> float:
    return sum(math.comb(n, i) for i in range(k + 1)) / 2**n


def test_median_ci_ranks_match_binomial_quantiles() -> None:
    assert median_ci_ranks(10) == (1, 8)  # the textbook interval [x(2), x(9)] of 10 samples
    assert median_ci_ranks(20) == (5, 14)  # [x(6), x(15)]
    assert median_ci_ranks(5) is None  # 2 * 2**-5 > 5%: no 95% interval from 5 samples
    for n in (6, 7, 13, 50, 101, 400):
        lo, hi = median_ci_ranks(n)
        assert hi == n - 1 - lo
        assert 1 - 2 * _binomial_cdf(lo, n) >= 0.95  # sorted[lo], sorted[hi] cover 95%
        assert 1 - 2 * _binomial_cdf(lo + 1, n) < 0.95  # one rank narrower does not


def test_median_ci_halfwidth_of_a_known_sample() -> None:
    sample = [7.0, 3.0, 10.0, 1.0, 5.0, 9.0, 2.0, 8.0, 6.0, 4.0]
    assert median_ci_halfwidth(sample) == (9.0 - 2.0) / 2
    assert median_ci_halfwidth(sample[:5]) == math.inf
    stats = latency_stats(sample)
    assert list(stats) == list(LATENCY_FIELDS)
    assert stats["latency_ms"] == 5.5 and stats["latency_n"] == 10
    assert stats["latency_iqr_ms"] == pytest.approx(4.5)
    assert stats["latency_std_ms"] == pytest.approx(np.std(sample, ddof=1))
    assert stats["latency_ci95_rel"] == pytest.approx(3.5 / 5.5)


def test_latency_repeats_until_the_median_ci_is_tight(monkeypatch: pytest.MonkeyPatch) -> None:
    durations_ns = [int(d) for d in np.random.default_rng(0).lognormal(0, 0.1, 5000) * 1e6]
    calls = iter(durations_ns)
    clock = [0]

    def fn() -> None:
        clock[0] += next(calls)

    monkeypatch.setattr(latency, "time", SimpleNamespace(perf_counter_ns=lambda: clock[0],
                                                         thread_time_ns=lambda: clock[0],
                                                         perf_counter=time.perf_counter))
    stats = measure_latency(fn, CPU, warmup=3, min_repeats=10, max_repeats=4000,
                            target_rel_ci=0.01, max_seconds=60)
    n = stats["latency_n"]
    samples = [d / 1e6 for d in durations_ns[3:3 + n]]
    assert n % 10 == 0 and 10 <= n < 4000
    wait = stats.pop("latency_runqueue_wait")
    assert wait is None or 0 <= wait <= 1  # None where the kernel exposes no schedstat
    expected = latency_stats(samples, samples)
    del expected["latency_runqueue_wait"]  # the timer's, of the whole timing
    assert stats == expected
    assert stats["latency_ci95_rel"] <= 0.01 < latency_stats(samples[:n - 10])["latency_ci95_rel"]
    assert stats["latency_wall_cpu_ratio"] == 1.0 and stats["latency_contended"] is False


def test_estimators_pick_their_series() -> None:
    """median and min of the wall clock, median of the thread's CPU time; a thread that waited
    for a core (wall well above CPU time) is marked contended; without CPU times (CUDA)
    cpu_median is the wall median."""
    wall = [10.0, 12.0, 30.0, 11.0, 13.0]
    cpu = [9.0, 9.5, 9.2, 9.1, 9.4]
    assert latency_stats(wall, cpu, "median")["latency_ms"] == 12.0
    assert latency_stats(wall, cpu, "min")["latency_ms"] == 10.0
    by_cpu = latency_stats(wall, cpu, "cpu_median")
    assert by_cpu["latency_ms"] == 9.2 and by_cpu["latency_wall_ms"] == 12.0
    assert by_cpu["latency_contended"] is True and by_cpu["latency_estimator"] == "cpu_median"
    on_cuda = latency_stats(wall, [float("nan")] * 5, "cpu_median")
    assert on_cuda["latency_ms"] == 12.0 and on_cuda["latency_estimator"] == "median"
    assert on_cuda["latency_cpu_ms"] is None and on_cuda["latency_contended"] is None
    with pytest.raises(ValueError, match="estimator 'mean'"):
        latency_stats(wall, cpu, "mean")
    with pytest.raises(ValueError, match="one intra-op thread"):
        dataclasses.replace(FAST, estimator="cpu_median")  # FAST has 2 threads


def test_latency_of_a_forward_on_cpu(tiny_supernet: SuperGPT) -> None:
    model = tiny_supernet.extract(TINY.smallest())
    x = torch.randint(VOCAB, (1, 64))
    with torch.inference_mode():
        stats = measure_latency(lambda: model(x), CPU, warmup=2, min_repeats=10, max_repeats=30,
                                max_seconds=0.5)
    assert list(stats) == list(LATENCY_FIELDS)
    assert 10 <= stats["latency_n"] <= 30
    assert 0 < stats["latency_ms"] and 0 <= stats["latency_ci95_ms"] < math.inf
    assert stats["latency_ci95_rel"] == pytest.approx(stats["latency_ci95_ms"]
                                                      / stats["latency_ms"])


# energy


def _write(path: Path, value: int) -> None:
    """Replace a counter file at once, as sysfs reads never see a partial value."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{value}\n")
    tmp.replace(path)


def _rapl_zone(root: Path, zone: str, name: str, energy_uj: int, max_uj: int) -> Path:
    path = root / zone
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path / "energy_uj"


def test_energy_unavailable_without_a_counter(tmp_path: Path) -> None:
    meter = open_energy_meter(CPU)  # this machine: no readable RAPL, or RAPL that reads
    assert meter.available or meter.reason
    missing = open_energy_meter(CPU, rapl_root=tmp_path / "powercap")
    assert not missing.available and missing.source == "rapl"
    assert "RAPL not exposed" in missing.reason

    def fail() -> None:
        raise AssertionError("no window runs without a meter")

    row = measure_energy(fail, missing, CPU)
    assert row == {**dict.fromkeys(ENERGY_VALUES), "energy_source": "rapl",
                   "energy_reason": missing.reason}
    with pytest.raises(RuntimeError, match="unavailable"):
        missing.read_mj()
    _rapl_zone(tmp_path / "psys", "intel-rapl:1", "psys", 0, 100)
    assert "no RAPL package domain" in RaplMeter(tmp_path / "psys").reason


def test_fake_rapl_counters_with_wrap_around(tmp_path: Path) -> None:
    max_uj = 10_000_000
    package0 = _rapl_zone(tmp_path, "intel-rapl:0", "package-0", max_uj - 2_500, max_uj)
    package1 = _rapl_zone(tmp_path, "intel-rapl:1", "package-1", 7, max_uj)
    core = _rapl_zone(tmp_path, "intel-rapl:0:0", "core", 0, max_uj)  # subzone: not counted
    meter = RaplMeter(tmp_path)
    assert meter.available and meter.source == "rapl" and meter.reason is None

    def step() -> None:  # one call: 1 mJ on package 0 (wrapping), 0.5 mJ on package 1
        for path, uj in ((package0, 1_000), (package1, 500), (core, 9_999)):
            _write(path, (int(path.read_text()) + uj) % max_uj)

    start = meter.read_mj()
    for _ in range(3):
        step()
    assert meter.read_mj() - start == pytest.approx(4.5)  # package 0 wrapped on the 3rd call
    row = measure_energy(step, meter, CPU, min_seconds=0.05)
    assert row["energy_mj"] == pytest.approx(1.5)
    assert row["energy_calls"] >= 1 and row["energy_window_s"] >= 0.05
    assert row["energy_source"] == "rapl" and row["energy_reason"] is None


def test_fake_rapl_counter_advanced_by_a_thread(tmp_path: Path) -> None:
    package = _rapl_zone(tmp_path, "intel-rapl:0", "package-0", 0, 2**32)
    meter = RaplMeter(tmp_path)
    stop = threading.Event()

    def power() -> None:  # 1 J per 10 ms tick
        while not stop.wait(0.01):
            _write(package, int(package.read_text()) + 1_000_000)

    thread = threading.Thread(target=power)
    thread.start()
    try:
        row = measure_energy(lambda: time.sleep(0.01), meter, CPU, min_seconds=0.3)
    finally:
        stop.set()
        thread.join()
    assert row["energy_mj"] > 0 and row["energy_calls"] >= 1


def test_power_sampling_integrates_power_over_time() -> None:
    start = time.perf_counter()
    with PowerSamplingMeter("nvml_power_sampling", lambda: 2_000.0, period_s=0.005) as meter:
        time.sleep(0.1)
        energy = meter.read_mj()
        elapsed = time.perf_counter() - start
    assert 2_000 * 0.1 <= energy <= 2_000 * elapsed  # 2 W (2000 mW) for 0.1 s is 200 mJ


def _fake_pynvml(energy_mj: list[int] | None, shutdowns: list[str]) -> SimpleNamespace:
    """A pynvml stand-in: an energy counter (None: not supported) and a constant 3 W."""

    class NVMLError(Exception):
        pass

    class NVMLErrorNotSupported(NVMLError):
        pass

    def total_energy(handle: str) -> int:
        if energy_mj is None:
            raise NVMLErrorNotSupported("Not Supported")
        energy_mj.append(energy_mj[-1] + 250)
        return energy_mj[-1]

    return SimpleNamespace(NVMLError=NVMLError, NVMLError_NotSupported=NVMLErrorNotSupported,
                           nvmlInit=lambda: None, nvmlShutdown=lambda: shutdowns.append("x"),
                           nvmlDeviceGetTotalEnergyConsumption=total_energy,
                           nvmlDeviceGetPowerUsage=lambda handle: 3_000)


@pytest.mark.parametrize("counter", [True, False], ids=["counter", "power_sampling"])
def test_nvml_meter_and_its_power_sampling_fallback(monkeypatch: pytest.MonkeyPatch,
                                                    counter: bool) -> None:
    shutdowns: list[str] = []
    monkeypatch.setitem(sys.modules, "pynvml", _fake_pynvml([1_000] if counter else None,
                                                            shutdowns))
    monkeypatch.setattr(energy, "_nvml_handle", lambda pynvml, device: "handle")
    with open_energy_meter(torch.device("cuda")) as meter:
        assert meter.available and meter.reason is None
        assert meter.source == ("nvml" if counter else "nvml_power_sampling")
        first = meter.read_mj()
        time.sleep(0.05)
        assert meter.read_mj() - first >= (250 if counter else 3_000 * 0.05)
    assert shutdowns == ["x"]


# memory


def _cpu_rows(archs: list, dtype: torch.dtype, batch: int = 1) -> list[dict]:
    x = torch.randint(VOCAB, (batch, 128), generator=torch.Generator().manual_seed(0))
    return [cpu_memory(runner.build_model(TINY, arch, VOCAB, 0, CPU, dtype), x) for arch in archs]


def test_cpu_memory_of_a_forward() -> None:
    small, large = TINY.smallest(), TINY.largest()
    rows = dict(zip((small, large), _cpu_rows([small, large], torch.float32), strict=True))
    for arch, row in rows.items():
        model = GPT(GPTConfig.from_space(TINY, arch, VOCAB))
        rotary = model.rotary.cos.numel() * 2 * 4
        assert tensor_bytes(model) == TINY.n_params(arch, VOCAB) * 4 + rotary
        assert row["memory_weights_mb"] * 2**20 == tensor_bytes(model)
        assert row["memory_reason"] is None
        assert row["memory_peak_mb"] > row["memory_activations_mb"] > 0
        # the logits alone (1 x 128 x VOCAB float32) are held at the end of the forward
        assert row["memory_activations_mb"] * 2**20 >= 128 * VOCAB * 4
    assert rows[large]["memory_peak_mb"] > rows[small]["memory_peak_mb"]
    assert _cpu_rows([large], torch.float32, batch=4)[0]["memory_activations_mb"] > (
        3 * rows[large]["memory_activations_mb"])


def test_cpu_memory_is_a_property_of_model_and_input() -> None:
    archs = TINY.sample(8, seed=3)
    fp32 = _cpu_rows(archs, torch.float32)
    _ = [torch.ones(2**22) for _ in range(8)]  # what the process did before must not count
    assert _cpu_rows(archs, torch.float32) == fp32
    bf16 = _cpu_rows(archs, torch.bfloat16)
    assert all(f["memory_weights_mb"] == 2 * b["memory_weights_mb"]
               for f, b in zip(fp32, bf16, strict=True))
    peaks = [[row["memory_peak_mb"] for row in rows] for rows in (fp32, bf16)]
    assert np.argsort(peaks[0]).tolist() == np.argsort(peaks[1]).tolist()


def test_dtypes_run_on_cpu() -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert dtype_unsupported_reason(dtype, CPU) is None
    assert "not supported" in dtype_unsupported_reason(torch.int32, CPU)


# flops


def _counted_flops(model: torch.nn.Module, x: torch.Tensor) -> int:
    """FlopCounterMode's count; the math SDPA backend makes attention visible on the CPU."""
    with torch.inference_mode(), sdpa_kernel(SDPBackend.MATH), \
            FlopCounterMode(display=False) as counter:
        model(x)
    return counter.get_total_flops()


def test_flops_match_flop_counter_on_tiny_archs(tiny_supernet: SuperGPT) -> None:
    for arch in [*TINY.sample(4, seed=3), TINY.smallest(), TINY.largest()]:
        x = torch.randint(VOCAB, (2, 64))
        counted = _counted_flops(tiny_supernet.extract(arch), x)
        assert forward_flops(arch, TINY, VOCAB, 2, 64) == pytest.approx(counted, rel=0.01)


def test_flops_match_flop_counter_on_s_archs() -> None:
    for arch in [*S.sample(2, seed=5), S.largest()]:
        with torch.device("meta"):
            model = GPT(GPTConfig.from_space(S, arch, 50304))
            x = torch.randint(50304, (1, 1024))
        counted = _counted_flops(model, x)
        assert forward_flops(arch, S, 50304, 1, 1024) == pytest.approx(counted, rel=0.01)


# device


def test_fingerprint_and_auto_label() -> None:
    fp = fingerprint(threads=2, device=CPU)
    for key in ("device_kind", "device_name", "cpu_model", "cpu_cores_physical",
                "cpu_cores_logical", "memory_gb", "gpu_memory_gb", "gpu_driver", "cuda_version",
                "torch_version", "threads", "hostname_hash"):
        assert key in fp
    assert fp["device_kind"] == "cpu" and fp["threads"] == 2
    assert re.fullmatch(r"[0-9a-f]{12}", fp["hostname_hash"])
    label = auto_label(fp)
    assert label == auto_label(fingerprint(threads=2, device=CPU))
    assert re.fullmatch(r"cpu-[a-z0-9]+(-[a-z0-9]+)*-2t", label)
    epyc = {"device_kind": "cpu", "device_name": "x",
            "cpu_model": "AMD EPYC 7B13 64-Core Processor", "threads": 2}
    xeon = {**epyc, "cpu_model": "Intel(R) Xeon(R) Platinum 8480+ CPU @ 2.00GHz", "threads": 16}
    h100 = {"device_kind": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "threads": 16}
    assert auto_label(epyc) == "cpu-amd-epyc-7b13-2t"
    assert auto_label(xeon) == "cpu-intel-xeon-platinum-8480-16t"
    assert auto_label(h100) == "cuda-nvidia-h100-80gb-hbm3"


def test_a_machine_without_gpu_is_labelled_without_torch(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """The label Snakemake plans with, where no GPU can be seen, is fingerprint's, and taking
    it imports no torch; a GPU driver's device node or a named CUDA device leaves it to torch."""
    node = tmp_path / "nvidiactl"
    monkeypatch.setattr(host, "GPU_DEVICE_NODES", (str(node),))
    expected = auto_label(fingerprint(threads=3, device=CPU))
    for named in ("cpu", "auto", ""):
        monkeypatch.setenv(host.DEVICE_ENV, named)
        assert host.cpu_only_label(3) == expected
    node.touch()
    assert host.cpu_only_label(3) is None  # auto, with a GPU driver present
    monkeypatch.setenv(host.DEVICE_ENV, "cpu")
    assert host.cpu_only_label(3) == expected
    monkeypatch.setenv(host.DEVICE_ENV, "cuda:1")
    assert host.cpu_only_label(3) is None
    probe = ("import sys; from hwgptbench.meters.host import cpu_only_label; "
             "print(cpu_only_label(3), 'torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True,
                         env={**os.environ, host.DEVICE_ENV: "cpu"}).stdout.split()
    assert out == [expected, "False"]


def test_resolve_label() -> None:
    fp = {"device_kind": "cuda", "device_name": "NVIDIA H100 80GB HBM3", "threads": 16}
    assert resolve_label("auto", fp) == "cuda-nvidia-h100-80gb-hbm3"
    assert resolve_label("cuda-nvidia-h100-80gb-hbm3", fp) == "cuda-nvidia-h100-80gb-hbm3"
    assert resolve_label("h100", fp, aliases={"h100": "cuda-nvidia-h100-80gb-hbm3"}) == "h100"
    # this machine named apart from another of its model: its label extended by words
    assert resolve_label("cuda-nvidia-h100-80gb-hbm3-lab2", fp) == "cuda-nvidia-h100-80gb-hbm3-lab2"
    with pytest.raises(DeviceMismatchError, match="'cuda-nvidia-h100-80gb-hbm3-local'"):
        resolve_label("cuda-nvidia-h100-80gb", fp)
    with pytest.raises(DeviceMismatchError, match="'a100'.*'cuda-nvidia-h100-80gb-hbm3'"):
        resolve_label("a100", fp)
    with pytest.raises(DeviceMismatchError, match="cuda-nvidia-a100"):
        resolve_label("a100", fp, aliases={"a100": "cuda-nvidia-a100-sxm4-40gb"})
    with pytest.raises(ValueError, match="not a slug"):
        resolve_label("H100 GPU", fp)


# runner


def test_condition_grid() -> None:
    from hwgptbench.params import ParamsError, section_of
    from hwgptbench.settings.sections import MeasureSettings

    grid = ([1, 8], [64], ["fp32", "bf16"], ["eager", "cuda_graph"])
    conditions = condition_grid(*grid, CPU)
    assert conditions == [Condition(b, 64, d, "eager") for b in (1, 8) for d in ("fp32", "bf16")]
    on_cuda = condition_grid(*grid, torch.device("cuda"))
    assert len(on_cuda) == 8 and Condition(8, 64, "bf16", "cuda_graph") in on_cuda
    with pytest.raises(ValueError, match="no launch mode runs on cpu"):
        condition_grid([1], [64], ["fp32"], ["cuda_graph"], CPU)
    # the grid's lists are a params section's, which refuses what no condition holds
    with pytest.raises(ParamsError, match="measure.dtypes"):
        section_of(MeasureSettings, {"dtypes": ["fp8"]})
    with pytest.raises(ParamsError, match="measure.seq_lens"):
        section_of(MeasureSettings, {"seq_lens": 64})


def test_interleaved_latency_times_every_callable_equally() -> None:
    """Callables that each use a fixed amount of CPU time: their CPU-time medians keep the
    1:2:4 proportions however busy the machine is (a wall-clock spin would not)."""
    calls = [0, 0, 0]

    def busy(i: int, seconds: float) -> None:
        calls[i] += 1
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    fns = [lambda i=i, s=s: busy(i, s) for i, s in enumerate((0.0005, 0.001, 0.002))]
    stats = measure_latency_interleaved(fns, CPU, warmup=2, min_repeats=8, max_repeats=50,
                                        max_seconds=0.5, seed=1, estimator="cpu_median")
    assert len({row["latency_n"] for row in stats}) == 1 and stats[0]["latency_n"] >= 8
    visits = stats[0]["latency_n"] // latency.VISIT_CALLS
    assert calls[0] == calls[1] == calls[2] == stats[0]["latency_n"] + visits + 2
    medians = [row["latency_ms"] for row in stats]
    assert medians == sorted(medians) and 1.5 < medians[2] / medians[1] < 2.5
    assert all(row["latency_estimator"] == "cpu_median" for row in stats)


def test_drift_is_divided_out_of_interleaved_samples() -> None:
    rng = np.random.default_rng(0)
    true_ms = np.array([1.0, 1.1, 1.3, 2.0, 2.2, 3.0])
    drift = rng.uniform(0.85, 1.15, size=200)  # the machine's speed, cycle by cycle
    noise = rng.normal(1, 0.01, size=(200, 6, latency.VISIT_CALLS))
    cycles = drift[:, None, None] * true_ms[None, :, None] * noise
    stats = latency.interleaved_stats(cycles)
    medians = np.array([row["latency_ms"] for row in stats])
    ratios = medians / true_ms
    assert np.allclose(ratios, ratios.mean(), rtol=0.01)  # relative latencies recovered
    assert all(row["latency_ci95_rel"] < 0.005 for row in stats)  # drift not in the CI
    assert 0.07 < stats[0]["latency_drift_cv"] < 0.11
    raw = latency_stats(cycles[:, 0, :].ravel().tolist())
    assert raw["latency_ci95_rel"] > 5 * stats[0]["latency_ci95_rel"]
    few = latency.interleaved_stats(cycles[:, :2, :])  # too few to tell drift from arch
    assert few[0]["latency_drift_cv"] is None
    assert few[0]["latency_ms"] == raw["latency_ms"]


def test_measure_arch_row_on_cpu() -> None:
    arch = TINY.sample(1, seed=0)[0]
    meter = open_energy_meter(CPU)
    row = measure_arch(TINY, arch, VOCAB, Condition(1, 128, "fp32"), CPU, meter, FAST)
    assert list(row) == ROW_COLUMNS
    assert row["status"] == "ok" and row["reason"] is None and row["threads"] == 2
    assert row["arch_id"] == arch.id and row["params"] == TINY.n_params(arch, VOCAB)
    assert row["flops"] == forward_flops(arch, TINY, VOCAB, 1, 128)
    assert FAST.min_repeats <= row["latency_n"] <= FAST.max_repeats
    assert row["memory_peak_mb"] > row["memory_weights_mb"] > 0
    if not meter.available:
        assert row["energy_mj"] is None and row["energy_reason"] == meter.reason


def test_unsupported_dtype_gives_a_row_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(runner, "dtype_unsupported_reason", lambda dtype, device: "no fp16 here")
    meter = open_energy_meter(CPU)
    row = measure_arch(TINY, TINY.smallest(), VOCAB, Condition(1, 16, "fp16"), CPU, meter,
                       FAST)
    assert list(row) == ROW_COLUMNS
    assert row["status"] == "unsupported_dtype" and row["reason"] == "no fp16 here"
    assert row["flops"] > 0 and row["params"] > 0
    assert all(row[key] is None for key in (*LATENCY_FIELDS, "energy_mj", "memory_peak_mb"))
    assert row["memory_reason"] == "no fp16 here"


# GPU


@pytest.fixture
def cuda_model() -> tuple[GPT, torch.Tensor]:
    torch.manual_seed(0)
    model = SuperGPT(TINY, 4096).extract(TINY.largest()).cuda().eval()
    return model, torch.randint(4096, (8, 128), device="cuda")


@pytest.mark.gpu
@needs_cuda
def test_cuda_event_latency_reaches_the_target_ci(cuda_model: tuple[GPT, torch.Tensor]) -> None:
    model, x = cuda_model
    with torch.inference_mode():
        stats = measure_latency(lambda: model(x), torch.device("cuda"), warmup=20,
                                min_repeats=50, max_repeats=5000, target_rel_ci=0.02,
                                max_seconds=30)
    assert stats["latency_ci95_rel"] <= 0.02 and stats["latency_n"] >= 50


@pytest.mark.gpu
@needs_cuda
def test_nvml_energy_of_a_forward_window(cuda_model: tuple[GPT, torch.Tensor]) -> None:
    model, x = cuda_model
    device = torch.device("cuda")
    with open_energy_meter(device) as meter, torch.inference_mode():
        assert meter.available, meter.reason
        row = measure_energy(lambda: model(x), meter, device, min_seconds=3.0)
    assert row["energy_source"] in ("nvml", "nvml_power_sampling")
    assert row["energy_mj"] > 0 and row["energy_window_s"] >= 3.0


@pytest.mark.gpu
@needs_cuda
def test_cuda_memory_peak_exceeds_weights(cuda_model: tuple[GPT, torch.Tensor]) -> None:
    model, x = cuda_model
    row = cuda_memory(model, x)
    assert row["memory_weights_mb"] * 2**20 == tensor_bytes(model)
    assert row["memory_peak_mb"] > row["memory_weights_mb"]
    assert row["memory_activations_mb"] > 0


@pytest.mark.gpu
@needs_cuda
def test_cuda_graph_replay_equals_eager(cuda_model: tuple[GPT, torch.Tensor]) -> None:
    model, x = cuda_model
    with torch.inference_mode():
        eager = model(x).clone()
        replay = cuda_graph_callable(model, x)
        torch.testing.assert_close(replay(), eager)
        torch.testing.assert_close(replay(), eager)


@pytest.mark.gpu
@needs_cuda
def test_measure_arch_rows_on_cuda() -> None:
    device = torch.device("cuda")
    arch = TINY.sample(1, seed=0)[0]
    with open_energy_meter(device) as meter:
        for condition in condition_grid([4], [128], ["fp32", "bf16"], ["eager", "cuda_graph"],
                                        device):
            row = measure_arch(TINY, arch, VOCAB, condition, device, meter, FAST)
            assert list(row) == ROW_COLUMNS and row["status"] == "ok", row
            assert row["memory_peak_mb"] > row["memory_weights_mb"] > 0


class _SteppingCounter(EnergyMeter):
    """A counter that advances only every ``period`` calls of ``call``, by their energy (as
    NVML's advances about every 100 ms): a window read at arbitrary ends is off by up to a
    period."""

    steps = True

    def __init__(self, period: int, mj_per_call: float) -> None:
        super().__init__("stepping")
        self.period, self.mj_per_call, self.calls = period, mj_per_call, 0

    def call(self) -> None:
        self.calls += 1
        time.sleep(0.001)

    def read_mj(self) -> float:
        return (self.calls // self.period) * self.period * self.mj_per_call


def test_energy_window_is_aligned_to_a_stepping_counter() -> None:
    meter = _SteppingCounter(period=7, mj_per_call=2.5)
    meter.calls = 3  # the window starts between two steps
    row = measure_energy(meter.call, meter, CPU, min_seconds=0.02)
    assert row["energy_mj"] == pytest.approx(2.5)  # whole periods: exact
    assert row["energy_calls"] % 7 == 0 and row["energy_calls"] >= 14
    assert meter.calls % 7 == 0  # it ended on a step


def test_frozen_survivors_leave_later_models_to_release() -> None:
    """freeze_survivors keeps what was alive out of later collections, and release still
    frees a model built afterwards whose modules hold a reference cycle."""
    alive = len(gc.get_objects())
    try:
        freeze_survivors()
        assert gc.get_freeze_count() >= alive // 2
        assert len(gc.get_objects()) < alive // 10  # what a collection walks from now on
        model = torch.nn.Sequential(torch.nn.Linear(4, 4))
        model.me = [model]  # a cycle: reference counts alone never free it
        dead = weakref.ref(model)
        del model
        release(torch.device("cpu"))
        assert dead() is None
    finally:
        gc.unfreeze()  # the rest of the test process collects as before
