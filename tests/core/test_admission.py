"""Admission's pricing of regenerations, on a fake clock (plain numbers; no sleeps)."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from renderq.core.admission import (
    MIN_FINISHED,
    MISS_SHARE,
    AdmissionConfig,
    LatencyScale,
    RenderCounts,
    RenderStats,
    WaitCalibration,
    independent_renders,
    independent_retries,
)
from renderq.core.cost import LatencyCurve, StageCost
from renderq.core.errors import ConfigError
from renderq.core.policies import Dynamic
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import BatchResult, ItemResult, Request, RequestState, ScoreResult
from tests.core.driver import key

K = key(0)
COST = StageCost(LatencyCurve((1, 4), (1.0, 2.0)))


def req(i: int, deadline: float | None = None) -> Request:
    return Request(f"r{i}", f"prompt {i}", K, base_seed=i, deadline=deadline)


def drain(s: Scheduler, now: float, passes: bool = True, first_fails: bool = False) -> float:
    """Render and score everything queued, one batch at a time, each at the curve's price."""
    while not s.idle():
        for b in s.schedule(now, {"gpu0": 1}):
            now += COST.latency(b.size)
            items = tuple(ItemResult(r.id, r.id) for r in b.requests)
            s.on_result(BatchResult(b.id, items, COST.latency(b.size), "gpu0"), now)
            # Requests that skip the gate were accepted with their render.
            scored = [r for r in b.requests if s.state(r.id) is RequestState.SCORING]
            ids = [r.id for r in scored]
            ok = [passes and not (first_fails and r.attempt == 0) for r in scored]
            scores = tuple(0.9 if good else 0.1 for good in ok)
            if ids:
                s.on_scores(ids, ScoreResult(scores, 0.0, "gpu0"), now)
    return now


def test_a_lone_request_that_would_pass_at_once_is_admitted_and_served_in_time() -> None:
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(0.5, max_attempts=3), cost=lambda k: COST)
    for i in range(300):  # every one accepted on its first render
        s.submit(req(i), 0.0)
    now = drain(s, 0.0)
    # 0 failures in 300 attempts bound the failure rate below 0.9%: no retry to price.
    assert s.retries_to_price() == 0
    # Alone, it renders in 1 s. Pricing the two retries the budget allows (3 s) refused
    # it, although nothing seen so far needed a retry.
    verdict = s.submit(req(1000, deadline=now + 1.5), now)
    assert verdict.admitted, verdict
    done = drain(s, now)
    assert s.state("r1000") is RequestState.ACCEPTED and done <= now + 1.5


def test_retries_are_priced_again_once_requests_need_them() -> None:
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(0.5, max_attempts=3), cost=lambda k: COST)
    for i in range(20):
        s.submit(req(i), 0.0)
    now = drain(s, 0.0, passes=False)  # every attempt fails: each escalated after three
    assert s.retries_to_price() == 2
    assert not s.submit(req(100, deadline=now + 2.5), now).admitted
    assert s.submit(req(101, deadline=now + 3.5), now).admitted


def test_requests_that_skip_the_gate_do_not_lower_the_failure_rate_priced() -> None:
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(0.5, max_attempts=3), cost=lambda k: COST)
    for i in range(20):
        s.submit(req(i), 0.0)
    # Every gated request fails once, then passes: half the gate's verdicts are failures,
    # so a quarter would still fail after one retry. Both retries are priced.
    now = drain(s, 0.0, first_fails=True)
    assert s.retries_to_price() == 2
    for i in range(20, 3020):  # then 3000 that skip the gate, accepted on their one render
        s.submit(dataclasses.replace(req(i), qa=False), now)
    drain(s, now)
    # Counted as passes, they would make the gate look nearly perfect (20 failures in
    # 3040 attempts) and one retry would be priced.
    assert s.retries_to_price() == 2


def test_every_retry_is_priced_until_enough_requests_have_finished() -> None:
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(0.5, max_attempts=3), cost=lambda k: COST)
    for i in range(MIN_FINISHED - 1):
        s.submit(req(i), 0.0)
    drain(s, 0.0)
    assert s.retries_to_price() == 2


