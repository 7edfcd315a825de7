"""The service's numbers: its Prometheus metrics and the counts behind ``/v1/stats``.

The metrics have their own registry, so several services can coexist. The dashboard's
counts are kept in one :class:`Stats` for the whole service and one per tenant; they are
counted on the engine's loop (from the listener's steps and the calls made there;
only a new job refused while draining is counted on its HTTP thread) and read there by
:meth:`Dashboard.view`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from renderq.core.events import Accepted, Escalated, Event, Regenerating
from renderq.core.ledger import shares_by
from renderq.core.scheduler import Scheduler
from renderq.core.stats import percentile
from renderq.core.types import Batch, BatchKind, Request
from renderq.runtime.realtime import Step

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
            "Observed over predicted render batch time (moving average of the last batches)",
            ["device_class"],
            registry=r,
        )
        self.latency_scale_priced = Gauge(
            "renderq_latency_scale_priced",
            "The latency scale admission prices with: the moving average plus one standard "
            "deviation of its swings, never below its slow mean",
            ["device_class"],
            registry=r,
        )
        self.renders_per_request = Gauge(
            "renderq_renders_per_request",
            "Renders each finished request has needed, as admission prices the queue ahead",
            registry=r,
        )
        self.wait_stretch = Gauge(
            "renderq_admission_wait_stretch",
            "What admission multiplies an expected wait by: how late requests admitted near "
            "their deadline have been finishing (99th percentile, at least 1)",
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


@dataclass(slots=True)
class Stats:
    """Counts for ``/v1/stats``: one for the whole service, one per tenant."""

    latencies: deque[float] = field(default_factory=lambda: deque(maxlen=2000))
    batch_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=100))
    #: ``(time, latency)`` of each image's final answer (latency None for bulk prompts),
    #: for the dashboard's charts; enough for the chart window at a few hundred images/s.
    finished: deque[tuple[float, float | None]] = field(
        default_factory=lambda: deque(maxlen=100_000)
    )
    refusals: dict[str, int] = field(default_factory=dict)
    served: int = 0
    rejected: int = 0
    accepted: int = 0
    device_seconds: dict[str, float] = field(
        default_factory=lambda: dict.fromkeys(("render", "score", "regen", "rescore"), 0.0)
    )

    def ledger(self) -> dict[str, Any]:
        """This tenant's head-count share of the device-seconds booked so far."""
        total = sum(self.device_seconds.values())
        per10k = total / 3600 / self.accepted * 10_000 if self.accepted else None
        return {
            "device_seconds": dict(self.device_seconds),
            "total_device_seconds": total,
            "accepted": self.accepted,
            "gpu_hours_per_10k_accepted": per10k,
        }


