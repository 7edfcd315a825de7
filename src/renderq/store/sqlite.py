"""The SQLite job store: the truth a resumed run starts from.

One database per output folder, in WAL mode, with a schema version in ``meta``. Tables:
``jobs`` (the job's settings), ``runs`` (each process that worked on it), ``requests``
(one row per prompt and its terminal state), ``attempts`` (every scored or failed
attempt: seed, batch, score, error), ``scores`` (each score with the scorer that gave
it), ``ledger`` (device-seconds per stage and device class, one row per booking) and
``decisions`` (each reviewer decision on an escalated prompt: who, when, what).
Each scheduler step that changes state (a render batch coming back, a score batch
coming back) is committed in one transaction with the ledger rows it booked, so a crash
leaves either all of a step or none of it; so is each reviewer decision with the state
change it makes.

Schema versions: 1 had no review; 2 adds ``decisions`` and, on ``requests``, ``parent``
(the prompt an edited prompt was resubmitted from) and ``priority``. A version 1 store is
migrated in place when opened; the migration is one transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError, RenderqError

SCHEMA_VERSION = 2
"""Version of the tables below; an older store is migrated, a newer one refused."""

ACTIONS = ("accept", "reject", "edit")
"""What a reviewer can decide about an escalated prompt."""


class PromptState(StrEnum):
    """A prompt's state in the store (the ``requests.state`` column).

    ``pending`` until the gate accepts it or its attempts run out (``escalated``); a
    reviewer then accepts (``accepted``), rejects (``rejected``) or edits (``edited``, with
    a new pending prompt) an escalated one. A ``StrEnum``: equal to its column text.
    """

    PENDING = "pending"
    ACCEPTED = "accepted"
    ESCALATED = "escalated"
    REJECTED = "rejected"
    EDITED = "edited"


NOT_ACCEPTED = frozenset({PromptState.ESCALATED, PromptState.REJECTED, PromptState.EDITED})
"""The states of a prompt the gate escalated and no reviewer accepted."""

_REVIEWED_STATE = {
    "accept": PromptState.ACCEPTED,
    "reject": PromptState.REJECTED,
    "edit": PromptState.EDITED,
}

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id INTEGER PRIMARY KEY, created REAL NOT NULL, config TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT, job_id INTEGER NOT NULL REFERENCES jobs(id),
    started REAL NOT NULL, finished REAL, pid INTEGER NOT NULL, mode TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS requests (
    id TEXT PRIMARY KEY, job_id INTEGER NOT NULL REFERENCES jobs(id), idx INTEGER NOT NULL,
    prompt TEXT NOT NULL, base_seed INTEGER NOT NULL, spec TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending', attempt INTEGER, score REAL, file_name TEXT,
    run INTEGER, batch_id INTEGER, batch_size INTEGER, updated REAL,
    parent TEXT REFERENCES requests(id), priority INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS attempts (
    request_id TEXT NOT NULL REFERENCES requests(id), attempt INTEGER NOT NULL,
    seed INTEGER NOT NULL, run INTEGER NOT NULL, batch_id INTEGER NOT NULL,
    batch_size INTEGER NOT NULL, score REAL, error TEXT,
    PRIMARY KEY (request_id, attempt));
CREATE TABLE IF NOT EXISTS ledger (
    id INTEGER PRIMARY KEY AUTOINCREMENT, run INTEGER NOT NULL, stage TEXT NOT NULL,
    device_class TEXT NOT NULL, seconds REAL NOT NULL);
CREATE TABLE IF NOT EXISTS scores (
    request_id TEXT NOT NULL, attempt INTEGER NOT NULL, scorer TEXT NOT NULL,
    score REAL NOT NULL, run INTEGER NOT NULL,
    PRIMARY KEY (request_id, attempt, scorer),
    FOREIGN KEY (request_id, attempt) REFERENCES attempts(request_id, attempt));
CREATE TABLE IF NOT EXISTS decisions (
    id INTEGER PRIMARY KEY AUTOINCREMENT, request_id TEXT NOT NULL REFERENCES requests(id),
    action TEXT NOT NULL, reviewer TEXT NOT NULL, at REAL NOT NULL, attempt INTEGER,
    prompt TEXT, new_request_id TEXT REFERENCES requests(id));
CREATE INDEX IF NOT EXISTS requests_state ON requests(state);
"""

