"""The discrete-event simulator: the real scheduler on a virtual clock.

The loop is the engine's step on simulated time: take every event due now (arrivals,
finished renders, finished scores), feed it to the scheduler, start what it cuts on free
workers, and jump to the next event or the scheduler's ``next_wakeup``. Renders and
scores take the device-seconds the simulated executor and scorer report; one scorer
worker scores images as soon as it is free, taking every rendered image waiting (up to
its cap), so it works on batch N while batch N+1 renders.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import random
import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.simulated import SimulatedExecutor, SimulatedScorer, check_speed
from renderq.core.admission import AdmissionConfig
from renderq.core.cost import Profile, StageCost
from renderq.core.errors import ConfigError, Stalled
from renderq.core.events import Accepted, Cancelled, Escalated, Event, ToScore
from renderq.core.ledger import LedgerReport
from renderq.core.policies import Policy
from renderq.core.scheduler import Scheduler
from renderq.core.score_stage import ScoreStage, score_cap
from renderq.core.settings import QASettings
from renderq.core.stats import percentile
from renderq.core.step import StepCost
from renderq.core.types import TERMINAL, Batch, BatchKey, Request, RequestState, ScoreResult
from renderq.runtime.arrivals import Arrival
from renderq.runtime.stepsim import VirtualStepLoop

_ARRIVE, _RENDERED, _SCORED, _WAKE, _STEP = range(5)


@dataclass(frozen=True, slots=True)
class SimConfig:
    """Everything one simulated run needs besides the policy."""

    profile: Profile
    arrivals: tuple[Arrival, ...]
    failure_rate: float = 0.08
    hard_share: float = 0.0
    #: A measured regeneration curve (see SimulatedScorer): retries pass with these
    #: chances by attempt instead of ``failure_rate``.
    fix_curve: tuple[float, ...] = ()
    #: The gate; an unset threshold is the fallback (the simulated scorer scores around it).
    qa: QASettings = field(default_factory=QASettings)
    render_workers: int = 1
    seed: int = 0
    jitter: float = 0.0
    deadline_s: float | None = None
    max_queue_per_key: int | None = None
    price_per_hour: float | None = None
    #: Closed loop (MLPerf single-stream when 1): this many requests outstanding, the next
    #: one submitted the moment one finishes; arrival times are then ignored.
    streams: int | None = None
    #: Replayed QA outcomes ``(request id, attempt) -> passed`` (see SimulatedScorer).
    outcomes: Mapping[tuple[str, int], bool] | None = None
    #: Scoring batch cap (the real engine's ``score_batch_size``); default: the profile's.
    score_batch_size: int | None = None
    #: Scorer and renderers share the device and take turns, scoring first, as the real
    #: engine does when the scorer's device class renders too; default: they overlap.
    share_device: bool = False
    #: Seconds a worker stays held per render or score batch beyond its device-seconds
    #: (the real engine's hand-offs, measured by ``--compare-sim``; in step mode a slot's
    #: beyond its request's stay in the loop); not booked.
    render_overhead_s: float = 0.0
    score_overhead_s: float = 0.0
    #: The machine's speed over the run, ``(t, factor)`` steps scaling each render batch
    #: by when it is cut (see SimulatedExecutor), in step mode each step by when it runs;
    #: a replayed run's own, or none.
    speed: tuple[tuple[float, float], ...] = ()
    #: Keys of equal priority share the device by device time (``core.fairness``);
    #: False: oldest head first across keys.
    fair_share: bool = True
    #: Step mode's costs (``renderq profile --step-level``); default: derived from the
    #: profile's render curve (``StepCost.from_profile``).
    step_cost: StepCost | None = None
    #: Each render worker scores its own batch right after rendering it, on its device
    #: (``renderq run --images``): a batch holds its worker for both, and the score
    #: stage only collects the scores, at no device time of its own.
    score_in_workers: bool = False
    #: The scheduler prices batches by the profile (fair share across keys charges a
    #: batch's seconds; admission prices deadlines); False: no cost model, as in a real
    #: ``bench`` run, whose fair share charges a batch its images (a replay of one must
    #: choose among keys as it did).
    priced: bool = True

    def __post_init__(self) -> None:
        if self.score_in_workers and self.share_device:
            raise ConfigError("score_in_workers scores on the render workers: no shared scorer")
        if self.render_workers < 1:
            raise ConfigError(f"render workers must be >= 1, got {self.render_workers}")
        if self.streams is not None and self.streams < 1:
            raise ConfigError(f"streams must be >= 1, got {self.streams}")
        for name in ("render_overhead_s", "score_overhead_s"):
            value = getattr(self, name)
            if not value >= 0:
                raise ConfigError(f"{name} must be >= 0 seconds, got {value}")
        check_speed(self.speed)


@dataclass(frozen=True, slots=True)
class SimResult:
    """The outcome of one simulated run of one mode."""

    mode: str
    ledger: LedgerReport
    latencies: tuple[float, ...]
    batch_sizes: tuple[int, ...]
    accepted: int
    escalated: int
    rejected: int
    unfinished: int
    renders: int
    rerenders: int
    makespan_s: float
    #: Every render and score batch in the order it came back: ``(stage, ((id, attempt),
    #: ...))``. The real-time engine cuts the same batches in the same order for the same
    #: trace (tests/runtime/test_drivers_agree.py).
    log: tuple[tuple[str, tuple[tuple[str, int], ...]], ...] = ()
    #: The request id of each entry of ``latencies``.
    ids: tuple[str, ...] = ()

    def percentile(self, q: float) -> float | None:
        """Latency percentile (nearest rank) of finished requests, seconds."""
        return percentile(self.latencies, q)

    @property
    def mean_batch_size(self) -> float:
        """Mean render batch size."""
        return statistics.fmean(self.batch_sizes) if self.batch_sizes else 0.0

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape ``renderq simulate --json`` prints per mode."""
        hours = self.ledger.gpu_hours()
        return {
            "gpu_hours": {k: hours[k] for k in ("render", "score", "regen", "rescore", "total")},
            "cost": self.ledger.cost(),
            "cost_per_10k_accepted": self.ledger.cost_per_10k_accepted(),
            "gpu_hours_per_10k_accepted": self.ledger.per_10k_accepted_hours(),
            "latency_s": {"p50": self.percentile(50), "p99": self.percentile(99)},
            "mean_batch_size": self.mean_batch_size,
            "batches": len(self.batch_sizes),
            "accepted": self.accepted,
            "escalated": self.escalated,
            "rejected": self.rejected,
            "unfinished": self.unfinished,
            "renders": self.renders,
            "rerenders": self.rerenders,
            "makespan_s": self.makespan_s,
        }


