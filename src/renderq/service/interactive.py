"""Interactive generation calls: built, admitted all or nothing, answered from the engine.

A call's requests ride at priority 10-19 (bulk jobs at 0-9, so interactive work always
goes first). :class:`Outstanding` tracks every request the service has in the scheduler,
interactive and bulk, and the calls that wait on them; one future per call carries its
refusal or every image's answer. Submits, answers and forgets run on the engine's loop;
a call's requests are built by its HTTP handler.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import os
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, NoReturn

from renderq.core.errors import ConfigError, UnknownRequest
from renderq.core.events import Accepted, Cancelled, Escalated, Event
from renderq.core.scheduler import Scheduler
from renderq.core.settings import request_seeds
from renderq.core.types import TERMINAL, BatchKey, Request, RequestState
from renderq.runtime.realtime import Step
from renderq.service.config import ServiceConfig
from renderq.service.metrics import Dashboard

INTERACTIVE_PRIORITY = 10
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
class Answer:
    """The answer to one generation call: every image's result in order, or a failure.

    One future for the call, resolved on the engine's loop when its last image ends, so
    the event loop is woken once per call.
    """

    #: Resolved on the engine's loop: an asyncio future of that loop, or a thread-safe one.
    done: Future[list[ImageResult]] | asyncio.Future[list[ImageResult]]
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
class Waiter:
    """A request in the scheduler: whose it is, since when, and the call waiting on it."""

    tenant: str
    submitted: float
    answer: Answer | None = None  # None: a bulk prompt
    index: int = 0
    qa: bool = True


class Outstanding:
    """Every request the service has in the scheduler, by id, and the calls waiting."""

    def __init__(
        self, config: ServiceConfig, dashboard: Dashboard, scheduler: Callable[[], Scheduler]
    ) -> None:
        self.config = config
        self.dashboard = dashboard
        self.waiters: dict[str, Waiter] = {}
        #: Each tenant's admitted interactive requests not yet answered (its limit's count).
        self.tenant_queued: dict[str, int] = {}
        self._scheduler = scheduler
        self._ids = itertools.count()
        self._nonce = uuid.uuid4().hex[:6]

    def requests(
        self, tenant: str, prompt: str, key: BatchKey, guidance: float, n: int, opts: dict[str, Any]
    ) -> list[Request]:
        """The requests of one call, in ``key`` (checked against the model by the caller)."""
        seed = opts.get("seed")
        base = seed if seed is not None else int.from_bytes(os.urandom(6), "big")
        rid = f"i{self._nonce}-{next(self._ids)}"
        return [
            Request(
                id=f"{rid}-{i}", prompt=prompt, key=key, base_seed=first,
                priority=INTERACTIVE_PRIORITY + int(opts.get("priority") or 0),
                guidance_scale=guidance, negative_prompt=opts.get("negative_prompt") or "",
                tenant=tenant, qa=bool(opts.get("qa", True)),
            )
            for i, first in enumerate(request_seeds(base, n))
        ]  # fmt: skip

    def submit(
        self,
        requests: Sequence[Request],
        deadline_s: float | None,
        now: float,
        answer: Answer,
        draining: bool,
    ) -> None:
        """Submit a call's requests, all or none: a refusal takes back those already in."""
        tenant = requests[0].tenant
        self.check_admission(tenant, len(requests), draining)
        sched = self._scheduler()
        done: list[Request] = []
        for i, r in enumerate(requests):
            if deadline_s is not None:
                r = dataclasses.replace(r, deadline=now + deadline_s, arrival=now)
            verdict = sched.submit(r, now)
            if not verdict.admitted:
                answer.abandoned = True  # the refusal, not the cancels, answers the call
                for d in done:
                    sched.cancel(d.id, now)
                    self.forget(d.id)
                sched.forget(r.id)
                retry = verdict.retry_after_s or 1.0
                self.refuse(429, verdict.reason, verdict.detail, retry, tenant)
            self.waiters[r.id] = Waiter(tenant, now, answer, i, r.qa)
            self.tenant_queued[tenant] = self.tenant_queued.get(tenant, 0) + 1
            done.append(r)

    def check_admission(self, tenant: str, n: int, draining: bool) -> None:
        """Refuse a call of ``n`` images while draining or past the tenant's queued limit."""
        if draining:
            self.refuse(503, "draining", DRAINING, 5.0, tenant)
        limit = self.config.tenant_max_queued
        queued = self.tenant_queued.get(tenant, 0)
        if limit is not None and n > limit:  # never fits: retrying cannot help
            raise ConfigError(f"n={n} is above this tenant's limit of {limit} queued requests")
        if limit is not None and queued + n > limit:
            self.refuse(
                429, "tenant_limit", f"tenant has {queued} requests queued (limit {limit})", 1.0,
                tenant,
            )  # fmt: skip

    def refuse(
        self, status: int, reason: str, detail: str, retry: float, tenant: str | None
    ) -> NoReturn:
        """Count the refusal on the dashboard and raise it."""
        self.dashboard.refused(reason, tenant)
        raise Refused(status, reason, detail, retry)

    def track(self, request: Request, now: float) -> None:
        """A bulk prompt entered the queue at ``now`` (nobody waits on its answer)."""
        self.waiters[request.id] = Waiter(request.tenant, now)

    def event(self, ev: Event, step: Step, now: float) -> None:
        """Count one engine event; a request's end answers its image and forgets it."""
        o = self.waiters.get(ev.request.id)
        answered = o is not None and o.answer is not None
        waited = now - o.submitted if o is not None and answered else None
        self.dashboard.event(ev, waited, o is not None and not o.qa, now)
        if not isinstance(ev, Accepted | Escalated | Cancelled):
            return
        if o is not None and o.answer is not None:
            o.answer.put(o.index, _result(ev, step, o.qa))
            self.dashboard.answered(o.tenant, now - o.submitted)
        self.forget(ev.request.id)

    def forget(self, request_id: str) -> None:
        """Stop tracking a request (and drop it from the scheduler once it has ended)."""
        o = self.waiters.pop(request_id, None)
        if o is not None and o.answer is not None:
            self.tenant_queued[o.tenant] = self.tenant_queued.get(o.tenant, 1) - 1
            o.answer.forget(o.index)
        sched = self._scheduler()
        try:
            if sched.state(request_id) in TERMINAL:
                sched.forget(request_id)
        except UnknownRequest:
            pass

    def fail_all(self, exc: BaseException) -> None:
        """Every waiting call fails with ``exc`` (the engine stopped: nothing will come)."""
        for waiter in self.waiters.values():
            if waiter.answer is not None:
                waiter.answer.fail(exc)

    def owed(self) -> int:
        """Admitted interactive requests not yet answered: a promise to keep before a stop."""
        return sum(1 for o in self.waiters.values() if o.answer is not None)

    def queued_by_key(self, tenant: str) -> dict[str, int]:
        """``tenant``'s requests waiting in the queue, per batch key label."""
        sched = self._scheduler()
        depths: dict[str, int] = {}
        for rid, o in self.waiters.items():
            if o.tenant == tenant and sched.state(rid) is RequestState.QUEUED:
                label = sched.request(rid).key.label()
                depths[label] = depths.get(label, 0) + 1
        return depths


def _result(ev: Accepted | Escalated | Cancelled, step: Step, qa: bool) -> ImageResult:
    """The answer of a request's end: its last attempt's image, seed and score."""
    last = ev.history[-1] if ev.history else None
    state = (
        "accepted"
        if isinstance(ev, Accepted)
        else ("escalated" if isinstance(ev, Escalated) else "cancelled")
    )
    if isinstance(ev, Accepted) and not qa:
        state = "skipped"
    # The scored image, or the accepted one that was never scored.
    image = step.images.get(ev.request.id)
    if image is None and isinstance(ev, Accepted):
        image = ev.image
    return ImageResult(
        ev.request.id, image, ev.request.seed, len(ev.history), last.score if last else None,
        state, last.batch_id if last else 0, last.batch_size if last else 0,
    )  # fmt: skip
