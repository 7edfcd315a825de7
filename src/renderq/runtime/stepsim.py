"""Step-level batching on a virtual clock: :class:`VirtualStepLoop`, and a trace through it.

- :class:`VirtualStepLoop` is the simulator's step loop. At every step boundary it applies
  the step batcher's plan as the real loop (``backends.step_loop.StepLoop``) does: joiners'
  prepare, one step at the running batch's size, the decode of those that finished, each
  charged from a :class:`~renderq.core.step.StepCost`. In ``--mode step`` the whole-batch
  simulator (:mod:`renderq.runtime.sim`) feeds it the scheduler's one-request batches,
  with the quality gate and its regenerations.
- :func:`simulate_step` runs a trace straight through one (no scheduler, no gate): each
  request joins at the first boundary at or after it arrives, and an idle loop waits for
  the next arrival. It measures step batching alone, to set beside the whole-batch
  simulator on the same trace (``benchmarks/step_sim.py``) or beside a real ``StepLoop``
  run of it (``benchmarks/step_real.py``; a test checks that the two make the same
  decisions on an executor whose costs the cost model states exactly).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.simulated import check_speed, speed_at
from renderq.core.errors import ConfigError, Stalled
from renderq.core.stats import percentile
from renderq.core.step import StepBatcher, StepCost
from renderq.core.types import Batch, BatchResult, ItemResult, Request


@dataclass(frozen=True, slots=True)
class StepSimResult:
    """The outcome of one step-mode run of a trace: simulated (:func:`simulate_step`), or a
    real loop's as ``benchmarks/step_real.py`` reads it."""

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
    ids = [r.id for r in requests]
    if len(set(ids)) != len(ids):
        raise ConfigError("simulated requests need distinct ids")
    loop = VirtualStepLoop(cost, cost.cap if cap is None else cap, "sim")
    pending = deque(sorted(requests, key=lambda r: r.arrival))
    latencies: dict[str, float] = {}
    spent: dict[str, float] = {}
    now = 0.0
    turns, budget = 0, 4 * (sum(r.key.steps for r in requests) + len(requests)) + 10
    while pending or loop.held:
        turns += 1
        if turns > budget:
            raise Stalled(f"step simulation made no progress by t={now:.3f} s")
        if not loop.held and pending[0].arrival > now:
            now = pending[0].arrival
        while pending and pending[0].arrival <= now:
            r = pending.popleft()
            loop.add(Batch(len(requests) - len(pending), r.key, (r,), now, 1), now)
        now, finished, _ = loop.boundary(now)
        for batch, result in finished:
            (r,) = batch.requests
            latencies[r.id] = now - r.arrival
            spent[r.id] = result.device_seconds
    return StepSimResult(
        latencies, sum(spent.values()), spent, tuple(loop.step_sizes), loop.preemptions, now
    )


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
    preemptions: int = 0
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
        self.preemptions += len(plan.preempt)
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
