"""A simulated executor and scorer: costs from a profile, outcomes from seeded randomness."""

from __future__ import annotations

import bisect
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from renderq.core.cost import StageCost
from renderq.core.errors import ConfigError
from renderq.core.types import Batch, BatchResult, ItemResult, Request, ScoreResult


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{name} must be in [0, 1], got {value}")


def speed_at(speed: Sequence[tuple[float, float]], t: float) -> float:
    """A speed trace's factor at ``t``: its last step's at or before ``t`` (the first step's
    before it; 1 without a trace)."""
    if not speed:
        return 1.0
    return speed[max(0, bisect.bisect_right(speed, t, key=lambda step: step[0]) - 1)][1]


def check_speed(speed: Sequence[tuple[float, float]]) -> None:
    """A speed trace's times must be finite and ascending, its factors finite and > 0."""
    last = -math.inf
    for t, factor in speed:
        if not (math.isfinite(t) and t >= last):
            raise ConfigError(f"speed trace times must be finite and ascending: {t} after {last}")
        if not (math.isfinite(factor) and factor > 0):
            raise ConfigError(f"speed factors must be finite and > 0, got {factor} at t={t}")
        last = t


@dataclass(slots=True)
class SimulatedExecutor:
    """Takes ``cost.latency(n)`` device-seconds per batch, times ``1 + U(-jitter, jitter)``.

    ``speed``: ``(t, factor)`` steps of the machine's speed over the run (a replayed run's
    own: each real batch's seconds over its size's median); a batch cut at time ``t``
    takes ``factor`` times as long, the factor of the last step at or before ``t`` (the
    first step's before it). A batch whose LoRA adapter differs from the previous batch's
    takes the cost model's ``switch_s`` more, as a worker switching adapters does, and a
    batch with an adapter active takes ``adapter_factor`` times its curve.
    """

    cost: StageCost
    device_class: str
    rng: random.Random
    jitter: float = 0.0
    speed: Sequence[tuple[float, float]] = ()
    #: The steps ``cost`` was measured at (0: every batch at ``cost`` as it is); a batch
    #: of another step count takes its steps' share of it.
    steps: int = 0
    _adapter: str = field(default="", init=False, repr=False)
    #: Adapter switches made so far.
    switches: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        _check_fraction("jitter", self.jitter)
        check_speed(self.speed)

    def slowdown(self, t: float) -> float:
        """The speed trace's factor at time ``t`` (1 without a trace)."""
        return speed_at(self.speed, t)

    def run(self, batch: Batch) -> BatchResult:
        """Every item renders (its image is the request id); time comes from the cost model."""
        cost = self.cost.for_adapter(batch.key.adapter)
        if self.steps:
            cost = cost.scaled(batch.key.steps / self.steps)
        seconds = cost.latency(batch.size) * self.slowdown(batch.created_at)
        if self.jitter:
            seconds *= 1.0 + self.rng.uniform(-self.jitter, self.jitter)
        if batch.key.adapter != self._adapter:
            seconds += self.cost.switch_s
            self._adapter = batch.key.adapter
            self.switches += 1
        items = tuple(ItemResult(r.id, image=r.id) for r in batch.requests)
        return BatchResult(batch.id, items, seconds, self.device_class)


@dataclass(slots=True)
class SimulatedScorer:
    """QA failure model: each attempt fails with ``failure_rate``; "hard" prompts never pass.

    With a ``fix_curve`` the retries follow a measured regeneration curve instead: a
    prompt whose attempts so far failed passes at attempt ``k`` (k >= 1) with probability
    ``fix_curve[k - 1]`` (the last value for attempts past the curve), the first attempt
    still failing with ``failure_rate``. Outcomes depend only on ``(seed, request id,
    attempt)``, not on batching or event order, so every mode of one simulation sees the
    same failures.
    """

    cost: StageCost
    device_class: str
    seed: int
    failure_rate: float
    hard_share: float = 0.0
    threshold: float = 0.25
    #: Replayed outcomes, ``(request id, attempt) -> passed``: a real run's QA results,
    #: so a simulation of that run fails exactly the attempts that failed for real.
    outcomes: Mapping[tuple[str, int], bool] | None = None
    #: Pass probability of attempt k+1 among prompts whose attempts 0..k failed.
    fix_curve: tuple[float, ...] = ()

    def __post_init__(self) -> None:
        _check_fraction("failure rate", self.failure_rate)
        _check_fraction("hard share", self.hard_share)
        for k, value in enumerate(self.fix_curve, start=1):
            _check_fraction(f"fix curve at attempt {k}", value)

    def is_hard(self, request_id: str) -> bool:
        """Whether this prompt never passes the gate."""
        return random.Random(f"{self.seed}:hard:{request_id}").random() < self.hard_share

    def fail_chance(self, attempt: int) -> float:
        """The chance that attempt ``attempt`` fails, given that every earlier one failed."""
        if attempt == 0 or not self.fix_curve:
            return self.failure_rate
        return 1.0 - self.fix_curve[min(attempt, len(self.fix_curve)) - 1]

    def score_one(self, request: Request) -> float:
        """The score of one attempt: above the threshold when it passes, below when not."""
        rng = random.Random(f"{self.seed}:{request.id}:{request.attempt}")
        replayed = (
            None if self.outcomes is None else self.outcomes.get((request.id, request.attempt))
        )
        if replayed is not None:
            fails = not replayed
        else:
            fails = self.is_hard(request.id) or rng.random() < self.fail_chance(request.attempt)
        margin = rng.uniform(0.001, 0.1)
        return self.threshold - margin if fails else self.threshold + margin

    def score(self, requests: Sequence[Request]) -> ScoreResult:
        """Score a batch of attempts."""
        scores = tuple(self.score_one(r) for r in requests)
        return ScoreResult(scores, self.cost.latency(len(requests)), self.device_class)
