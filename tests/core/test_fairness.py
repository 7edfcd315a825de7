"""The fair order across batch keys (``core.fairness``) as the scheduler applies it.

Each test drives one worker by hand on a plain clock: cut a batch, hand its result back
(QA off), cut the next. What is checked is the order of keys the scheduler chooses.
"""

from __future__ import annotations

import dataclasses
import itertools
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renderq.backends.simulated import SimulatedExecutor
from renderq.core.admission import expected_finish
from renderq.core.cost import LatencyCurve, StageCost
from renderq.core.errors import ProfileError
from renderq.core.fairness import MAX_SWITCH_SHARE, FairShare
from renderq.core.policies import AdHoc, Dynamic
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchKey, BatchResult, ItemResult, Request
from tests.core.driver import key

_ids = itertools.count()


def reqs(k: BatchKey, n: int, priority: int = 0) -> list[Request]:
    return [
        Request(f"{k.adapter or k.width}-{next(_ids)}", "p", k, base_seed=1, priority=priority)
        for _ in range(n)
    ]


def with_adapter(k: BatchKey, adapter: str) -> BatchKey:
    return dataclasses.replace(k, adapter=adapter)


def flat(seconds_per_batch: float, switch_s: float = 0.0, cap: int = 4) -> StageCost:
    curve = LatencyCurve.from_points([[1, seconds_per_batch], [cap, seconds_per_batch]])
    return StageCost(curve, switch_s=switch_s)


def run_batches(s: Scheduler, count: int, now: float = 0.0) -> list[BatchKey]:
    """Cut ``count`` batches one at a time on one worker, each returned at once."""
    order = []
    for _ in range(count):
        batches = s.schedule(now, {"gpu0": 1})
        if not batches:
            break
        [b] = batches
        order.append(b.key)
        items = tuple(ItemResult(r.id, image=r.id) for r in b.requests)
        s.on_result(BatchResult(b.id, items, 1.0, "gpu0"), now)
    return order


def scheduler(policy=None, cost=None) -> Scheduler:
    return Scheduler(policy or Dynamic(0.0, batch_size=4), qa=QAPolicy(enabled=False), cost=cost)


@pytest.mark.parametrize("fair", [True, False])
def test_a_rare_key_waits_one_turn_not_the_popular_backlog(fair: bool) -> None:
    popular, rare = key(0), key(1)
    s = Scheduler(Dynamic(0.0, batch_size=4), qa=QAPolicy(enabled=False), fair_share=fair)
    for r in reqs(popular, 400):
        s.submit(r, 0.0)
    assert run_batches(s, 3) == [popular] * 3
    for r in reqs(rare, 1):
        s.submit(r, 1.0)  # after 400 popular requests: first in, first out it is last
    order = run_batches(s, 100, now=1.0)
    assert order.index(rare) == (0 if fair else 97), order


def test_two_backlogged_keys_share_the_device_by_its_time_not_by_batches() -> None:
    slow, fast = key(0), key(1)
    costs = {slow: flat(2.0), fast: flat(1.0)}
    s = scheduler(cost=costs.get)
    for k in (slow, fast):
        for r in reqs(k, 200):
            s.submit(r, 0.0)
    order = run_batches(s, 30)
    device = {k: sum(costs[k].latency(4) for o in order if o == k) for k in (slow, fast)}
    assert order.count(fast) == 2 * order.count(slow)
    assert abs(device[slow] - device[fast]) <= 2.0


def test_a_key_idle_for_a_while_earns_no_burst() -> None:
    a, b = key(0), key(1)
    s = scheduler()
    for r in reqs(a, 400):
        s.submit(r, 0.0)
    run_batches(s, 50)
    for r in reqs(b, 400):
        s.submit(r, 1.0)
    order = run_batches(s, 10, now=1.0)
    assert 4 <= order.count(b) <= 6, order  # alternating, not ten of b to catch up


def test_priority_goes_before_fair_share() -> None:
    bulk, interactive = key(0), key(1)
    s = scheduler()
    for r in reqs(bulk, 40):
        s.submit(r, 0.0)
    run_batches(s, 2)
    for r in reqs(interactive, 40, priority=10):
        s.submit(r, 0.0)
    assert run_batches(s, 10) == [interactive] * 10


def test_adapter_turns_keep_switching_under_its_share_of_the_device() -> None:
    base = key(0)
    ink, oil = with_adapter(base, "ink"), with_adapter(base, "oil")
    cost = flat(1.0, switch_s=0.5)
    s = scheduler(cost=lambda k: cost)
    for k in (ink, oil):
        for r in reqs(k, 400):
            s.submit(r, 0.0)
    order = run_batches(s, 120)
    switches = sum(1 for x, y in itertools.pairwise(order) if x != y)
    device = len(order) * 1.0 + switches * 0.5
    assert switches * 0.5 / device <= MAX_SWITCH_SHARE
    assert 0.4 <= order.count(ink) / len(order) <= 0.6  # and both still get the device
    # Without a switch cost the keys take turns batch by batch.
    s = scheduler(cost=lambda k: flat(1.0))
    for k in (ink, oil):
        for r in reqs(k, 40):
            s.submit(r, 0.0)
    order = run_batches(s, 10)
    assert all(x != y for x, y in itertools.pairwise(order)), order


