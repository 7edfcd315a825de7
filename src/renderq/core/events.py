"""What the scheduler tells the shell after a result comes back."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from renderq.core.types import Request


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """One attempt of a prompt: its seed, the batch it rode in, and how it ended."""

    attempt: int
    seed: int
    batch_id: int
    batch_size: int
    score: float | None = None
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Event:
    """Base of all scheduler events; ``request`` is the attempt concerned."""

    request: Request
    history: tuple[AttemptRecord, ...]


@dataclass(frozen=True, slots=True)
class ToScore(Event):
    """The attempt rendered; the shell should score ``image``."""

    image: Any = None


@dataclass(frozen=True, slots=True)
class Accepted(Event):
    """The attempt passed the gate (or had none): terminal.

    ``image`` is set only for requests accepted without scoring (``Request.qa=False``);
    scored images are the ones the shell handed to the scorer.
    """

    score: float | None = None
    image: Any = None


@dataclass(frozen=True, slots=True)
class Regenerating(Event):
    """The attempt failed; ``next_request`` (attempt + 1, next seed) is queued again."""

    next_request: Request | None = None


@dataclass(frozen=True, slots=True)
class Escalated(Event):
    """Every attempt failed: terminal; the prompt goes to the review list."""


@dataclass(frozen=True, slots=True)
class Cancelled(Event):
    """The caller cancelled: terminal."""


@dataclass(frozen=True, slots=True)
class Admission:
    """The verdict of ``submit``: admitted, or rejected with a machine-readable reason."""

    admitted: bool
    reason: str = ""
    detail: str = ""
    retry_after_s: float | None = None
    #: Seconds admission expected the request to take, where it priced a deadline (before
    #: the correction by how late admitted requests have been finishing).
    expected_s: float | None = None
