"""A chaotic test shell for the scheduler: fake clock, several keys and device classes,
item errors, out-of-memory caps, cancellations and random scores, all from one seed.

It records what the invariants need: every batch cut (with the time and the free workers
left), every terminal event, and the device-seconds handed back.
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass, field

from renderq.core.events import Accepted, Cancelled, Escalated, Event, Regenerating, ToScore
from renderq.core.scheduler import Scheduler
from renderq.core.types import (
    Batch,
    BatchKey,
    BatchResult,
    ItemResult,
    Request,
    RequestState,
    ScoreResult,
)


def key(i: int, device: str = "gpu0") -> BatchKey:
    """A distinct batch key per index."""
    return BatchKey("m", 64 * (i + 1), 64, 20, True, "ddim", "fp32", device)


@dataclass
class Trace:
    """What happened during a drive."""

    batches: list[tuple[float, Batch]] = field(default_factory=list)
    terminal: dict[str, list[Event]] = field(default_factory=dict)
    rejected: set[str] = field(default_factory=set)
    queued_at: dict[str, float] = field(default_factory=dict)
    device_seconds: float = 0.0
    delay_violations: list[str] = field(default_factory=list)


def drive(
    sched: Scheduler,
    requests: list[Request],
    rng: random.Random,
    *,
    workers: dict[str, int],
    error_rate: float = 0.1,
    pass_rate: float = 0.6,
    cancel_rate: float = 0.05,
    oom_rate: float = 0.05,
    delay_cap: float | None = None,
    max_steps: int = 100_000,
) -> Trace:
    """Run ``requests`` (submitted at their arrival times) to completion."""
    trace = Trace()
    heap: list[tuple[float, int, str, object]] = []
    seq = itertools.count()
    for r in requests:
        heapq.heappush(heap, (r.arrival, next(seq), "arrive", r))
        if rng.random() < cancel_rate:
            heapq.heappush(heap, (r.arrival + rng.uniform(0, 3), next(seq), "cancel", r.id))
    free = dict(workers)
    to_score: list[Request] = []
    scoring = False
    for _ in range(max_steps):
        if not heap:
            break
        now = heap[0][0]
        while heap and heap[0][0] == now:
            _, _, kind, payload = heapq.heappop(heap)
            if kind == "arrive":
                assert isinstance(payload, Request)
                verdict = sched.submit(payload, now)
                if verdict.admitted:
                    trace.queued_at[payload.id] = now
                else:
                    trace.rejected.add(payload.id)
            elif kind == "cancel":
                assert isinstance(payload, str)
                if payload in trace.queued_at:
                    _note(trace, sched.cancel(payload, now), now, to_score)
            elif kind == "rendered":
                assert isinstance(payload, BatchResult)
                free[payload.device_class] += 1
                _note(trace, sched.on_result(payload, now), now, to_score)
            elif kind == "scored":
                ids, result = payload  # type: ignore[misc]
                scoring = False
                _note(trace, sched.on_scores(ids, result, now), now, to_score)
        for batch in sched.schedule(now, free):
            free[batch.key.device_class] -= 1
            trace.batches.append((now, batch))
            result = _render(batch, rng, error_rate, oom_rate)
            trace.device_seconds += result.device_seconds
            heapq.heappush(heap, (now + result.device_seconds, next(seq), "rendered", result))
        if delay_cap is not None:
            _check_delay(sched, trace, free, now, delay_cap)
        if to_score and not scoring:
            batch_reqs = to_score[:8]
            del to_score[:8]
            scores = tuple(
                None if rng.random() < 0.02 else (0.9 if rng.random() < pass_rate else 0.1)
                for _ in batch_reqs
            )
            result = ScoreResult(scores, 0.05 * len(batch_reqs), "scorer")
            trace.device_seconds += result.device_seconds
            scoring = True
            heapq.heappush(
                heap, (now + 0.05, next(seq), "scored", ([r.id for r in batch_reqs], result))
            )
        wake = sched.next_wakeup(now)
        if wake is not None:
            assert wake > now
            heapq.heappush(heap, (wake, next(seq), "wake", None))
    else:
        raise AssertionError("drive did not finish")
    return trace


def _render(batch: Batch, rng: random.Random, error_rate: float, oom_rate: float) -> BatchResult:
    fitted = max(1, batch.size // 2) if batch.size > 1 and rng.random() < oom_rate else None
    items = tuple(
        ItemResult(r.id, error="nan image") if rng.random() < error_rate else ItemResult(r.id, r.id)
        for r in batch.requests
    )
    return BatchResult(batch.id, items, 0.3 + 0.1 * batch.size, batch.key.device_class, fitted)


def _note(trace: Trace, events: list[Event], now: float, to_score: list[Request]) -> None:
    for ev in events:
        if isinstance(ev, ToScore):
            to_score.append(ev.request)
        elif isinstance(ev, Regenerating):
            trace.queued_at[ev.request.id] = now
        elif isinstance(ev, Accepted | Escalated | Cancelled):
            trace.terminal.setdefault(ev.request.id, []).append(ev)


def _check_delay(
    sched: Scheduler, trace: Trace, free: dict[str, int], now: float, delay: float
) -> None:
    for rid, state in sched.states().items():
        if state is not RequestState.QUEUED or sched.request(rid).window is not None:
            continue  # windowed requests wait for their windows, not the delay
        # Same-instant comparisons are exact because the driver wakes exactly at the due time.
        dc = sched.request(rid).key.device_class
        if free.get(dc, 0) > 0 and now >= trace.queued_at[rid] + delay:
            trace.delay_violations.append(f"{rid} queued at {trace.queued_at[rid]}, now {now}")
