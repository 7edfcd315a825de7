"""The service behind ``renderq serve``: one device pool, one scheduler, many callers.

HTTP handlers never touch the scheduler: every submit, cancel and snapshot runs on the
engine's loop thread through ``RealtimeEngine.call``, and results come back through
a future per call that the service's listener resolves from the engine's steps. Interactive
requests ride at priority 10-19, bulk jobs at 0-9, so interactive work always goes first.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import sys
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.registry import model_defaults, resolve, scorer_default_threshold
from renderq.core.admission import AdmissionConfig
from renderq.core.cost import LatencyCurve, StageCost
from renderq.core.errors import ConfigError, UnknownRequest
from renderq.core.events import Accepted, Cancelled, Escalated, Event, Regenerating
from renderq.core.ledger import shares_by
from renderq.core.protocols import Executor, Scorer
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.settings import key_for, make_policy
from renderq.core.stats import percentile
from renderq.core.types import TERMINAL, Batch, BatchKey, BatchKind, Request, RequestState
from renderq.runtime.realtime import RealtimeEngine, Step
from renderq.service.config import ServiceConfig
from renderq.service.jobs import SEP, JobBook, ServiceJob, job_shares
from renderq.service.metrics import Metrics, recent_series

INTERACTIVE_PRIORITY = 10
DASHBOARD_JOBS = 20
"""How many jobs ``/v1/stats`` lists (unfinished first, then the newest)."""
DRAINING = "the service is shutting down; retry elsewhere"


class Refused(Exception):
    """A request the service will not take now: HTTP status, reason and retry hint."""

    def __init__(self, status: int, reason: str, detail: str, retry_after_s: float = 1.0):
        super().__init__(detail)
        self.status, self.reason, self.detail = status, reason, detail
        self.retry_after_s = retry_after_s


@dataclass(frozen=True, slots=True)
class ImageResult:
    """The final answer for one interactive image."""

    request_id: str
    image: Any
    seed: int
    attempts: int
    score: float | None
    state: str
    batch_id: int
    batch_size: int


@dataclass(slots=True)
class _Answer:
    """The answer to one generation call: every image's result in order, or a failure.

    One future for the call, resolved on the loop thread when its last image ends, so
    the event loop is woken once per call.
    """

    done: Future[list[ImageResult]]
    results: list[ImageResult | None]
    left: int
    #: Set when the call was refused while being submitted: its requests' ends say nothing.
    abandoned: bool = False

    def put(self, index: int, result: ImageResult) -> None:
        """One image's final answer; the last one resolves the call."""
        if self.abandoned or self.done.done():
            return
        self.results[index] = result
        self.left -= 1
        if self.left == 0:
            self.done.set_result([r for r in self.results if r is not None])

    def fail(self, exc: BaseException) -> None:
        """The call fails (the first failure wins)."""
        if not self.abandoned and not self.done.done():
            self.done.set_exception(exc)

    def forget(self, index: int) -> None:
        """An image leaves the service: unanswered, it was cancelled, and so is the call."""
        if self.results[index] is None:
            self.fail(Refused(409, "cancelled", "the request was cancelled"))


@dataclass(slots=True)
class _Outstanding:
    tenant: str
    submitted: float
    answer: _Answer | None = None  # None: a bulk prompt
    index: int = 0
    qa: bool = True


@dataclass(slots=True)
class Defaults:
    """What the loaded model renders unless a request says otherwise."""

    width: int
    height: int
    steps: int
    guidance: float
    threshold: float
    sampler: str


@dataclass(slots=True)
class _Stats:
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


