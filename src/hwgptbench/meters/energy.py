"""Energy of one call, from a cumulative hardware energy counter read around a timed window.

Meters: on CUDA the NVML total-energy counter of the GPU (mJ; it advances about every 100 ms),
or, where the GPU does not support it, NVML power sampled in a background thread and integrated
over time (recent GPUs report power averaged over about 1 s, so short windows lag); on the CPU
the RAPL package counters of the Linux powercap sysfs (whole-package energy, so other load on
the machine counts too). A meter that cannot be read is unavailable with the reason, and its
rows carry ``energy_mj`` None, never 0.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from .latency import synchronize

log = logging.getLogger(__name__)

POWERCAP = Path("/sys/class/powercap")
_RAPL_ZONE = re.compile(r"intel-rapl:\d+")
_PACKAGE = re.compile(r"package-\d+")


class EnergyMeter:
    """A cumulative energy counter; an unavailable meter says why in ``reason``. A meter whose
    counter advances in steps (``steps``) has its windows aligned to them."""

    steps = False

    def __init__(self, source: str, reason: str | None = None) -> None:
        self.source = source
        self.reason = reason

    @property
    def available(self) -> bool:
        return self.reason is None

    def read_mj(self) -> float:
        """Energy in mJ since an arbitrary origin fixed for the life of the meter."""
        raise RuntimeError(f"{self.source} energy meter unavailable: {self.reason}")

    def close(self) -> None:
        """Release what the meter holds (threads, NVML)."""

    def __enter__(self) -> EnergyMeter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RaplMeter(EnergyMeter):
    """Sum of the RAPL package-domain counters under a powercap sysfs root, wrap-around safe."""

    def __init__(self, root: Path = POWERCAP) -> None:
        super().__init__("rapl")
        self._zones: list[tuple[Path, int]] = []
        self.reason = self._open(Path(root))
        if self.available:
            self._last = [int(path.read_text()) for path, _ in self._zones]
            self._total_uj = 0

    def _open(self, root: Path) -> str | None:
        """Find the package zones; the reason they cannot be read, or None."""
        if not root.is_dir():
            return f"no {root} (RAPL not exposed: container, VM or non-Intel CPU)"
        zones = sorted(p for p in root.iterdir() if _RAPL_ZONE.fullmatch(p.name))
        try:
            for zone in zones:
                if _PACKAGE.fullmatch((zone / "name").read_text().strip()):
                    max_uj = int((zone / "max_energy_range_uj").read_text())
                    int((zone / "energy_uj").read_text())
                    self._zones.append((zone / "energy_uj", max_uj))
        except PermissionError as err:
            return (f"permission denied reading {err.filename} (RAPL counters are readable by "
                    "root only on current kernels)")
        except (OSError, ValueError) as err:
            return f"cannot read RAPL counters under {root}: {err}"
        if not self._zones:
            return f"no RAPL package domain under {root}"
        return None

    def read_mj(self) -> float:
        if not self.available:
            return super().read_mj()
        for i, (path, max_uj) in enumerate(self._zones):
            now = int(path.read_text())
            last = self._last[i]
            self._total_uj += now - last if now >= last else now + max_uj - last
            self._last[i] = now
        return self._total_uj / 1000


class NvmlEnergyMeter(EnergyMeter):
    """The NVML total-energy counter of one GPU (mJ since the driver was loaded); it advances
    in steps about every 100 ms."""

    steps = True

    def __init__(self, pynvml: Any, handle: Any) -> None:
        super().__init__("nvml")
        self._pynvml, self._handle = pynvml, handle

    def read_mj(self) -> float:
        return float(self._pynvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def close(self) -> None:
        self._pynvml.nvmlShutdown()


class PowerSamplingMeter(EnergyMeter):
    """Power (mW) sampled in a background thread, integrated with the trapezoidal rule."""

    def __init__(self, source: str, read_mw: Callable[[], float], period_s: float = 0.02,
                 on_close: Callable[[], None] | None = None) -> None:
        super().__init__(source)
        self._read_mw, self._period_s, self._on_close = read_mw, period_s, on_close
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._energy_mj = 0.0
        self._last = (time.perf_counter(), read_mw())
        self._thread = threading.Thread(target=self._run, name="power-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> float:
        """Add the energy since the last sample; the energy so far in mJ."""
        with self._lock:
            now, power = time.perf_counter(), self._read_mw()
            then, last_power = self._last
            self._energy_mj += (power + last_power) / 2 * (now - then)
            self._last = (now, power)
            return self._energy_mj

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self._sample()

    def read_mj(self) -> float:
        return self._sample()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        if self._on_close is not None:
            self._on_close()


def _nvml_handle(pynvml: Any, device: torch.device) -> Any:
    """The NVML handle of a torch CUDA device: by UUID (NVML ignores CUDA_VISIBLE_DEVICES), by
    index where the UUID is not an NVML GPU UUID (MIG)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    uuid = torch.cuda.get_device_properties(index).uuid
    try:
        return pynvml.nvmlDeviceGetHandleByUUID(f"GPU-{uuid}")
    except pynvml.NVMLError:
        return pynvml.nvmlDeviceGetHandleByIndex(index)


