"""The QA decision: accept, regenerate with the next seed, or escalate to review."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from renderq.core.errors import ConfigError


class Verdict(enum.StrEnum):
    """What happens to an attempt after it is scored."""

    ACCEPT = "accept"
    REGENERATE = "regenerate"
    ESCALATE = "escalate"


DEFAULT_MAX_ATTEMPTS = 3
"""Renders per prompt in all (the first included) unless told otherwise, everywhere."""


@dataclass(frozen=True, slots=True)
class QAPolicy:
    """Accept at ``score >= threshold``; otherwise retry until ``max_attempts`` in all.

    ``max_attempts`` counts the first render, so 1 means "never regenerate".
    ``enabled=False`` accepts every image that rendered, scored or not (no gate).
    """

    threshold: float = 0.0
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"max_attempts must be >= 1, got {self.max_attempts}")

    def decide(self, score: float | None, attempt: int) -> Verdict:
        """Verdict for attempt ``attempt`` (0-based) that scored ``score``.

        ``score=None`` means the image could not be scored; with the gate on it is retried
        like a failing score.
        """
        if not self.enabled or (score is not None and score >= self.threshold):
            return Verdict.ACCEPT
        return self.retry(attempt)

    def retry(self, attempt: int) -> Verdict:
        """Verdict for an attempt that produced no image at all (gate or no gate)."""
        if attempt + 1 < self.max_attempts:
            return Verdict.REGENERATE
        return Verdict.ESCALATE
