"""The scheduler: queues per batch key, a policy that cuts batches, and the QA state machine.

It is sans-I/O: the shell calls ``submit``, ``schedule``, ``on_result``, ``on_scores``
and ``cancel`` with the current time, runs what ``schedule`` returns, and sleeps until
``next_wakeup``. The scheduler never reads a clock, never calls an executor and books
every batch's device-seconds in its ledger as results come back.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from renderq.core.admission import (
    DEEP_BATCHES,
    AdmissionConfig,
    LatencyScale,
    RenderStats,
    WaitCalibration,
    admit,
)
from renderq.core.cost import StageCost
from renderq.core.errors import ConfigError, UnknownRequest
from renderq.core.events import (
    Accepted,
    Admission,
    AttemptRecord,
    Cancelled,
    Escalated,
    Event,
    Regenerating,
    ToScore,
)
from renderq.core.fairness import MAX_SWITCH_SHARE, FairShare
from renderq.core.ledger import Ledger
from renderq.core.policies import Policy, QueueView, Window, Windows
from renderq.core.qa import QAPolicy, Verdict
from renderq.core.types import (
    TERMINAL,
    TRANSITIONS,
    Batch,
    BatchKey,
    BatchKind,
    BatchResult,
    Request,
    RequestState,
    ScoreResult,
    Stage,
    check_transition,
)

_S = RequestState

FREED_KEPT = 16
"""Render results remembered per device class, to find the one that freed a batch's worker."""
_ADMITTED = Admission(True)
CostLookup = Callable[[BatchKey], StageCost | None]
_Lane = tuple[BatchKey, Windows | None]


@dataclass(frozen=True, slots=True)
class Reserve:
    """Workers of every device class kept for urgent work: a batch whose head has a
    priority below ``min_priority`` starts only while more than ``workers`` of its class
    are free.

    Step mode's loop gives the engine more slots than its running batch holds and reserves
    the extra for interactive work: bulk requests fill the running batch only, and an
    interactive request always finds a slot, enters the loop and takes the place of a
    running bulk one at the next step boundary (``core.step``: the bulk request is paused
    with its latents and resumes where it stopped).
    """

    workers: int
    min_priority: int

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ConfigError(f"a reserve needs at least one worker, got {self.workers}")

    def admits(self, priority: int, free: int) -> bool:
        """Whether work of ``priority`` may take a worker when ``free`` are free."""
        return priority >= self.min_priority or free > self.workers


def _lane(request: Request) -> _Lane:
    return (request.key, request.window)


@dataclass(slots=True)
class _Record:
    request: Request
    state: RequestState = _S.NEW
    history: list[AttemptRecord] = field(default_factory=list)
    cancel_requested: bool = False
    # Where admission priced a deadline: (admitted at, expected wait, seconds to deadline).
    priced: tuple[float, float, float] | None = None


@dataclass(slots=True)
class _KeyQueue:
    """One key's queue: two FIFOs per priority level, cancelled entries skipped lazily.

    FIFOs are keyed ``(priority, again)``: ``again`` 1 holds requests that already waited
    once (regenerations, batches lost with their worker) and is served before ``again`` 0,
    new requests, of the same priority. A retry so waits for one batch, not the whole queue
    again. Each FIFO is ordered by enqueue time, so its head is its oldest entry. (A queue
    serves one *lane* of a key: the key's requests with the same ``window``, or none.)
    """

    levels: dict[tuple[int, int], deque[tuple[float, str]]] = field(default_factory=dict)
    live_by_level: dict[int, int] = field(default_factory=dict)
    live: int = 0
    inflight: int = 0

    def push(self, priority: int, at: float, request_id: str, *, again: bool = False) -> None:
        self.levels.setdefault((priority, int(again)), deque()).append((at, request_id))
        self.live_by_level[priority] = self.live_by_level.get(priority, 0) + 1
        self.live += 1

    def ahead_of(self, priority: int) -> int:
        return sum(n for p, n in self.live_by_level.items() if p >= priority)


