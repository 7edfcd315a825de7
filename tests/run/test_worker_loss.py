"""A worker that dies holding a batch: the batch goes back to the queue, nothing is lost.

Three ways to die: the worker thread raises out of its loop (a ``BaseException`` the
engine's per-item handling does not catch), the process that renders a batch exits
(the executor reports ``WorkerLost``), and a worker that dies every time (the run stops
with a clear error instead of looping). The lost device time is booked as ``lost``.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from renderq.core.errors import WorkerLost
from renderq.core.events import Accepted
from renderq.core.policies import Dynamic
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchResult, RequestState, Stage
from renderq.runtime.realtime import MAX_LOSSES, RealtimeEngine

from .test_realtime import Recorder, SlowExecutor, SlowScorer, _requests


class ThreadDeath(BaseException):
    """Stands for whatever ends a thread from inside (not an ``Exception``)."""


@dataclass
class DiesOnBatches(SlowExecutor):
    """Raises ``ThreadDeath`` (or ``WorkerLost`` from a child process that exits) on some calls."""

    die_on: frozenset[int] = frozenset({0})
    how: str = "thread"
    calls: int = 0
    seen: list[tuple[str, ...]] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        n = self.calls
        self.calls += 1
        self.seen.append(tuple(r.id for r in batch.requests))
        if n in self.die_on or (self.die_on == frozenset({-1})):
            if self.how == "thread":
                raise ThreadDeath("worker thread ended")
            child = subprocess.run([sys.executable, "-c", "import os; os._exit(3)"], check=False)
            raise WorkerLost(f"render process exited with code {child.returncode}")
        return super().run(batch)


def _engine(executor: SlowExecutor) -> tuple[RealtimeEngine, Recorder]:
    sched = Scheduler(Dynamic(0.01, 4), qa=QAPolicy(threshold=0.5, max_attempts=2))
    rec = Recorder()
    engine = RealtimeEngine(sched, {"cpu": executor}, SlowScorer(0.0), rec)
    return engine, rec


@pytest.mark.parametrize("how", ["thread", "process"])
def test_a_dead_worker_returns_its_batch_and_every_request_ends_once(how: str) -> None:
    ex = DiesOnBatches(0.0, die_on=frozenset({0, 2}), how=how)
    engine, rec = _engine(ex)
    for r in _requests(10):
        engine.submit(r)
    engine.run()
    accepted = [ev.request.id for ev in rec.events(Accepted)]
    assert sorted(accepted) == sorted(f"r{i}" for i in range(10))  # each once, none lost
    assert all(s is RequestState.ACCEPTED for s in engine.scheduler.states().values())
    # The lost batches' requests came back at the same attempt, in later batches.
    lost = [st for st in rec.steps if st.kind == "lost"]
    assert len(lost) == 2
    for st in lost:
        assert st.batch is not None
        assert all(r.attempt == 0 for r in st.batch.requests)
    assert all(ev.request.attempt == 0 for ev in rec.events(Accepted))
    assert set(ex.seen[0]) <= {r for b in ex.seen[1:] for r in b}


def test_lost_device_time_is_booked_as_lost() -> None:
    ex = DiesOnBatches(0.05, die_on=frozenset({0}), how="process")
    engine, rec = _engine(ex)
    for r in _requests(4):
        engine.submit(r)
    engine.run()
    lost = engine.scheduler.ledger.report().seconds.get(Stage.LOST, 0.0)
    assert lost > 0
    [step] = [st for st in rec.steps if st.kind == "lost"]
    assert step.ledger and step.ledger[0][0] == "lost" and step.ledger[0][2] == pytest.approx(lost)


def test_a_worker_that_always_dies_stops_the_run_clearly() -> None:
    ex = DiesOnBatches(0.0, die_on=frozenset({-1}), how="thread")
    engine, _ = _engine(ex)
    for r in _requests(3):
        engine.submit(r)
    with pytest.raises(WorkerLost, match=rf"lost {MAX_LOSSES + 1} batches in a row"):
        engine.run()
    assert all(s is RequestState.QUEUED for s in engine.scheduler.states().values())


@pytest.mark.slow
def test_a_job_whose_worker_dies_completes_with_nothing_lost_or_twice(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: object, scorer: object
) -> None:
    import json

    from renderq.backends.diffusers import DiffusersExecutor
    from renderq.jobs.runner import run_job

    from .conftest import PROMPTS, run_settings, write_prompts

    class DyingPipeline:
        def __init__(self, inner: object) -> None:
            self.inner = inner
            self.calls = 0

        def __getattr__(self, name: str) -> object:
            return getattr(self.inner, name)

        def __call__(self, **kwargs: object) -> object:
            self.calls += 1
            if self.calls == 2:
                raise ThreadDeath("worker thread ended mid-batch")
            return self.inner(**kwargs)  # type: ignore[operator]

    s = run_settings(
        write_prompts(tmp_path / "p.txt"),
        tmp_path / "out",
        tiny_model,
        tiny_clip,
        threshold=-1.0,
        max_batch_size=4,
    )
    pipe = DyingPipeline(executor.pipeline)  # type: ignore[attr-defined]
    summary = run_job(s, executor=DiffusersExecutor(pipe, s.spec.model), scorer=scorer)  # type: ignore[arg-type]
    assert summary.accepted == len(PROMPTS)
    rows = [json.loads(x) for x in (s.out / "metadata.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"p{i:06d}" for i in range(len(PROMPTS))]
    assert all(r["attempt"] == 0 for r in rows)
    ledger = json.loads((s.out / "ledger.json").read_text())
    assert ledger["device_seconds"]["lost"] > 0
