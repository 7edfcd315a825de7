"""Bulk jobs in the service: created, fed to the queue, cancelled, resumed and drained.

The jobs themselves are ``renderq run``-style folders (``service/jobs.py``, over the job
runner of ``jobs/``). Their prompts flow into the shared scheduler from a backlog as room
frees: backpressure, not refusal, so a job larger than the queue waits in its store and
finishes without a restart.

Two threads share the work: the job stores (SQLite connections, which stay on the thread
that opened them, and the images' writes and fsyncs) belong to the service's jobs thread,
so a commit never holds up the event loop; the backlogs and the scheduler belong to the
engine's loop. Each method says where it runs; the loop never waits on the jobs thread.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from renderq.core.scheduler import Scheduler
from renderq.core.types import Batch, BatchKey, Request, RequestState
from renderq.runtime.realtime import Step
from renderq.service.config import ServiceConfig
from renderq.service.interactive import Outstanding
from renderq.service.jobs import SEP, JobBook, ServiceJob, job_shares, not_accepted

DASHBOARD_JOBS = 20
"""How many jobs ``/v1/stats`` lists (unfinished first, then the newest)."""


class Bulk:
    """Every bulk job of the service, and the backlogs that feed their prompts to the queue."""

    def __init__(
        self,
        config: ServiceConfig,
        jobs: JobBook,
        outstanding: Outstanding,
        scheduler: Callable[[], Scheduler],
    ) -> None:
        self.config = config
        self.jobs = jobs
        self.outstanding = outstanding
        #: Bulk prompts waiting for room in their key's queue, per job (see :meth:`top_up`).
        self.backlog: dict[str, deque[Request]] = {}
        self._tenant: dict[str, str] = {}  # job id -> tenant, for the loop's counts
        #: Set when the service drains: no more bulk prompts enter the queue.
        self.stopped = False
        #: How many queued requests of one key bulk work may hold (None: no limit): three
        #: quarters of the per-key queue, so interactive requests of the key find room.
        limit = config.max_queue_per_key
        self.room = None if limit is None else max(1, limit * 3 // 4)
        self._scheduler = scheduler

    # -- on the jobs thread: the stores ------------------------------------------------

    def create(
        self,
        tenant: str,
        prompts: Sequence[tuple[str, int, str]],
        key: BatchKey,
        guidance: float,
        lengths: Sequence[dict[str, Any]],
        opts: dict[str, Any],
        now: float,
    ) -> tuple[str, list[Request]]:
        """Persist a job of prompts checked by the caller; its id and requests to queue."""
        spec = self.config.spec
        job = self.jobs.create(
            tenant, prompts, lengths=lengths, key=key, guidance=guidance,
            priority=int(opts.get("priority") or 0), mode=str(opts.get("mode", "dynamic")),
            windows=opts.get("windows"), max_attempts=self.config.qa.max_attempts,
            config={"model": spec.model, "scorer": spec.scorer, "guidance": guidance},
        )  # fmt: skip
        return job.id, _pending(job, now)

    def unfinished(self, now: float) -> list[tuple[str, list[Request]]]:
        """Open the unfinished jobs found on disk (after a restart): each one's requests."""
        return [(job.id, _pending(job, now)) for job in self.jobs.resume()]

    def status(self, tenant: str, job_id: str) -> dict[str, Any]:
        """A job's counts and ledger from its store."""
        return self.jobs.get(tenant, job_id).status()

    def mark_cancelled(self, tenant: str, job_id: str) -> None:
        """Record a job's cancel in its folder (its rendered images are kept)."""
        self.jobs.get(tenant, job_id).mark_cancelled()

    def close(self) -> int:
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

    def started(self, batch: Batch) -> None:
        """Hand each job its part of a render batch that started."""
        for job, reqs in self.jobs.split(batch.requests).items():
            job.started(batch, reqs)

    def step(self, step: Step, requests: Sequence[Request], seconds: float, dev: str) -> None:
        """Commit each job's part of a step: its events, images and share of ``seconds``."""
        shares = job_shares(requests, seconds, step.kind, dev)
        for job, sub in self.jobs.split_step(step, shares).items():
            job.step(sub)

    def progress(self, only: str | None = None) -> dict[str | None, list[dict[str, Any]]]:
        """The dashboard's job rows, for all (``None``) and per tenant (``only``: that
        tenant's alone): unfinished first, then newest; the loop adds each row's
        ``waiting`` (:meth:`add_waiting`).

        ``escalated`` counts every prompt that failed the gate and is not accepted (a
        reviewer's rejections and edits included).
        """
        jobs = [j for j in self.jobs.jobs.values() if only is None or j.tenant == only]
        jobs.sort(key=lambda j: (j.state in ("done", "cancelled"), -float(j.meta["created"])))
        rows: dict[str | None, list[dict[str, Any]]] = {None: []}
        for job in jobs:
            mine = rows.setdefault(job.tenant, [])
            if len(mine) >= DASHBOARD_JOBS and len(rows[None]) >= DASHBOARD_JOBS:
                continue
            counts = job.store.counts()
            accepted, pending = counts.get("accepted", 0), counts.get("pending", 0)
            row = {
                "id": job.id, "tenant": job.tenant, "state": job.state,
                "mode": str(job.meta["mode"]), "total": len(job.rows), "accepted": accepted,
                "escalated": not_accepted(counts), "pending": pending,
            }  # fmt: skip
            for scope in (None, job.tenant):
                if len(rows[scope]) < DASHBOARD_JOBS:
                    rows[scope].append(row)
        return rows

    # -- on the loop: the backlogs and the scheduler -----------------------------------

    def enqueue(self, job_id: str, requests: Sequence[Request], now: float) -> None:
        """Queue a job's requests (all its unended prompts) as room frees."""
        self.backlog.setdefault(job_id, deque()).extend(requests)
        for r in requests[:1]:
            self._tenant[job_id] = r.tenant
        self.top_up(now)

    def queue(self, request: Request, now: float) -> None:
        """Queue one more request of its job (a reviewer's edit) behind the job's backlog."""
        self.enqueue(str(request.job), [request], now)

    def top_up(self, now: float) -> None:
        """Move bulk prompts from their jobs' backlogs into the queue as room frees."""
        if not self.backlog or self.stopped:
            return
        sched, room = self._scheduler(), self.room
        depths = sched.queue_depths()
        for job_id, backlog in list(self.backlog.items()):
            while backlog and (room is None or depths.get(backlog[0].key, 0) < room):
                r = backlog.popleft()
                if not sched.submit(r, now).admitted:  # full some other way: try again later
                    sched.forget(r.id)
                    backlog.appendleft(r)
                    break
                self.outstanding.track(r, now)
                depths[r.key] = depths.get(r.key, 0) + 1
            if not backlog:
                del self.backlog[job_id]

    def in_flight(self, job_id: str) -> int:
        """The job's prompts in a running render or score batch.

        From the scheduler, not the tracked requests: a cancelled job's running prompts
        are no longer tracked but are still on the device.
        """
        busy = (RequestState.RUNNING, RequestState.SCORING)
        prefix = job_id + SEP
        states = self._scheduler().states().items()
        return sum(1 for rid, st in states if st in busy and rid.startswith(prefix))

    def cancel(self, job_id: str, now: float) -> None:
        """Drop a cancelled job's backlog and queued prompts (running batches finish)."""
        self.backlog.pop(job_id, None)
        sched = self._scheduler()
        for rid in [r for r in self.outstanding.waiters if r.startswith(job_id + SEP)]:
            sched.cancel(rid, now)
            self.outstanding.forget(rid)

    def cancel_queued(self, now: float) -> int:
        """Drop queued and waiting bulk prompts (they stay pending in their job stores)."""
        sched = self._scheduler()
        kept = sum(len(b) for b in self.backlog.values())
        self.backlog.clear()
        for rid in list(self.outstanding.waiters):
            if SEP in rid and sched.state(rid) is RequestState.QUEUED:
                sched.cancel(rid, now)
                self.outstanding.forget(rid)
                kept += 1
        return kept

    def waiting(self, tenant: str | None = None) -> int:
        """Bulk prompts (``tenant``'s, or all) still in their jobs' backlogs."""
        return sum(
            len(b)
            for job_id, b in self.backlog.items()
            if tenant is None or self._tenant.get(job_id) == tenant
        )

    def add_waiting(self, rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
        """:meth:`progress`'s rows with ``waiting``: prompts still in the job's backlog."""
        return [{**row, "waiting": len(self.backlog.get(row["id"], ()))} for row in rows]


def _pending(job: ServiceJob, now: float) -> list[Request]:
    # Job windows are in Unix time; the scheduler's clock (``now``) is the engine's.
    return job.pending_requests(clock_offset=now - time.time())
