"""Hypothesis strategies shared by the tests, in one place."""

from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from renderq.core.policies import AdHoc, Dynamic, Policy, Window, Windows
from renderq.core.types import BatchKey, Request
from tests.core.driver import key

DEVICES = ("gpu0", "gpu1")

LANE_WINDOWS = Windows(period=2.0, length=0.5, offset=0.25)
"""The windows of the requests that carry their own (a windowed lane of their key)."""


@st.composite
def workloads(draw: st.DrawFn, max_requests: int = 40) -> list[Request]:
    """Requests over a few keys, two device classes, three priorities; some windowed."""
    n = draw(st.integers(1, max_requests))
    out = []
    for i in range(n):
        k = draw(st.integers(0, 2))
        dev = DEVICES[draw(st.integers(0, 1))]
        out.append(
            Request(
                id=f"r{i}",
                prompt=f"prompt {i}",
                key=key(k, dev),
                base_seed=i,
                priority=draw(st.integers(0, 2)),
                arrival=draw(st.integers(0, 50)) / 10,
                window=draw(st.sampled_from([None, None, None, LANE_WINDOWS])),
            )
        )
    return out


dynamic_policies = st.builds(
    Dynamic,
    max_queue_delay_s=st.sampled_from([0.0, 0.05, 0.2, 1.0]),
    batch_size=st.one_of(st.none(), st.integers(1, 16)),
    preferred_sizes=st.sampled_from([(), (4,), (2, 8)]),
)

windows = st.one_of(
    st.just(Windows()),
    st.builds(
        lambda period, frac, offset: Windows(period=period, length=period * frac, offset=offset),
        st.sampled_from([1.0, 2.0, 5.0]),
        st.sampled_from([0.25, 0.5, 1.0]),
        st.sampled_from([0.0, 0.5]),
    ),
)

window_policies = st.builds(
    Window, windows=windows, batch_size=st.one_of(st.none(), st.integers(1, 16))
)

policies: st.SearchStrategy[Policy] = st.one_of(st.just(AdHoc()), dynamic_policies, window_policies)


STEP_KEYS = (
    BatchKey("m", 64, 64, 20, True, "ddim", "fp32", "gpu0"),
    BatchKey("m", 64, 64, 20, False, "ddim", "fp32", "gpu0"),
    BatchKey("m", 128, 64, 20, True, "ddim", "fp32", "gpu0"),
)
"""Batch keys of three step keys (guidance on/off, another width) for step-mode workloads."""


@st.composite
def step_workloads(draw: st.DrawFn, max_requests: int = 30) -> list[Request]:
    """Requests over three step keys with 1-8 steps each, three priorities, spread arrivals."""
    n = draw(st.integers(1, max_requests))
    out = []
    for i in range(n):
        base = STEP_KEYS[draw(st.integers(0, len(STEP_KEYS) - 1))]
        out.append(
            Request(
                id=f"r{i}",
                prompt=f"prompt {i}",
                key=dataclasses.replace(base, steps=draw(st.integers(1, 8))),
                base_seed=i,
                priority=draw(st.integers(0, 2)),
                arrival=draw(st.integers(0, 40)) / 100,
                guidance_scale=draw(st.sampled_from([3.0, 7.5])) if base.guidance else 1.0,
            )
        )
    return out
