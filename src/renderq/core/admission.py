"""Admission control: refuse at once what cannot be served, instead of letting queues grow.

Two checks, both before a request is queued: a bounded queue per key, and a deadline
check. The deadline check asks the cost model when the request would finish if every
batch ahead of it (of equal or higher priority) ran full on the key's workers. The work
ahead is ``ahead * renders_per_request`` renders (the regenerations the queue ahead will
still need, at the rate seen so far), the request's own batch is priced at its own size,
and each regeneration the request itself may need adds one batch (regenerations go ahead
of new requests, so a retry waits for one batch, not for the whole queue again) of the
size the queue would fill, ``min(cap, ahead + 1)``:
``now + (full batches * latency(cap) + latency(rest) + retries * latency(b)) / workers``.
Pricing every retry the budget allows keeps requests admitted at the edge of their deadline
from missing it when they fail the gate; it costs a short queue one small batch each.
A request whose deadline falls before that is rejected with reason ``deadline``; callers
may retry after the queue ahead has drained.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from renderq.core.errors import ConfigError
from renderq.core.events import Admission


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Limits for admission. ``None`` disables the corresponding check."""

    max_queue_per_key: int | None = None
    workers_per_device: int = 1

    def __post_init__(self) -> None:
        if self.max_queue_per_key is not None and self.max_queue_per_key < 1:
            raise ConfigError(f"max_queue_per_key must be >= 1, got {self.max_queue_per_key}")
        if self.workers_per_device < 1:
            raise ConfigError(f"workers_per_device must be >= 1, got {self.workers_per_device}")


def expected_finish(
    now: float,
    ahead: int,
    cap: int,
    latency: Callable[[int], float],
    workers: int,
    *,
    renders_per_request: float = 1.0,
    retries: int = 0,
) -> float:
    """When a request with ``ahead`` requests before it would finish, batches running full.

    ``renders_per_request`` prices the regenerations of the queue ahead; ``retries`` the
    request's own (one batch each, as full as the queue would make it).
    """
    total = math.ceil(ahead * renders_per_request) + 1
    full, rest = divmod(total, cap)
    busy = full * latency(cap) + (latency(rest) if rest else 0.0)
    busy += retries * latency(min(cap, total))
    return now + busy / workers


def admit(
    config: AdmissionConfig,
    *,
    now: float,
    queued: int,
    ahead: int,
    deadline: float | None,
    cap: int,
    latency: Callable[[int], float] | None,
    renders_per_request: float = 1.0,
    retries: int = 0,
) -> Admission:
    """The admission verdict for one request (pure); see :func:`expected_finish`."""
    limit = config.max_queue_per_key
    if limit is not None and queued >= limit:
        return Admission(
            False, "queue_full", f"{queued} requests already queued for this key (limit {limit})"
        )
    if deadline is not None:
        if deadline <= now:
            return Admission(False, "deadline", f"deadline {deadline:.3f} is already past")
        if latency is not None:
            finish = expected_finish(
                now,
                ahead,
                cap,
                latency,
                config.workers_per_device,
                renders_per_request=renders_per_request,
                retries=retries,
            )
            if finish > deadline:
                wait = finish - now
                return Admission(
                    False,
                    "deadline",
                    f"expected to finish in {wait:.2f}s, after the deadline in "
                    f"{deadline - now:.2f}s",
                    retry_after_s=max(0.0, math.ceil(wait - (deadline - now))),
                )
    return Admission(True)