def test_admission_prices_the_switch_to_another_adapter() -> None:
    base = key(0)
    ink, oil = with_adapter(base, "ink"), with_adapter(base, "oil")
    cost = flat(1.0, switch_s=5.0)
    s = Scheduler(AdHoc(), qa=QAPolicy(enabled=False), cost=lambda k: cost)
    for r in reqs(ink, 1):
        s.submit(r, 0.0)
    run_batches(s, 1)  # the worker now holds ink, and a batch came back (measured)
    [same] = reqs(ink, 1)
    [other] = reqs(oil, 1)
    assert s.submit(dataclasses.replace(same, deadline=3.0), 0.0).admitted
    verdict = s.submit(dataclasses.replace(other, deadline=3.0), 0.0)
    assert not verdict.admitted and verdict.reason == "deadline"
    assert expected_finish(0.0, 0, 4, lambda n: 1.0, 1, setup_s=5.0) == 6.0


def test_a_switch_shows_in_the_latency_a_policy_sees() -> None:
    base = key(0)
    ink, oil = with_adapter(base, "ink"), with_adapter(base, "oil")
    cost = flat(1.0, switch_s=0.25)
    s = scheduler(cost=lambda k: cost)
    for r in reqs(ink, 1):
        s.submit(r, 0.0)
    run_batches(s, 1)
    for r in reqs(oil, 1) + reqs(ink, 1):
        s.submit(r, 0.0)
    views = {lane[0]: s._view(lane, q) for lane, q in s._queues.items() if q.live}
    assert views[oil].latency is not None and views[oil].latency(1) == 1.25
    assert views[ink].latency is not None and views[ink].latency(1) == 1.0


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=5, max_value=60), min_size=2, max_size=5),
    cap=st.integers(min_value=1, max_value=4),
)
def test_backlogged_keys_of_equal_cost_go_round_robin(counts: list[int], cap: int) -> None:
    keys = [key(i) for i in range(len(counts))]
    s = scheduler(Dynamic(0.0, batch_size=cap))
    for k, n in zip(keys, counts, strict=True):
        for r in reqs(k, n):
            s.submit(r, 0.0)
    order = run_batches(s, 10_000)
    # While every key has work, each round serves each key once.
    rounds = min(-(-n // cap) for n in counts)
    for r in range(rounds):
        assert set(order[r * len(keys) : (r + 1) * len(keys)]) == set(keys)
    # And later: at most one batch of every other key between two of a key's own.
    for k in keys:
        mine = [i for i, o in enumerate(order) if o == k]
        for i, j in itertools.pairwise(mine):
            between = order[i + 1 : j]
            assert len(between) == len(set(between)) <= len(keys) - 1
    assert sum(order.count(k) for k in keys) == sum(-(-n // cap) for n in counts)


def test_fair_share_starts_a_new_lane_at_the_class_virtual_time() -> None:
    fair: FairShare[str] = FairShare()
    fair.charge("a", "gpu", 10.0)
    fair.charge("a", "gpu", 10.0)
    fair.activate("b", "gpu")
    assert fair.served("b") == 10.0  # the start tag of a's last batch, not 0
    assert fair.rank("b", "gpu", 0.0) < fair.rank("a", "gpu", 0.0)
    assert fair.rank("a", "gpu", 30.0) == (0, 0.0)  # a's turn lasts while under its quantum


def test_the_simulated_executor_pays_the_switch_when_the_adapter_changes() -> None:
    base = key(0)
    ex = SimulatedExecutor(flat(1.0, switch_s=0.5), "gpu0", random.Random(0))
    times = []
    for k in (base, with_adapter(base, "ink"), with_adapter(base, "ink"), base):
        batch = Batch(0, k, tuple(reqs(k, 1)), 0.0, 4)
        times.append(ex.run(batch).device_seconds)
    assert times == [1.0, 1.5, 1.0, 1.5] and ex.switches == 2


def test_a_key_with_an_adapter_is_priced_at_its_measured_extra_compute() -> None:
    base = key(0)
    ink = with_adapter(base, "ink")
    cost = dataclasses.replace(flat(1.0), adapter_factor=1.5)
    assert cost.for_adapter("").latency(4) == 1.0 and cost.for_adapter("ink").latency(4) == 1.5
    assert flat(1.0).for_adapter("ink").latency(4) == 1.0  # not measured: the curve as is
    s = Scheduler(AdHoc(), qa=QAPolicy(enabled=False), cost=lambda k: cost)
    for k in (base, ink):  # a batch of each came back: both measured, nothing queued
        for r in reqs(k, 1):
            s.submit(r, 0.0)
        run_batches(s, 1)
    [plain] = reqs(base, 1)
    [styled] = reqs(ink, 1)
    # Priced as two batches (the key's request still in flight, then its own): two of
    # 1.0 s fit in 2.5 s, the adapter's two of 1.5 s do not.
    assert s.submit(dataclasses.replace(plain, deadline=2.5), 0.0).admitted
    s.cancel(plain.id, 0.0)
    verdict = s.submit(dataclasses.replace(styled, deadline=2.5), 0.0)
    assert not verdict.admitted and verdict.reason == "deadline"
    assert "expected to finish in 3.00s" in verdict.detail
    # The simulated executor takes the same extra time.
    ex = SimulatedExecutor(cost, "gpu0", random.Random(0))
    times = [ex.run(Batch(0, k, tuple(reqs(k, 1)), 0.0, 4)).device_seconds for k in (base, ink)]
    assert times == [1.0, 1.5]
    with pytest.raises(ProfileError, match="adapter_factor must be > 0, got 0"):
        dataclasses.replace(cost, adapter_factor=0.0)