class RenderService:
    """Owns the model, the scheduler and the engine thread; thread-safe entry points."""

    def __init__(
        self,
        config: ServiceConfig,
        *,
        load: Callable[[ServiceConfig], tuple[Executor, Scorer, Defaults]] | None = None,
    ) -> None:
        self.config = config
        self.metrics = Metrics()
        self.ready = threading.Event()
        self.load_error: str | None = None
        self.draining = False
        self._load = load or load_models
        self._engine: RealtimeEngine | None = None
        self._sched: Scheduler | None = None
        self._thread: threading.Thread | None = None
        self._out: dict[str, _Outstanding] = {}
        self._tenant_queued: dict[str, int] = {}
        self._ids = itertools.count()
        self._nonce = uuid.uuid4().hex[:6]
        self._stats = _Stats()
        self._tenants: dict[str, _Stats] = {}
        self.defaults: Defaults | None = None
        self._executor: Executor | None = None
        #: Images per second at the best batch size, measured at warm-up.
        self.capacity: float | None = None
        self.jobs = JobBook(config.data_dir / "jobs")
        #: Bulk prompts waiting for room in their key's queue, per job (see ``_top_up``).
        self._backlog: dict[str, deque[Request]] = {}

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Load the model in the background; ``ready`` is set once it can serve."""
        threading.Thread(target=self._start, daemon=True, name="renderq-load").start()

    def _start(self) -> None:
        try:
            executor, scorer, self.defaults = self._load(self.config)
            self._executor = executor
            cost = warm_up(executor, self.defaults, self.config.render_cap)
            best = cost.best_size(cost.max_size)
            self.capacity = best / cost.latency(best)
            self._sched = Scheduler(
                make_policy(self.config.batching),
                qa=QAPolicy(self.defaults.threshold, self.config.qa.max_attempts),
                cost=lambda key: scaled_cost(cost, key, self.defaults),  # type: ignore[arg-type]
                admission=AdmissionConfig(self.config.max_queue_per_key, 1),
            )
            self._engine = RealtimeEngine(
                self._sched,
                {executor.device_class: executor},
                scorer,
                _Listener(self),
                score_batch_size=self.config.batching.score_batch_size,
            )
            self._thread = threading.Thread(
                target=lambda: self._engine.run(until_idle=False),  # type: ignore[union-attr]
                daemon=True,
                name="renderq-engine",
            )
            self._thread.start()
            self._resume_jobs()
            self.metrics.ready.set(1)
            self.ready.set()
        except Exception as exc:  # reported by /readyz
            self.load_error = f"{type(exc).__name__}: {exc}"

    def begin_drain(self) -> None:
        """Stop admission (new work answers 503 ``draining``); queued bulk prompts go back.

        Idempotent: the signal handler calls it first, the app's shutdown again.
        """
        if self.draining:
            return
        self.draining = True
        if self._engine is not None:
            self._call(self._cancel_queued_bulk).result(timeout=60)

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no batch runs and every admitted interactive request has its answer."""
        if self._engine is None:
            return True
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._call(lambda now: self._busy()).result(timeout=timeout_s) == 0:
                return True
            time.sleep(0.05)
        return False

    def drain(self, timeout_s: float = 60.0) -> None:
        """Stop admission, drop queued bulk work (kept pending in its store), finish the rest."""
        self.begin_drain()
        if self._engine is None:
            return
        self.wait_idle(timeout_s)
        kept = self._call(self._close_jobs).result(timeout=timeout_s)
        self._engine.stop()
        if self._thread is not None:
            self._thread.join(timeout=timeout_s)
        print(f"renderq serve: drained; {kept} queued bulk prompts kept for the next start",
              file=sys.stderr, flush=True)  # fmt: skip

    # -- interactive ------------------------------------------------------------------

    def build_requests(self, tenant: str, *, prompt: str, n: int, **opts: Any) -> list[Request]:
        """The requests for one generation call (validated against the loaded model)."""
        if n > self.config.max_n:
            raise ConfigError(f"n must be at most {self.config.max_n}, got {n}")
        negative = opts.get("negative_prompt") or ""
        plain, guidance = self._key_of(opts)
        key, _ = self.prompt_key(plain, prompt, negative)
        seed = opts.get("seed")
        base = seed if seed is not None else int.from_bytes(os.urandom(6), "big")
        rid = f"i{self._nonce}-{next(self._ids)}"
        return [
            Request(
                id=f"{rid}-{i}",
                prompt=prompt,
                key=key,
                base_seed=base + i,
                priority=INTERACTIVE_PRIORITY + int(opts.get("priority") or 0),
                guidance_scale=guidance,
                negative_prompt=negative,
                tenant=tenant,
                qa=bool(opts.get("qa", True)),
            )
            for i in range(n)
        ]

    async def generate(
        self, requests: Sequence[Request], deadline_s: float | None
    ) -> list[ImageResult]:
        """Submit all (all or nothing) and wait for every image's final answer.

        One future carries the refusal or every answer, so the event loop is woken once
        per call, not once for the admission and again for the images.
        """
        answer = _Answer(Future(), [None] * len(requests), len(requests))

        def submit(now: float) -> None:
            try:
                self._submit_interactive(requests, deadline_s, now, answer)
            except Exception as exc:
                answer.abandoned = False
                answer.fail(exc)

        self._call(submit)
        return await asyncio.wrap_future(answer.done)

    def _submit_interactive(
        self, requests: Sequence[Request], deadline_s: float | None, now: float, answer: _Answer
    ) -> None:
        tenant = requests[0].tenant
        self._check_admission(tenant, len(requests))
        sched = self._scheduler()
        done: list[Request] = []
        for i, r in enumerate(requests):
            if deadline_s is not None:
                r = dataclasses.replace(r, deadline=now + deadline_s, arrival=now)
            verdict = sched.submit(r, now)
            if not verdict.admitted:
                answer.abandoned = True  # the refusal, not the cancels, answers the call
                for d in done:
                    self._forget(d.id, sched.cancel(d.id, now))
                sched.forget(r.id)
                retry = verdict.retry_after_s or 1.0
                self._refuse(429, verdict.reason, verdict.detail, retry, tenant)
            self._out[r.id] = _Outstanding(tenant, now, answer, i, r.qa)
            self._tenant_queued[tenant] = self._tenant_queued.get(tenant, 0) + 1
            done.append(r)

    def _check_admission(self, tenant: str, n: int) -> None:
        if self.draining:
            self._refuse(503, "draining", DRAINING, 5.0, tenant)
        limit = self.config.tenant_max_queued
        queued = self._tenant_queued.get(tenant, 0)
        if limit is not None and n > limit:  # never fits: retrying cannot help
            raise ConfigError(f"n={n} is above this tenant's limit of {limit} queued requests")
        if limit is not None and queued + n > limit:
            self._refuse(
                429, "tenant_limit", f"tenant has {queued} requests queued (limit {limit})", 1.0,
                tenant,
            )  # fmt: skip

    def _refuse(
        self, status: int, reason: str, detail: str, retry: float, tenant: str | None = None
    ) -> None:
        self.metrics.rejections.labels(reason=reason).inc()
        self._stats.rejected += 1
        self._stats.refusals[reason] = self._stats.refusals.get(reason, 0) + 1
        if tenant is not None:
            mine = self._tenant(tenant)
            mine.rejected += 1
            mine.refusals[reason] = mine.refusals.get(reason, 0) + 1
        raise Refused(status, reason, detail, retry)

    # -- bulk jobs --------------------------------------------------------------------

    def create_job(self, tenant: str, prompts: Sequence[tuple[str, int, str]], **opts: Any) -> str:
        """Persist a bulk job and queue its prompts at bulk priority; returns its id."""
        if len(prompts) > self.config.max_job_prompts:
            raise ConfigError(
                f"a job holds at most {self.config.max_job_prompts} prompts, got {len(prompts)}"
            )
        key, guidance = self._key_of(opts)
        lengths = []
        for i, (text, _seed, negative) in enumerate(prompts):
            try:
                bucketed, truncated = self.prompt_key(key, text, negative)
            except ConfigError as exc:
                raise ConfigError(f"prompt {i}: {exc}") from None
            lengths.append({"prompt_bucket": bucketed.prompt_bucket, "truncated": truncated})
        if self.draining:
            self._refuse(503, "draining", DRAINING, 5.0, tenant)
        mode = str(opts.get("mode", "dynamic"))
        windows = opts.get("windows")

        def create(now: float) -> str:
            job = self.jobs.create(
                tenant,
                prompts,
                lengths=lengths,
                key=key,
                guidance=guidance,
                priority=int(opts.get("priority") or 0),
                mode=mode,
                windows=windows,
                config=self._job_config(guidance),
                max_attempts=self.config.qa.max_attempts,
            )
            self._submit_job(job, now)
            return job.id

        return str(self._call(create).result(timeout=120))

    def job_status(self, tenant: str, job_id: str) -> dict[str, Any]:
        """Progress and ledger of one of the tenant's jobs (JobNotFound otherwise)."""
        return dict(self._call(lambda now: self._job_status(tenant, job_id)).result(60))

    def _job_status(self, tenant: str, job_id: str) -> dict[str, Any]:
        """A job's status, with ``in_flight``: its prompts in a running render or score batch."""
        job = self.jobs.get(tenant, job_id)
        sched = self._scheduler()
        busy = (RequestState.RUNNING, RequestState.SCORING)
        prefix = job.id + SEP
        # From the scheduler, not ``_out``: a cancelled job's running prompts have left
        # ``_out`` but are still on the device.
        in_flight = sum(
            1 for rid, st in sched.states().items() if st in busy and rid.startswith(prefix)
        )
        return {**job.status(), "in_flight": in_flight}

    def job_images(
        self, tenant: str, job_id: str, offset: int, limit: int, with_images: bool
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of the job's accepted images."""
        fut = self._call(
            lambda now: self.jobs.get(tenant, job_id).images(offset, limit, with_images)
        )
        page, total = fut.result(60)
        return page, total

    def _submit_job(self, job: ServiceJob, now: float) -> None:
        # Job windows are in Unix time; the scheduler's clock is the engine's.
        self._backlog[job.id] = deque(job.pending_requests(clock_offset=now - time.time()))
        self._top_up(now)

    def bulk_room(self) -> int | None:
        """How many queued requests of one key bulk work may hold (None: no limit).

        Bulk prompts fill three quarters of the per-key queue at most, so interactive
        requests of the same key still find room.
        """
        limit = self.config.max_queue_per_key
        return None if limit is None else max(1, limit * 3 // 4)

    def _top_up(self, now: float) -> None:
        """Move bulk prompts from their jobs' backlogs into the queue as room frees.

        Backpressure, not refusal: a job larger than the queue waits in its store and
        flows in as batches leave, so it finishes without a restart.
        """
        if not self._backlog or self.draining:
            return
        sched = self._scheduler()
        room = self.bulk_room()
        depths = sched.queue_depths()
        for job_id, backlog in list(self._backlog.items()):
            while backlog and (room is None or depths.get(backlog[0].key, 0) < room):
                r = backlog.popleft()
                if not sched.submit(r, now).admitted:  # full some other way: try again later
                    sched.forget(r.id)
                    backlog.appendleft(r)
                    break
                self._out[r.id] = _Outstanding(r.tenant, now)
                depths[r.key] = depths.get(r.key, 0) + 1
            if not backlog:
                del self._backlog[job_id]

    def cancel_job(self, tenant: str, job_id: str) -> dict[str, Any]:
        """Cancel a job: queued prompts are dropped now, rendered images are kept."""

        def cancel(now: float) -> dict[str, Any]:
            job = self.jobs.get(tenant, job_id)
            job.mark_cancelled()
            self._backlog.pop(job.id, None)
            sched = self._scheduler()
            for rid in [r for r in self._out if r.startswith(job.id + SEP)]:
                self._forget(rid, sched.cancel(rid, now))
            return self._job_status(tenant, job_id)

        return dict(self._call(cancel).result(timeout=60))

    def _resume_jobs(self) -> None:
        def resume(now: float) -> None:
            for job in self.jobs.resume():
                self._submit_job(job, now)

        self._call(resume).result(timeout=300)

    def _job_config(self, guidance: float) -> dict[str, Any]:
        spec = self.config.spec
        return {"model": spec.model, "scorer": spec.scorer, "guidance": guidance}

    def _cancel_queued_bulk(self, now: float) -> int:
        """Drop queued and waiting bulk prompts (they stay pending in their job stores)."""
        sched = self._scheduler()
        kept = sum(len(b) for b in self._backlog.values())
        self._backlog.clear()
        for rid in list(self._out):
            if SEP in rid and sched.state(rid) is RequestState.QUEUED:
                self._forget(rid, sched.cancel(rid, now))
                kept += 1
        return kept

    def _close_jobs(self, now: float) -> int:
        """Close every job store; returns the prompts they keep pending for the next start.

        Read from the stores, not counted while cancelling: a prompt regenerated during
        the drain is pending too.
        """
        kept = 0
        for job in self.jobs.jobs.values():
            if job.meta["state"] != "cancelled":
                kept += int(job.status()["pending"])
        self.jobs.close()
        return kept

    # -- called by the listener on the loop thread --------------------------------------

    def on_started(self, batch: Batch, now: float) -> None:
        """Batch metrics, and the job listeners' progress counts."""
        self.metrics.batch_size.observe(batch.size)
        self._stats.batch_sizes.append(batch.size)
        for t in {r.tenant for r in batch.requests}:
            self._tenant(t).batch_sizes.append(batch.size)
        for r in batch.requests:
            o = self._out.get(r.id)
            if o is not None:
                self.metrics.queue_seconds.observe(max(0.0, now - o.submitted))
        for job, reqs in self.jobs.split(batch.requests).items():
            job.started(batch, reqs)

    def on_step(self, step: Step, now: float) -> None:
        """Metrics, job commits and interactive answers for one engine step."""
        secs = (
            step.render.device_seconds
            if step.render
            else (step.score.device_seconds if step.score else 0.0)
        )
        self.metrics.compute_seconds.labels(stage=step.kind).observe(secs)
        for stage, dev, s in step.ledger:
            self.metrics.device_seconds.labels(stage=stage, device_class=dev).inc(s)
        reqs = step.batch.requests if step.batch else step.scored
        dev = (
            step.render.device_class
            if step.render
            else (step.score.device_class if step.score else "")
        )
        shares = job_shares(reqs, secs, step.kind, dev)
        self._book_tenants(reqs, secs, step.kind)
        for job, sub in self.jobs.split_step(step, shares).items():
            job.step(sub)
        for ev in step.events:
            self._on_event(ev, step, now)
        self._top_up(now)

    def _on_event(self, ev: Event, step: Step, now: float) -> None:
        if isinstance(ev, Regenerating):
            self.metrics.qa.labels(outcome="regenerate").inc()
            return
        if not isinstance(ev, Accepted | Escalated | Cancelled):
            return
        o = self._out.get(ev.request.id)
        if not isinstance(ev, Cancelled):
            waited = now - o.submitted if o is not None and o.answer is not None else None
            self._stats.finished.append((now, waited))
            self._tenant(ev.request.tenant).finished.append((now, waited))
        if isinstance(ev, Accepted):
            self._tenant(ev.request.tenant).accepted += 1
            skipped = o is not None and not o.qa
            self.metrics.qa.labels(outcome="skipped" if skipped else "pass").inc()
        elif isinstance(ev, Escalated):
            self.metrics.qa.labels(outcome="escalate").inc()
        if o is not None and o.answer is not None:
            kind = "interactive"
            last = ev.history[-1] if ev.history else None
            state = (
                "accepted"
                if isinstance(ev, Accepted)
                else ("escalated" if isinstance(ev, Escalated) else "cancelled")
            )
            if isinstance(ev, Accepted) and not o.qa:
                state = "skipped"
            o.answer.put(
                o.index,
                ImageResult(
                    ev.request.id,
                    _image_of(ev, step),
                    ev.request.seed,
                    len(ev.history),
                    last.score if last else None,
                    state,
                    last.batch_id if last else 0,
                    last.batch_size if last else 0,
                ),
            )
            self._stats.latencies.append(now - o.submitted)
            self.metrics.latency.labels(kind=kind).observe(now - o.submitted)
            self._stats.served += 1
            mine = self._tenant(o.tenant)
            mine.latencies.append(now - o.submitted)
            mine.served += 1
        self._forget(ev.request.id, [])

    def _forget(self, request_id: str, events: Sequence[Event]) -> None:
        o = self._out.pop(request_id, None)
        if o is not None and o.answer is not None:
            self._tenant_queued[o.tenant] = self._tenant_queued.get(o.tenant, 1) - 1
            o.answer.forget(o.index)
        sched = self._scheduler()
        try:
            if sched.state(request_id) in TERMINAL:
                sched.forget(request_id)
        except UnknownRequest:
            pass

    # -- inspection -------------------------------------------------------------------

    def stats(self, tenant: str | None = None, admin: bool = True) -> dict[str, Any]:
        """Numbers for the dashboard (taken on the loop thread).

        ``admin``: the whole service, with each tenant's numbers under ``tenants``;
        otherwise only ``tenant``'s own requests, batches, latencies and ledger share.
        """
        if self._engine is None:
            return {"ready": False, "load_error": self.load_error}
        if admin or tenant is None:
            return dict(self._call(self._stats_now).result(timeout=10))
        return dict(self._call(lambda now: self._tenant_stats(tenant, now)).result(timeout=10))

    def _stats_now(self, now: float) -> dict[str, Any]:
        sched = self._scheduler()
        depths = {k.label(): n for k, n in sched.queue_depths().items()}
        self.metrics.set_queue_depths(depths)
        lat = self._stats.latencies
        waiting = sum(len(b) for b in self._backlog.values())
        self.metrics.bulk_waiting.set(waiting)
        return {
            "ready": True,
            "draining": self.draining,
            "scope": "all",
            "queue_depth": depths,
            # Bulk prompts waiting in their jobs' backlogs are queued work too.
            "queued": sum(depths.values()) + waiting,
            "bulk_waiting": waiting,
            "running_batches": len(sched.running_batches()),
            "recent_batch_sizes": list(self._stats.batch_sizes),
            "latency_p50_s": percentile(lat, 50),
            "latency_p99_s": percentile(lat, 99),
            "served": self._stats.served,
            "rejected": self._stats.rejected,
            "refusals": dict(sorted(self._stats.refusals.items())),
            "series": recent_series(self._stats.finished, now),
            "jobs": self._job_progress(None),
            "capacity_images_per_s": self.capacity,
            "ledger": sched.ledger.report().to_dict(),
            "tenants": {t: self._tenant_stats(t, now) for t in sorted(self._tenants)},
        }

    def _tenant_stats(self, tenant: str, now: float) -> dict[str, Any]:
        """One tenant's view: its own queued and running work, and its share of the ledger."""
        sched = self._scheduler()
        waiting = sum(
            len(b) for job_id, b in self._backlog.items() if self.jobs.jobs[job_id].tenant == tenant
        )
        depths: dict[str, int] = {}
        for rid, o in self._out.items():
            if o.tenant == tenant and sched.state(rid) is RequestState.QUEUED:
                label = sched.request(rid).key.label()
                depths[label] = depths.get(label, 0) + 1
        running = sum(
            1 for b in sched.running_batches() if any(r.tenant == tenant for r in b.requests)
        )
        mine = self._tenants.get(tenant) or _Stats()
        return {
            "ready": True,
            "draining": self.draining,
            "scope": tenant,
            "queue_depth": depths,
            "queued": sum(depths.values()) + waiting,
            "bulk_waiting": waiting,
            "running_batches": running,
            "recent_batch_sizes": list(mine.batch_sizes),
            "latency_p50_s": percentile(mine.latencies, 50),
            "latency_p99_s": percentile(mine.latencies, 99),
            "served": mine.served,
            "rejected": mine.rejected,
            "refusals": dict(sorted(mine.refusals.items())),
            "series": recent_series(mine.finished, now),
            "jobs": self._job_progress(tenant),
            "capacity_images_per_s": self.capacity,
            "ledger": mine.ledger(),
        }

    def _job_progress(self, tenant: str | None) -> list[dict[str, Any]]:
        """The dashboard's job rows (``tenant``'s, or all): unfinished first, then newest.

        ``escalated`` counts every prompt that failed the gate and is not accepted (a
        reviewer's rejections and edits included); ``waiting`` the prompts still in the
        job's backlog, not yet in the queue.
        """
        jobs = [j for j in self.jobs.jobs.values() if tenant is None or j.tenant == tenant]
        jobs.sort(key=lambda j: (j.state in ("done", "cancelled"), -float(j.meta["created"])))
        rows = []
        for job in jobs[:DASHBOARD_JOBS]:
            counts = job.store.counts()
            accepted, pending = counts.get("accepted", 0), counts.get("pending", 0)
            escalated = sum(counts.get(s, 0) for s in ("escalated", "rejected", "edited"))
            rows.append({
                "id": job.id, "tenant": job.tenant, "state": job.state,
                "mode": str(job.meta["mode"]), "total": len(job.rows), "accepted": accepted,
                "escalated": escalated, "pending": pending,
                "waiting": len(self._backlog.get(job.id, ())),
            })  # fmt: skip
        return rows

    def _tenant(self, tenant: str) -> _Stats:
        found = self._tenants.get(tenant)
        if found is None:
            found = self._tenants[tenant] = _Stats()
        return found

    def _book_tenants(self, reqs: Sequence[Request], seconds: float, kind: BatchKind) -> None:
        """Each tenant's share of a batch's device-seconds, split as the ledger splits it."""
        if not reqs or seconds <= 0 or kind is BatchKind.LOST:
            return
        for tenant, stages in shares_by(
            ((r.tenant, r.attempt) for r in reqs), seconds, kind
        ).items():
            booked = self._tenant(tenant).device_seconds
            for stage, s in stages.items():
                booked[stage.value] = booked.get(stage.value, 0.0) + s

    def metrics_text(self) -> bytes:
        """Prometheus exposition; refreshes the scheduler's gauges first."""
        if self._engine is not None:
            self._call(self._refresh_gauges).result(timeout=10)
        return self.metrics.render()

    def _refresh_gauges(self, now: float) -> None:
        sched = self._scheduler()
        self.metrics.set_queue_depths({k.label(): n for k, n in sched.queue_depths().items()})
        self.metrics.bulk_waiting.set(sum(len(b) for b in self._backlog.values()))
        if self._executor is not None:
            dev = self._executor.device_class
            self.metrics.latency_scale.labels(device_class=dev).set(sched.latency_scale(dev))
        self.metrics.renders_per_request.set(sched.renders_per_request())

    # -- helpers ----------------------------------------------------------------------

    def _key_of(self, opts: dict[str, Any]) -> tuple[BatchKey, float]:
        """The batch key (prompt bucket 0) and guidance of a request's size/steps/guidance.

        Checked against the loaded model; :meth:`prompt_key` adds the prompt's own part.
        """
        d = self._defaults()
        width, height = opts.get("size") or (d.width, d.height)
        self._executor_check("check_size", width, height)
        steps = opts.get("steps") or d.steps
        if steps > self.config.max_steps:
            raise ConfigError(f"steps must be at most {self.config.max_steps}, got {steps}")
        guidance = d.guidance if opts.get("guidance") is None else float(opts["guidance"])
        return self.key(width, height, steps, guidance), guidance

    def key(
        self, width: int, height: int, steps: int, guidance: float, prompt_bucket: int = 0
    ) -> BatchKey:
        """The batch key of a request to the served model (the rule ``renderq run`` uses)."""
        d = self._defaults()
        device = self._executor.device_class if self._executor else self.config.spec.device
        return key_for(
            self.config.spec.model, width, height, steps, guidance, d.sampler,
            self.config.spec.precision, device, prompt_bucket,
        )  # fmt: skip

    def prompt_key(
        self, key: BatchKey, prompt: str, negative_prompt: str = ""
    ) -> tuple[BatchKey, list[str]]:
        """``key`` with the prompt's length bucket, and the encoders that would cut it.

        The negative prompt is checked by the executor first: a model that would ignore
        one refuses it (ConfigError naming it), as ``renderq run`` does.
        """
        self._executor_check("check_negative_prompt", negative_prompt)
        bucket, truncated = prompt_length(self._executor, prompt)
        if bucket != key.prompt_bucket:
            key = dataclasses.replace(key, prompt_bucket=bucket)
        return key, truncated

    def _busy(self) -> int:
        sched = self._scheduler()
        states = sched.states().values()
        running = sum(1 for s in states if s in (RequestState.RUNNING, RequestState.SCORING))
        # Admitted interactive requests are a promise: they are answered before the stop.
        waiting = sum(1 for o in self._out.values() if o.answer is not None)
        return running + waiting

    def _executor_check(self, name: str, *args: Any) -> None:
        """Run the executor's input check ``name`` where it has one (the null model has not)."""
        check = getattr(self._executor, name, None)
        if check is not None:
            check(*args)

    def _defaults(self) -> Defaults:
        if self.defaults is None or not self.ready.is_set():
            raise Refused(503, "not_ready", self.load_error or "the model is still loading", 2.0)
        return self.defaults

    def _scheduler(self) -> Scheduler:
        assert self._sched is not None
        return self._sched

    def _call(self, fn: Callable[[float], Any]) -> Future[Any]:
        if self._engine is None:
            raise Refused(503, "not_ready", self.load_error or "the model is still loading", 2.0)
        return self._engine.call(fn)


class _Listener:
    def __init__(self, service: RenderService) -> None:
        self.service = service

    def started(self, batch: Batch) -> None:
        eng = self.service._engine
        self.service.on_started(batch, eng.now() if eng else 0.0)

    def step(self, step: Step) -> None:
        eng = self.service._engine
        self.service.on_step(step, eng.now() if eng else 0.0)


def load_models(config: ServiceConfig) -> tuple[Executor, Scorer, Defaults]:
    """Load the configured diffusers pipeline and CLIP scorer."""
    from renderq.backends.clip import ClipScorer
    from renderq.backends.diffusers import DiffusersExecutor
    from renderq.backends.null import NULL_MODEL, NullExecutor, NullScorer

    spec = config.spec
    if spec.model == NULL_MODEL:  # pure service overhead: instant blank images
        null = NullExecutor()
        return null, NullScorer(), Defaults(null.size, null.size, 1, 0.0, 0.0, null.sampler)

    executor = DiffusersExecutor.load(
        resolve(spec.model), device=spec.device, precision=spec.precision, name=spec.model
    )
    scorer = ClipScorer.load(resolve(spec.scorer), device=spec.device, name=spec.scorer)
    width, height = executor.default_size()
    steps, guidance = spec.resolve(*model_defaults(spec.model))
    threshold = config.qa.policy(scorer_default_threshold(spec.scorer)).threshold
    defaults = Defaults(width, height, steps, guidance, threshold, executor.sampler)
    return executor, scorer, defaults


def prompt_length(executor: Any, prompt: str) -> tuple[int, list[str]]:
    """The executor's length bucket of ``prompt`` and what would truncate it (0, none: an
    executor without text-encoder buckets)."""
    measure = getattr(executor, "prompt_length", None)
    if measure is None:
        return 0, []
    length = measure(prompt)
    return int(length.bucket), list(length.truncated)


def warm_up(executor: Executor, d: Defaults, cap: int) -> LatencyCurve:
    """Render a batch of 1 and of ``cap`` (one warm-up, two timed runs each): the cost curve.

    Admission corrects it later by the latency it observes (``Scheduler.latency_scale``).
    """
    prompt = "a red circle"
    key = key_for(
        "warm-up", d.width, d.height, d.steps, d.guidance, d.sampler, "-",
        executor.device_class, prompt_length(executor, prompt)[0],
    )  # fmt: skip
    points = []
    for n in sorted({1, cap}):
        reqs = tuple(
            Request(f"w{i}", prompt, key, base_seed=i, guidance_scale=d.guidance) for i in range(n)
        )
        executor.run(Batch(0, key, reqs, 0.0, n))  # the first call of a size is the slowest
        # The faster of two timed runs: a one-off stall should not price every request.
        runs = [executor.run(Batch(0, key, reqs, 0.0, n)).device_seconds for _ in range(2)]
        points.append((n, min(runs)))
    return LatencyCurve.from_points(points)


def scaled_cost(curve: LatencyCurve, key: BatchKey, d: Defaults) -> StageCost:
    """The warm-up curve scaled to a key's steps and pixels (linear in both, an estimate)."""
    factor = (key.steps / d.steps) * (key.width * key.height) / (d.width * d.height)
    return StageCost(LatencyCurve(curve.sizes, tuple(s * factor for s in curve.seconds)))


def _image_of(ev: Event, step: Step) -> Any:
    """The image of a terminal event: the scored one, or the unscored accepted one."""
    image = step.images.get(ev.request.id)
    if image is None and isinstance(ev, Accepted):
        image = ev.image
    return image
