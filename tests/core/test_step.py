"""The step batcher: join, leave, preempt and resume at step boundaries, on a fake executor.

A small driver plays the shell: a fake clock that advances by each step's seconds,
arrivals submitted at the first boundary after they arrive, the fake step executor holding
each request's progress (paused ones set aside, never recomputed), some regenerations
through the same queue and some cancellations.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renderq.core.errors import ConfigError, ProfileError, UnknownRequest
from renderq.core.step import Phase, StepBatcher, StepCost, StepKey, StepPlan
from renderq.core.types import BatchKey, Request
from renderq.testing.fakes import FakeStepExecutor, FakeStepState
from tests.strategies import STEP_KEYS, step_workloads

KEY = STEP_KEYS[0]


def req(rid: str, steps: int, priority: int = 0, key: BatchKey = KEY) -> Request:
    return Request(rid, f"prompt {rid}", dataclasses.replace(key, steps=steps), priority=priority)


@dataclass
class Shell:
    """Applies plans to a fake step executor and checks every plan as it goes."""

    batcher: StepBatcher
    ex: FakeStepExecutor = field(default_factory=FakeStepExecutor)
    running: dict[str, FakeStepState] = field(default_factory=dict)
    paused: dict[str, FakeStepState] = field(default_factory=dict)
    left: list[tuple[str, int]] = field(default_factory=list)
    plans: list[StepPlan] = field(default_factory=list)
    step_seconds: float = 0.0
    now: float = 0.0
    known: dict[str, Request] = field(default_factory=dict)

    def submit(self, request: Request) -> None:
        self.known[request.id] = request
        self.batcher.submit(request, self.now)

    def boundary(self) -> StepPlan:
        plan = self.batcher.plan(self.now)
        self.plans.append(plan)
        self.check(plan)
        for rid in plan.preempt:
            self.paused[rid] = self.running.pop(rid)
        for rid in plan.resume:
            self.running[rid] = self.paused.pop(rid)
        for r in plan.join:
            assert r.id not in self.running and r.id not in self.paused
            self.running[r.id] = self.ex.prepare(r)
        assert set(plan.run) == set(self.running), (plan, list(self.running))
        if plan.run:
            states = [self.running[rid] for rid in plan.run]
            seconds = self.ex.step(states)
            self.step_seconds += seconds
            self.now += seconds
            done = [s.request.id for s in states if s.done]
            for r in self.batcher.on_step(done, seconds, self.now):
                self.ex.images([self.running.pop(r.id)])
                self.left.append((r.id, r.attempt))
        return plan

    def check(self, plan: StepPlan) -> None:
        """Invariants of every plan: cap, one key, top priority on the device, no idle room."""
        phases = self.batcher.phases()
        assert {rid for rid, p in phases.items() if p is Phase.RUNNING} == set(plan.run)
        assert len(set(plan.run)) == len(plan.run)
        if not plan.run:
            assert not phases
            return
        assert plan.key is not None
        live = [self.known[rid] for rid in phases]
        run = [self.known[rid] for rid in plan.run]
        cap = self.batcher.cap(plan.key) if callable(self.batcher.cap) else self.batcher.cap
        assert len(run) <= cap
        assert all(StepKey.of(r.key) == plan.key for r in run)
        # A running request makes way only for strictly higher priority (no thrashing).
        for rid in plan.preempt:
            assert max(r.priority for r in run) > self.known[rid].priority
        # The highest priority present is always on the device.
        assert max(r.priority for r in run) == max(r.priority for r in live)
        mine = [r for r in live if StepKey.of(r.key) == plan.key]
        others = [r.priority for r in live if StepKey.of(r.key) != plan.key]
        if not others or max(others) < max(r.priority for r in mine):
            # No other key is owed a turn: the batch is as full as the key allows, and
            # with the best of the key's requests.
            assert len(run) == min(cap, len(mine))
            left_out = [r.priority for r in mine if r.id not in plan.run]
            assert not left_out or min(r.priority for r in run) >= max(left_out)


def test_a_request_joins_the_running_batch_at_the_next_step() -> None:
    shell = Shell(StepBatcher(cap=4))
    shell.submit(req("a", 3))
    assert shell.boundary().run == ("a",)
    shell.submit(req("b", 2))
    plan = shell.boundary()
    assert plan.run == ("a", "b") and [r.id for r in plan.join] == ["b"]
    assert shell.boundary().run == ("a", "b")  # a finishes here (3 steps), b too (2)
    assert shell.left == [("a", 0), ("b", 0)] and shell.batcher.idle()
    assert shell.ex.steps == [("a",), ("a", "b"), ("a", "b")]


def test_different_step_counts_share_a_batch_and_leave_when_done() -> None:
    shell = Shell(StepBatcher(cap=4))
    for rid, steps in (("a", 1), ("b", 3), ("c", 2)):
        shell.submit(req(rid, steps))
    while not shell.batcher.idle():
        shell.boundary()
    assert shell.ex.steps == [("a", "b", "c"), ("b", "c"), ("b",)]
    assert shell.left == [("a", 0), ("c", 0), ("b", 0)]


def test_an_interactive_request_preempts_a_bulk_one_which_resumes_where_it_stopped() -> None:
    shell = Shell(StepBatcher(cap=1))
    shell.submit(req("bulk", 4))
    shell.boundary()
    shell.boundary()
    shell.submit(req("urgent", 2, priority=5))
    plan = shell.boundary()
    assert plan.preempt == ("bulk",) and plan.run == ("urgent",)
    assert shell.batcher.phases()["bulk"] is Phase.PAUSED
    assert shell.paused["bulk"].index == 2  # its progress is kept
    shell.boundary()
    plan = shell.boundary()
    assert plan.resume == ("bulk",) and plan.join == ()
    shell.boundary()
    assert shell.left == [("urgent", 0), ("bulk", 0)]
    assert shell.ex.prepared == ["bulk", "urgent"]  # prepared once each
    assert Counter(i for s in shell.ex.steps for i in s) == {"bulk": 4, "urgent": 2}


def test_a_higher_priority_key_pauses_the_whole_running_batch() -> None:
    other = STEP_KEYS[2]
    shell = Shell(StepBatcher(cap=4))
    shell.submit(req("a", 3))
    shell.submit(req("b", 3))
    shell.boundary()
    shell.submit(req("x", 1, priority=1, key=other))
    plan = shell.boundary()
    assert plan.key == StepKey.of(other) and set(plan.preempt) == {"a", "b"}
    plan = shell.boundary()
    assert set(plan.resume) == {"a", "b"} and plan.key == StepKey.of(KEY)


def test_equal_priority_keys_take_turns_by_draining() -> None:
    other = STEP_KEYS[1]
    shell = Shell(StepBatcher(cap=4))
    shell.submit(req("a", 2))
    shell.boundary()
    shell.submit(req("x", 1, key=other))
    shell.submit(req("b", 1))  # same key as a, but x came first
    plan = shell.boundary()
    assert plan.run == ("a",) and plan.preempt == () and plan.join == ()
    assert shell.boundary().run == ("x",)
    assert shell.boundary().run == ("b",)


def test_the_cap_follows_the_key() -> None:
    wide = StepKey.of(STEP_KEYS[2])
    shell = Shell(StepBatcher(cap=lambda k: 1 if k == wide else 3))
    for i in range(4):
        shell.submit(req(f"n{i}", 1))
    assert len(shell.boundary().run) == 3


def test_bad_calls_name_the_bad_value() -> None:
    b = StepBatcher(cap=2)
    with pytest.raises(ConfigError, match="-1"):
        StepBatcher(cap=-1)
    with pytest.raises(ConfigError, match="no running batch"):
        b.on_step([], 0.1, 0.0)
    b.submit(req("a", 2), 0.0)
    with pytest.raises(ConfigError, match="'a' is already"):
        b.submit(req("a", 2), 0.0)
    b.plan(0.0)
    with pytest.raises(UnknownRequest, match="zz"):
        b.on_step(["zz"], 0.1, 0.1)
    with pytest.raises(ConfigError, match="nan"):
        b.on_step([], float("nan"), 0.1)
    with pytest.raises(ConfigError, match="'a' is running"):
        b.cancel("a")


def test_a_request_that_left_can_be_forgotten_one_still_here_cannot() -> None:
    b = StepBatcher(cap=2)
    b.submit(req("a", 1), 0.0)
    b.submit(req("b", 2), 0.0)
    b.plan(0.0)
    assert [r.id for r in b.on_step(["a"], 0.2, 0.2)] == ["a"]
    assert b.spent == {"a": 0.1, "b": 0.1}
    with pytest.raises(ConfigError, match="'b' is still in the step batcher"):
        b.forget("b")
    b.forget("a")  # a long-lived shell keeps no record of it
    assert b.spent == {"b": 0.1}


def _run(reqs: list[Request], cap: int, seed: int) -> tuple[Shell, set[str], set[str]]:
    """Drive a workload to the end; some results regenerate once, some requests cancel."""
    rng = random.Random(seed)
    shell = Shell(StepBatcher(cap=cap))
    pending = sorted(reqs, key=lambda r: r.arrival)
    regen: set[str] = set()
    cancelled: set[str] = set()
    boundaries = 0
    while pending or not shell.batcher.idle():
        if not shell.batcher.running and pending and pending[0].arrival > shell.now:
            shell.now = pending[0].arrival  # idle: jump to the next arrival
        while pending and pending[0].arrival <= shell.now:
            shell.submit(pending.pop(0))
        for rid, phase in shell.batcher.phases().items():
            if phase is not Phase.RUNNING and rng.random() < 0.02:
                assert shell.batcher.cancel(rid) is phase
                shell.paused.pop(rid, None)
                cancelled.add(rid)
        before = len(shell.left)
        shell.boundary()
        for rid, attempt in shell.left[before:]:
            if attempt == 0 and rng.random() < 0.2:  # the QA gate sent it back
                shell.submit(dataclasses.replace(shell.known[rid], attempt=1))
                regen.add(rid)
        boundaries += 1
        assert boundaries < 10_000, "no progress"
    return shell, regen, cancelled


@settings(max_examples=200, deadline=None)
@given(reqs=step_workloads(), cap=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_nothing_lost_or_finished_twice_never_over_cap_never_mixed(
    reqs: list[Request], cap: int, seed: int
) -> None:
    shell, regen, cancelled = _run(reqs, cap, seed)
    assert shell.batcher.idle() and not shell.paused and not shell.running
    left = Counter(shell.left)
    assert all(n == 1 for n in left.values()), left  # no attempt finished twice
    prepared = Counter(shell.ex.prepared)
    rode = Counter(rid for s in shell.ex.steps for rid in s)
    for r in reqs:
        finished = {a for (rid, a) in left if rid == r.id}
        steps = r.key.steps
        if r.id in cancelled:  # cancelled while waiting or paused: at most one attempt cut
            assert prepared[r.id] - len(finished) in (0, 1)
            assert len(finished) * steps <= rode[r.id] < (len(finished) + 1) * steps
            continue
        # Nothing lost: every attempt finished; each prepared once and stepped exactly its
        # own step count (a paused request resumed, never redone).
        assert finished == ({0, 1} if r.id in regen else {0}), (r.id, finished)
        assert prepared[r.id] == len(finished)
        assert rode[r.id] == len(finished) * steps, (r.id, rode[r.id])
    # Device time is shared out exactly.
    spent = sum(shell.batcher.spent.values())
    assert spent == pytest.approx(shell.step_seconds, rel=1e-9, abs=1e-12)


def test_a_step_cost_from_a_loops_trace_takes_medians_and_prices_sizes_it_never_reached() -> None:
    steps = [(1, 0.10), (2, 0.30), (2, 0.18), (2, 0.20), (1, 0.12), (1, 0.11)]
    cost = StepCost.from_trace(steps, [0.05, 0.01, 0.02], [(1, 0.4), (2, 0.5), (2, 0.7)], cap=4)
    assert cost.step.sizes == (1, 2, 4)
    assert cost.step.seconds == pytest.approx((0.11, 0.20, 0.40))  # 4 at size 2's per request
    assert cost.prepare_s == pytest.approx(0.02)
    assert cost.decode_s(1) == pytest.approx(0.4) and cost.decode_s(2) == pytest.approx(0.6)
    assert cost.decode_s(4) == pytest.approx(1.2)  # never decoded 4 at once: per request
    assert cost.source.startswith("measured")
    assert StepCost.from_trace([(3, 0.3)]).cap == 3  # no cap given: what it saw
    with pytest.raises(ProfileError, match="at least one measured step"):
        StepCost.from_trace([])
