"""Goodput and deadlines under overload, in the simulator (the real scheduler, virtual time).

Poisson arrivals at 1x, 2x and 10x the embedded model's CPU capacity, each request with a
20 s deadline, a fifth of the attempts failing the gate. Admission must keep the device
as busy at 10x as at 1x, and let at most 1% of what it admits miss its deadline.
"""

from __future__ import annotations

import random

import pytest

from renderq.core.policies import Dynamic
from renderq.profiles import load_profile
from renderq.runtime.arrivals import arrivals
from renderq.runtime.sim import SimConfig, SimResult, simulate

PROFILE = load_profile("mini-sd-cpu")
CAP = 8
CAPACITY = CAP / PROFILE.render.latency(CAP)
DEADLINE_S = 20.0


def overload(load: float, failure_rate: float, share_device: bool) -> SimResult:
    rate = load * CAPACITY
    arr = tuple(arrivals(f"poisson:{rate}", int(rate * 300), random.Random(1)))
    cfg = SimConfig(
        PROFILE, arr, failure_rate=failure_rate, deadline_s=DEADLINE_S,
        max_queue_per_key=512, share_device=share_device, seed=2,
    )  # fmt: skip
    return simulate(Dynamic(0.1, CAP), cfg)


def served_per_s(r: SimResult) -> float:
    return (r.accepted + r.escalated) / r.makespan_s


@pytest.mark.parametrize(
    ("failure_rate", "share_device"), [(0.2, True), (0.08, True), (0.08, False)]
)
def test_overload_keeps_goodput_and_admitted_requests_meet_their_deadlines(
    failure_rate: float, share_device: bool
) -> None:
    """``share_device``: scoring takes turns with rendering (one CPU, one GPU for both), or
    overlaps it (a scorer on a device of its own)."""
    runs = {load: overload(load, failure_rate, share_device) for load in (1, 2, 10)}
    base = served_per_s(runs[1])
    for load, r in runs.items():
        finished = r.accepted + r.escalated
        missed = sum(lat > DEADLINE_S for lat in r.latencies)
        assert missed <= 0.01 * finished, (load, missed, finished)
        assert served_per_s(r) >= 0.95 * base, (load, served_per_s(r), base)
    assert runs[10].rejected > 0.8 * len(runs[10].latencies)  # it was refusing most
