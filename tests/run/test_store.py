"""The SQLite job store: schema version, WAL, one transaction per step, resume points."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from renderq.jobs.runner import resume_points
from renderq.store.sqlite import (
    AttemptRow,
    JobStore,
    Outcome,
    PromptRow,
    PromptState,
    StoreError,
)

SPEC = {"width": 32, "height": 32, "steps": 3, "negative_prompt": ""}


def _store(tmp_path: Path, n: int = 3) -> JobStore:
    store = JobStore.open(tmp_path / "job.sqlite")
    rows = [PromptRow(f"p{i}", i, f"prompt {i}", i, SPEC) for i in range(n)]
    store.create_job({"model": "m"}, rows)
    return store


def test_wal_and_schema_version(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.close()
    conn = sqlite3.connect(tmp_path / "job.sqlite")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    conn.execute("UPDATE meta SET value='99' WHERE key='schema_version'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="schema version 99"):
        JobStore.open(tmp_path / "job.sqlite")


def test_a_failed_step_leaves_nothing_behind(tmp_path: Path) -> None:
    store = _store(tmp_path)
    accepted = Outcome("p0", PromptState.ACCEPTED, 0, 0.5, "images/p0.png", 1, 2)
    store.commit_step(1, [], [accepted], [])
    attempt = AttemptRow("p1", 0, 1, 2, 2, 0.1, None)
    # p0 is not pending any more
    bad = [Outcome("p1", PromptState.ESCALATED, 0), Outcome("p0", PromptState.ACCEPTED, 0)]
    with pytest.raises(StoreError, match="'p0' is not pending"):
        store.commit_step(1, [attempt], bad, [("render", "cpu", 1.0)])
    assert store.attempts() == {} and store.ledger_entries() == []
    assert store.counts() == {"accepted": 1, "pending": 2}


def test_resume_points(tmp_path: Path) -> None:
    store = _store(tmp_path)
    # p0 scored at attempt 0 and 1 (failed), p1 never ended, p2 failed its last attempt.
    ended = [AttemptRow("p0", 0, 0, 1, 3, 0.1, None), AttemptRow("p0", 1, 9, 2, 3, 0.1, None)]
    ended += [AttemptRow("p2", a, a, 1, 3, None, "NaN") for a in range(3)]
    store.commit_step(1, ended, [], [("render", "cpu", 2.0), ("regen", "cpu", 1.0)], "clip")
    todo, exhausted = resume_points(store, max_attempts=3)
    assert todo == {"p0": 2, "p1": 0} and exhausted == ["p2"]
    assert [s for _, _, s, _ in store.scores()] == ["clip", "clip"]
    assert sum(x for _, _, x in store.ledger_entries()) == 3.0


def test_states_read_back_as_the_enum_and_a_foreign_state_is_refused(tmp_path: Path) -> None:
    store = _store(tmp_path)
    store.commit_step(1, [], [Outcome("p1", PromptState.ESCALATED, 2, 0.1)], [])
    states = [r.state for r in store.requests()]
    assert states == [PromptState.PENDING, PromptState.ESCALATED, PromptState.PENDING]
    assert all(isinstance(s, PromptState) for s in states)
    assert [r.prompt.id for r in store.requests(PromptState.ESCALATED)] == ["p1"]
    store.close()
    conn = sqlite3.connect(tmp_path / "job.sqlite")
    conn.execute("UPDATE requests SET state='lost' WHERE id='p2'")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="'p2' has the unknown state 'lost'"):
        JobStore.open(tmp_path / "job.sqlite").requests()