@given(st.lists(st.integers(0, 200), min_size=1, max_size=5), st.integers(0, 4))
def test_retries_priced_cover_all_but_the_miss_share(needed: list[int], budget: int) -> None:
    counts = RenderCounts(tuple(needed))
    k = counts.retries_to_price(budget)
    assert 0 <= k <= budget
    if counts.finished < MIN_FINISHED:
        assert k == budget
    else:
        assert k == budget or counts.share_above(k + 1) <= MISS_SHARE
        assert k == 0 or counts.share_above(k) > MISS_SHARE  # the fewest that do


def test_render_counts_share_above() -> None:
    counts = RenderCounts((90, 9, 1))  # 90 took one render, 9 two, 1 three
    assert counts.finished == 100
    assert counts.share_above(1) == pytest.approx(0.10)
    assert counts.share_above(2) == pytest.approx(0.01)
    assert counts.share_above(3) == 0.0
    assert counts.retries_to_price(2) == 1


def test_the_failure_rate_is_priced_at_its_upper_bound() -> None:
    stats = RenderStats()
    assert stats.fail_rate() == 1.0  # nothing known: the worst
    for i in range(30):
        stats.attempt(passed=i % 3 != 0)  # 10 of 30 fail
    assert stats.fail_rate() == pytest.approx(0.483, abs=1e-3)  # Wilson, one-sided 95%
    for _ in range(270):
        stats.attempt(passed=True)
    assert 10 / 300 < stats.fail_rate() < 0.06
    assert stats.ahead(1) == (1.0, 0.0)  # no retries allowed: one render each
    mean, sd = stats.ahead(3)
    assert (mean, sd) == independent_renders(stats.fail_rate(), 3)


def test_independent_failures_give_the_truncated_geometric() -> None:
    assert independent_renders(0.0, 3) == (1.0, 0.0)
    assert independent_renders(1.0, 3) == (3.0, 0.0)
    mean, sd = independent_renders(0.5, 2)
    assert (mean, sd) == pytest.approx((1.5, 0.5))
    mean, sd = independent_renders(1 / 3, 3)  # 2/3 one render, 2/9 two, 1/9 three
    assert mean == pytest.approx(13 / 9) and sd == pytest.approx(math.sqrt(23 / 9 - (13 / 9) ** 2))
    assert independent_retries(0.05, 2) == 1  # 5% fail once, 0.25% twice
    assert independent_retries(0.2, 2) == 2  # 4% would still fail after one retry
    assert independent_retries(0.0, 2) == 0


def test_the_deadline_reserve_refuses_work_that_would_finish_inside_it() -> None:
    def served(reserve: float) -> tuple[Scheduler, float]:
        s = Scheduler(
            Dynamic(0.0, 4),
            qa=QAPolicy(0.5, max_attempts=3),
            cost=lambda k: COST,
            admission=AdmissionConfig(deadline_reserve_s=reserve),
        )
        for i in range(300):  # measured: no retries to price, a 1 s render alone
            s.submit(req(i), 0.0)
        return s, drain(s, 0.0)

    s, now = served(0.0)
    assert s.submit(req(1000, deadline=now + 1.4), now).admitted
    s, now = served(0.5)
    # 1 s of render fits 1.4 s, not 1.4 s less the 0.5 s kept for the answer's way back.
    verdict = s.submit(req(1000, deadline=now + 1.4), now)
    assert not verdict.admitted and verdict.reason == "deadline"
    assert "reserve of 0.50s" in verdict.detail and verdict.retry_after_s == 1
    assert s.submit(req(1001, deadline=now + 1.6), now).admitted
    short = s.submit(req(1002, deadline=now + 0.4), now)  # nothing left after the reserve
    assert not short.admitted and "leaves no time" in short.detail
    with pytest.raises(ConfigError, match=r"deadline_reserve_s must be >= 0, got -0\.1"):
        AdmissionConfig(deadline_reserve_s=-0.1)


