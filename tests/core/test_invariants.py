"""Property tests of the DESIGN.md invariants, over random chaotic workloads."""

from __future__ import annotations

import math
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from renderq.core.events import Accepted, Escalated
from renderq.core.policies import Dynamic, Policy, Window
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import TERMINAL, Request
from tests.core.driver import Trace, drive
from tests.strategies import dynamic_policies, policies, window_policies, workloads

WORKERS = {"gpu0": 1, "gpu1": 2}


def run(
    policy: Policy, reqs: list[Request], seed: int, max_attempts: int, **kw: float
) -> tuple[Scheduler, Trace]:
    sched = Scheduler(policy, qa=QAPolicy(threshold=0.5, max_attempts=max_attempts), default_cap=12)
    trace = drive(sched, reqs, random.Random(seed), workers=WORKERS, **kw)  # type: ignore[arg-type]
    return sched, trace


common = dict(
    reqs=workloads(),
    seed=st.integers(0, 2**32),
    max_attempts=st.integers(1, 4),
)


@settings(max_examples=150, deadline=None)
@given(policy=policies, **common)
def test_every_request_ends_in_exactly_one_terminal_state(
    policy: Policy, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    sched, trace = run(policy, reqs, seed, max_attempts)
    states = sched.states()
    assert set(states) == {r.id for r in reqs}
    assert all(s in TERMINAL for s in states.values()), states
    for r in reqs:
        ends = trace.terminal.get(r.id, [])
        if r.id in trace.rejected:
            assert ends == []
        else:
            assert len(ends) == 1, (r.id, ends)
            assert states[r.id].value == {
                "Accepted": "accepted", "Escalated": "escalated", "Cancelled": "cancelled"
            }[type(ends[0]).__name__]  # fmt: skip
    assert sched.idle()


@settings(max_examples=150, deadline=None)
@given(policy=policies, **common)
def test_no_batch_exceeds_its_cap_or_mixes_keys(
    policy: Policy, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    _, trace = run(policy, reqs, seed, max_attempts, oom_rate=0.2)
    assert trace.batches
    for _, batch in trace.batches:
        assert 1 <= batch.size <= batch.cap <= 12
        if policy.max_batch_size is not None:
            assert batch.cap <= policy.max_batch_size
        assert {r.key for r in batch.requests} == {batch.key}
        assert len({r.window for r in batch.requests}) == 1
        assert len({r.id for r in batch.requests}) == batch.size


@settings(max_examples=150, deadline=None)
@given(policy=dynamic_policies, **common)
def test_dynamic_never_keeps_a_due_request_from_a_free_worker(
    policy: Dynamic, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    _, trace = run(policy, reqs, seed, max_attempts, delay_cap=policy.max_queue_delay_s)
    assert trace.delay_violations == []


@settings(max_examples=150, deadline=None)
@given(policy=window_policies, **common)
def test_window_batches_start_only_inside_windows(
    policy: Window, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    _, trace = run(policy, reqs, seed, max_attempts)
    for t, batch in trace.batches:
        own = batch.requests[0].window  # a windowed lane keeps to its own windows
        assert (own or policy.windows).active(t) is not None, t


@settings(max_examples=150, deadline=None)
@given(policy=policies, **common)
def test_windowed_requests_run_only_inside_their_windows(
    policy: Policy, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    _, trace = run(policy, reqs, seed, max_attempts)
    for t, batch in trace.batches:
        windows = batch.requests[0].window
        assert windows is None or windows.active(t) is not None, (t, windows)


@settings(max_examples=150, deadline=None)
@given(policy=policies, **common)
def test_retries_never_exceed_the_budget(
    policy: Policy, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    sched, trace = run(policy, reqs, seed, max_attempts, error_rate=0.3, pass_rate=0.3)
    for rid, ends in trace.terminal.items():
        history = sched.history(rid)
        assert len(history) <= max_attempts
        assert [h.attempt for h in history] == list(range(len(history)))
        if isinstance(ends[0], Escalated):
            assert len(history) == max_attempts
        if isinstance(ends[0], Accepted):
            assert history[-1].score is not None and history[-1].score >= 0.5


@settings(max_examples=150, deadline=None)
@given(policy=policies, **common)
def test_ledger_stage_totals_add_up_to_batch_seconds(
    policy: Policy, reqs: list[Request], seed: int, max_attempts: int
) -> None:
    sched, trace = run(policy, reqs, seed, max_attempts)
    report = sched.ledger.report()
    assert math.isclose(report.total_seconds, trace.device_seconds, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(report.batch_seconds, trace.device_seconds, rel_tol=1e-9, abs_tol=1e-9)
    assert math.isclose(
        sum(report.seconds_by_device.values()), report.total_seconds, rel_tol=1e-9, abs_tol=1e-9
    )
    assert report.accepted == sum(isinstance(e[0], Accepted) for e in trace.terminal.values())
