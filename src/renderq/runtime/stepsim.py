"""Step-level batching driven end to end: on a virtual clock, and on a real one.

Both drivers apply the step batcher's plan at each boundary the same way: preempted
requests are set aside with their state, resumed ones taken back, joiners prepared, then
one step of the running batch; requests whose last step ran are decoded in one batch and
finish. Arrivals are submitted at the first boundary at or after they arrive; an idle
device waits for the next arrival.

- :func:`simulate_step` charges each call from a :class:`~renderq.core.step.StepCost`
  (joiners' prepare, the step at its running-batch size, the decode batch) on a virtual
  clock: it predicts latency and device-seconds per image for a cost profile, to set
  beside the whole-batch simulator (:mod:`renderq.runtime.sim`) on the same trace.
- :func:`run_steps` drives a real :class:`~renderq.core.step.StepRunner` (the step
  executor, or a fake) on a clock: a real step-mode run of a trace.

Neither has the quality gate: they measure step batching alone. With the gate, the
scheduler and its regenerations, step mode runs through the scheduler like every mode
(``--mode step``): the real engine renders through ``backends.step_loop.StepLoop``'s
slots, and the whole-batch simulator through :class:`VirtualStepLoop` here, which charges
the same :class:`~renderq.core.step.StepCost` on its virtual clock.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.simulated import check_speed, speed_at
from renderq.core.errors import ConfigError, Stalled
from renderq.core.stats import percentile
from renderq.core.step import StepBatcher, StepCost, StepRunner
from renderq.core.types import Batch, BatchResult, ItemResult, Request


@dataclass(frozen=True, slots=True)
class StepSimResult:
    """The outcome of one simulated step-mode run."""

    #: Seconds from arrival to decoded image, by request id.
    latencies: dict[str, float]
    #: Device-seconds of every prepare, step and decode.
    device_seconds: float
    #: Device-seconds booked to each request (its prepare, step shares and decode share).
    spent: dict[str, float]
    #: Running-batch size of every step, in order.
    step_sizes: tuple[int, ...]
    preemptions: int
    makespan_s: float

    def percentile(self, q: float) -> float | None:
        """Latency percentile (nearest rank), seconds."""
        return percentile(self.latencies.values(), q)

    @property
    def seconds_per_image(self) -> float:
        """Device-seconds per finished image."""
        return self.device_seconds / len(self.latencies) if self.latencies else 0.0

    @property
    def mean_running(self) -> float:
        """Mean running-batch size over the steps."""
        return sum(self.step_sizes) / len(self.step_sizes) if self.step_sizes else 0.0


def simulate_step(
    cost: StepCost, requests: Sequence[Request], cap: int | None = None
) -> StepSimResult:
    """Run ``requests`` (their ``arrival``, ``priority`` and ``key.steps``) in step mode."""
    limit = cost.cap if cap is None else cap
    if limit < 1 or limit > cost.cap:
        raise ConfigError(f"step cap must be from 1 to {cost.cap} (the cost model), got {cap}")
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise ConfigError("simulated requests need distinct ids")
    batcher = StepBatcher(cap=limit)
    pending = sorted(requests, key=lambda r: r.arrival)
    arrival = {r.id: r.arrival for r in requests}
    remaining: dict[str, int] = {}
    spent: dict[str, float] = {}
    latencies: dict[str, float] = {}
    sizes: list[int] = []
    device_s, preemptions = 0.0, 0
    now = 0.0
    turns, budget = 0, 4 * (sum(r.key.steps for r in requests) + len(requests)) + 10
    while pending or not batcher.idle():
        turns += 1
        if turns > budget:
            raise Stalled(f"step simulation made no progress by t={now:.3f} s")
        if batcher.idle() and pending[0].arrival > now:
            now = pending[0].arrival
        while pending and pending[0].arrival <= now:
            r = pending.pop(0)
            batcher.submit(r, now)
        plan = batcher.plan(now)
        if not plan.run:
            continue
        preemptions += len(plan.preempt)
        for r in plan.join:
            remaining[r.id] = r.key.steps
            spent[r.id] = spent.get(r.id, 0.0) + cost.prepare_s
        prepare = cost.prepare_s * len(plan.join)
        step = cost.step.latency(len(plan.run))
        now += prepare + step
        sizes.append(len(plan.run))
        for rid in plan.run:
            remaining[rid] -= 1
        done = [rid for rid in plan.run if remaining[rid] == 0]
        left = batcher.on_step(done, step, now)
        decode = cost.decode_s(len(left))
        now += decode
        device_s += prepare + step + decode
        for r in left:
            spent[r.id] += decode / len(left)
            latencies[r.id] = now - arrival[r.id]
            del remaining[r.id]
    for rid, share in batcher.spent.items():
        spent[rid] = spent.get(rid, 0.0) + share
    return StepSimResult(latencies, device_s, spent, tuple(sizes), preemptions, now)


@dataclass(slots=True)
class StepRun:
    """The outcome of a real step-mode run (:func:`run_steps`)."""

    #: Seconds from arrival to decoded image, by request id.
    latencies: dict[str, float] = field(default_factory=dict)
    #: Each request's image, by id.
    images: dict[str, Any] = field(default_factory=dict)
    #: Device-seconds the runner booked to each request.
    spent: dict[str, float] = field(default_factory=dict)
    #: Running-batch size of every step, in order.
    step_sizes: list[int] = field(default_factory=list)
    preemptions: int = 0
    wall_s: float = 0.0

    def percentile(self, q: float) -> float | None:
        """Latency percentile (nearest rank), seconds."""
        return percentile(self.latencies.values(), q)

    @property
    def device_seconds(self) -> float:
        """Device-seconds of the whole run (every request's prepare, steps and decode)."""
        return sum(self.spent.values())

    @property
    def seconds_per_image(self) -> float:
        """Device-seconds per finished image."""
        return self.device_seconds / len(self.latencies) if self.latencies else 0.0


def run_steps(
    runner: StepRunner,
    requests: Sequence[Request],
    cap: int,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> StepRun:
    """Run ``requests`` in step mode as they arrive (``arrival``: seconds after the start)."""
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise ConfigError("requests need distinct ids")
    batcher = StepBatcher(cap=cap)
    pending = sorted(requests, key=lambda r: r.arrival)
    running: dict[str, Any] = {}
    paused: dict[str, Any] = {}
    out = StepRun()
    start = clock()
    while pending or not batcher.idle():
        now = clock() - start
        if batcher.idle() and pending[0].arrival > now:
            sleep(pending[0].arrival - now)
            continue
        while pending and pending[0].arrival <= now:
            batcher.submit(pending.pop(0), now)
        plan = batcher.plan(now)
        if not plan.run:
            raise Stalled(f"the step batcher holds requests but ran none at t={now:.3f} s")
        out.preemptions += len(plan.preempt)
        for rid in plan.preempt:
            paused[rid] = running.pop(rid)
        for rid in plan.resume:
            running[rid] = paused.pop(rid)
        for r in plan.join:
            running[r.id] = runner.prepare(r)
        states = [running[rid] for rid in plan.run]
        seconds = runner.step(states)
        out.step_sizes.append(len(states))
        done = [s for s in states if s.done]
        batcher.on_step([s.request.id for s in done], seconds, clock() - start)
        if done:
            images = runner.images(done)
            end = clock() - start
            for s, image in zip(done, images, strict=True):
                rid = s.request.id
                out.images[rid] = image
                out.latencies[rid] = end - s.request.arrival
                out.spent[rid] = s.device_seconds
                del running[rid]
    out.wall_s = clock() - start
    return out


@dataclass(slots=True)
class VirtualStepLoop:
    """A step loop on a virtual clock, fed batches by the scheduler (``--mode step``).

    The simulator hands it each batch the scheduler cuts (one request per free slot) with
    :meth:`add` and calls :meth:`boundary` at every step boundary: the batcher's plan,
    joiners' prepare, one step at the running batch's size, the decode of those that
    finished. A batch comes back (with its requests' device-seconds: prepare, step shares,
    decode share, as the real loop books them) once all of its requests have finished.
    """

    cost: StepCost
    cap: int
    device_class: str
    #: The machine's speed over a replayed run, ``(t, factor)``: a step run at ``t`` takes
    #: ``factor`` times its cost (see ``SimConfig.speed``).
    speed: Sequence[tuple[float, float]] = ()
    batcher: StepBatcher = field(init=False)
    step_sizes: list[int] = field(default_factory=list)
    _remaining: dict[str, int] = field(default_factory=dict)
    _spent: dict[str, float] = field(default_factory=dict)
    _batch_of: dict[str, Batch] = field(default_factory=dict)
    _left: dict[int, int] = field(default_factory=dict)
    running: bool = False
    #: Score batches waiting for the next boundary (scorer on the loop's device), and
    #: when the device is free of the last one scored while the loop was idle.
    _scores: list[tuple[float, Any]] = field(default_factory=list)
    _free_at: float = 0.0

    def __post_init__(self) -> None:
        if not 1 <= self.cap <= self.cost.cap:
            raise ConfigError(
                f"step cap must be from 1 to {self.cost.cap} (the step cost model), got {self.cap}"
            )
        check_speed(self.speed)
        self.batcher = StepBatcher(cap=self.cap)

    @property
    def held(self) -> int:
        """Requests the loop holds: running, waiting to join or paused."""
        return len(self._batch_of)

    def add(self, batch: Batch, now: float) -> None:
        """The scheduler's batch reaches the loop; its requests join at the next boundary."""
        self._left[batch.id] = batch.size
        for r in batch.requests:
            self._batch_of[r.id] = batch
            self._remaining[r.id] = r.key.steps
            self._spent[r.id] = 0.0
            self.batcher.submit(r, now)

    def add_score(self, seconds: float, payload: Any, now: float) -> float | None:
        """A score batch for the loop's device: when it ends if the loop is idle (it runs
        at once), else None (it runs at the next boundary, see :meth:`boundary`)."""
        if self.running:
            self._scores.append((seconds, payload))
            return None
        self._free_at = max(now, self._free_at) + seconds
        return self._free_at

    def boundary(
        self, now: float
    ) -> tuple[float, list[tuple[Batch, BatchResult]], list[tuple[float, Any]]]:
        """Run the next step from ``now``: when it ends, the batches that finished, and the
        score batches run first at this boundary with when each ended."""
        now = max(now, self._free_at)
        scored = []
        for seconds, payload in self._scores:
            now += seconds
            scored.append((now, payload))
        self._scores.clear()
        plan = self.batcher.plan(now)
        if not plan.run:
            return now, [], scored
        for r in plan.join:
            self._spent[r.id] += self.cost.prepare_s
        prepare = self.cost.prepare_s * len(plan.join)
        step = self.cost.step.latency(len(plan.run)) * speed_at(self.speed, now)
        self.step_sizes.append(len(plan.run))
        for rid in plan.run:
            self._remaining[rid] -= 1
            self._spent[rid] += step / len(plan.run)
        done = [rid for rid in plan.run if self._remaining[rid] == 0]
        end = now + prepare + step
        left = self.batcher.on_step(done, step, end)
        decode = self.cost.decode_s(len(left))
        end += decode
        out = []
        for r in left:
            self._spent[r.id] += decode / len(left)
            batch = self._batch_of[r.id]
            self._left[batch.id] -= 1
            if self._left[batch.id] == 0:
                del self._left[batch.id]
                items = tuple(ItemResult(q.id, image=q.id) for q in batch.requests)
                seconds = sum(self._spent.pop(q.id) for q in batch.requests)
                for q in batch.requests:
                    del self._batch_of[q.id], self._remaining[q.id]
                out.append((batch, BatchResult(batch.id, items, seconds, self.device_class)))
        return end, out, scored
