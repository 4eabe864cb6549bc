"""Energy of one call, from a cumulative hardware energy counter read around a timed window.

Meters: on CUDA the NVML total-energy counter of the GPU (mJ; it advances about every 100 ms),
or, where the GPU does not support it, NVML power sampled in a background thread and integrated
over time (recent GPUs report power averaged over about 1 s, so short windows lag); on the CPU
the RAPL package counters of the Linux powercap sysfs (whole-package energy, so other load on
the machine counts too). A meter that cannot be read is unavailable with the reason, and its
rows carry ``energy_mj`` None, never 0.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

# the value columns of an energy row (null without a meter), beside energy_source and _reason
ENERGY_VALUES = ("energy_mj", "energy_window_s", "energy_calls", "energy_power_w",
                 "energy_ms_per_call", "energy_above_idle_mj")
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
        self.idle_w: float | None = None  # power with nothing running, once calibrated
        self.period_s: float | None = None  # update period of a stepping counter, likewise

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


QUEUE_DEPTH = 3  # calls in flight on an asynchronous device while its counter is read


class CallQueue:
    """Calls of fn issued to a device without waiting for each one: on CUDA at most ``depth``
    in flight (an event recorded after each; the host waits for the oldest only), so the
    device stays busy while the host reads a counter; elsewhere each call returns done."""

    def __init__(self, fn: Callable[[], Any], device: torch.device,
                 depth: int = QUEUE_DEPTH) -> None:
        self.fn, self.depth = fn, depth
        self.asynchronous = torch.device(device).type == "cuda"
        self._pending: collections.deque[Any] = collections.deque()
        self._done = 0

    def submit(self) -> None:
        """Issue one call (waiting first for the oldest of ``depth`` in flight)."""
        self.fn()
        if not self.asynchronous:
            self._done += 1
            return
        event = torch.cuda.Event()
        event.record()
        self._pending.append(event)
        while len(self._pending) > self.depth:
            self._pending.popleft().synchronize()
            self._done += 1

    def completed(self) -> int:
        """Calls finished so far (without waiting for any)."""
        while self._pending and self._pending[0].query():
            self._pending.popleft()
            self._done += 1
        return self._done

    def drain(self) -> None:
        """Wait for every call issued."""
        while self._pending:
            self._pending.popleft().synchronize()
            self._done += 1


def _next_step(queue: CallQueue, meter: EnergyMeter, last_mj: float, deadline: float,
               clock: Callable[[], float]) -> float:
    """Keep the queue busy and read the counter until it moves past last_mj (or the deadline
    passes); the new reading."""
    now = meter.read_mj()
    while now == last_mj and clock() < deadline:
        queue.submit()
        now = meter.read_mj()
    return now


def calibrate(meter: EnergyMeter, seconds: float = 1.0,
              clock: Callable[[], float] = time.perf_counter,
              sleep: Callable[[float], None] = time.sleep) -> None:
    """Set the meter's idle power (W, nothing running, over at least ``seconds``) and, for a
    counter that advances in steps, its update period (s: from one step to the first step at
    least ``seconds`` later, polled every millisecond); nothing without a meter."""
    if not meter.available:
        return
    if not meter.steps:
        start, start_mj = clock(), meter.read_mj()
        sleep(seconds)
        meter.idle_w = (meter.read_mj() - start_mj) / max(clock() - start, 1e-9) / 1000
        return
    deadline = clock() + 2 * max(1.0, seconds)
    previous = meter.read_mj()
    first: tuple[float, float] | None = None
    steps = 0
    while clock() < deadline:
        sleep(0.001)
        now = meter.read_mj()
        if now == previous:
            continue
        previous = now
        if first is None:
            first = (clock(), now)
            continue
        steps += 1
        elapsed = clock() - first[0]
        if elapsed >= seconds:
            meter.period_s, meter.idle_w = elapsed / steps, (now - first[1]) / elapsed / 1000
            return
    log.warning("the %s counter did not advance twice in %.0f s: idle power and update period "
                "not measured", meter.source, 2 * max(1.0, seconds))


def measure_energy(fn: Callable[[], Any], meter: EnergyMeter, device: torch.device,
                   min_seconds: float = 3.0, clock: Callable[[], float] = time.perf_counter,
                   queue: CallQueue | None = None) -> dict[str, Any]:
    """Energy per call of fn over a window of back-to-back calls of at least min_seconds.

    The calls run as they are timed, back to back: on an asynchronous device (CUDA) up to
    ``QUEUE_DEPTH`` are in flight and the host reads the counter while they run, so no gap
    between calls (a synchronisation, a counter read) enters the energy. A counter that
    advances in steps (NVML, about every 100 ms) is read from one step to a later one and the
    calls are those completed between the two readings, so the window holds whole update
    periods (of ``meter.period_s`` each, once :func:`calibrate` measured it); other counters are
    read at the window's ends. Per row: energy per call, the window, its calls, its mean power
    (W), the time per call in the window (ms) and, where :func:`calibrate` measured the idle
    power (``meter.idle_w``), the energy per call above idle."""
    fields: dict[str, Any] = {"energy_source": meter.source, "energy_reason": meter.reason}
    if not meter.available:
        return {**dict.fromkeys(ENERGY_VALUES), **fields}
    queue = queue or CallQueue(fn, device)
    for _ in range(queue.depth if queue.asynchronous else 0):  # the device busy first
        queue.submit()
    start_mj = meter.read_mj()
    if meter.steps:
        start_mj = _next_step(queue, meter, start_mj, clock() + max(1.0, min_seconds), clock)
    start_done, start = queue.completed(), clock()
    while clock() - start < min_seconds or queue.completed() == start_done:
        queue.submit()
    end_mj = meter.read_mj()
    if meter.steps:
        end_mj = _next_step(queue, meter, end_mj, clock() + max(1.0, min_seconds), clock)
    calls, window = queue.completed() - start_done, clock() - start
    queue.drain()
    if meter.steps and meter.period_s:  # whole periods of the counter, not the host's view
        window = max(round(window / meter.period_s), 1) * meter.period_s
    energy = (end_mj - start_mj) / max(calls, 1)
    per_call_ms = 1000 * window / max(calls, 1)
    above = None if meter.idle_w is None else energy - meter.idle_w * per_call_ms
    return {"energy_mj": energy, "energy_window_s": window, "energy_calls": calls,
            "energy_power_w": (end_mj - start_mj) / window / 1000,
            "energy_ms_per_call": per_call_ms, "energy_above_idle_mj": above, **fields}
