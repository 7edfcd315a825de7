"""The real-time engine and the simulator cut the same render and score batches, in order.

Both drive the same scheduler and the same score stage; for one trace, with a
deterministic executor and scorer whose QA outcomes agree, the sequence of batches that
come back must be identical, request by request and attempt by attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from renderq.core.policies import AdHoc, Dynamic, Policy, Window
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchResult, ItemResult, Request, ScoreResult
from renderq.engine.arrivals import Arrival
from renderq.engine.realtime import RealtimeEngine, Step
from renderq.engine.sim import SimConfig, profile_key, simulate
from renderq.profiles import load_profile

PROFILE = load_profile("article-sdxl-a100")
N = 23
#: Attempts that fail the gate, in both drivers.
FAILS = {("r0000003", 0), ("r0000003", 1), ("r0000010", 0), ("r0000017", 0)}
THRESHOLD = 0.25


@dataclass
class Executor:
    device_class: str = PROFILE.device_class

    def run(self, batch: Batch) -> BatchResult:
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, 0.001, self.device_class)


@dataclass
class Scorer:
    device_class: str = PROFILE.device_class
    calls: list[int] = field(default_factory=list)

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        scores = tuple(THRESHOLD - 0.1 if tuple(im) in FAILS else THRESHOLD + 0.1 for im in images)
        return ScoreResult(scores, 0.001, self.device_class)


@dataclass
class Log:
    entries: list[tuple[str, tuple[tuple[str, int], ...]]] = field(default_factory=list)

    def started(self, batch: Batch) -> None:
        pass

    def step(self, step: Step) -> None:
        reqs = step.batch.requests if step.kind == "render" and step.batch else step.scored
        self.entries.append((step.kind, tuple((r.id, r.attempt) for r in reqs)))


def _real(policy: Policy, score_batch_size: int) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
    sched = Scheduler(policy, qa=QAPolicy(threshold=THRESHOLD, max_attempts=3))
    log = Log()
    engine = RealtimeEngine(
        sched, {PROFILE.device_class: Executor()}, Scorer(), log, score_batch_size=score_batch_size
    )
    key = profile_key(PROFILE)
    for i in range(N):  # the simulator's ids and seeds for the same trace
        engine.submit(Request(f"r{i:07d}", f"prompt {i}", key, base_seed=i))
    engine.run()
    return log.entries


@pytest.mark.parametrize(
    "policy", [AdHoc(), Dynamic(0.0, 4), Window(batch_size=5)], ids=lambda p: p.name
)
@pytest.mark.parametrize("score_batch_size", [3, 32])
def test_real_time_and_simulated_drivers_cut_the_same_batches(
    policy: Policy, score_batch_size: int
) -> None:
    outcomes = {(f"r{i:07d}", a): (f"r{i:07d}", a) not in FAILS for i in range(N) for a in range(3)}
    sim = simulate(
        policy,
        SimConfig(
            PROFILE,
            tuple(Arrival(0.0) for _ in range(N)),
            max_attempts=3,
            threshold=THRESHOLD,
            outcomes=outcomes,
            score_batch_size=score_batch_size,
            share_device=True,  # the fakes share one device class, as on a CPU
        ),
    )
    real = _real(policy, score_batch_size)
    assert list(sim.log) == real
    assert {s for s, _ in real} == {"render", "score"}
    assert any(a > 0 for _, ids in real for _, a in ids)  # regenerations are in the trace
