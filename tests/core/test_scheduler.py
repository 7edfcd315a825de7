"""Unit tests of the scheduler on a fake clock (plain numbers; no sleeps)."""

from __future__ import annotations

import dataclasses

import pytest

from renderq.core.admission import AdmissionConfig, expected_finish
from renderq.core.cost import LatencyCurve, StageCost
from renderq.core.errors import ConfigError, InvalidTransition, UnknownRequest
from renderq.core.events import Accepted, Cancelled, Escalated, Regenerating, ToScore
from renderq.core.policies import AdHoc, Dynamic, Window, Windows
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.seeds import seed_for
from renderq.core.types import (
    BatchResult,
    ItemResult,
    Request,
    RequestState,
    ScoreResult,
    check_transition,
)
from tests.core.driver import key

K0, K1 = key(0), key(1)


def req(i: int, k=K0, priority: int = 0, deadline: float | None = None) -> Request:
    return Request(
        f"r{i}", f"prompt {i}", k, base_seed=100 + i, priority=priority, deadline=deadline
    )


def ok(
    batch_id: int, reqs: list[Request], seconds: float = 1.0, fitted: int | None = None
) -> BatchResult:
    return BatchResult(
        batch_id, tuple(ItemResult(r.id, r.id) for r in reqs), seconds, "gpu0", fitted
    )