def serve_one_at_a_time(s: Scheduler, now: float, score_delay: float) -> float:
    """Render the queue one request per batch on the curve (1 s each); each score comes
    back ``score_delay`` after its render, while the next batch renders. The end time."""
    scoring: str | None = None
    while True:
        cut = s.schedule(now, {"gpu0": 1})
        if scoring is not None:
            s.on_scores([scoring], ScoreResult((0.9,), 0.0, "gpu0"), now + score_delay)
            scoring = None
        if not cut:
            return now + score_delay
        [b] = cut
        now += 1.0
        s.on_result(BatchResult(b.id, (ItemResult(b.requests[0].id, 0),), 1.0, "gpu0"), now)
        scoring = b.requests[0].id


def test_admission_stretches_its_wait_by_how_late_requests_behind_a_queue_finished() -> None:
    s = Scheduler(Dynamic(0.0, 1), qa=QAPolicy(0.5, max_attempts=3), cost=lambda k: COST)
    for i in range(300):  # measured: no retries to price, a 1 s render alone
        s.submit(req(i), 0.0)
    now = serve_one_at_a_time(s, 0.0, 0.0)
    # A lone request's wait is too short to say anything of a queue's: a score 1.8 s late
    # on a 1 s render does not count.
    for i in range(MIN_FINISHED):
        assert s.submit(req(500 + i, deadline=now + 1.5), now).admitted
        now = serve_one_at_a_time(s, now, 1.8)
    assert s.wait_stretch() == 1.0
    # Behind three queued requests, with the queue's margin for regenerations admission
    # expects 5 s; the score comes back 1.8 s after the last render (a scorer's turn the
    # render curve does not see): 5.8 s of the 6 s they had.
    for i in range(MIN_FINISHED):
        for j in range(3):
            s.submit(req(1000 + 10 * i + j), now)
        verdict = s.submit(req(1000 + 10 * i + 9, deadline=now + 6.0), now)
        assert verdict.admitted and verdict.expected_s == pytest.approx(5.0)
        now = serve_one_at_a_time(s, now, 1.8)
    assert s.wait_stretch() == pytest.approx(5.8 / 5.0)
    # 5 s fits 5.5 s, but these requests take 5.8 s: refused now, not answered late.
    for j in range(3):
        s.submit(req(2000 + j), now)
    late = s.submit(req(2009, deadline=now + 5.5), now)
    assert not late.admitted and late.reason == "deadline" and "5.80s" in late.detail
    assert s.submit(req(2010, deadline=now + 6.0), now).admitted


def test_wait_calibration_ignores_requests_far_from_their_deadline() -> None:
    w = WaitCalibration()
    for _ in range(3 * MIN_FINISHED):  # 3x late, but they had 10 s for 1 s of work
        w.observe(3.0, 1.0, 10.0)
    assert w.factor() == 1.0
    for _ in range(MIN_FINISHED):  # used 1.2 s of the 2 s they had: they count
        w.observe(1.2, 1.0, 2.0)
    assert w.factor() == pytest.approx(1.2)


@given(st.lists(st.floats(0.2, 3.0), min_size=MIN_FINISHED, max_size=400))
def test_the_wait_stretch_covers_all_but_the_miss_share(ratios: list[float]) -> None:
    w = WaitCalibration()
    for r in ratios:
        w.observe(r, 1.0, 1.0)
    kept = list(w.ratios)
    assert kept == ratios[-len(kept) :]
    stretch = w.factor()
    assert stretch >= 1.0
    assert sum(r > stretch for r in kept) <= MISS_SHARE * len(kept)
    # and no larger than it must be: the smallest stretch of the kept ratios that does
    assert stretch == 1.0 or sum(r >= stretch for r in kept) > MISS_SHARE * len(kept)


def test_the_latency_scale_prices_a_slowdown_at_once_and_a_speed_up_slowly() -> None:
    scale = LatencyScale()
    for _ in range(200):  # a device on its curve
        scale.observe(1.0)
    for _ in range(5):  # a few fast batches do not say the next twenty will be as fast
        scale.observe(0.8)
    assert scale.mean < 0.9 and scale.priced() > 0.98
    for _ in range(5):  # a slowdown is priced at once
        scale.observe(1.3)
    assert scale.priced() >= scale.mean > 1.15
    for _ in range(300):  # a lasting speed-up is priced as the slow mean follows
        scale.observe(0.8)
    assert scale.priced() == pytest.approx(0.8, abs=0.01)