class Scheduler:
    """Batches same-key requests under one policy and runs the QA loop on their results."""

    def __init__(
        self,
        policy: Policy,
        *,
        qa: QAPolicy | None = None,
        cost: CostLookup | None = None,
        default_cap: int = 64,
        admission: AdmissionConfig | None = None,
        ledger: Ledger | None = None,
        fair_share: bool = True,
        reserve: Reserve | None = None,
    ) -> None:
        """``fair_share``: keys of equal priority share a device class by device time
        (``core.fairness``); ``False`` serves them oldest head first (first in, first out
        across keys), for measuring what fair share changes. ``reserve``: workers of each
        class that only urgent work may take (see :class:`Reserve`)."""
        if default_cap < 1:
            raise ConfigError(f"default_cap must be >= 1, got {default_cap}")
        self._reserve = reserve
        self.policy = policy
        self.qa = qa or QAPolicy()
        self.ledger = ledger if ledger is not None else Ledger()
        self._cost = cost or (lambda key: None)
        self._default_cap = default_cap
        self._admission = admission or AdmissionConfig()
        self._records: dict[str, _Record] = {}
        # One queue per key and lane: requests with ``window`` set form their own lane of
        # the key, batched by a Window policy over those windows; the rest by ``policy``.
        self._queues: dict[_Lane, _KeyQueue] = {}
        self._lane_policies: dict[Windows, Policy] = {}
        self._cap_overrides: dict[BatchKey, int] = {}
        self._running: dict[int, Batch] = {}
        self._batch_ids = itertools.count(1)
        self._cost_cache: dict[BatchKey, StageCost | None] = {}
        self._base_caps: dict[BatchKey, int] = {}
        self._renders = RenderStats()
        self._latency_scale: dict[str, LatencyScale] = {}
        self._waits = WaitCalibration()
        self._measured: set[str] = set()  # device classes a render batch came back from
        # Per device class, the last render results: (time, whether work was queued then).
        self._freed: dict[str, deque[tuple[float, bool]]] = {}
        self._fair: FairShare[_Lane] | None = FairShare() if fair_share else None
        # The adapter of the last render batch cut per device class (what its worker
        # holds), and the classes that have run an adapter at all.
        self._adapter: dict[str, str] = {}
        self._lora_classes: set[str] = set()

    # -- inspection ---------------------------------------------------------------------

    def state(self, request_id: str) -> RequestState:
        """Current state of a request."""
        return self._record(request_id).state

    def request(self, request_id: str) -> Request:
        """The request's current attempt."""
        return self._record(request_id).request

    def history(self, request_id: str) -> tuple[AttemptRecord, ...]:
        """Every attempt of a request so far."""
        return tuple(self._record(request_id).history)

    def states(self) -> Mapping[str, RequestState]:
        """States of every request the scheduler has seen."""
        return {rid: rec.state for rid, rec in self._records.items()}

    def queue_depths(self) -> dict[BatchKey, int]:
        """Live queued requests per key."""
        depths: dict[BatchKey, int] = {}
        for (key, _), q in self._queues.items():
            if q.live:
                depths[key] = depths.get(key, 0) + q.live
        return depths

    def running_batches(self) -> Sequence[Batch]:
        """Batches cut and not yet reported back."""
        return list(self._running.values())

    def cap(self, key: BatchKey) -> int:
        """The effective batch cap of a key: policy, memory model and OOM lowering."""
        return self._cap(key)

    def renders_per_request(self) -> float:
        """Renders each finished request has needed so far (1.0 until 20 have finished).

        Admission multiplies its time estimate by this: a request that will need a
        regeneration costs its deadline a second render.
        """
        return self._renders.per_request()

    def renders_sd(self) -> float:
        """The standard deviation of renders per finished request (0.0 until 20 have finished)."""
        return self._renders.sd()

    def retries_to_price(self) -> int:
        """The regenerations admission prices for a gated request's own deadline.

        See :meth:`RenderStats.retries`: what all but 1% of requests need, as far as known.
        """
        return self._renders.retries(self.qa.max_attempts)

    def latency_scale(self, device_class: str) -> float:
        """Observed over predicted render latency on a device class (1.0 until a batch returns).

        A moving average (``core.admission.LatencyScale``) of the wall time from cut to
        result (from the result before it, when work waited then) over what the cost
        model predicts for that batch size. Admission multiplies
        its estimate by it (plus ``SCALE_Z`` of its spread), so a device slower under load
        than when its curve was measured is priced as it is now.
        """
        found = self._latency_scale.get(device_class)
        return found.mean if found is not None else 1.0

    def priced_latency_scale(self, device_class: str) -> float:
        """The scale admission multiplies its estimate by on a device class: the moving
        average plus ``SCALE_Z`` of its spread, never below its slow mean
        (``LatencyScale.priced``; 1.0 until a batch returns)."""
        found = self._latency_scale.get(device_class)
        return found.priced() if found is not None else 1.0

    def wait_stretch(self) -> float:
        """What admission multiplies an expected wait by (``core.admission.WaitCalibration``):
        how late the requests it admitted near their deadline have been finishing."""
        return self._waits.factor()

    def idle(self) -> bool:
        """True when no request is queued, running or being scored."""
        return not self._running and all(
            q.live == 0 and q.inflight == 0 for q in self._queues.values()
        )

    # -- requests in --------------------------------------------------------------------

    def set_workers_per_device(self, workers: int) -> None:
        """Admission prices the queue against ``workers`` render workers from now on (a
        pool that grew while serving)."""
        self._admission = dataclasses.replace(self._admission, workers_per_device=workers)

    def submit(self, request: Request, now: float) -> Admission:
        """Admit and queue a new request (attempt 0), or reject it with a reason."""
        if request.id in self._records:
            raise ConfigError(f"request id {request.id!r} was already submitted")
        rec = _Record(request)
        self._records[request.id] = rec
        q = self._queue(_lane(request))
        if self._admission.max_queue_per_key is None and request.deadline is None:
            self._enqueue(rec, q, now)
            return _ADMITTED
        cost = self._stage_cost(request.key)
        dev = request.key.device_class
        scale = self.priced_latency_scale(dev)
        gated = request.qa and self.qa.enabled
        # A device no batch has come back from yet is priced by its curve alone, which may
        # be far off (one slow warm-up). Refusing every deadline would keep it unmeasured
        # for good, so the first request on it while it is idle goes in and measures it.
        if cost is not None and dev not in self._measured and self._device_idle(dev):
            cost = None
        priced = request.deadline is not None and cost is not None  # else no time to price
        budget = self.qa.max_attempts if self.qa.enabled else 1
        ahead_mean, ahead_sd = self._renders.ahead(budget) if priced else (1.0, 0.0)
        verdict = admit(
            self._admission,
            now=now,
            queued=q.live,
            ahead=q.ahead_of(request.priority) + q.inflight,
            deadline=request.deadline,
            cap=self._cap(request.key),
            latency=(lambda n: cost.latency(n) * scale) if cost is not None else None,
            renders_per_request=ahead_mean,
            renders_sd=ahead_sd,
            retries=self.retries_to_price() if gated and priced else 0,
            setup_s=self._switch_s(request.key) * scale if cost is not None else 0.0,
            stretch=self._waits.factor(),
        )
        if not verdict.admitted:
            self._move(rec, _S.REJECTED)
            return verdict
        if verdict.expected_s is not None and request.deadline is not None and cost is not None:
            full = cost.latency(min(self._cap(request.key), cost.curve.max_size)) * scale
            if verdict.expected_s >= DEEP_BATCHES * full:  # behind a queue (WaitCalibration)
                rec.priced = (now, verdict.expected_s, request.deadline - now)
        self._enqueue(rec, q, now)
        return verdict

    def cancel(self, request_id: str, now: float) -> list[Event]:
        """Cancel a request: queued work is dropped now, running work when it returns."""
        rec = self._record(request_id)
        if rec.state in TERMINAL:
            return []
        if rec.state is _S.QUEUED:
            q = self._queues[_lane(rec.request)]
            q.live -= 1
            q.live_by_level[rec.request.priority] -= 1
            self._move(rec, _S.CANCELLED)
            return [Cancelled(rec.request, tuple(rec.history))]
        rec.cancel_requested = True
        return []

    # -- batches out --------------------------------------------------------------------

    def schedule(self, now: float, free_workers: Mapping[str, int]) -> list[Batch]:
        """Cut the batches to start now, at most one per free worker of each device class.

        Keys are served highest head priority first; keys of equal priority by fair share
        of their device class (``core.fairness``: the key charged the least device time so
        far, or the one whose turn it is), then oldest head first. A key whose policy says
        "wait" never holds back another key.
        """
        free = dict(free_workers)
        out: list[Batch] = []
        while True:
            best: tuple[tuple[int, int, float, float], _Lane, int] | None = None
            for lane, q in self._queues.items():
                dc = lane[0].device_class
                if q.live == 0 or free.get(dc, 0) <= 0:
                    continue
                n = self._policy(lane).cut(self._view(lane, q), now)
                if n <= 0:
                    continue
                prio, oldest = self._head(q)
                if self._reserve is not None and not self._reserve.admits(prio, free[dc]):
                    continue  # the last free workers are kept for urgent work
                fair = self._fair.rank(lane, dc, self._turn_s(lane[0])) if self._fair else (0, 0.0)
                rank = (-prio, *fair, oldest)
                if best is None or rank < best[0]:
                    best = (rank, lane, n)
            if best is None:
                return out
            _, lane, n = best
            out.append(self._cut(lane, n, now))
            free[lane[0].device_class] -= 1

    def next_wakeup(self, now: float) -> float | None:
        """The earliest future time at which ``schedule`` could cut without a new event."""
        times = [
            t
            for lane, q in self._queues.items()
            if q.live
            for t in (self._policy(lane).wakeup(self._view(lane, q), now),)
            if t is not None and t > now
        ]
        return min(times, default=None)

    # -- results in ---------------------------------------------------------------------

    def on_result(self, result: BatchResult, now: float) -> list[Event]:
        """Take a render batch's results: images go to scoring, failures are retried."""
        batch = self._running.pop(result.batch_id, None)
        if batch is None:
            raise UnknownRequest(f"no running batch with id {result.batch_id}")
        q = self._queues[_lane(batch.requests[0])]
        if result.fitted_cap is not None:
            self.lower_cap(batch.key, result.fitted_cap)
        self._observe_latency(batch, now)
        self.ledger.book_batch(
            BatchKind.RENDER,
            (r.attempt for r in batch.requests),
            result.device_seconds,
            result.device_class,
        )
        items = {it.request_id: it for it in result.items}
        events: list[Event] = []
        for req in batch.requests:
            rec = self._records[req.id]
            item = items.get(req.id)
            error = "executor returned no result for this item" if item is None else item.error
            rec.history.append(
                AttemptRecord(req.attempt, req.seed, batch.id, batch.size, error=error)
            )
            if rec.cancel_requested:
                q.inflight -= 1
                self._move(rec, _S.CANCELLED)
                events.append(Cancelled(req, tuple(rec.history)))
            elif error is None and item is not None and not req.qa:
                q.inflight -= 1
                self._move(rec, _S.ACCEPTED, now)
                self.ledger.count_accepted()
                events.append(Accepted(req, tuple(rec.history), image=item.image))
            elif error is None and item is not None:
                self._move(rec, _S.SCORING)
                events.append(ToScore(req, tuple(rec.history), image=item.image))
            else:
                q.inflight -= 1
                events.append(self._retry_or_escalate(rec, None, now))
        dev = batch.key.device_class
        queued = any(q.live for (key, _), q in self._queues.items() if key.device_class == dev)
        self._freed.setdefault(dev, deque(maxlen=FREED_KEPT)).append((now, queued))
        return events

    def on_scores(self, request_ids: Sequence[str], result: ScoreResult, now: float) -> list[Event]:
        """Take one scoring batch's scores and apply the QA decision to each attempt."""
        if len(request_ids) != len(result.scores):
            raise ConfigError(
                f"{len(request_ids)} request ids but {len(result.scores)} scores in a score batch"
            )
        recs = [self._record(rid) for rid in request_ids]
        for rec in recs:
            if rec.state is not _S.SCORING:
                raise ConfigError(f"request {rec.request.id!r} is {rec.state.value}, not scoring")
        self.ledger.book_batch(
            BatchKind.SCORE,
            (r.request.attempt for r in recs),
            result.device_seconds,
            result.device_class,
        )
        events: list[Event] = []
        for rec, score in zip(recs, result.scores, strict=True):
            self._queues[_lane(rec.request)].inflight -= 1
            h = rec.history[-1]
            rec.history[-1] = AttemptRecord(
                h.attempt, h.seed, h.batch_id, h.batch_size, score=score, error=h.error
            )
            if rec.cancel_requested:
                self._move(rec, _S.CANCELLED)
                events.append(Cancelled(rec.request, tuple(rec.history)))
            elif not rec.request.qa or self.qa.decide(score, rec.request.attempt) is Verdict.ACCEPT:
                self._move(rec, _S.ACCEPTED, now)
                self.ledger.count_accepted()
                events.append(Accepted(rec.request, tuple(rec.history), score=score))
            else:
                events.append(self._retry_or_escalate(rec, score, now))
        return events

    def on_lost(
        self, batch_id: int, now: float, device_seconds: float = 0.0, device_class: str = ""
    ) -> None:
        """A batch whose worker died: its requests go back to the queue, attempt unchanged.

        ``device_seconds`` the worker spent on it before dying are booked as
        ``Stage.LOST`` on ``device_class`` (the batch's own class by default).
        """
        batch = self._running.pop(batch_id, None)
        if batch is None:
            raise UnknownRequest(f"no running batch with id {batch_id}")
        if device_seconds > 0:
            self.ledger.book(Stage.LOST, device_class or batch.key.device_class, device_seconds)
        q = self._queues[_lane(batch.requests[0])]
        for req in batch.requests:
            q.inflight -= 1
            self._enqueue(self._records[req.id], q, now)

    def forget(self, request_id: str) -> None:
        """Drop a terminal request's record (long-running services call this to bound memory)."""
        rec = self._record(request_id)
        if rec.state not in TERMINAL:
            raise ConfigError(f"request {request_id!r} is {rec.state.value}; only ended ones go")
        del self._records[request_id]

    def lower_cap(self, key: BatchKey, cap: int) -> None:
        """Lower a key's batch cap for the rest of the run (after an out-of-memory batch)."""
        self._cap_overrides[key] = max(1, min(cap, self._cap_overrides.get(key, cap)))

    # -- internals ----------------------------------------------------------------------

    def _device_idle(self, device_class: str) -> bool:
        busy = any(b.key.device_class == device_class for b in self._running.values())
        return not busy and not any(
            q.live for (key, _), q in self._queues.items() if key.device_class == device_class
        )

    def _observe_latency(self, batch: Batch, now: float) -> None:
        """Observe a render batch's wall time over its curve's latency.

        The wall time runs from the cut, or from the result that freed the worker when
        work was already waiting then: the gap between the two (a scorer's turn on the
        device, the shell's own work, a busy interpreter) delays every batch of a full
        queue, and admission prices a full queue by this scale.
        """
        dev = batch.key.device_class
        self._measured.add(dev)
        cost = self._stage_cost(batch.key)
        start = batch.created_at
        before = [freed for freed in self._freed.get(dev, ()) if freed[0] <= start]
        last, waiting = max(before, default=(start, False))
        if waiting:  # the last result before the cut left work waiting
            start = last
        wall = now - start
        if cost is None or wall <= 0 or batch.size > cost.curve.max_size:
            return  # nothing to compare with (or a clock that did not move)
        self._latency_scale.setdefault(dev, LatencyScale()).observe(wall / cost.latency(batch.size))

    def _retry_or_escalate(self, rec: _Record, score: float | None, now: float) -> Event:
        if rec.request.qa and self.qa.enabled:
            self._renders.attempt(passed=False)
        attempt = rec.request.attempt
        verdict = self.qa.retry(attempt) if score is None else self.qa.decide(score, attempt)
        if verdict is Verdict.REGENERATE:
            self._move(rec, _S.REGENERATING)
            rec.request = dataclasses.replace(rec.request, attempt=rec.request.attempt + 1)
            self._enqueue(rec, self._queues[_lane(rec.request)], now)
            return Regenerating(rec.request, tuple(rec.history), next_request=rec.request)
        self._move(rec, _S.ESCALATED, now)
        return Escalated(rec.request, tuple(rec.history))

    def _enqueue(self, rec: _Record, q: _KeyQueue, now: float) -> None:
        again = rec.state is not _S.NEW
        if q.live == 0 and self._fair is not None:
            self._fair.activate(_lane(rec.request), rec.request.key.device_class)
        self._move(rec, _S.QUEUED)
        q.push(rec.request.priority, now, rec.request.id, again=again)

    def _cut(self, lane: _Lane, n: int, now: float) -> Batch:
        key = lane[0]
        q = self._queues[lane]
        taken: list[Request] = []
        for level in sorted(q.levels, reverse=True):
            dq = q.levels[level]
            prio = level[0]
            while dq and len(taken) < n:
                _, rid = dq.popleft()
                rec = self._records.get(rid)
                if rec is None or rec.state is not _S.QUEUED:
                    continue  # cancelled while queued (and perhaps forgotten since)
                self._move(rec, _S.RUNNING)
                q.live_by_level[prio] -= 1
                taken.append(rec.request)
            if len(taken) == n:
                break
        q.live -= len(taken)
        q.inflight += len(taken)
        if self._fair is not None:
            cost = self._stage_cost(key)
            seconds = cost.latency(min(len(taken), cost.curve.max_size)) if cost else len(taken)
            self._fair.charge(lane, key.device_class, seconds + self._switch_s(key))
        self._adapter[key.device_class] = key.adapter
        if key.adapter:
            self._lora_classes.add(key.device_class)
        batch = Batch(next(self._batch_ids), key, tuple(taken), now, self._cap(key))
        self._running[batch.id] = batch
        return batch

    def _head(self, q: _KeyQueue) -> tuple[int, float]:
        """Highest live priority and the oldest live enqueue time of a queue."""
        best_prio: int | None = None
        oldest = float("inf")
        for (prio, _), dq in q.levels.items():
            while dq and not self._is_queued(dq[0][1]):
                dq.popleft()
            if dq:
                oldest = min(oldest, dq[0][0])
                best_prio = prio if best_prio is None else max(best_prio, prio)
        return (best_prio or 0, oldest)

    def _is_queued(self, request_id: str) -> bool:
        rec = self._records.get(request_id)
        return rec is not None and rec.state is _S.QUEUED

    def _view(self, lane: _Lane, q: _KeyQueue) -> QueueView:
        cost = self._stage_cost(lane[0])
        latency = None
        if cost is not None:
            curve, switch = cost.curve, self._switch_s(lane[0])
            latency = curve.latency if not switch else (lambda n: curve.latency(n) + switch)
        return QueueView(
            size=q.live,
            oldest=self._head(q)[1],
            inflight=q.inflight,
            cap=self._cap(lane[0]),
            latency=latency,
        )

    def _switch_s(self, key: BatchKey) -> float:
        """The adapter switch a batch of ``key`` needs first: its cost model's ``switch_s``
        where the device class's last batch had another adapter, else 0."""
        if self._adapter.get(key.device_class, "") == key.adapter:
            return 0.0
        cost = self._stage_cost(key)
        return cost.switch_s if cost is not None else 0.0

    def _turn_s(self, key: BatchKey) -> float:
        """How long a key keeps its device class once it has it (see ``core.fairness``):
        long enough that switching adapters takes at most ``MAX_SWITCH_SHARE`` of it; one
        batch on a device class that has never run an adapter."""
        if not key.adapter and key.device_class not in self._lora_classes:
            return 0.0
        cost = self._stage_cost(key)
        return cost.switch_s / MAX_SWITCH_SHARE if cost is not None else 0.0

    def _cap(self, key: BatchKey) -> int:
        base = self._base_caps.get(key)
        if base is None:
            cost = self._stage_cost(key)
            base = self._default_cap if cost is None else cost.cap()
            if self.policy.max_batch_size is not None:
                base = min(base, self.policy.max_batch_size)
            base = self._base_caps[key] = max(1, base)
        override = self._cap_overrides.get(key)
        return base if override is None else max(1, min(base, override))

    def _policy(self, lane: _Lane) -> Policy:
        """The scheduler's policy, or for a windowed lane a Window policy over its windows."""
        windows = lane[1]
        if windows is None:
            return self.policy
        policy = self._lane_policies.get(windows)
        if policy is None:
            policy = self._lane_policies[windows] = Window(windows, self.policy.max_batch_size)
        return policy

    def _stage_cost(self, key: BatchKey) -> StageCost | None:
        """The cost model of ``key``'s batches, its adapter's extra compute included."""
        if key not in self._cost_cache:
            cost = self._cost(key)
            self._cost_cache[key] = cost.for_adapter(key.adapter) if cost is not None else None
        return self._cost_cache[key]

    def _queue(self, lane: _Lane) -> _KeyQueue:
        q = self._queues.get(lane)
        if q is None:
            q = self._queues[lane] = _KeyQueue()
        return q

    def _record(self, request_id: str) -> _Record:
        try:
            return self._records[request_id]
        except KeyError:
            raise UnknownRequest(f"unknown request id {request_id!r}") from None

    def _move(self, rec: _Record, new: RequestState, now: float | None = None) -> None:
        """Move a request to ``new``; ``now`` for its end (accepted, escalated)."""
        if new not in TRANSITIONS[rec.state]:
            check_transition(rec.state, new)  # raises with the message
        rec.state = new
        if new is _S.ACCEPTED or new is _S.ESCALATED:
            if rec.priced is not None and now is not None:
                admitted_at, expected, budget = rec.priced
                self._waits.observe(now - admitted_at, expected, budget)
            # Only gated requests' attempts tell how often the gate fails.
            gated = rec.request.qa and self.qa.enabled
            if gated and new is _S.ACCEPTED:
                self._renders.attempt(passed=True)
            self._renders.finish(len(rec.history), gated=gated)