#: Version 1 -> 2, run in one transaction when a version 1 store is opened (the
#: ``decisions`` table itself comes from ``_SCHEMA``, which is idempotent).
_MIGRATE_1_TO_2 = (
    "ALTER TABLE requests ADD COLUMN parent TEXT REFERENCES requests(id)",
    "ALTER TABLE requests ADD COLUMN priority INTEGER NOT NULL DEFAULT 0",
)


class StoreError(RenderqError):
    """A store that cannot be used: another schema version, or a corrupt file."""


@dataclass(frozen=True, slots=True)
class PromptRow:
    """A prompt of the job as stored: its id, position, text, base seed and render spec.

    ``parent`` is set on a prompt a reviewer edited and resubmitted: the id it came from;
    ``priority`` is the scheduler priority its requests get.
    """

    id: str
    idx: int
    prompt: str
    base_seed: int
    spec: dict[str, Any]
    parent: str | None = None
    priority: int = 0


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt that ended (scored, or failed before scoring)."""

    request_id: str
    attempt: int
    seed: int
    batch_id: int
    batch_size: int
    score: float | None
    error: str | None
    run: int = 0


@dataclass(frozen=True, slots=True)
class Outcome:
    """A terminal state reached by a prompt: ``accepted`` (with its file) or ``escalated``."""

    request_id: str
    state: PromptState
    attempt: int
    score: float | None = None
    file_name: str | None = None
    batch_id: int | None = None
    batch_size: int | None = None


@dataclass(frozen=True, slots=True)
class StoredRequest:
    """A prompt's row with its current state.

    ``pending``, ``accepted``, ``escalated``, and after a reviewer's decision on an
    escalated prompt ``accepted`` (the chosen attempt), ``rejected`` or ``edited``.
    """

    prompt: PromptRow
    state: PromptState
    attempt: int | None
    score: float | None
    file_name: str | None
    run: int | None
    batch_id: int | None
    batch_size: int | None


@dataclass(frozen=True, slots=True)
class Decision:
    """A reviewer's decision on an escalated prompt, as recorded.

    ``action`` is one of :data:`ACTIONS`; ``attempt`` is the accepted attempt; ``prompt``
    and ``new_request_id`` the edited text and the request it was resubmitted as.
    """

    request_id: str
    action: str
    reviewer: str
    at: float
    attempt: int | None = None
    prompt: str | None = None
    new_request_id: str | None = None


class JobStore:
    """A job's SQLite store. Open with :meth:`open`; close with :meth:`close`."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        """Wrap an open connection (use :meth:`open`)."""
        self._conn = conn
        self.path = path

    @classmethod
    def open(cls, path: Path) -> JobStore:
        """Open (creating if needed) the store at ``path``; refuses another schema version."""
        conn = sqlite3.connect(str(path), timeout=30.0, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.execute("PRAGMA foreign_keys=ON")
            conn.executescript(_SCHEMA)  # idempotent; executescript commits on its own
            with _tx(conn):
                row = conn.execute("SELECT value FROM meta WHERE key='schema_version'").fetchone()
                if row is None:
                    conn.execute(
                        "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                    )
                elif int(row[0]) == 1:
                    for sql in _MIGRATE_1_TO_2:
                        conn.execute(sql)
                    conn.execute(
                        "UPDATE meta SET value=? WHERE key='schema_version'", (str(SCHEMA_VERSION),)
                    )
                elif int(row[0]) != SCHEMA_VERSION:
                    raise StoreError(
                        f"store {path} has schema version {row[0]}, this renderq reads "
                        f"version {SCHEMA_VERSION}"
                    )
        except sqlite3.DatabaseError as exc:
            conn.close()
            raise StoreError(f"cannot open job store {path}: {exc}") from exc
        except StoreError:
            conn.close()
            raise
        return cls(conn, path)

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()

    # -- the job ------------------------------------------------------------------------

    def job_config(self) -> dict[str, Any] | None:
        """The settings the job was created with, or None for a new store."""
        row = self._conn.execute("SELECT config FROM jobs WHERE id=1").fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def create_job(self, config: dict[str, Any], prompts: Sequence[PromptRow]) -> None:
        """Record a new job with its settings and every prompt, in one transaction."""
        with _tx(self._conn):
            self._conn.execute(
                "INSERT INTO jobs VALUES (1, ?, ?)",
                (time.time(), json.dumps(config, sort_keys=True)),
            )
            self._insert_prompts(prompts)

    def _insert_prompts(self, prompts: Sequence[PromptRow]) -> None:
        self._conn.executemany(
            "INSERT INTO requests (id, job_id, idx, prompt, base_seed, spec, parent, priority) "
            "VALUES (?, 1, ?, ?, ?, ?, ?, ?)",
            [(p.id, p.idx, p.prompt, p.base_seed, json.dumps(p.spec), p.parent, p.priority)
             for p in prompts],
        )  # fmt: skip

    def start_run(self, pid: int, mode: str) -> int:
        """Record a process starting work on the job; returns the run number."""
        with _tx(self._conn):
            cur = self._conn.execute(
                "INSERT INTO runs (job_id, started, pid, mode) VALUES (1, ?, ?, ?)",
                (time.time(), pid, mode),
            )
        return int(cur.lastrowid or 0)

    def finish_run(self, run: int) -> None:
        """Mark a run as finished normally."""
        with _tx(self._conn):
            self._conn.execute("UPDATE runs SET finished=? WHERE id=?", (time.time(), run))

    # -- state changes ------------------------------------------------------------------

    def commit_step(
        self,
        run: int,
        attempts: Iterable[AttemptRow],
        outcomes: Iterable[Outcome],
        ledger: Iterable[tuple[str, str, float]],
        scorer: str = "",
    ) -> None:
        """Commit one scheduler step: ended attempts, terminal states and ledger bookings."""
        rows = [
            (a.request_id, a.attempt, a.seed, run, a.batch_id, a.batch_size, a.score, a.error)
            for a in attempts
        ]
        with _tx(self._conn):
            self._conn.executemany("INSERT OR REPLACE INTO attempts VALUES (?,?,?,?,?,?,?,?)", rows)
            self._conn.executemany(
                "INSERT OR REPLACE INTO scores VALUES (?, ?, ?, ?, ?)",
                [(r[0], r[1], scorer, r[6], run) for r in rows if r[6] is not None],
            )
            for o in outcomes:
                self._mark(run, o)
            self._conn.executemany(
                "INSERT INTO ledger (run, stage, device_class, seconds) VALUES (?, ?, ?, ?)",
                [(run, stage, dev, secs) for stage, dev, secs in ledger],
            )

    def _mark(self, run: int, o: Outcome) -> None:
        """Move a pending request to its terminal state (inside a transaction)."""
        cur = self._conn.execute(
            "UPDATE requests SET state=?, attempt=?, score=?, file_name=?, run=?, batch_id=?, "
            "batch_size=?, updated=? WHERE id=? AND state='pending'",
            (o.state, o.attempt, o.score, o.file_name, run, o.batch_id, o.batch_size,
             time.time(), o.request_id),
        )  # fmt: skip
        if cur.rowcount != 1:
            raise StoreError(f"request {o.request_id!r} is not pending; cannot mark {o.state}")

    # -- reading ------------------------------------------------------------------------

    def requests(self, state: PromptState | None = None) -> list[StoredRequest]:
        """Every prompt (or those in ``state``), in job order."""
        sql = (
            "SELECT id, idx, prompt, base_seed, spec, parent, priority, state, attempt, score, "
            "file_name, run, batch_id, batch_size FROM requests"
        )
        args: tuple[Any, ...] = ()
        if state is not None:
            sql += " WHERE state=?"
            args = (state,)
        rows = self._conn.execute(sql + " ORDER BY idx", args).fetchall()
        return [
            StoredRequest(
                PromptRow(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]),
                self._state(r[0], r[7]),
                *r[8:],
            )
            for r in rows
        ]

    def _state(self, request_id: str, text: str) -> PromptState:
        try:
            return PromptState(text)
        except ValueError:
            raise StoreError(
                f"{self.path}: prompt {request_id!r} has the unknown state {text!r} (known: "
                f"{', '.join(PromptState)})"
            ) from None

    def attempts(self) -> dict[str, list[AttemptRow]]:
        """Every ended attempt, grouped by request id, in attempt order."""
        out: dict[str, list[AttemptRow]] = {}
        for r in self._conn.execute(
            "SELECT request_id, attempt, seed, batch_id, batch_size, score, error, run "
            "FROM attempts ORDER BY request_id, attempt"
        ):
            out.setdefault(r[0], []).append(AttemptRow(*r))
        return out

    def scores(self) -> list[tuple[str, int, str, float]]:
        """Every score: ``(request_id, attempt, scorer, score)``."""
        rows = self._conn.execute(
            "SELECT request_id, attempt, scorer, score FROM scores ORDER BY request_id, attempt"
        )
        return [(str(r), int(a), str(s), float(x)) for r, a, s, x in rows]

    def attempts_of(self, request_id: str) -> list[AttemptRow]:
        """Every ended attempt of one request, in attempt order."""
        rows = self._conn.execute(
            "SELECT request_id, attempt, seed, batch_id, batch_size, score, error, run "
            "FROM attempts WHERE request_id=? ORDER BY attempt",
            (request_id,),
        )
        return [AttemptRow(*r) for r in rows]

    def ledger_entries(self) -> list[tuple[str, str, float]]:
        """Every ledger booking: ``(stage, device_class, seconds)``."""
        rows = self._conn.execute("SELECT stage, device_class, seconds FROM ledger ORDER BY id")
        return [(str(s), str(d), float(x)) for s, d, x in rows]

    def counts(self) -> dict[str, int]:
        """Number of prompts in each state."""
        rows = self._conn.execute("SELECT state, COUNT(*) FROM requests GROUP BY state")
        return {str(s): int(n) for s, n in rows}

    def runs(self) -> int:
        """How many runs have worked on this job."""
        return int(self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()[0])

    # -- review -------------------------------------------------------------------------

    def decide(
        self,
        request_id: str,
        action: str,
        reviewer: str,
        *,
        attempt: int | None = None,
        file_name: str | None = None,
        resubmit: PromptRow | None = None,
    ) -> Decision:
        """Record a reviewer's decision on an escalated prompt and make its state change.

        ``accept`` marks the prompt accepted at ``attempt`` with ``file_name`` (its image,
        already written); ``reject`` marks it rejected; ``edit`` marks it edited and adds
        ``resubmit``, a new pending prompt whose ``parent`` is this one. The decision and
        the change are one transaction; a prompt that is not escalated (pending, accepted
        by the gate, or decided already) is refused, so a prompt is decided at most once.
        """
        if action not in ACTIONS:
            raise ConfigError(f"review action must be one of {', '.join(ACTIONS)}, got {action!r}")
        if not reviewer.strip():
            raise ConfigError("a review decision needs the reviewer's name")
        if (action == "accept") != (attempt is not None and file_name is not None):
            raise ConfigError("accept needs the attempt and its image; reject and edit take none")
        if (action == "edit") != (resubmit is not None):
            raise ConfigError("edit needs the resubmitted prompt; accept and reject take none")
        if resubmit is not None and resubmit.parent != request_id:
            raise ConfigError(f"resubmitted prompt {resubmit.id!r} must name {request_id!r}")
        at = time.time()
        with _tx(self._conn):
            self.check_reviewable(request_id)
            if attempt is not None:
                self._accept_attempt(request_id, attempt, file_name, at)
            else:
                self._conn.execute(
                    "UPDATE requests SET state=?, updated=? WHERE id=?",
                    (_REVIEWED_STATE[action], at, request_id),
                )
            if resubmit is not None:
                self._insert_prompts([resubmit])
            self._conn.execute(
                "INSERT INTO decisions (request_id, action, reviewer, at, attempt, prompt, "
                "new_request_id) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (request_id, action, reviewer, at, attempt,
                 resubmit.prompt if resubmit else None, resubmit.id if resubmit else None),
            )  # fmt: skip
        return Decision(request_id, action, reviewer, at, attempt,
                        resubmit.prompt if resubmit else None,
                        resubmit.id if resubmit else None)  # fmt: skip

    def check_reviewable(self, request_id: str) -> None:
        """Raise unless ``request_id`` is an escalated prompt no reviewer has decided yet."""
        found = self._conn.execute(
            "SELECT state FROM requests WHERE id=?", (request_id,)
        ).fetchone()
        if found is None:
            raise ConfigError(f"no prompt {request_id!r} in {self.path}")
        if found[0] != PromptState.ESCALATED:
            raise StoreError(
                f"prompt {request_id!r} is {found[0]}, not escalated; only escalated prompts "
                "are reviewed, once"
            )

    def _accept_attempt(
        self, request_id: str, attempt: int, file_name: str | None, at: float
    ) -> None:
        row = self._conn.execute(
            "SELECT score, run, batch_id, batch_size FROM attempts "
            "WHERE request_id=? AND attempt=? AND error IS NULL",
            (request_id, attempt),
        ).fetchone()
        if row is None:
            raise ConfigError(f"prompt {request_id!r} has no rendered attempt {attempt}")
        self._conn.execute(
            "UPDATE requests SET state='accepted', attempt=?, score=?, file_name=?, run=?, "
            "batch_id=?, batch_size=?, updated=? WHERE id=?",
            (attempt, row[0], file_name, row[1], row[2], row[3], at, request_id),
        )

    def update_spec(self, request_id: str, spec: dict[str, Any]) -> None:
        """Replace a pending prompt's render spec (an edited prompt's, once the model is known)."""
        with _tx(self._conn):
            cur = self._conn.execute(
                "UPDATE requests SET spec=? WHERE id=? AND state='pending'",
                (json.dumps(spec), request_id),
            )
            if cur.rowcount != 1:
                raise StoreError(f"request {request_id!r} is not pending; its spec stays")

    def decisions(self) -> list[Decision]:
        """Every reviewer decision, oldest first."""
        rows = self._conn.execute(
            "SELECT request_id, action, reviewer, at, attempt, prompt, new_request_id "
            "FROM decisions ORDER BY id"
        )
        return [Decision(*r) for r in rows]

    def next_index(self) -> int:
        """The position a prompt added now takes in job order (after every other)."""
        row = self._conn.execute("SELECT COALESCE(MAX(idx), -1) + 1 FROM requests").fetchone()
        return int(row[0])


class _tx:
    """``BEGIN IMMEDIATE`` ... ``COMMIT`` (``ROLLBACK`` on error) on an autocommit connection."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self.conn = conn

    def __enter__(self) -> None:
        self.conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        self.conn.execute("ROLLBACK" if exc_type is not None else "COMMIT")


def check_config(stored: dict[str, Any], wanted: dict[str, Any], out: Path) -> None:
    """Refuse to resume a job whose settings differ, naming what differs."""
    diff = sorted(k for k in set(stored) | set(wanted) if stored.get(k) != wanted.get(k))
    if diff:
        parts = ", ".join(f"{k}: {stored.get(k)!r} there, {wanted.get(k)!r} now" for k in diff)
        raise ConfigError(
            f"{out} holds a different job ({parts}); use another --out or the same settings"
        )