@dataclass(slots=True)
class _Loop:
    cfg: SimConfig
    sched: Scheduler
    executor: SimulatedExecutor
    scorer: SimulatedScorer
    scoring: ScoreStage
    heap: list[tuple[float, int, int, Any]] = field(default_factory=list)
    seq: itertools.count[int] = field(default_factory=itertools.count)
    free: int = 0
    wakes: set[float] = field(default_factory=set)
    done_at: dict[str, float] = field(default_factory=dict)
    arrived: dict[str, float] = field(default_factory=dict)
    pending: deque[Request] = field(default_factory=deque)
    batch_sizes: list[int] = field(default_factory=list)
    log: list[tuple[str, tuple[tuple[str, int], ...]]] = field(default_factory=list)
    renders: int = 0
    rerenders: int = 0
    accepted: int = 0
    escalated: int = 0
    #: Step mode's loops, one per render worker (the engine's workers are their slots);
    #: empty in the other modes.
    steps: list[VirtualStepLoop] = field(default_factory=list)
    #: With ``score_in_workers``: each rendered attempt's score and share of the scoring
    #: seconds, given by its render worker.
    worker_scores: dict[tuple[str, int], tuple[float, float]] = field(default_factory=dict)

    def push(self, t: float, kind: int, payload: Any) -> None:
        heapq.heappush(self.heap, (t, next(self.seq), kind, payload))

    def handle(self, now: float, kind: int, payload: Any) -> None:
        if kind == _ARRIVE:
            self.arrived[payload.id] = now
            if not self.sched.submit(payload, now).admitted:
                self.finished(payload.id, now)
        elif kind == _RENDERED:
            batch, result = payload
            self.log.append(("render", tuple((r.id, r.attempt) for r in batch.requests)))
            self.free += 1
            self.note(self.sched.on_result(result, now), now)
        elif kind == _SCORED:
            reqs, result = payload
            ids = [r.id for r in reqs]
            self.log.append(("score", tuple((r.id, r.attempt) for r in reqs)))
            self.scoring.done()
            self.note(self.sched.on_scores(ids, result, now), now)
        elif kind == _STEP:
            self.step(now, payload)
        else:
            self.wakes.discard(payload)

    def step(self, now: float, index: int) -> None:
        """A step boundary of loop ``index``: its finished batches come back when it ends."""
        loop = self.steps[index]
        end, results, scored = loop.boundary(now)
        for at, payload in scored:
            self.push(at, _SCORED, payload)
        for batch, result in results:
            self.push(end + self.cfg.render_overhead_s, _RENDERED, (batch, result))
        loop.running = not loop.batcher.idle()
        if loop.running:
            self.push(end, _STEP, index)

    def note(self, events: Sequence[Event], now: float) -> None:
        for ev in events:
            if isinstance(ev, ToScore):
                self.scoring.add(ev.request, None)
            elif isinstance(ev, Accepted):
                self.accepted += 1
                self.finished(ev.request.id, now)
            elif isinstance(ev, Escalated):
                self.escalated += 1
                self.finished(ev.request.id, now)
            elif isinstance(ev, Cancelled):
                self.finished(ev.request.id, now)

    def finished(self, request_id: str, now: float) -> None:
        self.done_at[request_id] = now
        if self.pending:
            self.push(now, _ARRIVE, self.pending.popleft())

    def dispatch(self, now: float) -> None:
        dc = self.cfg.profile.device_class
        self.dispatch_score(now, dc)
        free = 0 if self.scoring.holds() == dc else self.free
        for batch in self.sched.schedule(now, {dc: free}):
            self.start(batch, now)
        wake = self.sched.next_wakeup(now)
        if wake is not None and wake not in self.wakes:
            self.wakes.add(wake)
            self.push(wake, _WAKE, wake)

    def dispatch_score(self, now: float, dc: str) -> None:
        job = self.scoring.take({dc: self.free}, {dc: self.cfg.render_workers})
        if job is not None:
            reqs = job.requests
            if self.cfg.qa.enabled and self.cfg.score_in_workers:
                given = [self.worker_scores.pop((r.id, r.attempt)) for r in reqs]
                scores, seconds = tuple(sc for sc, _ in given), sum(sh for _, sh in given)
                result = ScoreResult(scores, seconds, self.scorer.device_class)
                held = 0.0  # the render workers spent it
            elif self.cfg.qa.enabled:
                result = self.scorer.score(reqs)
                held = result.device_seconds + self.cfg.score_overhead_s
            else:  # no gate: nothing is scored, nothing costs scorer time
                result = ScoreResult((None,) * len(reqs), 0.0, self.scorer.device_class)
                held = 0.0
            if self.steps and self.cfg.share_device:
                # On the first loop's device: scored at its next step boundary, before the
                # step (as the real loops' scorer takes turns with the first).
                at = self.steps[0].add_score(held, (reqs, result), now)
                if at is not None:
                    self.push(at, _SCORED, (reqs, result))
                return
            self.push(now + held, _SCORED, (reqs, result))

    def start(self, batch: Batch, now: float) -> None:
        self.free -= 1
        self.batch_sizes.append(batch.size)
        for r in batch.requests:
            self.renders += 1
            self.rerenders += r.attempt > 0
        if self.steps:
            # The loop holding fewest requests (the real loops' slots are interleaved, so
            # free slots are taken from every loop in turn).
            index = min(range(len(self.steps)), key=lambda i: self.steps[i].held)
            loop = self.steps[index]
            loop.add(batch, now)
            if not loop.running:
                loop.running = True
                self.push(now, _STEP, index)
            return
        result = self.executor.run(batch)
        held = result.device_seconds + self.cfg.render_overhead_s
        if self.cfg.score_in_workers and self.cfg.qa.enabled:
            ok = [r for r, it in zip(batch.requests, result.items, strict=True) if it.ok]
            if ok:
                scored = self.scorer.score(ok)
                held += scored.device_seconds
                share = scored.device_seconds / len(ok)
                for r, sc in zip(ok, scored.scores, strict=True):
                    self.worker_scores[(r.id, r.attempt)] = (float(sc or 0.0), share)
        self.push(now + held, _RENDERED, (batch, result))


