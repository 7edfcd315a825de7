"""The real-time engine with fake stages: overlap or turns of render and score, QA, retries."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.core.events import Accepted, Escalated, Regenerating
from renderq.core.policies import Dynamic, Window
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchKey, BatchResult, ItemResult, Request, ScoreResult
from renderq.runtime.realtime import RealtimeEngine
from renderq.testing.fakes import RecordingListener

KEY = BatchKey("fake", 32, 32, 2, True, "ddim", "fp32", "cpu")


@dataclass
class SlowExecutor:
    """Takes ``seconds`` per batch and records when each batch ran."""

    seconds: float
    device_class: str = "cpu"
    spans: list[tuple[float, float, int]] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        start = time.monotonic()
        time.sleep(self.seconds)
        self.spans.append((start, time.monotonic(), batch.size))
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, self.seconds, self.device_class)


@dataclass
class SlowScorer:
    """Scores 1.0 unless the (id, attempt) image is listed in ``fail``; records its spans."""

    seconds: float
    fail: set[tuple[str, int]] = field(default_factory=set)
    device_class: str = "cpu"
    spans: list[tuple[float, float]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        start = time.monotonic()
        time.sleep(self.seconds)
        self.spans.append((start, time.monotonic()))
        scores = tuple(0.0 if tuple(im) in self.fail else 1.0 for im in images)
        return ScoreResult(scores, self.seconds, self.device_class)


Recorder = RecordingListener


def _requests(n: int) -> list[Request]:
    return [Request(f"r{i}", f"prompt {i}", KEY, base_seed=i) for i in range(n)]


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _sixteen_in_batches_of_four(
    scorer_device: str, share_device: bool | None = None
) -> tuple[SlowExecutor, SlowScorer, Recorder]:
    ex = SlowExecutor(0.05)
    sc = SlowScorer(0.04, device_class=scorer_device)
    rec = Recorder()
    sched = Scheduler(Window(batch_size=4), qa=QAPolicy(threshold=0.5, max_attempts=2))
    engine = RealtimeEngine(sched, {"cpu": ex}, sc, rec, share_device=share_device)
    for r in _requests(16):
        engine.submit(r)
    engine.run()
    assert len(rec.events(Accepted)) == 16
    assert [b.size for b in rec.batches] == [4, 4, 4, 4]
    renders = sum(st.batch.size for st in rec.steps if st.kind == "render" and st.batch)
    assert renders == 16
    booked = {stage for st in rec.steps for stage, _, _ in st.ledger}
    assert booked == {"render", "score"}
    return ex, sc, rec


def test_a_scorer_on_its_own_device_overlaps_rendering() -> None:
    ex, sc, _ = _sixteen_in_batches_of_four("gpu:1")
    # The scorer worked on an earlier batch while a later one rendered.
    assert any(_overlap(s, (r0, r1)) for s in sc.spans for r0, r1, _ in ex.spans)


def test_a_shared_device_runs_one_stage_at_a_time_scoring_first() -> None:
    ex, sc, rec = _sixteen_in_batches_of_four("cpu")
    spans = [(a, b) for a, b, _ in ex.spans]
    assert not any(_overlap(s, r) for s in sc.spans for r in spans)
    # Each batch's images were scored before the next batch started rendering.
    assert len(sc.spans) == 4
    for (_, scored_end), (next_start, _) in zip(sc.spans, spans[1:], strict=False):
        assert scored_end <= next_start
    kinds = [st.kind for st in rec.steps]
    assert kinds == ["render", "score"] * 4
    # Each step says how long the engine held the worker: the stage's time and hand-offs.
    for st in rec.steps:
        assert st.held_s >= (0.05 if st.kind == "render" else 0.04)
        assert st.held_s < 5.0


def test_sharing_can_be_turned_off() -> None:
    ex, sc, _ = _sixteen_in_batches_of_four("cpu", share_device=False)
    assert any(_overlap(s, (r0, r1)) for s in sc.spans for r0, r1, _ in ex.spans)


def test_failed_scores_regenerate_through_the_same_queue() -> None:
    ex = SlowExecutor(0.01)
    sc = SlowScorer(0.01, fail={("r1", 0), ("r2", 0), ("r2", 1)})
    rec = Recorder()
    sched = Scheduler(Dynamic(0.05, batch_size=8), qa=QAPolicy(threshold=0.5, max_attempts=2))
    engine = RealtimeEngine(sched, {"cpu": ex}, sc, rec)
    for r in _requests(6):
        engine.submit(r)
    engine.run()
    assert {e.request.id for e in rec.events(Accepted)} == {"r0", "r1", "r3", "r4", "r5"}
    escalated = rec.events(Escalated)
    assert [e.request.id for e in escalated] == ["r2"]
    assert [a.attempt for a in escalated[0].history] == [0, 1]
    assert sorted(e.request.id for e in rec.events(Regenerating)) == ["r1", "r2"]
    # The two retries were batched together (one batch of 2 after the first of 6).
    assert [b.size for b in rec.batches] == [6, 2]
    booked = {stage for st in rec.steps for stage, _, _ in st.ledger}
    assert booked == {"render", "score", "regen", "rescore"}


def test_scorer_exceptions_are_retried_then_regenerated() -> None:
    class Broken(SlowScorer):
        calls = 0

        def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
            Broken.calls += 1
            raise RuntimeError("scorer down")

    rec = Recorder()
    sched = Scheduler(Window(batch_size=4), qa=QAPolicy(threshold=0.5, max_attempts=2))
    engine = RealtimeEngine(sched, {"cpu": SlowExecutor(0.0)}, Broken(0.0), rec, score_retries=2)
    for r in _requests(2):
        engine.submit(r)
    engine.run()
    # 2 attempts x (1 try + 2 retries) score calls; then every attempt is escalated.
    assert Broken.calls == 6
    assert len(rec.events(Escalated)) == 2
