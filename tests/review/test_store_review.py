"""Reviewer decisions in the job store: one transaction each, once per prompt, and the
migration of a version 1 store (the schema before review) in place."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from renderq.core.errors import ConfigError
from renderq.store.sqlite import (
    SCHEMA_VERSION,
    AttemptRow,
    Decision,
    JobStore,
    Outcome,
    PromptRow,
    StoreError,
)

SPEC = {"width": 32, "height": 32, "steps": 3, "negative_prompt": ""}

#: The version 1 schema as renderq 0.1 wrote it, before reviewer decisions.
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE jobs (id INTEGER PRIMARY KEY, created REAL NOT NULL, config TEXT NOT NULL);
CREATE TABLE runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL REFERENCES jobs(id),
    started REAL NOT NULL, finished REAL, pid INTEGER NOT NULL, mode TEXT NOT NULL);
CREATE TABLE requests (
    id TEXT PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs(id), idx INTEGER NOT NULL,
    prompt TEXT NOT NULL, base_seed INTEGER NOT NULL, spec TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending', attempt INTEGER, score REAL, file_name TEXT,
    run INTEGER, batch_id INTEGER, batch_size INTEGER, updated REAL);
CREATE TABLE attempts (
    request_id TEXT NOT NULL REFERENCES requests(id), attempt INTEGER NOT NULL,
    seed INTEGER NOT NULL, run INTEGER NOT NULL, batch_id INTEGER NOT NULL,
    batch_size INTEGER NOT NULL, score REAL, error TEXT, PRIMARY KEY (request_id, attempt));
CREATE TABLE ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run INTEGER NOT NULL, stage TEXT NOT NULL,
    device_class TEXT NOT NULL, seconds REAL NOT NULL);
CREATE TABLE scores (
    request_id TEXT NOT NULL, attempt INTEGER NOT NULL, scorer TEXT NOT NULL,
    score REAL NOT NULL, run INTEGER NOT NULL, PRIMARY KEY (request_id, attempt, scorer));
INSERT INTO meta VALUES ('schema_version', '1');
INSERT INTO jobs VALUES (1, 0, '{"model": "m"}');
INSERT INTO requests (id, job_id, idx, prompt, base_seed, spec, state, attempt, score)
    VALUES ('p0', 1, 0, 'a red circle', 0, '{}', 'escalated', 1, 0.1);
INSERT INTO attempts VALUES ('p0', 0, 0, 1, 1, 1, 0.05, NULL), ('p0', 1, 7, 1, 2, 1, 0.1, NULL);
"""


def _escalated(tmp_path: Path, n: int = 3) -> JobStore:
    """A store whose ``n`` prompts each failed two attempts (the second one NaN for p1)."""
    store = JobStore.open(tmp_path / "job.sqlite")
    store.create_job(
        {"model": "m"}, [PromptRow(f"p{i}", i, f"prompt {i}", i, SPEC) for i in range(n)]
    )
    tries = [AttemptRow(f"p{i}", a, i + a, 1, n, 0.1 * a, None) for i in range(n) for a in range(2)]
    tries[3] = AttemptRow("p1", 1, 2, 1, n, None, "NaN")
    store.commit_step(1, tries, [Outcome(f"p{i}", "escalated", 1) for i in range(n)], [])
    return store


