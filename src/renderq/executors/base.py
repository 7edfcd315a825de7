"""The executor seam: a batch goes in, one result per request comes out."""

from __future__ import annotations

from typing import Protocol

from renderq.core.types import Batch, BatchResult


class Executor(Protocol):
    """Renders batches. Never raises for one bad item: that item's result carries the error."""

    device_class: str

    def run(self, batch: Batch) -> BatchResult:
        """Render every request of ``batch`` and say how many device-seconds it took."""
        ...
