"""Prometheus metrics of one service (own registry, so several services can coexist)."""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_SECONDS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
_SIZES = (1, 2, 4, 8, 16, 32, 64, 128)


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
