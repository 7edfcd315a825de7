"""The scorer seam: images and prompts in, one score per image out."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from renderq.core.types import ScoreResult


class Scorer(Protocol):
    """Scores images against their prompts (higher is better)."""

    device_class: str

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """One score per image, plus the device-seconds the batch took."""
        ...
