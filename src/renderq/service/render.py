"""The service behind ``renderq serve``: one device pool, one scheduler, many callers.

HTTP handlers never touch the scheduler directly: every submit, cancel and snapshot runs
on the engine's loop through ``RealtimeEngine.call`` (under ``serve``, the event loop that
answers HTTP, so a handler's call runs at once), and results come back through a future
per call that the service's listener resolves from the engine's steps.
:class:`RenderService` is the face the app talks to; the work is in its parts: the loaded
model (``loading.py``), interactive calls (``interactive.py``), bulk jobs (``bulk.py``)
and the dashboard's counts (``metrics.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from typing import Any, TypeVar

from renderq.core.admission import AdmissionConfig
from renderq.core.errors import ConfigError
from renderq.core.protocols import Executor, Scorer
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Reserve, Scheduler
from renderq.core.types import Batch, Request, RequestState
from renderq.runtime.realtime import RealtimeEngine, Step
from renderq.service.bulk import Bulk
from renderq.service.config import ServiceConfig
from renderq.service.interactive import (
    DRAINING,
    INTERACTIVE_PRIORITY,
    Answer,
    ImageResult,
    Outstanding,
    Refused,
)
from renderq.service.jobs import JobBook
from renderq.service.loading import (
    Defaults,
    Served,
    Workers,
    load_models,
    scaled_cost,
    step_curve,
    warm_up,
)
from renderq.service.metrics import Dashboard, Metrics

T = TypeVar("T")


class RenderService:
    """Owns the model, the scheduler and the engine; thread-safe entry points."""

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
        self.workers = Workers()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._running: Future[None] | None = None  # the engine's run, until it ends
        self.defaults: Defaults | None = None
        self.model: Served | None = None
        #: Images per second at the best batch size, measured at warm-up.
        self.capacity: float | None = None
        self.dashboard = Dashboard(self.metrics, self._scheduler)
        self.outstanding = Outstanding(config, self.dashboard, self._scheduler)
        self.jobs = JobBook(config.data_dir / "jobs")
        #: The one thread that owns the job stores (see ``bulk.py``).
        self._jobs_thread = ThreadPoolExecutor(1, thread_name_prefix="renderq-jobs")
        self.bulk = Bulk(config, self.jobs, self.outstanding, self._scheduler)

    # -- life cycle -------------------------------------------------------------------

    def start(self) -> None:
        """Load the model in the background; ``ready`` is set once it can serve.

        Called on a running event loop (the app's start-up), the engine steps on that
        loop, so an interactive call is submitted and answered without a thread hop;
        called from plain code, it steps on a thread of its own.
        """
        try:
            self._loop = asyncio.get_running_loop()
        except RuntimeError:
            self._loop = None
        threading.Thread(target=self._start, daemon=True, name="renderq-load").start()

    def _start(self) -> None:
        try:
            executor, scorer, defaults = self._load(self.config)
            self.workers = workers = Workers.start(self.config, executor)
            dc, cap, loops = workers.device_class, self.config.render_cap, workers.loops
            self.defaults, self.model = defaults, Served(self.config, executor, defaults, dc)
            # Every worker renders the same pipeline on the same kind of device: one
            # worker's curve prices a batch; the class's capacity is n times its best. A
            # step loop is one device (its slots are not workers), timed whole-batch.
            n = len(loops) or len(workers.executors)
            curve = warm_up(executor if loops else workers.executors[0], defaults, cap)
            best = curve.best_size(curve.max_size)
            self.capacity = n * best / curve.latency(best)
            priced = step_curve(curve, cap) if loops else curve
            self._engine = engine = RealtimeEngine.build(
                self.config.batching,
                QAPolicy(defaults.threshold, self.config.qa.max_attempts),
                {dc: workers.executors},
                loops[0].beside(scorer) if loops else scorer,
                self,
                cost=lambda key: scaled_cost(priced, key, defaults),
                admission=AdmissionConfig(
                    self.config.max_queue_per_key, n, self.config.deadline_reserve_s
                ),
                share_device=False if loops else None,  # a loop takes turns with the scorer
                reserve=Reserve(cap * n, INTERACTIVE_PRIORITY) if loops else None,
            )
            # A Ray pool read from the cluster (``devices = "auto"``) grows as nodes join.
            watch = getattr(workers.owner, "watch", None)
            if watch is not None and not loops:
                watch(self.add_workers)
            if self._loop is not None:
                self._running = asyncio.run_coroutine_threadsafe(
                    engine.serve(until_idle=False), self._loop
                )
            else:
                self._running = Future()
                threading.Thread(
                    target=self._run_engine, args=(engine, self._running), daemon=True,
                    name="renderq-engine",
                ).start()  # fmt: skip
            self._running.add_done_callback(self._engine_ended)
            for job_id, requests in self.on_jobs(self.bulk.unfinished).result(timeout=300):
                self._call(partial(self.bulk.enqueue, job_id, requests)).result(timeout=300)
            self.metrics.ready.set(1)
            self.ready.set()
        except Exception as exc:  # reported by /readyz
            self.load_error = f"{type(exc).__name__}: {exc}"
            self.workers.close()

    @staticmethod
    def _run_engine(engine: RealtimeEngine, ended: Future[None]) -> None:
        try:
            engine.run(until_idle=False)
            ended.set_result(None)
        except BaseException as exc:
            ended.set_exception(exc)

    def _engine_ended(self, ended: Future[None]) -> None:
        exc = None if ended.cancelled() else ended.exception()
        if exc is not None:  # waiting and later calls answer 503 with the reason
            self.load_error = f"the engine stopped: {type(exc).__name__}: {exc}"
            self.ready.clear()
            self.outstanding.fail_all(Refused(503, "not_ready", self.load_error, 5.0))
            print(f"renderq serve: {self.load_error}", file=sys.stderr, flush=True)

    def add_workers(self, device_class: str, executors: Sequence[Executor]) -> Future[int]:
        """Take more render workers of the served class (actors on a node that joined):
        the engine starts them, and admission and the capacity count them from then on.
        The future holds the class's worker count after the addition."""
        added = list(executors)
        if device_class != self.workers.device_class:
            raise ConfigError(
                f"the service renders on {self.workers.device_class!r}; workers of "
                f"{device_class!r} cannot join it"
            )
        engine = self._engine
        if engine is None:
            raise ConfigError("workers can join only a service that has started its engine")
        grown = engine.add_workers(device_class, added)

        def count(now: float) -> int:
            before = len(self.workers.executors)
            self.workers.executors = [*self.workers.executors, *added]
            engine.scheduler.set_workers_per_device(len(self.workers.executors))
            if self.capacity is not None:
                self.capacity *= len(self.workers.executors) / before
            return len(self.workers.executors)

        engine.call(count)
        return grown

    def begin_drain(self) -> None:
        """Stop admission (new work answers 503 ``draining``); queued bulk prompts go back.

        Idempotent: the signal handler calls it first, the app's shutdown again.
        """
        if self.draining:
            return
        self.draining = self.bulk.stopped = True
        if self._alive():
            self._call(self.bulk.cancel_queued).result(timeout=60)

    def wait_idle(self, timeout_s: float = 60.0) -> bool:
        """Wait until no batch runs and every admitted interactive request has its answer."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self._alive():  # nothing runs: not loaded, or the engine stopped
                return True
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
        # After every step already handed to the jobs thread (it runs them in order).
        kept = self.on_jobs(lambda now: self.bulk.close()).result(timeout=timeout_s)
        self._engine.stop()
        if self._running is not None:
            with contextlib.suppress(Exception):  # an engine that failed: _engine_ended
                self._running.result(timeout=timeout_s)
        self.workers.close()
        print(f"renderq serve: drained; {kept} queued bulk prompts kept for the next start",
              file=sys.stderr, flush=True)  # fmt: skip

    # -- interactive ------------------------------------------------------------------

    def build_requests(self, tenant: str, *, prompt: str, n: int, **opts: Any) -> list[Request]:
        """The requests for one generation call (validated against the loaded model)."""
        if n > self.config.max_n:
            raise ConfigError(f"n must be at most {self.config.max_n}, got {n}")
        model = self._model()
        plain, guidance = model.key_of(opts)
        key, _ = model.prompt_key(plain, prompt, opts.get("negative_prompt") or "")
        return self.outstanding.requests(tenant, prompt, key, guidance, n, opts)

    async def generate(
        self, requests: Sequence[Request], deadline_s: float | None
    ) -> list[ImageResult]:
        """Submit all (all or nothing) and wait for every image's final answer.

        One future carries the refusal or every answer, so the event loop is woken once
        per call, not once for the admission and again for the images.
        """
        loop = asyncio.get_running_loop()
        # With the engine on this loop the answer is this loop's own future; otherwise
        # a thread-safe one, wrapped.
        done: asyncio.Future[list[ImageResult]] | Future[list[ImageResult]] = (
            loop.create_future() if loop is self._loop else Future()
        )
        answer = Answer(done, [None] * len(requests), len(requests))

        def submit(now: float) -> None:
            try:
                self.outstanding.submit(requests, deadline_s, now, answer, self.draining)
            except Exception as exc:
                answer.abandoned = False
                answer.fail(exc)

        self._call(submit)
        return await (done if isinstance(done, asyncio.Future) else asyncio.wrap_future(done))

    # -- bulk jobs --------------------------------------------------------------------

    def create_job(self, tenant: str, prompts: Sequence[tuple[str, int, str]], **opts: Any) -> str:
        """Persist a bulk job and queue its prompts at bulk priority; returns its id."""
        if len(prompts) > self.config.max_job_prompts:
            raise ConfigError(
                f"a job holds at most {self.config.max_job_prompts} prompts, got {len(prompts)}"
            )
        model = self._model()
        key, guidance = model.key_of(opts)
        lengths = []
        for i, (text, _seed, negative) in enumerate(prompts):
            try:
                bucketed, truncated = model.prompt_key(key, text, negative)
            except ConfigError as exc:
                raise ConfigError(f"prompt {i}: {exc}") from None
            lengths.append({"prompt_bucket": bucketed.prompt_bucket, "truncated": truncated})
        if self.draining:
            self.outstanding.refuse(503, "draining", DRAINING, 5.0, tenant)

        def create(now: float) -> tuple[str, list[Request]]:
            return self.bulk.create(tenant, prompts, key, guidance, lengths, opts, now)

        job_id, requests = self.on_jobs(create).result(timeout=120)
        self._call(partial(self.bulk.enqueue, job_id, requests)).result(timeout=120)
        return job_id

    def job_status(self, tenant: str, job_id: str) -> dict[str, Any]:
        """Progress and ledger of one of the tenant's jobs (JobNotFound otherwise), with
        ``in_flight``: its prompts in a running render or score batch."""
        status = self.on_jobs(lambda now: self.bulk.status(tenant, job_id)).result(60)
        in_flight = self._call(lambda now: self.bulk.in_flight(job_id)).result(60)
        return {**status, "in_flight": in_flight}

    def job_images(
        self, tenant: str, job_id: str, offset: int, limit: int, with_images: bool
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of the job's accepted images."""
        page, total = self.on_jobs(
            lambda now: self.jobs.get(tenant, job_id).images(offset, limit, with_images)
        ).result(60)
        return page, total

    def cancel_job(self, tenant: str, job_id: str) -> dict[str, Any]:
        """Cancel a job: queued prompts are dropped now, rendered images are kept."""
        self.on_jobs(lambda now: self.bulk.mark_cancelled(tenant, job_id)).result(60)
        self._call(partial(self.bulk.cancel, job_id)).result(60)
        return self.job_status(tenant, job_id)

    def on_jobs(self, fn: Callable[[float], T]) -> Future[T]:
        """Run ``fn(now)`` on the jobs thread, which owns every job store (its SQLite
        connections stay on one thread, and its commits and image writes never hold up
        the event loop); in order with the engine's steps handed to it."""
        return self._jobs_thread.submit(lambda: fn(self._now()))

    # -- the engine's listener: called on the engine's loop ----------------------------

    def started(self, batch: Batch) -> None:
        """Batch metrics, and the job listeners' progress counts."""
        now, waiters = self._now(), self.outstanding.waiters
        waits = [now - waiters[r.id].submitted for r in batch.requests if r.id in waiters]
        self.dashboard.started(batch, waits)
        if any(r.job for r in batch.requests):
            self._jobs_thread.submit(self.bulk.started, batch).add_done_callback(_report)

    def step(self, step: Step) -> None:
        """Metrics, job commits and interactive answers for one engine step."""
        now, stage = self._now(), step.render if step.render is not None else step.score
        secs, dev = (stage.device_seconds, stage.device_class) if stage else (0.0, "")
        reqs = step.batch.requests if step.batch else step.scored
        self.dashboard.booked(step, reqs, secs)
        if any(r.job for r in reqs) or any(ev.request.job for ev in step.events):
            self._jobs_thread.submit(self.bulk.step, step, reqs, secs, dev).add_done_callback(
                _report
            )
        for ev in step.events:
            self.outstanding.event(ev, step, now)
        self.bulk.top_up(now)

    # -- inspection -------------------------------------------------------------------

    def stats(self, tenant: str | None = None, admin: bool = True) -> dict[str, Any]:
        """Numbers for the dashboard (the jobs' rows on the jobs thread, the rest on the
        engine's loop).

        ``admin``: the whole service, with each tenant's numbers under ``tenants``;
        otherwise only ``tenant``'s own requests, batches, latencies and ledger share.
        """
        if self._engine is None:
            return {"ready": False, "load_error": self.load_error}
        scope = None if admin else tenant
        rows = self.on_jobs(lambda now: self.bulk.progress(scope)).result(timeout=10)
        return dict(self._call(lambda now: self._view(now, scope, rows)).result(timeout=10))

    def _view(
        self, now: float, tenant: str | None, rows: dict[str | None, list[dict[str, Any]]]
    ) -> dict[str, Any]:
        depths = self._depths() if tenant is None else self.outstanding.queued_by_key(tenant)
        jobs = self.bulk.add_waiting(rows.get(tenant, []))
        view = self.dashboard.view(
            tenant, depths, self.bulk.waiting(tenant), jobs, now,
            draining=self.draining, capacity=self.capacity,
        )  # fmt: skip
        view["render_workers"] = {self.workers.device_class: len(self.workers.executors)}
        if tenant is None:
            tenants = sorted(self.dashboard.tenants)
            view["tenants"] = {t: self._view(now, t, rows) for t in tenants}
        return view

    def metrics_text(self) -> bytes:
        """Prometheus exposition; refreshes the scheduler's gauges first."""
        if self._engine is not None:
            dev = self.model.device_class if self.model else None
            self._call(
                lambda now: self.dashboard.gauges(self._depths(), self.bulk.waiting(), dev)
            ).result(timeout=10)
        return self.metrics.render()

    # -- helpers ----------------------------------------------------------------------

    def _depths(self) -> dict[str, int]:
        return {k.label(): n for k, n in self._scheduler().queue_depths().items()}

    def _busy(self) -> int:
        states = self._scheduler().states().values()
        running = sum(1 for s in states if s in (RequestState.RUNNING, RequestState.SCORING))
        # Admitted interactive requests are a promise: they are answered before the stop.
        return running + self.outstanding.owed()

    def _now(self) -> float:
        return self._engine.now() if self._engine else 0.0

    def _model(self) -> Served:
        if self.model is None or not self.ready.is_set():
            raise self._not_ready()
        return self.model

    def _scheduler(self) -> Scheduler:
        assert self._engine is not None
        return self._engine.scheduler

    def _alive(self) -> bool:
        """The engine is built and has not stopped."""
        return self._engine is not None and not (self._running is not None and self._running.done())

    def _call(self, fn: Callable[[float], Any]) -> Future[Any]:
        if not self._alive():
            raise self._not_ready()
        assert self._engine is not None
        return self._engine.call(fn)

    def _not_ready(self) -> Refused:
        return Refused(503, "not_ready", self.load_error or "the model is still loading", 2.0)


def _report(done: Future[Any]) -> None:
    """Say on stderr when a bulk job's commit failed (its prompts stay pending in its
    store and resume at the next start)."""
    exc = None if done.cancelled() else done.exception()
    if exc is not None:
        print(f"renderq serve: a bulk job's commit failed: {type(exc).__name__}: {exc}",
              file=sys.stderr, flush=True)  # fmt: skip
