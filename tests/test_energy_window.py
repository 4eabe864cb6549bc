"""Energy per forward from forwards run back to back (meters/energy.py), on a simulated device:
a host clock, a queue that runs calls one after another as they are issued, and a counter that
publishes its energy every 100 ms, as NVML's does. Synchronising after every call, as the
window did before, charges each call for the host's gaps; the queue keeps the device busy and
gives the busy energy."""

from __future__ import annotations

import collections

import pytest

from hwgptbench.meters.energy import EnergyMeter, calibrate, measure_energy

BUSY_S, HOST_S, READ_S = 0.002, 0.0008, 0.0004  # a call on the device; issuing it; a counter read
BUSY_W, IDLE_W, PERIOD_S = 500.0, 100.0, 0.1


class Device:
    """The simulated machine: the host's clock and the device's busy intervals."""

    def __init__(self) -> None:
        self.now = 0.0
        self.free_at = 0.0
        self.busy: list[tuple[float, float]] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def issue(self) -> float:
        """Queue one call; when it will be done."""
        self.now += HOST_S
        start = max(self.now, self.free_at)
        self.free_at = start + BUSY_S
        self.busy.append((start, self.free_at))
        return self.free_at

    def joules(self, t: float) -> float:
        busy = sum(max(0.0, min(end, t) - start) for start, end in self.busy)
        return IDLE_W * t + (BUSY_W - IDLE_W) * busy


class Counter(EnergyMeter):
    """The device's energy, published at every multiple of PERIOD_S; a read costs host time."""

    steps = True

    def __init__(self, device: Device) -> None:
        super().__init__("simulated")
        self.device = device

    def read_mj(self) -> float:
        self.device.now += READ_S
        return 1000 * self.device.joules(self.device.now // PERIOD_S * PERIOD_S)


class Queue:
    """The device's call queue: at most ``depth`` calls in flight (0: each call waited for, as
    a synchronisation after every call does)."""

    asynchronous = True

    def __init__(self, device: Device, depth: int) -> None:
        self.device, self.depth = device, depth
        self.pending: collections.deque[float] = collections.deque()
        self.done = 0

    def submit(self) -> None:
        self.pending.append(self.device.issue())
        while len(self.pending) > self.depth:
            self.device.now = max(self.device.now, self.pending.popleft())
            self.done += 1

    def completed(self) -> int:
        while self.pending and self.pending[0] <= self.device.now:
            self.pending.popleft()
            self.done += 1
        return self.done

    def drain(self) -> None:
        while self.pending:
            self.device.now = max(self.device.now, self.pending.popleft())
            self.done += 1


def _window(depth: int) -> dict[str, float]:
    device = Device()
    meter = Counter(device)
    calibrate(meter, 1.0, device.clock, device.sleep)
    return measure_energy(lambda: None, meter, None, 0.3, device.clock,  # type: ignore[arg-type]
                          Queue(device, depth))


def test_calibration_reads_idle_power_and_the_update_period() -> None:
    device = Device()
    meter = Counter(device)
    calibrate(meter, 1.0, device.clock, device.sleep)
    assert meter.idle_w == pytest.approx(IDLE_W, rel=0.01)
    assert meter.period_s == pytest.approx(PERIOD_S, rel=0.01)


def test_back_to_back_forwards_leave_the_gaps_out_of_the_energy() -> None:
    row = _window(depth=3)
    assert row["energy_mj"] == pytest.approx(BUSY_W * BUSY_S * 1000, rel=0.02)  # W s -> mJ
    assert row["energy_ms_per_call"] == pytest.approx(BUSY_S * 1000, rel=0.02)
    assert row["energy_power_w"] == pytest.approx(BUSY_W, rel=0.02)
    assert row["energy_above_idle_mj"] == pytest.approx((BUSY_W - IDLE_W) * BUSY_S * 1000,
                                                        rel=0.03)
    assert row["energy_window_s"] >= 0.3 and row["energy_calls"] >= 100


def test_a_synchronised_window_charges_each_call_for_the_gaps() -> None:
    """The old window (each call waited for, the counter polled between calls) as a baseline:
    the host's time between calls is idle power in every call's energy."""
    synced, busy = _window(depth=0), _window(depth=3)
    gap = HOST_S  # the device idles while the host issues the next call
    assert synced["energy_ms_per_call"] == pytest.approx((BUSY_S + gap) * 1000, rel=0.05)
    assert synced["energy_mj"] == pytest.approx((BUSY_W * BUSY_S + IDLE_W * gap) * 1000,
                                                rel=0.05)
    assert synced["energy_mj"] / busy["energy_mj"] > 1.05
