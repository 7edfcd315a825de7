"""The step-mode simulator on hand-computed cases and random workloads (virtual clock)."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renderq.backends.step_loop import StepLoop
from renderq.core.cost import LatencyCurve
from renderq.core.errors import ConfigError, ProfileError
from renderq.core.step import StepCost
from renderq.core.types import Request
from renderq.profiles import load_profile
from renderq.runtime.stepsim import simulate_step
from renderq.testing.fakes import FakeStepExecutor, FakeStepState, ManualClock
from tests.strategies import STEP_KEYS, step_workloads

FLAT = LatencyCurve((1, 4), (1.0, 1.0))


def req(rid: str, steps: int, arrival: float, priority: int = 0) -> Request:
    key = dataclasses.replace(STEP_KEYS[0], steps=steps)
    return Request(rid, f"prompt {rid}", key, arrival=arrival, priority=priority)


def test_a_late_request_joins_the_running_batch() -> None:
    cost = StepCost(FLAT, prepare_s=0.1, decode=LatencyCurve((1, 4), (0.2, 0.2)))
    result = simulate_step(cost, [req("a", 3, 0.0), req("b", 2, 0.5)])
    # a: prepare + step (1.1); b joins at 1.1: prepare + step (2.2); both step (3.2);
    # both finish and decode together (3.4).
    assert result.step_sizes == (1, 2, 2)
    assert result.latencies == pytest.approx({"a": 3.4, "b": 2.9})
    assert result.device_seconds == pytest.approx(3.4)
    assert result.spent == pytest.approx({"a": 0.1 + 1 + 0.5 + 0.5 + 0.1, "b": 0.1 + 1 + 0.1})


def test_an_urgent_request_preempts_and_the_bulk_one_resumes() -> None:
    result = simulate_step(
        StepCost(FLAT), [req("bulk", 4, 0.0), req("urgent", 1, 0.5, priority=1)], cap=1
    )
    assert result.preemptions == 1
    assert result.latencies == pytest.approx({"urgent": 1.5, "bulk": 5.0})
    assert result.device_seconds == pytest.approx(5.0)  # nothing recomputed


def test_step_cost_from_a_whole_batch_profile() -> None:
    profile = load_profile("mini-sd-cpu")
    cost = StepCost.from_profile(profile)
    assert cost.step.sizes == profile.render.curve.sizes
    assert cost.step.latency(4) == pytest.approx(profile.render.latency(4) / profile.steps)
    assert "mini-sd-cpu" in cost.source and cost.cap == profile.render.curve.max_size


def test_bad_settings_name_the_value() -> None:
    with pytest.raises(ConfigError, match="got 9"):
        simulate_step(StepCost(FLAT), [req("a", 1, 0.0)], cap=9)
    with pytest.raises(ConfigError, match="distinct ids"):
        simulate_step(StepCost(FLAT), [req("a", 1, 0.0), req("a", 2, 0.0)])
    with pytest.raises(ConfigError, match="-1"):
        StepCost(FLAT, prepare_s=-1)


@settings(max_examples=100, deadline=None)
@given(
    reqs=step_workloads(),
    cap=st.integers(1, 4),
    prepare=st.sampled_from([0.0, 0.05]),
    decode=st.sampled_from([None, LatencyCurve((1, 4), (0.1, 0.2))]),
)
def test_every_request_finishes_once_and_device_time_adds_up(
    reqs: list[Request], cap: int, prepare: float, decode: LatencyCurve | None
) -> None:
    cost = StepCost(LatencyCurve((1, 4), (0.2, 0.5)), prepare_s=prepare, decode=decode)
    result = simulate_step(cost, reqs, cap=cap)
    assert set(result.latencies) == {r.id for r in reqs}
    assert all(lat > 0 for lat in result.latencies.values())
    assert sum(result.step_sizes) == sum(r.key.steps for r in reqs)  # no step redone
    assert max(result.step_sizes) <= cap
    assert sum(result.spent.values()) == pytest.approx(result.device_seconds)


def test_step_profile_documents_parse_and_bad_ones_name_the_field() -> None:
    doc = {
        "name": "p",
        "source": {"kind": "measured"},
        "step": {"points": [[1, 0.02], [4, 0.05]]},
        "prepare_s": 0.01,
        "decode": {"points": [[1, 0.03], [4, 0.06]]},
    }
    cost = StepCost.from_dict(doc)
    assert cost.step.latency(2) == pytest.approx(0.03) and cost.prepare_s == 0.01
    assert cost.decode_s(4) == 0.06 and cost.decode_s(0) == 0.0 and cost.source == "measured: p"
    with pytest.raises(ProfileError, match="step"):
        StepCost.from_dict({"name": "p"})


@dataclasses.dataclass
class ArrivingFake:
    """The fake step executor on a manual clock, which also plays the trace's arrivals.

    Each step and decode advances the clock by its seconds, then hands the loop every
    request that has arrived by then; when the last request held has been decoded, the
    clock jumps to the next arrival. It all runs on the loop's own thread, between its
    steps, so a real :class:`StepLoop` meets each request exactly when the simulator's
    loop does.
    """

    clock: ManualClock
    trace: list[Request]
    fake: FakeStepExecutor = dataclasses.field(default_factory=FakeStepExecutor)
    loop: Any = None
    answers: list[Any] = dataclasses.field(default_factory=list)
    answered_at: dict[str, float] = dataclasses.field(default_factory=dict)
    held: int = 0
    all_in: threading.Event = dataclasses.field(default_factory=threading.Event)

    @property
    def device_class(self) -> str:
        return self.fake.device_class

    def arrive(self) -> None:
        if not self.held and self.trace and self.trace[0].arrival > self.clock.t:
            self.clock.t = self.trace[0].arrival
        while self.trace and self.trace[0].arrival <= self.clock.t:
            r = self.trace.pop(0)
            self.answers.append(self.loop.submit(r))
            self.held += 1
        if not self.trace:
            self.all_in.set()

    def prepare(self, request: Request) -> FakeStepState:
        return self.fake.prepare(request)

    def step(self, running: list[FakeStepState]) -> float:
        seconds = self.fake.step(running)
        self.clock.advance(seconds)
        self.arrive()
        return seconds

    def decode(self, finished: list[FakeStepState]) -> list[Any]:
        items = self.fake.decode(finished)
        self.clock.advance(self.fake.decode_s)
        self.answered_at.update((s.request.id, self.clock.t) for s in finished)
        self.held -= len(finished)
        self.arrive()
        return items


@settings(max_examples=60, deadline=None)
@given(reqs=step_workloads(), cap=st.integers(1, 4))
def test_the_real_step_loop_makes_the_simulators_decisions(reqs: list[Request], cap: int) -> None:
    """Same trace, a runner whose costs the cost model states exactly: same steps, times."""
    clock = ManualClock()
    runner = ArrivingFake(clock, sorted(reqs, key=lambda r: r.arrival))
    loop = StepLoop(runner, cap, clock=clock)
    runner.loop = loop
    try:
        loop.call(runner.arrive)
        assert runner.all_in.wait(30)
        results = [a.result(timeout=30) for a in runner.answers]
    finally:
        loop.close()
    f = runner.fake
    sizes = tuple(range(1, cap + 1))
    cost = StepCost(
        LatencyCurve(sizes, tuple(f.base_s + f.row_s * n for n in sizes)),
        decode=LatencyCurve(sizes, tuple(f.decode_s for _ in sizes)),
    )
    sim = simulate_step(cost, reqs, cap=cap)
    assert tuple(len(s) for s in f.steps) == sim.step_sizes
    assert loop.preemptions == sim.preemptions
    arrival = {r.id: r.arrival for r in reqs}
    assert {rid: t - arrival[rid] for rid, t in runner.answered_at.items()} == pytest.approx(
        sim.latencies
    )
    assert sorted(item.image for item, _ in results) == sorted((r.id, 0) for r in reqs)
    assert sum(s for _, s in results) == pytest.approx(sim.device_seconds)


def _sim(policy, trace, cost=None, **kw):  # type: ignore[no-untyped-def]
    from renderq.runtime.sim import SimConfig, simulate

    return simulate(policy, SimConfig(load_profile("mini-sd-cpu"), trace, step_cost=cost, **kw))


def test_step_mode_through_the_scheduler_keeps_the_gate_and_books_every_step() -> None:
    import random

    from renderq.core.policies import Dynamic, StepSlots
    from renderq.runtime.arrivals import arrivals

    trace = tuple(arrivals("poisson:5", 400, random.Random(3)))
    cost = StepCost(LatencyCurve((1, 8), (0.01, 0.04)), prepare_s=0.002)
    whole = _sim(Dynamic(0.1, 8), trace, failure_rate=0.2)
    step = _sim(StepSlots(8), trace, cost, failure_rate=0.2)
    # The same outcomes (they depend on request and attempt, not on batching), nothing
    # left, and the ledger holds the step loop's device time: every step at its running
    # size, every request's prepare (first attempts and regenerations alike).
    assert step.unfinished == 0 and step.accepted + step.escalated == 400
    assert (step.accepted, step.escalated, step.rerenders) == (
        whole.accepted, whole.escalated, whole.rerenders,
    )  # fmt: skip
    render = step.ledger.seconds["render"] + step.ledger.seconds["regen"]
    steps = sum(cost.step.latency(n) for n in step.batch_sizes)
    assert render == pytest.approx(steps + cost.prepare_s * (400 + step.rerenders))
    assert max(step.batch_sizes) <= 8 and step.mean_batch_size > 1.0


def test_a_request_alone_in_step_mode_takes_its_steps() -> None:
    from renderq.core.policies import StepSlots
    from renderq.runtime.arrivals import Arrival

    cost = StepCost(LatencyCurve((1, 8), (0.05, 0.2)), prepare_s=0.01)
    result = _sim(StepSlots(8), (Arrival(0.0),), cost, failure_rate=0.0)
    steps = load_profile("mini-sd-cpu").steps
    # The scheduler cuts it at once; scoring runs after the image comes back.
    assert result.batch_sizes == (1,) * steps
    assert result.ledger.seconds["render"] == pytest.approx(0.01 + steps * 0.05)


def test_a_replayed_hand_off_holds_each_step_mode_slot_but_is_not_booked() -> None:
    from renderq.core.policies import StepSlots
    from renderq.runtime.arrivals import Arrival

    cost = StepCost(LatencyCurve((1, 8), (0.05, 0.2)), prepare_s=0.01)
    steps = load_profile("mini-sd-cpu").steps
    plain = _sim(StepSlots(8), (Arrival(0.0),), cost, failure_rate=0.0)
    held = _sim(StepSlots(8), (Arrival(0.0),), cost, failure_rate=0.0, render_overhead_s=0.3)
    # The image reaches the engine (and its scorer) 0.3 s after the loop answered it.
    assert held.latencies[0] == pytest.approx(plain.latencies[0] + 0.3)
    assert held.ledger.seconds["render"] == pytest.approx(0.01 + steps * 0.05)


def test_a_replayed_speed_trace_slows_the_steps_run_in_a_slow_spell() -> None:
    from renderq.core.policies import StepSlots
    from renderq.runtime.arrivals import Arrival

    cost = StepCost(LatencyCurve((1, 8), (0.05, 0.2)), prepare_s=0.01)
    steps = load_profile("mini-sd-cpu").steps
    # Twice as slow from between the 4th step's start (0.16 s) and the 5th's (0.21 s) on:
    # 4 steps at 0.05 s, the rest at 0.1 s.
    spell = ((0.0, 1.0), (0.185, 2.0))
    result = _sim(StepSlots(8), (Arrival(0.0),), cost, failure_rate=0.0, speed=spell)
    assert result.batch_sizes == (1,) * steps
    assert result.ledger.seconds["render"] == pytest.approx(0.01 + 4 * 0.05 + (steps - 4) * 0.1)


def test_a_finished_request_is_scored_after_the_step_the_loop_starts_meanwhile() -> None:
    from renderq.core.policies import StepSlots
    from renderq.runtime.arrivals import Arrival

    # A (10 steps) and B (20) start together at 0.04 s a step. A's last step ends at 0.4 s;
    # the loop goes on with B at once, as a real loop does (it does not wait for the
    # engine to hear of A), so A's score (on the loop's device) runs after step 11.
    cost = StepCost(LatencyCurve((1, 8), (0.04, 0.04)))
    trace = (Arrival(0.0, steps=10), Arrival(0.0, steps=20))
    result = _sim(StepSlots(8), trace, cost, failure_rate=0.0, share_device=True)
    score = load_profile("mini-sd-cpu").score.latency(1)
    a = dict(zip(result.ids, result.latencies, strict=True))["r0000000"]
    assert a == pytest.approx(11 * 0.04 + score)


def test_step_mode_on_two_devices_runs_a_loop_on_each() -> None:
    from renderq.core.policies import StepSlots
    from renderq.runtime.arrivals import Arrival

    # A flat step cost (a GPU-like curve): 16 requests at once fill one loop of 8 twice
    # over, or two loops of 8 once each, in half the time for the same device-seconds.
    cost = StepCost(LatencyCurve((1, 8), (0.04, 0.04)))
    trace = tuple(Arrival(0.0) for _ in range(16))
    one = _sim(StepSlots(8), trace, cost, failure_rate=0.0)
    two = _sim(StepSlots(8), trace, cost, failure_rate=0.0, render_workers=2)
    steps = load_profile("mini-sd-cpu").steps
    assert one.accepted == two.accepted == 16 and two.unfinished == 0
    # Every step of both loops ran full: 8 requests each, never 16 in one.
    assert one.batch_sizes == (8,) * (2 * steps) and two.batch_sizes == (8,) * (2 * steps)
    assert two.makespan_s < 0.6 * one.makespan_s
    render = lambda r: r.ledger.seconds["render"]  # noqa: E731
    assert render(two) == pytest.approx(render(one)) == pytest.approx(2 * steps * 0.04)


def test_step_mode_takes_turns_with_a_scorer_on_its_device() -> None:
    import random

    from renderq.core.policies import StepSlots
    from renderq.runtime.arrivals import arrivals

    trace = tuple(arrivals("poisson:5", 300, random.Random(1)))
    cost = StepCost(LatencyCurve((1, 8), (0.01, 0.04)))
    apart = _sim(StepSlots(8), trace, cost, failure_rate=0.2)
    turns = _sim(StepSlots(8), trace, cost, failure_rate=0.2, share_device=True)
    # Scoring on the loop's device runs between steps: nothing starves, everything ends,
    # and requests wait longer than with a scorer of its own, by no more than its work.
    assert turns.unfinished == 0 and turns.accepted + turns.escalated == 300
    assert (turns.accepted, turns.rerenders) == (apart.accepted, apart.rerenders)
    p99 = turns.percentile(99) or 0.0
    assert (apart.percentile(99) or 0.0) <= p99 < (apart.percentile(99) or 0.0) + 2.0