class Dashboard:
    """The whole service's :class:`Stats`, each tenant's, and the Prometheus metrics."""

    def __init__(self, metrics: Metrics, scheduler: Callable[[], Scheduler]) -> None:
        self.metrics = metrics
        self.all = Stats()
        self.tenants: dict[str, Stats] = {}
        self._scheduler = scheduler

    def tenant(self, tenant: str) -> Stats:
        """``tenant``'s counts (started on first use)."""
        found = self.tenants.get(tenant)
        if found is None:
            found = self.tenants[tenant] = Stats()
        return found

    def refused(self, reason: str, tenant: str | None) -> None:
        """Count a refusal, for ``tenant`` too where one is known."""
        self.metrics.rejections.labels(reason=reason).inc()
        for stats in (self.all, *(() if tenant is None else (self.tenant(tenant),))):
            stats.rejected += 1
            stats.refusals[reason] = stats.refusals.get(reason, 0) + 1

    def started(self, batch: Batch, waits: Iterable[float]) -> None:
        """A render batch left the queue; ``waits``: its tracked requests' seconds there."""
        self.metrics.batch_size.observe(batch.size)
        self.all.batch_sizes.append(batch.size)
        for t in {r.tenant for r in batch.requests}:
            self.tenant(t).batch_sizes.append(batch.size)
        for waited in waits:
            self.metrics.queue_seconds.observe(max(0.0, waited))

    def booked(self, step: Step, requests: Sequence[Request], seconds: float) -> None:
        """A step's device-seconds: the metrics, and each tenant's share of ``seconds``
        split as the ledger splits it (``core.ledger.shares_by``)."""
        self.metrics.compute_seconds.labels(stage=step.kind).observe(seconds)
        for stage, dev, s in step.ledger:
            self.metrics.device_seconds.labels(stage=stage, device_class=dev).inc(s)
        if not requests or seconds <= 0 or step.kind is BatchKind.LOST:
            return
        tenants = shares_by(((r.tenant, r.attempt) for r in requests), seconds, step.kind)
        for tenant, stages in tenants.items():
            booked = self.tenant(tenant).device_seconds
            for st, s in stages.items():
                booked[st.value] = booked.get(st.value, 0.0) + s

    def event(self, ev: Event, waited: float | None, skipped: bool, now: float) -> None:
        """Count one engine event: QA outcomes, and a request's end at ``now``.

        ``waited``: the seconds its caller waited (None: nobody waits on it, a bulk
        prompt); ``skipped``: it was accepted without scoring (the caller asked so).
        """
        if isinstance(ev, Regenerating):
            self.metrics.qa.labels(outcome="regenerate").inc()
        if not isinstance(ev, Accepted | Escalated):
            return
        mine = self.tenant(ev.request.tenant)
        self.all.finished.append((now, waited))
        mine.finished.append((now, waited))
        if isinstance(ev, Accepted):
            mine.accepted += 1
            self.metrics.qa.labels(outcome="skipped" if skipped else "pass").inc()
        else:
            self.metrics.qa.labels(outcome="escalate").inc()

    def answered(self, tenant: str, latency: float) -> None:
        """An interactive image was answered ``latency`` seconds after its call."""
        self.metrics.latency.labels(kind="interactive").observe(latency)
        for stats in (self.all, self.tenant(tenant)):
            stats.latencies.append(latency)
            stats.served += 1

    def view(
        self,
        tenant: str | None,
        depths: Mapping[str, int],
        waiting: int,
        jobs: list[dict[str, Any]],
        now: float,
        *,
        draining: bool,
        capacity: float | None,
    ) -> dict[str, Any]:
        """``/v1/stats`` of the whole service (``tenant`` None) or of one tenant's work.

        ``depths``: the scope's queued requests per key label; ``waiting``: its bulk
        prompts still in their jobs' backlogs (queued work too); ``jobs``: its dashboard
        rows; ``capacity``: images per second at the best batch size.
        """
        sched = self._scheduler()
        running = sched.running_batches()
        if tenant is None:
            mine, ledger = self.all, sched.ledger.report().to_dict()
            self.metrics.set_queue_depths(depths)
            self.metrics.bulk_waiting.set(waiting)
        else:
            mine = self.tenants.get(tenant) or Stats()
            ledger = mine.ledger()
            running = [b for b in running if any(r.tenant == tenant for r in b.requests)]
        return {
            "ready": True,
            "draining": draining,
            "scope": "all" if tenant is None else tenant,
            "queue_depth": dict(depths),
            "queued": sum(depths.values()) + waiting,
            "bulk_waiting": waiting,
            "running_batches": len(running),
            "recent_batch_sizes": list(mine.batch_sizes),
            "latency_p50_s": percentile(mine.latencies, 50),
            "latency_p99_s": percentile(mine.latencies, 99),
            "served": mine.served,
            "rejected": mine.rejected,
            "refusals": dict(sorted(mine.refusals.items())),
            "series": recent_series(mine.finished, now),
            "jobs": jobs,
            "capacity_images_per_s": capacity,
            "ledger": ledger,
        }

    def gauges(self, depths: Mapping[str, int], waiting: int, device_class: str | None) -> None:
        """Refresh the scheduler's gauges: queue depths per key, bulk backlog, and what
        admission applies (``device_class``: the render device's latency scale)."""
        sched = self._scheduler()
        self.metrics.set_queue_depths(depths)
        self.metrics.bulk_waiting.set(waiting)
        if device_class is not None:
            scale = sched.latency_scale(device_class)
            self.metrics.latency_scale.labels(device_class=device_class).set(scale)
            priced = sched.priced_latency_scale(device_class)
            self.metrics.latency_scale_priced.labels(device_class=device_class).set(priced)
        self.metrics.renders_per_request.set(sched.renders_per_request())
        self.metrics.wait_stretch.set(sched.wait_stretch())
