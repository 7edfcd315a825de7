"""The real-time engine takes render workers while it runs (a pool that grows).

A worker added mid-run takes batches at once, nothing is lost or rendered twice; a device
class new to the run gets its own queue; an added worker whose backend is gone (its node
left) is retired while its class has other workers, and the run finishes on them.
"""

from __future__ import annotations

import threading
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field

import pytest

from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.events import Accepted
from renderq.core.policies import Dynamic
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchKey, BatchResult, Request, RequestState
from renderq.runtime.realtime import MAX_LOSSES, RealtimeEngine
from renderq.testing.fakes import FakeExecutor, RecordingListener, ScriptedScorer

CPU = BatchKey("m", 64, 64, 2, True, "ddim", "fp32", "cpu")
GPU = BatchKey("m", 64, 64, 2, True, "ddim", "fp32", "gpu")
WAIT_S = 30.0  # a bound on waiting for another thread, never a synchronisation by time


def _engine(
    first: FakeExecutor, n: int, key: BatchKey = CPU
) -> tuple[RealtimeEngine, RecordingListener]:
    sched = Scheduler(Dynamic(0.01, 4), qa=QAPolicy(threshold=0.5))
    rec = RecordingListener()
    engine = RealtimeEngine(sched, {"cpu": first}, ScriptedScorer(), rec)
    for i in range(n):
        engine.submit(Request(f"r{i}", f"prompt {i}", key, base_seed=i))
    return engine, rec


@dataclass
class Grows(FakeExecutor):
    """On its first batch, adds ``more`` to the engine and holds that batch until ``until``
    is set (bounded), so only the added workers can take batches meanwhile."""

    engine: RealtimeEngine | None = None
    more: list[FakeExecutor] = field(default_factory=list)
    until: threading.Event = field(default_factory=threading.Event)
    added: list[Future[int]] = field(default_factory=list)
    waited: list[bool] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        if self.engine is not None and not self.added:
            self.added.append(self.engine.add_workers(self.device_class, self.more))
            self.waited.append(self.until.wait(timeout=WAIT_S))
        return FakeExecutor.run(self, batch)


@dataclass
class Signals(FakeExecutor):
    """Renders like a FakeExecutor and sets ``rendered`` after its first batch."""

    rendered: threading.Event = field(default_factory=threading.Event)

    def run(self, batch: Batch) -> BatchResult:
        result = FakeExecutor.run(self, batch)
        self.rendered.set()
        return result


def _rendered(*executors: FakeExecutor) -> Counter[tuple[str, int]]:
    return Counter((r.id, r.attempt) for ex in executors for b in ex.batches for r in b.requests)


def test_a_worker_added_mid_run_takes_batches_at_once_and_nothing_is_lost_or_twice() -> None:
    added = Signals()
    first = Grows(more=[added], until=added.rendered)
    engine, rec = _engine(first, 24)
    first.engine = engine
    engine.run()
    assert first.waited == [True]  # the added worker rendered while the first held a batch
    assert first.added[0].result(timeout=WAIT_S) == 2
    assert added.batches and first.batches
    accepted = [ev.request.id for ev in rec.events(Accepted)]
    assert sorted(accepted) == sorted(f"r{i}" for i in range(24))  # each once
    rendered = _rendered(first, added)
    assert set(rendered.values()) == {1} and len(rendered) == 24  # no attempt rendered twice
    assert all(s is RequestState.ACCEPTED for s in engine.scheduler.states().values())


def test_a_device_class_new_to_the_run_gets_its_queue_and_its_batches() -> None:
    # The requests are for "gpu", which the engine starts without: they wait for the
    # class's workers, added before the loop runs (applied once it does).
    gpu = FakeExecutor(device_class="gpu")
    engine, rec = _engine(FakeExecutor(), 6, key=GPU)
    count = engine.add_workers("gpu", [gpu])
    engine.run()
    assert count.result(timeout=WAIT_S) == 1
    assert sorted(ev.request.id for ev in rec.events(Accepted)) == [f"r{i}" for i in range(6)]
    assert sum(b.size for b in gpu.batches) == 6
    assert all(st.batch is None or st.batch.key.device_class == "gpu" for st in rec.steps)


@dataclass
class NodeGone(FakeExecutor):
    """An added worker whose node has left: every batch is lost; says when it gave up."""

    calls: int = 0
    retired: threading.Event = field(default_factory=threading.Event)

    def run(self, batch: Batch) -> BatchResult:
        self.calls += 1
        if self.calls > MAX_LOSSES:
            self.retired.set()
        raise WorkerLost("render actor's node left the cluster")


def test_an_added_worker_whose_node_left_is_retired_and_the_run_finishes() -> None:
    gone = NodeGone()
    first = Grows(more=[gone], until=gone.retired)
    engine, rec = _engine(first, 12)
    first.engine = engine
    engine.run()
    assert first.waited == [True]
    assert gone.calls == MAX_LOSSES + 1  # retired, not started again
    assert [st.kind for st in rec.steps].count("lost") == MAX_LOSSES + 1
    accepted = sorted(ev.request.id for ev in rec.events(Accepted))
    assert accepted == sorted(f"r{i}" for i in range(12))  # each once, on the first worker
    assert sum(b.size for b in first.batches) == 12


def test_adding_nothing_or_a_worker_of_another_class_is_refused() -> None:
    engine, _ = _engine(FakeExecutor(), 0)
    with pytest.raises(ConfigError, match="given no executor"):
        engine.add_workers("cpu", [])
    with pytest.raises(ConfigError, match="class 'gpu' added to 'cpu'"):
        engine.add_workers("cpu", [FakeExecutor(device_class="gpu")])
