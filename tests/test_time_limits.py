"""The tests' time limits follow the machine: a baseline times a margin times how much slower
this machine is than the reference VM (tests/conftest.py)."""

from __future__ import annotations

import math

import pytest

import conftest


def test_slowness_is_the_ratio_to_the_reference_and_never_below_one() -> None:
    assert conftest.slowness_of(8.0, 2.0) == 4.0
    assert conftest.slowness_of(1.0, 2.0) == 1.0
    assert conftest.slowness() >= 1.0


def test_a_slower_machine_gets_proportionally_longer_limits(monkeypatch: pytest.MonkeyPatch
                                                            ) -> None:
    monkeypatch.setattr(conftest, "slowness", lambda: 1.0)
    at_reference = conftest.limit(100)
    assert at_reference == math.ceil(100 * conftest.MARGIN)
    monkeypatch.setattr(conftest, "slowness", lambda: 2.0)  # twice as slow, or as loaded
    assert conftest.limit(100) == 2 * at_reference


def test_every_test_limit_grows_with_the_slowness(request: pytest.FixtureRequest) -> None:
    marker = request.node.get_closest_marker("timeout")
    assert marker is not None
    configured = float(request.config.getini("timeout"))
    assert marker.args[0] == math.ceil(configured * conftest.slowness())
