"""Reviewer decisions on a run folder: the store, the dataset, review.jsonl and a resume."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from renderq.core.errors import ConfigError
from renderq.jobs import review
from renderq.output.dataset import DatasetWriter
from renderq.store.lock import FolderLock, JobLocked
from renderq.store.sqlite import StoreError

from .conftest import MAX_ATTEMPTS, REVIEW_PROMPTS, run_escalating

pytestmark = pytest.mark.slow


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_every_attempt_of_an_escalated_prompt_keeps_its_image(escalated: Path) -> None:
    out = escalated / "out"
    rows = _lines(out / "review.jsonl")
    assert [r["id"] for r in rows] == [f"p{i:06d}" for i in range(len(REVIEW_PROMPTS))]
    images = [a["image"] for r in rows for a in r["attempts"]]
    assert len(images) == 2 * len(REVIEW_PROMPTS) and all(images)
    assert sorted(f"review/{p.name}" for p in (out / "review").iterdir()) == sorted(images)
    assert all((out / i).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for i in images)
    assert all(r["review"] is None and r["parent"] is None for r in rows)
    assert list((out / "images").iterdir()) == []


def test_accept_reject_edit_then_a_resume_renders_the_edit(
    escalated: Path, tiny_model: Path, tiny_clip: Path
) -> None:
    out = escalated / "out"
    a = review.decide(out, "p000000", "accept", "ana", attempt=1)
    review.decide(out, "p000001", "reject", "bo")
    e = review.decide(out, "p000002", "edit", "ana", prompt="a big yellow triangle on white")
    assert e.new_request_id == "p000002-r1"

    def check_views() -> None:
        [meta] = _lines(out / "metadata.jsonl")
        with review.open_store(out) as store:
            p0 = store.attempts_of("p000000")[1]
        assert (meta["id"], meta["attempt"], meta["seed"], meta["clip_score"]) == (
            "p000000", 1, p0.seed, p0.score,
        )  # fmt: skip
        assert meta["accepted_by"] == "review" and meta["file_name"] == "images/p000000.png"
        kept = (out / "review" / "p000000-1.png").read_bytes()
        assert (out / "images" / "p000000.png").read_bytes() == kept  # the same pixels
        rev = {r["id"]: r for r in _lines(out / "review.jsonl")}
        assert "p000000" not in rev
        assert rev["p000001"]["review"]["decision"] == "rejected"
        assert rev["p000001"]["review"]["reviewer"] == "bo"
        assert rev["p000002"]["review"] == {
            "decision": "edited", "reviewer": "ana", "at": e.at,
            "new_prompt": "a big yellow triangle on white", "resubmitted_as": "p000002-r1",
        }  # fmt: skip
        assert rev["p000003"]["review"] is None

    check_views()
    assert a.attempt == 1 and a.reviewer == "ana"
    with review.open_store(out) as store:
        states = {r.prompt.id: r.state for r in store.requests()}
        [new] = [r.prompt for r in store.requests() if r.prompt.parent]
    assert states == {"p000000": "accepted", "p000001": "rejected", "p000002": "edited",
                      "p000003": "escalated", "p000002-r1": "pending"}  # fmt: skip
    assert (new.id, new.priority, new.prompt) == ("p000002-r1", 1, "a big yellow triangle on white")

    # The next run on the folder (a resume) renders the edited prompt through the queue.
    summary = run_escalating(escalated, tiny_model, tiny_clip)
    assert summary["submitted_this_run"] == 1 and summary["pending"] == 0
    assert (summary["accepted"], summary["escalated"], summary["prompts"]) == (1, 4, 5)
    with review.open_store(out) as store:
        assert len(store.attempts_of("p000002-r1")) == MAX_ATTEMPTS
        assert {r.prompt.id: r.state for r in store.requests()}["p000002-r1"] == "escalated"
    check_views()  # the run rewrote the views from the store: the decisions are still there
    rev = {r["id"]: r for r in _lines(out / "review.jsonl")}
    assert rev["p000002-r1"]["parent"] == "p000002"
    with review.open_store(out) as store:
        assert [i.id for i in review.items(store)] == [
            "p000000", "p000001", "p000002", "p000003", "p000002-r1",
        ]  # fmt: skip
    # An edit of an edit counts on from the original's id.
    again = review.decide(out, "p000002-r1", "edit", "bo", prompt="a big yellow triangle")
    assert again.new_request_id == "p000002-r2"
    with review.open_store(out) as store:
        [r2] = store.requests("pending")
    assert (r2.prompt.id, r2.prompt.parent) == ("p000002-r2", "p000002-r1")


def test_bad_decisions_name_the_problem_and_change_nothing(escalated: Path) -> None:
    out = escalated / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".jsonl"}
    with pytest.raises(ConfigError, match="needs the attempt"):
        review.decide(out, "p000000", "accept", "ana")
    with pytest.raises(ConfigError, match="no image was kept for attempt 7 of 'p000000'"):
        review.decide(out, "p000000", "accept", "ana", attempt=7)
    with pytest.raises(ConfigError, match="edited prompt for 'p000001' is empty"):
        review.decide(out, "p000001", "edit", "ana", prompt="  ")
    with pytest.raises(ConfigError, match="is unchanged"):
        review.decide(out, "p000001", "edit", "ana", prompt=REVIEW_PROMPTS[1])
    with pytest.raises(ConfigError, match="no prompt 'nope'"):
        review.decide(out, "nope", "reject", "ana")
    with FolderLock(out), pytest.raises(JobLocked, match="another renderq process"):
        review.decide(out, "p000000", "reject", "ana")
    with pytest.raises(ConfigError, match="not a renderq run folder"):
        review.decide(escalated, "p000000", "reject", "ana")
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.suffix == ".jsonl"} == before
    assert list((out / "images").iterdir()) == []

    review.decide(out, "p000000", "accept", "ana", attempt=0)
    accepted = (out / "images" / "p000000.png").read_bytes()
    with pytest.raises(StoreError, match="'p000000' is accepted, not escalated"):
        review.decide(out, "p000000", "accept", "bo", attempt=1)
    assert (out / "images" / "p000000.png").read_bytes() == accepted  # not overwritten


def test_the_gate_view_and_labels_follow_the_decisions(escalated: Path) -> None:
    out = escalated / "out"
    review.decide(out, "p000000", "accept", "ana", attempt=1)
    review.decide(out, "p000001", "reject", "bo")
    with review.open_store(out) as store:
        scores = {r: [a.score for a in store.attempts_of(r)] for r in ("p000000", "p000001")}
        labels = review.review_labels(store)
        gate = review.gate_view(store)
    assert sorted(labels) == sorted([(scores["p000000"][1], True)]
                                    + [(s, False) for s in scores["p000001"]])  # fmt: skip
    assert gate.threshold == 1.0 and gate.accepted == (scores["p000000"][1],)
    assert gate.accepted_passing == 0 == gate.rejected_passing  # every score is under 1.0
    d = gate.to_dict()
    assert d["accepted"]["n"] == 1 and d["rejected"]["n"] == 2


def test_prune_keeps_attempt_images_only_of_prompts_that_may_reach_review(tmp_path: Path) -> None:
    import numpy as np

    w = DatasetWriter(tmp_path)
    img = np.zeros((4, 4, 3), dtype=np.uint8)
    for rid in ("a-r1", "b"):
        for k in range(2):
            w.write_attempt_image(rid, k, img)
    (tmp_path / "review" / "b-2.png.part").write_bytes(b"half")
    assert w.prune_attempts({"a-r1"}) == ["review/b-0.png", "review/b-1.png", "review/b-2.png.part"]
    assert sorted(p.name for p in (tmp_path / "review").iterdir()) == ["a-r1-0.png", "a-r1-1.png"]