def test_a_version_1_store_is_migrated_in_place_and_its_prompts_reviewed(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.close()
    store = JobStore.open(path)
    try:
        [row] = store.requests()
        assert (row.state, row.prompt.parent, row.prompt.priority) == ("escalated", None, 0)
        d = store.decide("p0", "accept", "ana", attempt=0, file_name="images/p0.png")
        assert store.decisions() == [d]
        [row] = store.requests()
        assert (row.state, row.attempt, row.score, row.file_name) == (
            "accepted", 0, 0.05, "images/p0.png",
        )  # fmt: skip
    finally:
        store.close()
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT value FROM meta").fetchone()[0] == str(SCHEMA_VERSION) == "2"
    conn.close()
    JobStore.open(path).close()  # opening the migrated store again changes nothing


def test_each_decision_moves_an_escalated_prompt_once(tmp_path: Path) -> None:
    store = _escalated(tmp_path)
    try:
        store.decide("p0", "accept", "ana", attempt=1, file_name="images/p0.png")
        store.decide("p1", "reject", "bo")
        new = PromptRow("p2-r1", store.next_index(), "prompt 2, edited", 2, SPEC, "p2", 1)
        store.decide("p2", "edit", "ana", resubmit=new)
        states = {r.prompt.id: r.state for r in store.requests()}
        assert states == {"p0": "accepted", "p1": "rejected", "p2": "edited", "p2-r1": "pending"}
        [added] = store.requests("pending")
        assert (added.prompt.idx, added.prompt.parent, added.prompt.priority) == (3, "p2", 1)
        got = [(d.request_id, d.action, d.reviewer, d.attempt, d.new_request_id)
               for d in store.decisions()]  # fmt: skip
        assert got == [("p0", "accept", "ana", 1, None), ("p1", "reject", "bo", None, None),
                       ("p2", "edit", "ana", None, "p2-r1")]  # fmt: skip
        assert store.decisions()[2].prompt == "prompt 2, edited"
        for rid in ("p0", "p1", "p2"):
            with pytest.raises(StoreError, match=f"prompt '{rid}' is (accepted|rejected|edited)"):
                store.decide(rid, "reject", "cy")
        with pytest.raises(StoreError, match="'p2-r1' is pending"):
            store.decide("p2-r1", "reject", "cy")
        assert len(store.decisions()) == 3
    finally:
        store.close()


def test_bad_decisions_are_refused_and_leave_nothing(tmp_path: Path) -> None:
    store = _escalated(tmp_path)
    try:
        with pytest.raises(ConfigError, match="'approve'"):
            store.decide("p0", "approve", "ana")
        with pytest.raises(ConfigError, match="reviewer's name"):
            store.decide("p0", "reject", " ")
        with pytest.raises(ConfigError, match="no prompt 'nope'"):
            store.decide("nope", "reject", "ana")
        # p1's attempt 1 failed to render: there is no image to accept.
        with pytest.raises(ConfigError, match="'p1' has no rendered attempt 1"):
            store.decide("p1", "accept", "ana", attempt=1, file_name="images/p1.png")
        with pytest.raises(ConfigError, match="has no rendered attempt 5"):
            store.decide("p1", "accept", "ana", attempt=5, file_name="images/p1.png")
        with pytest.raises(ConfigError, match="must name 'p0'"):
            store.decide("p0", "edit", "ana", resubmit=PromptRow("x", 9, "x", 0, SPEC, "p2"))
        assert store.decisions() == []
        assert {r.state for r in store.requests()} == {"escalated"}
    finally:
        store.close()


def test_decisions_survive_reopening(tmp_path: Path) -> None:
    store = _escalated(tmp_path)
    d = store.decide("p1", "reject", "bo")
    store.close()
    again = JobStore.open(tmp_path / "job.sqlite")
    try:
        assert again.decisions() == [d] and isinstance(d, Decision) and d.at > 0
        assert again.counts() == {"escalated": 2, "rejected": 1}
    finally:
        again.close()


def test_an_edited_prompt_gets_the_bucket_of_its_own_text(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from renderq.backends.architectures import PromptLength
    from renderq.jobs.runner import respec_edits

    store = _escalated(tmp_path)
    spec = {**SPEC, "prompt_bucket": 128, "truncated": []}
    longer = "prompt 0, edited to be long enough for the next bucket"
    store.decide("p0", "edit", "ana", resubmit=PromptRow("p0-r1", 3, longer, 0, spec, "p0", 1))
    # A T5 pipeline's executor: the edited text needs the 256-token bucket and CLIP cuts it.
    lengths = {longer: PromptLength(256, ("clip: 80 tokens > 77",))}
    executor = SimpleNamespace(
        prompt_length=lambda p, buckets=True: lengths.get(p, PromptLength(128))
    )
    try:
        respec_edits(store, executor)  # type: ignore[arg-type]
        [row] = store.requests("pending")
        assert row.prompt.spec == {**spec, "prompt_bucket": 256,
                                   "truncated": ["clip: 80 tokens > 77"]}  # fmt: skip
        with pytest.raises(StoreError, match="'p1' is not pending"):
            store.update_spec("p1", spec)
    finally:
        store.close()
