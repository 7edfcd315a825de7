"""The real-time engine and the simulator cut the same render and score batches, in order.

Both drive the same scheduler and the same score stage; for one trace, with a
deterministic executor and scorer whose QA outcomes agree, the sequence of batches that
come back must be identical, request by request and attempt by attempt.
"""

from __future__ import annotations

import pytest

from renderq.core.policies import AdHoc, Dynamic, Policy, Window
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.settings import QASettings
from renderq.core.types import Request
from renderq.profiles import load_profile
from renderq.runtime.arrivals import Arrival
from renderq.runtime.realtime import RealtimeEngine
from renderq.runtime.sim import SimConfig, profile_key, simulate
from renderq.testing.fakes import FakeExecutor, RecordingListener, ScriptedScorer

PROFILE = load_profile("article-sdxl-a100")
N = 23
#: Attempts that fail the gate, in both drivers.
FAILS = {("r0000003", 0), ("r0000003", 1), ("r0000010", 0), ("r0000017", 0)}
THRESHOLD = 0.25


def _real(policy: Policy, score_batch_size: int) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
    sched = Scheduler(policy, qa=QAPolicy(threshold=THRESHOLD, max_attempts=3))
    dc = PROFILE.device_class
    log = RecordingListener()
    scorer = ScriptedScorer(frozenset(FAILS), dc, pass_score=THRESHOLD + 0.1, fail_score=0.1)
    engine = RealtimeEngine(
        sched, {dc: FakeExecutor(dc)}, scorer, log, score_batch_size=score_batch_size
    )
    key = profile_key(PROFILE)
    for i in range(N):  # the simulator's ids and seeds for the same trace
        engine.submit(Request(f"r{i:07d}", f"prompt {i}", key, base_seed=i))
    engine.run()
    return log.log()


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
            qa=QASettings(THRESHOLD, max_attempts=3),
            outcomes=outcomes,
            score_batch_size=score_batch_size,
            share_device=True,  # the fakes share one device class, as on a CPU
        ),
    )
    real = _real(policy, score_batch_size)
    assert list(sim.log) == real
    assert {s for s, _ in real} == {"render", "score"}
    assert any(a > 0 for _, ids in real for _, a in ids)  # regenerations are in the trace
