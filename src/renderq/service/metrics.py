"""Prometheus metrics of one service (own registry, so several services can coexist)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)
SERIES_WINDOW_S = 300.0
"""How far back the dashboard's charts look, in seconds."""
SERIES_BUCKET_S = 10.0
"""The width of one point of the dashboard's charts, in seconds."""


class Metrics:
    """The service's metrics; every name starts with ``renderq_``."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.queue_depth = Gauge(
            "renderq_queue_depth", "Requests queued per batch key", ["key"], registry=r
        )
        self.queue_seconds = Histogram(
            "renderq_queue_seconds",
            "Time from queueing to batch start",
            buckets=_SECONDS,
            registry=r,
        )
        self.compute_seconds = Histogram(
            "renderq_compute_seconds",
            "Device-seconds per batch",
            ["stage"],
            buckets=_SECONDS,
            registry=r,
        )
        self.batch_size = Histogram(
            "renderq_batch_size", "Requests per render batch", buckets=_SIZES, registry=r
        )
        self.device_seconds = Counter(
            "renderq_device_seconds",
            "Device-seconds booked",
            ["stage", "device_class"],
            registry=r,
        )
        self.rejections = Counter(
            "renderq_admission_rejections",
            "Requests refused at admission",
            ["reason"],
            registry=r,
        )
        self.qa = Counter("renderq_qa", "QA outcomes of attempts", ["outcome"], registry=r)
        self.latency = Histogram(
            "renderq_request_seconds",
            "Submit to final answer, per image",
            ["kind"],
            buckets=_SECONDS,
            registry=r,
        )
        self.bulk_waiting = Gauge(
            "renderq_bulk_waiting",
            "Bulk prompts waiting in their jobs' backlogs for room in the queue",
            registry=r,
        )
        self.ready = Gauge("renderq_ready", "1 once the model is loaded", registry=r)
        self.latency_scale = Gauge(
            "renderq_latency_scale",
            "Observed over predicted render batch time (moving average) that admission applies",
            ["device_class"],
            registry=r,
        )
        self.renders_per_request = Gauge(
            "renderq_renders_per_request",
            "Renders each finished request has needed, as admission prices the queue ahead",
            registry=r,
        )

    def set_queue_depths(self, depths: Mapping[str, int]) -> None:
        """Replace the per-key queue depth series with ``depths``."""
        self.queue_depth.clear()
        for key, n in depths.items():
            self.queue_depth.labels(key=key).set(n)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)


def recent_series(
    finished: Iterable[tuple[float, float | None]],
    now: float,
    window_s: float = SERIES_WINDOW_S,
    bucket_s: float = SERIES_BUCKET_S,
) -> dict[str, Any]:
    """Throughput and median latency per bucket over the last ``window_s`` seconds.

    ``finished`` holds ``(time, latency)`` per image that reached its final answer
    (``latency`` None where nobody waited on it: a bulk prompt). ``t`` is each bucket's
    end in seconds before ``now`` (0 is now), oldest first; a bucket without a latency
    is None, so a chart leaves a gap rather than drawing a zero.
    """
    if window_s <= 0 or bucket_s <= 0:
        raise ValueError(f"window_s and bucket_s must be positive, got {window_s}, {bucket_s}")
    n = max(1, round(window_s / bucket_s))
    counts = [0] * n
    waits: list[list[float]] = [[] for _ in range(n)]
    for at, latency in finished:
        age = now - at
        if age < 0 or age >= n * bucket_s:
            continue
        i = n - 1 - int(age // bucket_s)
        counts[i] += 1
        if latency is not None:
            waits[i].append(latency)
    return {
        "bucket_s": bucket_s,
        "t": [-(n - 1 - i) * bucket_s for i in range(n)],
        "throughput_per_s": [c / bucket_s for c in counts],
        "latency_p50_s": [_median(w) for w in waits],
    }


def _median(values: list[float]) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid] if len(ordered) % 2 else (ordered[mid - 1] + ordered[mid]) / 2
