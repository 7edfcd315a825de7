"""A null executor and scorer: instant tiny blank images, for measuring pure overhead."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from renderq.core.types import Batch, BatchResult, ItemResult, ScoreResult

NULL_MODEL = "null"
"""The model id that selects the null executor in ``renderq serve`` and the benches."""


class NullExecutor:
    """Returns an 8x8 black image per request at once; its device-seconds are wall time."""

    device_class = "null"
    sampler = "null"

    def __init__(self, size: int = 8) -> None:
        self.size = size

    def default_size(self) -> tuple[int, int]:
        """The only size it makes."""
        return (self.size, self.size)

    def check_size(self, width: int, height: int) -> None:
        """Any size is accepted (the image is always the default size)."""

    def run(self, batch: Batch) -> BatchResult:
        """Blank images, one per request."""
        import numpy as np

        start = time.perf_counter()
        image: Any = np.zeros((self.size, self.size, 3), dtype=np.uint8)
        items = tuple(ItemResult(r.id, image=image) for r in batch.requests)
        return BatchResult(batch.id, items, time.perf_counter() - start, self.device_class)


class NullScorer:
    """Scores every image 1.0 at no cost."""

    device_class = "null"

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """A passing score for each image, zero seconds."""
        return ScoreResult((1.0,) * len(images), 0.0, self.device_class)
