"""Step-level batching on a virtual clock: the step batcher driven by a per-step cost model.

One device, one running batch. At each step boundary the batcher's plan is applied
(joiners pay their prepare time, then the step runs at the cost of its running-batch
size); requests whose last step ran are decoded in one batch and finish. Arrivals are
submitted at the first boundary at or after they arrive; an idle device jumps to the next
arrival. Every request's progress is kept across a pause, so a preempted request resumes
where it stopped.

This is the model of step mode alone (no quality gate, no scoring): it predicts latency
and device-seconds per image for a cost profile, to set beside the whole-batch simulator
(:mod:`renderq.runtime.sim`) on the same trace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from renderq.core.errors import ConfigError, Stalled
from renderq.core.stats import percentile
from renderq.core.step import StepBatcher, StepCost
from renderq.core.types import Request


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
        if not batcher.running and pending and pending[0].arrival > now:
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
