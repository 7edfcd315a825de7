"""Batching policies: small objects that say how many queued requests to cut now.

A policy sees one key's queue through a ``QueueView`` and answers two questions:
``cut`` (how many to take now; 0 means wait) and ``wakeup`` (the earliest future time
its answer could change with no new event). The scheduler owns the queues; policies
own no state, so one policy object serves every key.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from renderq.core.errors import ConfigError
from renderq.core.windows import Windows as Windows  # re-exported: the window policy's input


@dataclass(frozen=True, slots=True)
class QueueView:
    """What a policy may know about one key's queue."""

    size: int
    oldest: float
    inflight: int
    cap: int
    latency: Callable[[int], float] | None = None


class Policy(Protocol):
    """A batching policy. ``max_batch_size`` of None means "as large as the cap allows"."""

    @property
    def name(self) -> str:
        """The mode name (``adhoc``, ``dynamic``, ``window``)."""
        ...

    @property
    def max_batch_size(self) -> int | None:
        """The policy's own cap on batch size, if any."""
        ...

    def cut(self, view: QueueView, now: float) -> int:
        """How many requests to batch now (0 = wait)."""
        ...

    def wakeup(self, view: QueueView, now: float) -> float | None:
        """Earliest time > now at which ``cut`` could become non-zero without new events."""
        ...


@dataclass(frozen=True, slots=True)
class AdHoc:
    """The baseline: every request runs alone, as soon as a worker is free."""

    name: str = "adhoc"

    @property
    def max_batch_size(self) -> int | None:
        """Always one."""
        return 1

    def cut(self, view: QueueView, now: float) -> int:
        """One request whenever any is queued."""
        return 1 if view.size > 0 else 0

    def wakeup(self, view: QueueView, now: float) -> float | None:
        """Never waits, so never needs a timer."""
        return None


@dataclass(frozen=True, slots=True)
class StepSlots:
    """Step-level batching, as the scheduler sees it: one request per free slot.

    The workers of a device class in step mode are the slots of one step loop (as many as
    its running batch holds); the loop, not the scheduler, forms the running batch at each
    denoising step. ``batch_size`` is that running batch's cap (it also caps score batches
    as a render batch's size does).
    """

    batch_size: int | None = None
    name: str = "step"

    @property
    def max_batch_size(self) -> int | None:
        """The step loop's running-batch cap."""
        return self.batch_size

    def cut(self, view: QueueView, now: float) -> int:
        """One request whenever any is queued (a slot is free when asked)."""
        return 1 if view.size > 0 else 0

    def wakeup(self, view: QueueView, now: float) -> float | None:
        """Never waits, so never needs a timer."""
        return None


DEFAULT_MAX_QUEUE_DELAY_S = 0.5
"""The dynamic mode's longest wait for a batch to fill, unless told otherwise, everywhere."""


@dataclass(frozen=True, slots=True)
class Dynamic:
    """Triton-style dynamic batching.

    Cut a full batch (``max_batch_size``, or the memory cap if lower) at once; cut the
    largest reachable ``preferred_sizes`` entry at once; otherwise wait until the oldest
    queued request has waited ``max_queue_delay_s`` and cut what is there.
    """

    max_queue_delay_s: float = DEFAULT_MAX_QUEUE_DELAY_S
    batch_size: int | None = None
    preferred_sizes: tuple[int, ...] = ()
    name: str = "dynamic"

    def __post_init__(self) -> None:
        if not math.isfinite(self.max_queue_delay_s) or self.max_queue_delay_s < 0:
            raise ConfigError(f"max_queue_delay_s must be >= 0, got {self.max_queue_delay_s}")
        if self.batch_size is not None and self.batch_size < 1:
            raise ConfigError(f"max batch size must be >= 1, got {self.batch_size}")
        if any(p < 1 for p in self.preferred_sizes):
            raise ConfigError(f"preferred batch sizes must be >= 1, got {self.preferred_sizes}")

    @property
    def max_batch_size(self) -> int | None:
        """The configured maximum batch size."""
        return self.batch_size

    def cut(self, view: QueueView, now: float) -> int:
        """Full batch, else a preferred size, else whatever is there once the delay is up."""
        if view.size <= 0:
            return 0
        if view.size >= view.cap:
            return view.cap
        reachable = [p for p in self.preferred_sizes if p <= view.size]
        if reachable:
            return max(reachable)
        if now >= view.oldest + self.max_queue_delay_s:
            return view.size
        return 0

    def wakeup(self, view: QueueView, now: float) -> float | None:
        """When the oldest request's delay runs out."""
        due = view.oldest + self.max_queue_delay_s
        return due if view.size > 0 and due > now else None


@dataclass(frozen=True, slots=True)
class Window:
    """Scheduled offline windows: nothing runs outside a window; inside, fill to the cap.

    A partial batch starts only when nothing of its key is in flight (so no regeneration
    can still join it) or when the window would close before a full batch could finish.
    """

    windows: Windows = field(default_factory=Windows)
    batch_size: int | None = None
    name: str = "window"

    @property
    def max_batch_size(self) -> int | None:
        """The configured maximum batch size."""
        return self.batch_size

    def cut(self, view: QueueView, now: float) -> int:
        """Full batches inside a window; a partial one only when waiting cannot fill it.

        Where the cost model knows the latency, a batch is shrunk to what finishes before
        the window closes, and none starts when not even one request would.
        """
        span = self.windows.active(now)
        if span is None or view.size <= 0:
            return 0
        n = min(view.size, view.cap)
        if view.size < view.cap and view.inflight > 0 and now < self._last_call(span, view):
            return 0
        if view.latency is not None and math.isfinite(span[1]):
            while n > 0 and now + view.latency(n) > span[1]:
                n -= 1
        return n

    def wakeup(self, view: QueueView, now: float) -> float | None:
        """Next window start, or the last moment to cut a partial batch in this one."""
        if view.size <= 0:
            return None
        span = self.windows.active(now)
        if span is None:
            return self.windows.next_start(now)
        last = self._last_call(span, view)
        return last if last > now and math.isfinite(last) else None

    @staticmethod
    def _last_call(span: tuple[float, float], view: QueueView) -> float:
        expected = view.latency(view.cap) if view.latency is not None else 0.0
        return span[1] - expected


def parse_sizes(text: str) -> Sequence[int]:
    """Parse ``"4,8,16"`` into sizes, naming the bad value on error."""
    try:
        return tuple(int(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise ConfigError(f"batch sizes must be integers, got {text!r}") from None
