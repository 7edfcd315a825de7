"""The real-time engine as a long-running service loop: thread-safe calls, stop."""

from __future__ import annotations

import threading

import pytest

from renderq.core.events import Accepted
from renderq.core.policies import Dynamic
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchKey, Request
from renderq.runtime.realtime import RealtimeEngine, Step
from renderq.testing.fakes import FakeExecutor, ScriptedScorer

KEY = BatchKey("m", 64, 64, 2, True, "ddim", "fp32", "cpu")


class Collect:
    def __init__(self) -> None:
        self.accepted: list[str] = []
        self.done = threading.Event()

    def started(self, batch: Batch) -> None:
        pass

    def step(self, step: Step) -> None:
        self.accepted += [e.request.id for e in step.events if isinstance(e, Accepted)]
        if len(self.accepted) >= 5:
            self.done.set()


def test_calls_submit_from_other_threads_while_the_loop_keeps_running() -> None:
    sched = Scheduler(Dynamic(0.01, 4), qa=QAPolicy(threshold=0.5))
    listener = Collect()
    engine = RealtimeEngine(sched, {"cpu": FakeExecutor()}, ScriptedScorer(), listener)
    loop = threading.Thread(target=lambda: engine.run(until_idle=False), daemon=True)
    loop.start()
    verdicts = [
        engine.call(lambda now, i=i: sched.submit(Request(f"r{i}", "a red circle", KEY), now))
        for i in range(5)
    ]
    assert all(v.result(timeout=10).admitted for v in verdicts)
    assert listener.done.wait(timeout=10)
    assert loop.is_alive()  # idle, but still serving
    bad = engine.call(lambda now: sched.state("nope"))
    with pytest.raises(KeyError, match="nope"):
        bad.result(timeout=10)
    engine.stop()
    loop.join(timeout=10)
    assert not loop.is_alive() and sorted(listener.accepted) == [f"r{i}" for i in range(5)]


class Broken(Collect):
    def step(self, step: Step) -> None:
        raise RuntimeError("listener broke")


class TickingClock:
    """A clock that moves ``step`` seconds every time it is read (a slow, busy thread)."""

    def __init__(self, step: float) -> None:
        self.t, self.step = 0.0, step

    def __call__(self) -> float:
        self.t += self.step
        return self.t


@pytest.mark.parametrize("step", [0.01, 0.05])
def test_a_timer_that_runs_out_between_two_clock_reads_still_cuts_the_batch(step: float) -> None:
    # The loop once read the clock for ``schedule`` and again for ``next_wakeup``: when the
    # oldest request's delay ran out in between, neither cut it nor set a timer, and a lone
    # request waited for the next arrival (for ever, if none came).
    sched = Scheduler(Dynamic(0.1, 4), qa=QAPolicy(threshold=0.5))
    listener = Collect()
    engine = RealtimeEngine(
        sched, {"cpu": FakeExecutor()}, ScriptedScorer(), listener, clock=TickingClock(step)
    )
    engine.submit(Request("r0", "a red circle", KEY))
    loop = threading.Thread(target=engine.run, daemon=True)
    loop.start()
    loop.join(timeout=10)
    stuck = loop.is_alive()
    engine.stop()
    assert not stuck, f"the lone request was never cut (clock step {step})"
    assert listener.accepted == ["r0"]


def test_on_a_running_loop_a_call_from_that_loop_runs_at_once_and_results_come_back() -> None:
    # ``serve`` steps the engine on the caller's event loop: a handler's call is answered
    # before it returns (no thread hop), and the workers' results arrive as loop callbacks.
    import asyncio

    sched = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(threshold=0.5))
    listener = Collect()
    engine = RealtimeEngine(sched, {"cpu": FakeExecutor()}, ScriptedScorer(), listener)
    # Posted from another thread before the loop runs: kept and delivered at the start.
    early = engine.call(lambda now: sched.submit(Request("r0", "a red circle", KEY), now))

    async def main() -> tuple[bool, list[bool]]:
        serving = asyncio.ensure_future(engine.serve(until_idle=False))
        await asyncio.sleep(0)
        calls = [
            engine.call(lambda now, i=i: sched.submit(Request(f"r{i}", "a circle", KEY), now))
            for i in range(1, 5)
        ]
        answered = [c.done() and c.result().admitted for c in calls]
        while not listener.done.is_set():
            await asyncio.sleep(0.01)
        engine.stop()
        await asyncio.wait_for(serving, 10)
        return early.result(timeout=0).admitted, answered

    admitted_early, answered = asyncio.run(asyncio.wait_for(main(), 30))
    assert admitted_early and answered == [True] * 4
    assert sorted(listener.accepted) == [f"r{i}" for i in range(5)]


def test_a_listener_that_raises_ends_serve_with_its_error() -> None:
    import asyncio

    sched = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(threshold=0.5))
    engine = RealtimeEngine(sched, {"cpu": FakeExecutor()}, ScriptedScorer(), Broken())
    engine.submit(Request("r0", "a red circle", KEY))
    with pytest.raises(RuntimeError, match="listener broke"):
        asyncio.run(asyncio.wait_for(engine.serve(), 30))


def test_run_called_where_an_event_loop_already_runs_still_finishes() -> None:
    # A notebook's cell runs on a running loop; ``run`` must not refuse it (asyncio.run
    # would), and an error still reaches the caller.
    import asyncio

    sched = Scheduler(Dynamic(0.0, 4), qa=QAPolicy(threshold=0.5))
    listener = Collect()
    engine = RealtimeEngine(sched, {"cpu": FakeExecutor()}, ScriptedScorer(), listener)
    for i in range(3):
        engine.submit(Request(f"r{i}", "a red circle", KEY))

    async def cell() -> None:
        engine.run()

    asyncio.run(cell())
    assert sorted(listener.accepted) == ["r0", "r1", "r2"]

    broken = RealtimeEngine(
        Scheduler(Dynamic(0.0, 4), qa=QAPolicy(threshold=0.5)),
        {"cpu": FakeExecutor()}, ScriptedScorer(), Broken(),
    )  # fmt: skip
    broken.submit(Request("r0", "a red circle", KEY))

    async def failing_cell() -> None:
        broken.run()

    with pytest.raises(RuntimeError, match="listener broke"):
        asyncio.run(failing_cell())