def _step_loops(policy: Policy, cfg: SimConfig) -> list[VirtualStepLoop]:
    """Step mode's virtual loops, one per render worker (device): the configured step
    cost, capped by the policy's batch."""
    cost = cfg.step_cost or StepCost.from_profile(cfg.profile)
    cap = min(policy.max_batch_size or cost.cap, cost.cap)
    return [
        VirtualStepLoop(cost, cap, cfg.profile.device_class, cfg.speed)
        for _ in range(cfg.render_workers)
    ]


@dataclass(slots=True)
class _ProgressGuard:
    """Raises :class:`Stalled` instead of looping for ever on a policy or scheduler bug.

    Every loop turn must, within ``idle_turns`` turns, start a render or finish a request;
    and no run may render more than every request's full retry budget.
    """

    max_renders: int
    idle_turns: int = 100_000
    _last: tuple[int, int] = (0, 0)
    _idle: int = 0

    def check(self, loop: _Loop, now: float) -> None:
        if loop.renders > self.max_renders:
            raise Stalled(
                f"the simulation rendered {loop.renders} attempts for a budget of "
                f"{self.max_renders} (requests x max attempts) by t={now:.3f} s: a retry "
                "that does not advance its attempt?"
            )
        mark = (loop.renders, len(loop.done_at))
        self._idle = 0 if mark != self._last else self._idle + 1
        self._last = mark
        if self._idle > self.idle_turns:
            raise Stalled(
                f"{self.idle_turns} simulator turns at t={now:.3f} s without a render "
                "starting or a request finishing: a policy whose wake-up never cuts a batch?"
            )