def test_dynamic_cuts_full_batch_at_once_and_partial_after_delay() -> None:
    s = Scheduler(Dynamic(max_queue_delay_s=0.5, batch_size=4))
    for i in range(6):
        s.submit(req(i), now=0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    assert [r.id for r in b.requests] == ["r0", "r1", "r2", "r3"]
    assert s.schedule(0.1, {"gpu0": 1}) == []
    assert s.next_wakeup(0.1) == 0.5
    [b2] = s.schedule(0.5, {"gpu0": 1})
    assert b2.size == 2 and s.next_wakeup(0.5) is None


def test_preferred_size_cuts_before_the_delay() -> None:
    s = Scheduler(Dynamic(max_queue_delay_s=10, batch_size=16, preferred_sizes=(2, 4)))
    for i in range(5):
        s.submit(req(i), now=0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    assert b.size == 4


def test_one_key_waiting_never_blocks_another() -> None:
    s = Scheduler(Dynamic(max_queue_delay_s=5, batch_size=2))
    s.submit(req(0, K0), 0.0)  # K0 waits for its delay
    s.submit(req(1, K1), 0.0)
    s.submit(req(2, K1), 0.0)  # K1 is full
    [b] = s.schedule(0.0, {"gpu0": 2})
    assert b.key == K1


def test_higher_priority_first_within_and_across_keys() -> None:
    s = Scheduler(AdHoc())
    s.submit(req(0, K0, priority=0), 0.0)
    s.submit(req(1, K1, priority=0), 0.0)
    s.submit(req(2, K1, priority=5), 1.0)
    s.submit(req(3, K0, priority=9), 2.0)
    order = [s.schedule(3.0, {"gpu0": 1})[0].requests[0].id for _ in range(1)]
    batches = s.schedule(3.0, {"gpu0": 3})
    order += [b.requests[0].id for b in batches]
    assert order == ["r3", "r2", "r0", "r1"]


def test_accept_regenerate_escalate_with_seed_schedule() -> None:
    s = Scheduler(AdHoc(), qa=QAPolicy(threshold=0.5, max_attempts=2))
    s.submit(req(0), 0.0)
    s.submit(req(1), 0.0)
    b0, b1 = s.schedule(0.0, {"gpu0": 2})
    ev = s.on_result(ok(b0.id, list(b0.requests)), 1.0) + s.on_result(
        ok(b1.id, list(b1.requests)), 1.0
    )
    assert all(isinstance(e, ToScore) for e in ev)
    ev = s.on_scores(["r0", "r1"], ScoreResult((0.9, 0.1), 0.2, "gpu0"), 1.5)
    assert isinstance(ev[0], Accepted) and ev[0].score == 0.9
    assert isinstance(ev[1], Regenerating)
    nxt = ev[1].next_request
    assert nxt is not None and nxt.attempt == 1 and nxt.seed == seed_for(101, 1) != 101
    [b2] = s.schedule(1.5, {"gpu0": 1})
    s.on_result(ok(b2.id, list(b2.requests)), 2.0)
    [esc] = s.on_scores(["r1"], ScoreResult((0.2,), 0.1, "gpu0"), 2.5)
    assert isinstance(esc, Escalated)
    assert [(h.attempt, h.seed, h.score) for h in esc.history] == [
        (0, 101, 0.1),
        (1, seed_for(101, 1), 0.2),
    ]
    assert s.state("r0") is RequestState.ACCEPTED and s.state("r1") is RequestState.ESCALATED
    rep = s.ledger.report()
    assert rep.seconds["render"] == 2.0 and rep.seconds["regen"] == 1.0
    assert rep.seconds["score"] == pytest.approx(0.2) and rep.seconds["rescore"] == pytest.approx(
        0.1
    )


def test_item_error_fails_only_that_item() -> None:
    s = Scheduler(Dynamic(0, 4), qa=QAPolicy(threshold=0.5, max_attempts=3))
    reqs = [req(i) for i in range(3)]
    for r in reqs:
        s.submit(r, 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    items = (ItemResult("r0", "img"), ItemResult("r1", error="nan image"), ItemResult("r2", "img"))
    ev = s.on_result(BatchResult(b.id, items, 3.0, "gpu0"), 1.0)
    kinds = {e.request.id: type(e).__name__ for e in ev}
    assert kinds == {"r0": "ToScore", "r1": "Regenerating", "r2": "ToScore"}
    assert s.request("r1").attempt == 1 and s.history("r1")[0].error == "nan image"


def test_missing_item_is_retried_not_lost() -> None:
    s = Scheduler(Dynamic(0, 4))
    s.submit(req(0), 0.0)
    s.submit(req(1), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    ev = s.on_result(BatchResult(b.id, (ItemResult("r0", "img"),), 1.0, "gpu0"), 1.0)
    assert {type(e).__name__ for e in ev} == {"ToScore", "Regenerating"}
    assert s.state("r1") is RequestState.QUEUED


def test_fitted_cap_lowers_the_key_cap_for_the_rest_of_the_run() -> None:
    s = Scheduler(Dynamic(0, 8))
    for i in range(20):
        s.submit(req(i), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    assert b.size == 8
    s.on_result(ok(b.id, list(b.requests), fitted=4), 1.0)
    assert s.cap(K0) == 4
    [b2] = s.schedule(1.0, {"gpu0": 1})
    assert b2.size == 4 and b2.cap == 4


def test_lost_batch_is_requeued_with_the_same_attempt() -> None:
    s = Scheduler(Dynamic(0, 4))
    for i in range(3):
        s.submit(req(i), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    s.on_lost(b.id, 1.0)
    assert all(s.state(f"r{i}") is RequestState.QUEUED for i in range(3))
    [b2] = s.schedule(1.0, {"gpu0": 1})
    assert sorted(r.id for r in b2.requests) == ["r0", "r1", "r2"]
    assert all(r.attempt == 0 for r in b2.requests)
    with pytest.raises(UnknownRequest):
        s.on_lost(b.id, 2.0)


def test_cancel_queued_now_and_running_on_return() -> None:
    s = Scheduler(AdHoc())
    s.submit(req(0), 0.0)
    s.submit(req(1), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    assert s.cancel("r0", 0.1) == []  # running: takes effect on return
    [c] = s.cancel("r1", 0.1)
    assert isinstance(c, Cancelled) and s.queue_depths() == {}
    [c0] = s.on_result(ok(b.id, list(b.requests)), 1.0)
    assert isinstance(c0, Cancelled)
    assert s.idle() and s.cancel("r0", 2.0) == []


def test_admission_rejects_full_queue_and_impossible_deadline_at_once() -> None:
    cost = StageCost(LatencyCurve((1, 4), (1.0, 2.0)))
    s = Scheduler(
        Dynamic(0.1, 4),
        qa=QAPolicy(max_attempts=1),  # no retries to price: the queue alone decides
        cost=lambda k: cost,
        admission=AdmissionConfig(max_queue_per_key=5),
    )
    for i in range(5):
        assert s.submit(req(i), 0.0).admitted
    full = s.submit(req(5), 0.0)
    assert not full.admitted and full.reason == "queue_full" and "limit 5" in full.detail
    assert s.state("r5") is RequestState.REJECTED
    late = s.submit(req(6, K1, deadline=0.5), 0.0)
    assert not late.admitted and late.reason == "deadline"
    assert s.submit(req(7, K1, deadline=5.0), 0.0).admitted
    # Behind 5 queued K0 requests: 2 batches of 4 -> 2 s + 1 s ... finish at 3 s.
    assert not s.submit(req(8, K0, deadline=2.5), 0.0).admitted


def test_duplicate_submit_and_bad_transitions_are_errors() -> None:
    s = Scheduler(AdHoc())
    s.submit(req(0), 0.0)
    with pytest.raises(ConfigError, match="r0"):
        s.submit(req(0), 0.0)
    with pytest.raises(UnknownRequest, match="nope"):
        s.state("nope")
    with pytest.raises(InvalidTransition, match="accepted"):
        check_transition(RequestState.ACCEPTED, RequestState.QUEUED)


def test_window_waits_for_the_window_and_for_regens_to_fill() -> None:
    s = Scheduler(Window(Windows(explicit=((10.0, 20.0),)), batch_size=4))
    for i in range(5):
        s.submit(req(i), 0.0)
    assert s.schedule(0.0, {"gpu0": 1}) == []
    assert s.next_wakeup(0.0) == 10.0
    [b] = s.schedule(10.0, {"gpu0": 2})  # full batch; the partial waits: r0..r3 in flight
    assert b.size == 4
    assert s.schedule(10.0, {"gpu0": 1}) == []
    s.on_result(ok(b.id, list(b.requests)), 11.0)
    s.on_scores([r.id for r in b.requests], ScoreResult((0.9,) * 4, 0.1, "gpu0"), 11.5)
    [b2] = s.schedule(11.5, {"gpu0": 1})  # nothing in flight now: the partial goes
    assert b2.size == 1


def test_window_batches_finish_before_the_window_closes() -> None:
    cost = StageCost(LatencyCurve((1, 8), (1.0, 4.0)))  # 1.0, 1.43, ..., 2.71 (5), 3.14 (6)
    s = Scheduler(Window(Windows(explicit=((0.0, 3.0),)), batch_size=8), cost=lambda k: cost)
    for i in range(8):
        s.submit(req(i), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    assert b.size == 5 and cost.latency(5) <= 3.0 < cost.latency(6)
    s.on_lost(b.id, 2.5)
    assert s.schedule(2.5, {"gpu0": 1}) == []  # 0.5 s left fits not even one
    assert s.next_wakeup(2.5) is None and s.queue_depths() == {K0: 8}


def test_without_the_gate_images_are_accepted_but_render_errors_still_retry() -> None:
    s = Scheduler(Dynamic(0, 4), qa=QAPolicy(enabled=False, max_attempts=2))
    s.submit(req(0), 0.0)
    s.submit(req(1), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    items = (ItemResult("r0", "img"), ItemResult("r1", error="nan image"))
    ev = s.on_result(BatchResult(b.id, items, 1.0, "gpu0"), 1.0)
    assert {e.request.id: type(e).__name__ for e in ev} == {"r0": "ToScore", "r1": "Regenerating"}
    [acc] = s.on_scores(["r0"], ScoreResult((None,), 0.0, "gpu0"), 1.0)
    assert isinstance(acc, Accepted)


def test_a_request_may_skip_the_gate_while_others_keep_it() -> None:
    s = Scheduler(Dynamic(0, 4), qa=QAPolicy(threshold=0.5, max_attempts=2))
    s.submit(Request("free", "a red circle", K0, qa=False), 0.0)
    s.submit(Request("gated", "a red circle", K0), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    ev = s.on_result(ok(b.id, list(b.requests)), 1.0)
    assert [type(e).__name__ for e in ev] == ["Accepted", "ToScore"]
    assert isinstance(ev[0], Accepted) and ev[0].image == "free" and ev[0].score is None
    [regen] = s.on_scores(["gated"], ScoreResult((0.1,), 0.1, "gpu0"), 1.0)
    assert isinstance(regen, Regenerating) and s.ledger.accepted == 1


def test_forget_drops_only_ended_requests() -> None:
    s = Scheduler(AdHoc())
    s.submit(req(0), 0.0)
    with pytest.raises(ConfigError, match="queued"):
        s.forget("r0")
    s.submit(req(1), 0.0)
    s.cancel("r0", 0.0)
    s.forget("r0")
    with pytest.raises(UnknownRequest):
        s.state("r0")
    [b] = s.schedule(0.0, {"gpu0": 1})  # the forgotten entry is skipped, not a KeyError
    assert b.requests[0].id == "r1" and list(s.states()) == ["r1"]


def test_admission_prices_the_regenerations_it_has_seen() -> None:
    cost = StageCost(LatencyCurve((1, 4), (1.0, 2.0)))
    s = Scheduler(AdHoc(), qa=QAPolicy(threshold=0.5, max_attempts=2), cost=lambda k: cost)
    assert s.renders_per_request() == 1.0
    for i in range(20):  # every request fails once, then passes: 2 renders each
        s.submit(req(i), 0.0)
    now = 0.0
    while not s.idle():
        for b in s.schedule(now, {"gpu0": 1}):
            s.on_result(ok(b.id, list(b.requests)), now)
            r = b.requests[0]
            s.on_scores([r.id], ScoreResult((0.9 if r.attempt else 0.1,), 0.0, "gpu0"), now)
        now += 1.0
    assert s.renders_per_request() == 2.0
    # Alone in the queue, one render takes 1 s, and its own retry (max_attempts 2) one more
    # batch: 1.5 s is too soon.
    late = s.submit(req(100, deadline=now + 1.5), now)
    assert not late.admitted and late.reason == "deadline"
    assert s.submit(req(101, deadline=now + 2.5), now).admitted


def test_admission_prices_the_regenerations_of_the_queue_ahead_and_its_own() -> None:
    cost = StageCost(LatencyCurve((1, 4), (1.0, 2.0)))
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(0.5, max_attempts=3), cost=lambda k: cost)
    for i in range(20):  # half the requests fail once: 1.5 renders per finished request
        s.submit(req(100 + i), 0.0)
    while not s.idle():
        for b in s.schedule(0.0, {"gpu0": 1}):
            s.on_result(ok(b.id, list(b.requests)), 0.0)
            scores = tuple(0.9 if r.attempt or int(r.id[1:]) % 2 else 0.1 for r in b.requests)
            s.on_scores([r.id for r in b.requests], ScoreResult(scores, 0.0, "gpu0"), 0.0)
    assert s.renders_per_request() == 1.5
    # 10 of 30 attempts failed: admission prices the failure rate's upper bound, 0.483, at
    # which 23% would still fail after one retry (over the 1% it lets go), so both retries
    # are priced; per request ahead, 1.72 renders (the larger of 1.5 seen and the rate's),
    # with a standard deviation of 0.82.
    assert s.retries_to_price() == 2
    # Alone: its batch of one (1 s) and two retries that would ride in batches of one.
    assert not s.submit(req(9, deadline=2.9), 0.0).admitted
    assert s.submit(req(8, deadline=3.1), 0.0).admitted
    assert s.cancel("r8", 0.0)
    for i in range(4):
        assert s.submit(req(i), 0.0).admitted
    # 4 ahead: 4 x 1.72 = 6.9 renders + 2.33 x 0.82 x sqrt(4) = 3.8 more, + itself: 12.
    # Three batches of 4 (6 s), plus two retries, each waiting for the full batch running
    # when it is queued again and riding in another (8 s): 14 s.
    assert not s.submit(req(10, deadline=13.9), 0.0).admitted
    assert s.submit(req(11, deadline=14.1), 0.0).admitted
    # A request that skips the gate has no retries to price: 5 ahead x 1.72 + 2.33 x 0.82 x
    # sqrt(5) -> 13 renders + 1: three batches of 4 (6 s) and one of 2 (4/3 s).
    skip = dataclasses.replace(req(12, deadline=7.2), qa=False)
    assert not s.submit(skip, 0.0).admitted
    assert s.submit(dataclasses.replace(req(13, deadline=7.4), qa=False), 0.0).admitted


def test_regenerations_are_served_before_new_requests_of_their_priority() -> None:
    s = Scheduler(Dynamic(0.0, 2), qa=QAPolicy(0.5, max_attempts=2))
    for i in range(2):
        s.submit(req(i), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    for i in range(2, 6):
        s.submit(req(i), 1.0)
    s.on_result(ok(b.id, list(b.requests)), 2.0)
    s.on_scores(["r0", "r1"], ScoreResult((0.1, 0.9), 0.0, "gpu0"), 2.0)  # r0 regenerates
    [b2] = s.schedule(2.0, {"gpu0": 1})
    assert [r.id for r in b2.requests] == ["r0", "r2"]
    assert b2.requests[0].attempt == 1
    # A higher priority still goes first, retry or not.
    s.submit(req(9, priority=5), 3.0)
    s.on_result(ok(b2.id, list(b2.requests)), 3.0)
    [b3] = s.schedule(3.0, {"gpu0": 1})
    assert b3.requests[0].id == "r9"


def test_admission_learns_the_observed_latency_of_the_device() -> None:
    cost = StageCost(LatencyCurve((1, 4), (1.0, 2.0)))
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(max_attempts=1), cost=lambda k: cost)
    assert s.latency_scale("gpu0") == 1.0
    # Never measured and idle: the first request goes in even against its curve (5 s).
    assert s.submit(req(99, deadline=0.5), 0.0).admitted
    s.cancel("r99", 0.0)
    assert s.submit(req(0, deadline=1.5), 0.0).admitted  # 1 s predicted
    # Not idle any more: the curve decides.
    assert not s.submit(req(98, deadline=0.5), 0.0).admitted
    [b] = s.schedule(0.0, {"gpu0": 1})
    s.on_result(ok(b.id, list(b.requests)), 3.0)  # took 3 s: three times the curve
    s.on_scores(["r0"], ScoreResult((0.9,), 0.0, "gpu0"), 3.0)
    assert s.latency_scale("gpu0") == pytest.approx(3.0)
    assert not s.submit(req(1, deadline=3.0 + 2.5), 3.0).admitted
    assert s.submit(req(2, deadline=3.0 + 3.5), 3.0).admitted
    [b] = s.schedule(3.0, {"gpu0": 1})
    s.on_result(ok(b.id, list(b.requests)), 4.0)  # back to 1 s: the average moves a fifth
    assert s.latency_scale("gpu0") == pytest.approx(3.0 + 0.2 * (1.0 - 3.0))
    assert s.latency_scale("cpu") == 1.0  # other device classes keep their own
    s.on_scores(["r2"], ScoreResult((0.9,), 0.0, "gpu0"), 4.0)
    # The device swung between 3x and 1x: admission prices the average (2.6) plus one
    # standard deviation of the swings (0.8), 3.4 s for one batch, not 2.6 s.
    assert s.priced_latency_scale("gpu0") == pytest.approx(3.4)
    assert s.priced_latency_scale("cpu") == 1.0
    assert not s.submit(req(3, deadline=4.0 + 3.0), 4.0).admitted
    assert s.submit(req(4, deadline=4.0 + 3.5), 4.0).admitted


def test_the_latency_scale_counts_the_gap_before_a_batch_that_work_waited_for() -> None:
    cost = StageCost(LatencyCurve((1, 4), (1.0, 1.0)))
    s = Scheduler(Dynamic(0.0, 1), qa=QAPolicy(max_attempts=1), cost=lambda k: cost)
    for i in range(2):
        s.submit(req(i), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    s.on_result(ok(b.id, list(b.requests)), 1.0)  # on the curve; r1 was waiting meanwhile
    assert s.latency_scale("gpu0") == pytest.approx(1.0)
    # The shell cuts the next batch only 0.5 s later (a scorer's turn, a busy loop): a
    # full queue moves at 1.5 s a batch, and the scale says so.
    [b] = s.schedule(1.5, {"gpu0": 1})
    s.on_result(ok(b.id, list(b.requests)), 2.5)
    assert s.latency_scale("gpu0") == pytest.approx(1.0 + 0.2 * (1.5 - 1.0))
    # Nothing waited when that batch came back: the idle time before the next arrival is
    # no gap of the device's, and the batch is measured from its cut.
    s.submit(req(2), 4.0)
    [b] = s.schedule(4.0, {"gpu0": 1})
    s.on_result(ok(b.id, list(b.requests)), 5.0)
    assert s.latency_scale("gpu0") == pytest.approx(1.1 + 0.2 * (1.0 - 1.1))


def test_windowed_requests_form_their_own_lane_of_the_key() -> None:
    windows = Windows(explicit=((10.0, 20.0),))
    s = Scheduler(Dynamic(0.5, 4))
    for i in range(3):
        s.submit(dataclasses.replace(req(i), window=windows), 0.0)
    s.submit(req(3), 0.0)
    assert s.queue_depths() == {K0: 4}
    # Outside the window only the plain request runs, after its queue delay, alone.
    assert s.schedule(0.0, {"gpu0": 1}) == []
    assert s.next_wakeup(0.0) == 0.5
    [b] = s.schedule(0.5, {"gpu0": 1})
    assert [r.id for r in b.requests] == ["r3"]
    s.on_result(ok(b.id, list(b.requests)), 1.0)
    assert s.next_wakeup(1.0) == 10.0
    assert s.schedule(9.9, {"gpu0": 1}) == []
    # Inside it, the windowed lane runs as a window batch (nothing in flight: cut at once).
    [w] = s.schedule(10.0, {"gpu0": 1})
    assert [r.id for r in w.requests] == ["r0", "r1", "r2"] and w.key == K0
    # An out-of-memory result lowers the cap of the key, in every lane.
    s.on_result(ok(w.id, list(w.requests), fitted=2), 11.0)
    assert s.cap(K0) == 2


def test_expected_finish_prices_retries_at_the_batch_the_queue_would_fill() -> None:
    curve = LatencyCurve((1, 4), (1.0, 2.0))
    alone = expected_finish(0.0, 0, 4, curve.latency, 1, renders_per_request=1.5, retries=2)
    assert alone == pytest.approx(1.0 + 2 * 1.0)
    busy = expected_finish(10.0, 8, 4, curve.latency, 2, renders_per_request=1.0, retries=1)
    # Deeper than a batch: the retry waits for the batch running then, and rides in its own.
    assert busy == pytest.approx(10.0 + (2 * 2.0 + 1.0 + 2 * 2.0) / 2)
    spread = expected_finish(0.0, 4, 4, curve.latency, 1, renders_per_request=1.0, renders_sd=1)
    # 4 + 2.33 x 1 x sqrt(4) = 8.66 -> 9 renders ahead + 1: two batches of 4 and one of 2.
    assert spread == pytest.approx(2 * 2.0 + 4 / 3)


def test_admission_counts_the_batches_already_running_as_work_ahead() -> None:
    cost = StageCost(LatencyCurve((1, 4), (1.0, 2.0)))
    s = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(max_attempts=1), cost=lambda k: cost)
    s.submit(req(0, deadline=10.0), 0.0)  # measures the idle device; admitted as the probe
    [b] = s.schedule(0.0, {"gpu0": 1})
    s.on_result(ok(b.id, list(b.requests), seconds=1.0), 1.0)
    s.on_scores(["r0"], ScoreResult((0.9,), 0.0, "gpu0"), 1.0)
    for i in range(1, 5):
        assert s.submit(req(i), 1.0).admitted
    [running] = s.schedule(1.0, {"gpu0": 1})
    assert running.size == 4 and s.queue_depths() == {}
    # Nothing queued, but four requests in flight: a new one waits for them (one batch of
    # 4) and then renders alone, 3 s in all at the curve's prices; 1.5 s is not enough.
    late = s.submit(req(5, deadline=1.0 + 1.5), 1.0)
    assert not late.admitted and late.reason == "deadline"
    assert s.submit(req(6, deadline=1.0 + 3.5), 1.0).admitted


def test_a_lost_batch_releases_its_in_flight_count() -> None:
    s = Scheduler(Dynamic(0, 4), qa=QAPolicy(max_attempts=1))
    for i in range(3):
        s.submit(req(i), 0.0)
    [b] = s.schedule(0.0, {"gpu0": 1})
    s.on_lost(b.id, 1.0)
    [b2] = s.schedule(1.0, {"gpu0": 1})
    s.on_result(ok(b2.id, list(b2.requests)), 2.0)
    s.on_scores([r.id for r in b2.requests], ScoreResult((0.9,) * 3, 0.0, "gpu0"), 2.0)
    assert all(s.state(f"r{i}") is RequestState.ACCEPTED for i in range(3))
    assert s.idle()  # no phantom in-flight requests left on the key
