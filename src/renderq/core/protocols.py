"""The two seams every driver runs through: executors render batches, scorers score images.

Both are protocols, so the runtime depends on these shapes only; the real executors and
scorers (diffusers, CLIP, simulated, null, faults) live in ``renderq.backends``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from renderq.core.types import Batch, BatchResult, ScoreResult


class Executor(Protocol):
    """Renders batches. Never raises for one bad item: that item's result carries the error."""

    device_class: str

    def run(self, batch: Batch) -> BatchResult:
        """Render every request of ``batch`` and say how many device-seconds it took."""
        ...


class Scorer(Protocol):
    """Scores images against their prompts (higher is better)."""

    device_class: str

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """One score per image, plus the device-seconds the batch took."""
        ...