def _open_nvml(device: torch.device) -> EnergyMeter:
    """The NVML energy counter of device, else NVML power sampling, else unavailable."""
    try:
        import pynvml
    except ImportError:
        return EnergyMeter("nvml", "pynvml (nvidia-ml-py) is not installed")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as err:
        return EnergyMeter("nvml", f"NVML initialisation failed: {err}")
    try:
        handle = _nvml_handle(pynvml, device)
        try:
            pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
            return NvmlEnergyMeter(pynvml, handle)
        except pynvml.NVMLError_NotSupported:
            log.info("NVML energy counter not supported on %s; sampling power", device)
            return PowerSamplingMeter("nvml_power_sampling",
                                      lambda: pynvml.nvmlDeviceGetPowerUsage(handle),
                                      on_close=pynvml.nvmlShutdown)
    except pynvml.NVMLError as err:
        pynvml.nvmlShutdown()
        return EnergyMeter("nvml", f"NVML cannot read {device}: {err}")


def open_energy_meter(device: torch.device, rapl_root: Path = POWERCAP) -> EnergyMeter:
    """The energy meter of a device: NVML on CUDA, RAPL on the CPU (unavailable with a reason
    where neither can be read)."""
    device = torch.device(device)
    meter = _open_nvml(device) if device.type == "cuda" else RaplMeter(rapl_root)
    if not meter.available:
        log.warning("energy not measured on %s: %s", device, meter.reason)
    return meter


def _until_step(fn: Callable[[], Any], meter: EnergyMeter, device: torch.device,
                last_mj: float, deadline: float) -> tuple[float, int]:
    """Call fn (each call completed before the next) until the counter moves past last_mj;
    the new reading and the calls made. Gives up at deadline (the reading then is the last)."""
    calls = 0
    while True:
        now = meter.read_mj()
        if now != last_mj or time.perf_counter() > deadline:
            return now, calls
        fn()
        synchronize(device)
        calls += 1


def measure_energy(fn: Callable[[], Any], meter: EnergyMeter, device: torch.device,
                   min_seconds: float = 3.0) -> dict[str, Any]:
    """Energy per call of fn, from the meter over a window of repeated calls of at least
    min_seconds.

    A counter that advances in steps (NVML, about every 100 ms) is read from one step to a
    later one, calls running throughout and counted between the two steps, so the window holds
    whole update periods and a short window is not off by a fraction of one; other counters
    are read at the window's ends (keep windows >= 2-3 s where they are coarse)."""
    fields = {"energy_source": meter.source, "energy_reason": meter.reason}
    if not meter.available:
        return {"energy_mj": None, "energy_window_s": None, "energy_calls": None, **fields}
    device = torch.device(device)
    synchronize(device)
    start_mj = meter.read_mj()
    if meter.steps:  # begin at a step, with the device already busy
        start_mj, _ = _until_step(fn, meter, device, start_mj,
                                  time.perf_counter() + max(1.0, min_seconds))
    start, calls = time.perf_counter(), 0
    while calls == 0 or time.perf_counter() - start < min_seconds:
        fn()
        calls += 1
    synchronize(device)
    end_mj = meter.read_mj()
    if meter.steps:  # end at the next step
        end_mj, more = _until_step(fn, meter, device, end_mj,
                                   time.perf_counter() + max(1.0, min_seconds))
        calls += more
    window = time.perf_counter() - start
    return {"energy_mj": (end_mj - start_mj) / calls, "energy_window_s": window,
            "energy_calls": calls, **fields}