def profile_key(profile: Profile) -> BatchKey:
    """The batch key every simulated request of a profile shares."""
    return BatchKey(
        model=profile.model,
        width=profile.width,
        height=profile.height,
        steps=profile.steps,
        guidance=True,
        sampler="default",
        precision=profile.precision,
        device_class=profile.device_class,
    )


def render_cost(profile: Profile, key: BatchKey) -> StageCost | None:
    """The profile's render cost for ``key``: any adapter, and another step count scaled by
    its steps (a render's time is about linear in its steps); None for another model."""
    if dataclasses.replace(key, adapter="", steps=profile.steps) != profile_key(profile):
        return None
    return profile.render.scaled(key.steps / profile.steps)


def simulate(policy: Policy, cfg: SimConfig) -> SimResult:
    """Run one mode over the configured arrivals; the same inputs give the same result."""
    profile = cfg.profile
    key = profile_key(profile)
    qa = cfg.qa.policy()
    sched = Scheduler(
        policy,
        qa=qa,
        # Every adapter's key costs what the profile measured (plus its switch_s), and a
        # key of another step count the profile's time scaled by its steps.
        cost=(lambda k: render_cost(profile, k)) if cfg.priced else None,
        admission=AdmissionConfig(cfg.max_queue_per_key, cfg.render_workers),
        fair_share=cfg.fair_share,
    )
    rng = random.Random(cfg.seed)
    loop = _Loop(
        cfg,
        sched,
        SimulatedExecutor(
            profile.render, profile.device_class, rng, cfg.jitter, cfg.speed, profile.steps
        ),
        SimulatedScorer(
            profile.score,
            profile.device_class,
            cfg.seed,
            cfg.failure_rate,
            cfg.hard_share,
            qa.threshold,
            cfg.outcomes,
            cfg.fix_curve,
        ),
        ScoreStage(
            score_cap(cfg.score_batch_size, policy.max_batch_size, profile.score.cap()),
            profile.device_class,
            # Step mode's loop takes turns with a scorer on its device itself (below).
            shared=profile.device_class if cfg.share_device and policy.name != "step" else None,
        ),
        free=cfg.render_workers,
    )
    if policy.name == "step":
        if cfg.score_in_workers:
            raise ConfigError("step mode's loop scores beside its steps, not in its slots")
        loop.steps = _step_loops(policy, cfg)
        loop.free = sum(s.cap for s in loop.steps)  # the loops' slots
    requests = []
    for i, a in enumerate(cfg.arrivals):
        deadline_s = a.deadline_s if a.deadline_s is not None else cfg.deadline_s
        if cfg.streams is not None:
            deadline_s = None  # closed loop: arrival times, and so deadlines, are not known
        requests.append(
            Request(
                id=f"r{i:07d}",
                prompt=a.prompt or f"prompt {i}",
                key=dataclasses.replace(key, adapter=a.lora, steps=a.steps or key.steps),
                base_seed=cfg.seed * 1_000_003 + i,
                priority=a.priority,
                arrival=a.t,
                deadline=None if deadline_s is None else a.t + deadline_s,
            )
        )
    if cfg.streams is None:
        for req in requests:
            loop.push(req.arrival, _ARRIVE, req)
    else:
        loop.pending.extend(requests[cfg.streams :])
        for req in requests[: cfg.streams]:
            loop.push(0.0, _ARRIVE, req)
    now = 0.0
    guard = _ProgressGuard(len(requests) * qa.max_attempts)
    while loop.heap:
        now, _, kind, payload = heapq.heappop(loop.heap)
        loop.handle(now, kind, payload)
        while loop.heap and loop.heap[0][0] == now:
            _, _, kind, payload = heapq.heappop(loop.heap)
            loop.handle(now, kind, payload)
        loop.dispatch(now)
        guard.check(loop, now)
    states = sched.states()
    rejected = sum(1 for s in states.values() if s is RequestState.REJECTED)
    served = [r for r in sorted(loop.done_at) if states[r] is not RequestState.REJECTED]
    return SimResult(
        mode=policy.name,
        ledger=sched.ledger.report(cfg.price_per_hour),
        latencies=tuple(loop.done_at[r] - loop.arrived[r] for r in served),
        ids=tuple(served),
        # Step mode: the running batch's size at every step.
        batch_sizes=tuple(
            [n for s in loop.steps for n in s.step_sizes] if loop.steps else loop.batch_sizes
        ),
        accepted=loop.accepted,
        escalated=loop.escalated,
        rejected=rejected,
        unfinished=sum(1 for s in states.values() if s not in TERMINAL),
        renders=loop.renders,
        rerenders=loop.rerenders,
        makespan_s=now,
        log=tuple(loop.log),
    )
