"""The score stage's decisions, sans I/O: what is scored together, when, and what a failure does.

Both shells (the real-time engine and the simulator) hand rendered images to a
:class:`ScoreStage` and ask it for the next score batch; neither decides anything about
scoring itself, so the simulator scores exactly the batches the real engine would.

- **Batching**: every image waiting, up to ``batch_size`` (which the shells set to the
  smallest of the configured score batch size, the render policy's cap and the scorer's
  memory cap where one is known).
- **Turn-taking**: on a device class that also renders (a CPU, one GPU for both stages) the
  scorer starts only while no render batch runs there, and while it scores, renders of
  that class wait (:meth:`holds`). Scoring goes first when the device frees up.
- **Retries**: a score batch that fails is tried again first, up to ``retries`` more
  times; then each of its attempts gets a failed score (``None`` with the error), which
  the QA decision treats like a failed render.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from renderq.core.errors import ConfigError
from renderq.core.types import Request, ScoreResult


def score_cap(configured: int | None, render_cap: int | None, memory_cap: int | None = None) -> int:
    """The largest score batch: the smallest of the caps that are set (None: unset)."""
    caps = [c for c in (configured, render_cap, memory_cap) if c is not None]
    return min(caps) if caps else 1 << 30


@dataclass(slots=True)
class ScoreJob:
    """One score batch: the attempts and their images, and how often it has failed."""

    requests: list[Request]
    images: list[Any]
    tries: int = 0


@dataclass(slots=True)
class ScoreStage:
    """The scorer's queue and its one worker's state (see the module docstring)."""

    batch_size: int
    device_class: str
    #: The device class the scorer shares with a renderer (None: its own device).
    shared: str | None = None
    retries: int = 2
    _waiting: deque[tuple[Request, Any]] = field(default_factory=deque)
    _retry: deque[ScoreJob] = field(default_factory=deque)
    busy: bool = False

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ConfigError(f"score batch size must be >= 1, got {self.batch_size}")
        if self.retries < 0:
            raise ConfigError(f"score retries must be >= 0, got {self.retries}")

    def add(self, request: Request, image: Any) -> None:
        """A rendered attempt waiting for its score."""
        self._waiting.append((request, image))

    def holds(self) -> str | None:
        """The device class renders must leave alone now (the scorer is on it)."""
        return self.shared if self.busy else None

    def take(self, free: Mapping[str, int], workers: Mapping[str, int]) -> ScoreJob | None:
        """The next score batch to start, or None (busy, nothing waiting, or not its turn).

        ``free`` and ``workers`` count free and all render workers per device class: on
        a shared device the scorer starts only when every render worker there is free.
        """
        if self.busy:
            return None
        if self.shared is not None and free.get(self.shared, 0) < workers.get(self.shared, 0):
            return None
        if self._retry:
            job = self._retry.popleft()
        elif self._waiting:
            n = min(self.batch_size, len(self._waiting))
            pairs = [self._waiting.popleft() for _ in range(n)]
            job = ScoreJob([r for r, _ in pairs], [im for _, im in pairs])
        else:
            return None
        self.busy = True
        return job

    def done(self) -> None:
        """The running score batch came back with scores."""
        self.busy = False

    def failed(self, job: ScoreJob, error: str) -> ScoreResult | None:
        """The running batch failed: None when it will be tried again, else its failed result."""
        self.busy = False
        job.tries += 1
        if job.tries <= self.retries:
            self._retry.append(job)
            return None
        n = len(job.requests)
        return ScoreResult((None,) * n, 0.0, self.device_class, (error,) * n)

    def idle(self) -> bool:
        """Nothing waiting, nothing to retry, nothing running."""
        return not (self._waiting or self._retry or self.busy)
