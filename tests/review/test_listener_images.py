"""The job listener keeps each failed attempt's image for review, and drops them when the
gate accepts a later attempt (the service's bulk jobs never rewrite their views)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from renderq.core.events import Accepted, AttemptRecord, Escalated, Regenerating
from renderq.core.types import BatchKey, Request
from renderq.jobs.runner import JobListener
from renderq.jobs.summary import Progress
from renderq.output.dataset import DatasetWriter
from renderq.runtime.realtime import Step
from renderq.store.sqlite import JobStore, PromptRow

KEY = BatchKey("m", 8, 8, 2, True, "ddim", "fp32", "cpu")
SPEC = {"width": 8, "height": 8, "steps": 2, "negative_prompt": ""}


def _req(rid: str, attempt: int) -> Request:
    return Request(rid, f"prompt {rid}", KEY, attempt=attempt)


def _rec(attempt: int, score: float) -> AttemptRecord:
    return AttemptRecord(attempt, 100 + attempt, attempt + 1, 2, score)


def test_failed_attempts_images_are_kept_until_the_gate_accepts(tmp_path: Path) -> None:
    store = JobStore.open(tmp_path / "renderq.sqlite")
    rows = [PromptRow(r, i, f"prompt {r}", 0, SPEC) for i, r in enumerate(("a", "b"))]
    store.create_job({"model": "m"}, rows)
    listener = JobListener(store, DatasetWriter(tmp_path), store.start_run(1, "window"), "clip",
                           {r.id: r for r in rows}, Progress(2))  # fmt: skip
    img = {r: np.full((8, 8, 3), 40 * i, dtype=np.uint8) for i, r in enumerate(("a", "b"))}
    first = (_rec(0, 0.1),)
    fails = (Regenerating(_req("a", 0), first), Regenerating(_req("b", 0), first))
    listener.step(Step("score", fails, (), images=img))
    kept = tmp_path / "review"
    assert sorted(p.name for p in kept.iterdir()) == ["a-0.png", "b-0.png"]

    second = (_rec(0, 0.1), _rec(1, 0.9))
    listener.step(Step("score", (Accepted(_req("a", 1), second, 0.9),
                                 Escalated(_req("b", 1), (_rec(0, 0.1), _rec(1, 0.2)))),
                       (), images=img))  # fmt: skip
    try:
        assert sorted(p.name for p in kept.iterdir()) == ["b-0.png", "b-1.png"]
        assert (tmp_path / "images" / "a.png").is_file()
        [row] = [json.loads(x) for x in (tmp_path / "review.jsonl").read_text().splitlines()]
        assert [a["image"] for a in row["attempts"]] == ["review/b-0.png", "review/b-1.png"]
    finally:
        store.close()
