"""A null executor and scorer: instant tiny blank images, for measuring pure overhead.

``SleepExecutor`` stands for a device that takes a fixed time per batch (it sleeps; it
computes nothing): with it a pool's dispatch (hand-offs, transport, the scheduler) is
measured apart from compute.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from renderq.core.errors import ConfigError
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


class SleepExecutor:
    """Sleeps ``seconds`` per batch, then returns ``NullExecutor``'s blank images.

    It books the sleep as the batch's device-seconds: the figures it yields measure
    dispatch, never a model.
    """

    sampler = "null"

    def __init__(self, seconds: float, device_class: str = "sleep", size: int = 8) -> None:
        """A worker of ``device_class`` that takes ``seconds`` per batch."""
        if not seconds >= 0:
            raise ConfigError(f"seconds per batch must be >= 0, got {seconds}")
        import numpy as np

        self.seconds = seconds
        self.device_class = device_class
        # Made here, like a model loaded at start-up: the first batch pays no import.
        self._image: Any = np.zeros((size, size, 3), dtype=np.uint8)

    def run(self, batch: Batch) -> BatchResult:
        """Sleep, then one blank image per request."""
        time.sleep(self.seconds)
        items = tuple(ItemResult(r.id, image=self._image) for r in batch.requests)
        return BatchResult(batch.id, items, self.seconds, self.device_class)


@dataclass(frozen=True, slots=True)
class SleepLoad:
    """Builds a :class:`SleepExecutor` inside a pool worker (process or actor)."""

    seconds: float
    size: int = 8

    def build(self, spec: Any, device: str) -> SleepExecutor:
        """A sleeping executor of ``spec``'s device class."""
        return SleepExecutor(self.seconds, spec.device_class, self.size)


class NullScorer:
    """Scores every image 1.0 at no cost."""

    device_class = "null"

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """A passing score for each image, zero seconds."""
        return ScoreResult((1.0,) * len(images), 0.0, self.device_class)
