"""The real-time engine: the scheduler core on a real clock, with real executors.

One step reads like the simulator's: now -> schedule -> run -> score -> decide -> commit
-> feed results back -> sleep until ``next_wakeup`` or the next result. The steps run on
an asyncio event loop (its own for ``run`` and the bench; the HTTP server's for ``serve``,
so an interactive answer crosses no thread but its worker's): results arrive as loop
callbacks and the next wake-up is a loop timer. Rendering and
scoring are separate stages on separate worker threads (one render worker per executor,
one or more per device class, and one scorer worker), so on its own device the scorer
works on batch N while batch N+1 renders; torch releases the GIL inside its kernels, so
the stages really overlap.

When the scorer runs on a device class that also renders (a CPU-only machine, or one GPU
for both stages), the two stages take turns on it instead: a device runs one job at a
time, and scoring goes first when it is free (scores finish requests; a render batch that
waits for them waits only the milliseconds a score batch takes). Side by side, both
stages would book the same device-seconds; on CPU cores they also slowed each other (see
``renderq.backends.device``). Overlap on one shared GPU has not been measured.

The engine never decides anything about batching (the scheduler does) and never writes
anything (its ``Listener`` does): every render or score batch that comes back is fed to
the scheduler and handed to the listener as one ``Step`` with the events it caused and
the ledger rows it booked, which the listener commits in one transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Protocol

from renderq.core.admission import AdmissionConfig
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.events import Admission, Event, ToScore
from renderq.core.ledger import Ledger, LedgerRow
from renderq.core.policies import Policy
from renderq.core.protocols import Executor, Scorer
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import CostLookup, Reserve, Scheduler
from renderq.core.score_stage import ScoreJob, ScoreStage, score_cap
from renderq.core.settings import Batching, make_policy
from renderq.core.types import (
    Batch,
    BatchKind,
    BatchResult,
    ItemResult,
    Request,
    ScoreResult,
    Stage,
)

"""A ledger booking: ``(stage, device_class, seconds)``."""


@dataclass(frozen=True, slots=True)
class Step:
    """One result fed back to the scheduler: what came back and what it caused.

    ``kind`` is ``"render"``, ``"score"`` or ``"lost"`` (a render batch whose worker
    died: ``batch`` is set, its requests are queued again, ``ledger`` holds the device
    time it cost). For a render step ``batch`` and ``render`` are set; for a score
    step ``scored`` holds the attempts scored and ``score`` the result. ``images`` maps
    request ids to the images scored in this step. ``held_s``: the engine's seconds from
    handing the batch to its worker to this step, the device's time on it plus the
    hand-offs either side (what a simulator must hold a worker for).
    """

    kind: BatchKind
    events: tuple[Event, ...]
    ledger: tuple[LedgerRow, ...]
    batch: Batch | None = None
    render: BatchResult | None = None
    scored: tuple[Request, ...] = ()
    score: ScoreResult | None = None
    images: Mapping[str, Any] = field(default_factory=dict)
    held_s: float = 0.0


class Listener(Protocol):
    """Receives every step; it commits the step (store, dataset) before returning."""

    def started(self, batch: Batch) -> None:
        """A render batch was cut and handed to a worker."""
        ...

    def step(self, step: Step) -> None:
        """A render or score batch came back and was fed to the scheduler."""
        ...


_RENDERED, _SCORED, _SCORE_FAILED, _CALL = "rendered", "scored", "score_failed", "call"
_LOST, _STOP = "lost", "stop"
MAX_LOSSES = 3
"""Batches in a row a render worker may lose (dying each time) before it is retired; the run
stops when a device class has no worker left."""


class RealtimeEngine:
    """Drives a :class:`Scheduler` with a real clock until every request is terminal."""

    def __init__(
        self,
        scheduler: Scheduler,
        executors: Mapping[str, Executor | Sequence[Executor]],
        scorer: Scorer,
        listener: Listener,
        *,
        score_batch_size: int = 32,
        score_retries: int = 2,
        share_device: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``executors`` maps each device class to its workers' executors (one worker per
        executor: a device pool gives several; a single executor is one worker).

        ``share_device``: whether scoring and rendering take turns on the scorer's device
        class; by default they do exactly when a render executor has that device class.
        ``False`` lets them overlap (for measuring what taking turns saves).
        """
        if not executors:
            raise ConfigError("the engine needs at least one executor")
        self.scheduler = scheduler
        self.executors = {dc: _as_list(ex) for dc, ex in executors.items()}
        empty = [dc for dc, ex in self.executors.items() if not ex]
        if empty:
            raise ConfigError(f"device class {empty[0]!r} has no executor")
        self.scorer = scorer
        self.listener = listener
        self._clock = clock
        self._t0 = clock()
        self._posting = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0
        self._early: list[tuple[str, Any]] = []  # posted before the loop started
        self._done: asyncio.Future[None] | None = None
        self._until_idle = True
        self._step_due = False
        self._timer: asyncio.TimerHandle | None = None
        self._render_q: dict[str, queue.Queue[Batch | None]] = {
            dc: queue.Queue() for dc in self.executors
        }
        self._score_q: queue.Queue[ScoreJob | None] = queue.Queue()
        self._workers = {dc: len(ex) for dc, ex in self.executors.items()}
        self._free = dict(self._workers)
        shares = scorer.device_class in self.executors
        self.scoring = ScoreStage(
            score_cap(score_batch_size, scheduler.policy.max_batch_size),
            scorer.device_class,
            shared=scorer.device_class if (shares and share_device is not False) else None,
            retries=score_retries,
        )
        self._score_sent = 0.0
        self._sent: dict[int, float] = {}  # render batch id -> when its worker got it
        self._threads: list[threading.Thread] = []

    @classmethod
    def build(
        cls,
        batching: Batching,
        qa: QAPolicy,
        executors: Mapping[str, Executor | Sequence[Executor]],
        scorer: Scorer,
        listener: Listener,
        *,
        policy: Policy | None = None,
        ledger: Ledger | None = None,
        cost: CostLookup | None = None,
        admission: AdmissionConfig | None = None,
        default_cap: int = 64,
        share_device: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
        reserve: Reserve | None = None,
    ) -> RealtimeEngine:
        """The engine ``run``, ``serve`` and ``bench`` drive: a new scheduler with
        ``batching``'s policy and the QA decision ``qa``, scoring in ``batching``'s batches.

        ``policy``: one ``make_policy`` already made from ``batching`` (the bench's harness
        makes one per mode, windows included); ``ledger``, ``cost``, ``admission``,
        ``default_cap`` and ``reserve`` go to the :class:`Scheduler`, the rest to the engine.
        """
        sched = Scheduler(
            policy or make_policy(batching), qa=qa, cost=cost, default_cap=default_cap,
            admission=admission, ledger=ledger, reserve=reserve,
        )  # fmt: skip
        return cls(
            sched, executors, scorer, listener, score_batch_size=batching.score_batch_size,
            share_device=share_device, clock=clock,
        )  # fmt: skip

    @property
    def shares_device(self) -> bool:
        """Whether scoring and rendering take turns on the scorer's device class."""
        return self.scoring.shared is not None

    @property
    def score_batch_size(self) -> int:
        """The largest score batch."""
        return self.scoring.batch_size

    def now(self) -> float:
        """Seconds since the engine was created (the scheduler's time axis)."""
        return self._clock() - self._t0

    def submit(self, request: Request) -> Admission:
        """Submit a request now."""
        return self.scheduler.submit(request, self.now())

    def stop(self) -> None:
        """Ask the loop to stop after the step in progress (results in flight are dropped)."""
        self._post((_STOP, None))

    # -- the loop -----------------------------------------------------------------------

    def call(self, fn: Callable[[float], Any]) -> Future[Any]:
        """Run ``fn(now)`` on the loop's thread; thread-safe, for callers while it runs.

        A service submits and cancels this way, so the scheduler is only ever touched by
        the loop's thread. Called on that thread (a handler on the service's event loop),
        ``fn`` runs at once and the loop steps right after. The future holds ``fn``'s
        return value or exception.
        """
        fut: Future[Any] = Future()
        if self._loop is not None and threading.get_ident() == self._loop_thread:
            self._run_call(fn, fut)
            self._soon()
        else:
            self._post((_CALL, (fn, fut)))
        return fut

    def add_workers(self, device_class: str, executors: Sequence[Executor]) -> Future[int]:
        """Give ``device_class`` more render workers, one per executor; thread-safe.

        For a pool that grows during a run (a Ray node joining). Applied on the loop's
        thread through :meth:`call`, so the scheduler sees the class's free workers go up
        at its next step and hands them batches at once; a class new to the engine gets
        its own queue. The future holds the class's worker count after the addition. The
        workers are started once the loop handles the call: added before :meth:`run`,
        they start with it; added after the loop ended, never.
        """
        new = list(executors)
        if not new:
            raise ConfigError(f"add_workers for {device_class!r} was given no executor")
        wrong = [e.device_class for e in new if e.device_class != device_class]
        if wrong:
            raise ConfigError(f"an executor of class {wrong[0]!r} added to {device_class!r}")

        def add(now: float) -> int:
            if device_class not in self.executors:
                self.executors[device_class] = []
                self._render_q[device_class] = queue.Queue()
                self._workers[device_class] = self._free[device_class] = 0
            workers = self.executors[device_class]
            for executor in new:
                workers.append(executor)
                index = len(workers) - 1
                self._start_worker(
                    self._render_worker, (device_class, index), f"render-{device_class}-{index}"
                )
            self._workers[device_class] += len(new)
            self._free[device_class] += len(new)
            return self._workers[device_class]

        return self.call(add)

    def run(self, *, until_idle: bool = True) -> None:
        """Run until every submitted request is terminal (or :meth:`stop` is called), on an
        event loop of its own: the calling thread's, or, where that thread already runs
        one (a notebook), a thread's of its own while the caller waits, as for any call.

        With ``until_idle=False`` it keeps running when idle, waiting for :meth:`call`,
        until :meth:`stop`.
        """
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            asyncio.run(self.serve(until_idle=until_idle))
            return
        with ThreadPoolExecutor(1, thread_name_prefix="renderq-engine") as own:
            own.submit(asyncio.run, self.serve(until_idle=until_idle)).result()

    async def serve(self, *, until_idle: bool = True) -> None:
        """:meth:`run` on the running event loop: a service runs the engine on the loop
        that answers its HTTP requests, so an answer crosses no thread but the worker's.

        Every step runs as a callback of the loop: a worker's result arrives with
        ``call_soon_threadsafe``, the scheduler's next wake-up is a ``call_later`` timer,
        and after each message (or each burst of them) the loop dispatches once.
        """
        loop = asyncio.get_running_loop()
        self._until_idle, self._step_due, self._timer = until_idle, False, None
        with self._posting:  # a message posted now is either early or delivered
            self._done = loop.create_future()
            self._loop, self._loop_thread = loop, threading.get_ident()
            early, self._early = self._early, []
        for dc, executors in self.executors.items():
            for i in range(len(executors)):
                self._start_worker(self._render_worker, (dc, i), f"render-{dc}-{i}")
        self._start_worker(self._score_worker, None, "score")
        for msg in early:
            self._deliver(msg)
        self._soon()
        try:
            await self._done
        finally:
            with self._posting:
                self._loop = None
            if self._timer is not None:
                self._timer.cancel()
            for dc, q in self._render_q.items():
                for _ in self.executors[dc]:
                    q.put(None)
            self._score_q.put(None)
            threads = list(self._threads)
            await asyncio.to_thread(_join_all, threads, 60.0)

    def _post(self, msg: tuple[str, Any]) -> None:
        """Hand ``msg`` to the loop from any thread (kept until the loop starts; dropped
        once it has ended)."""
        with self._posting:
            loop = self._loop
            if loop is None:
                if self._done is None:
                    self._early.append(msg)
                return
        with contextlib.suppress(RuntimeError):  # the loop closed after the check
            loop.call_soon_threadsafe(self._deliver, msg)

    def _deliver(self, msg: tuple[str, Any]) -> None:
        if self._done is None or self._done.done():
            return
        try:
            self._handle(msg)
        except BaseException as exc:  # the run ends with it, as a threaded loop's would
            self._done.set_exception(exc)
            return
        self._soon()

    def _soon(self) -> None:
        """Step once the messages already delivered are handled (one step per burst)."""
        if not self._step_due and self._loop is not None:
            self._step_due = True
            self._loop.call_soon(self._step)

    def _step(self) -> None:
        """Dispatch, finish when idle, and set the timer for the scheduler's next wake-up."""
        self._step_due = False
        done = self._done
        if done is None or done.done() or self._loop is None:
            return
        try:
            # One reading of the clock for cutting and for the timer: with two, a delay
            # that ran out between them was neither cut nor timed.
            now = self.now()
            self._dispatch(now)
            if self._until_idle and self._finished():
                done.set_result(None)
                return
            wake = self.scheduler.next_wakeup(now)
        except BaseException as exc:
            done.set_exception(exc)
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if wake is not None:
            self._timer = self._loop.call_later(max(0.0, wake - self.now()), self._step)

    def _start_worker(self, target: Callable[..., None], arg: Any, name: str) -> None:
        args = () if arg is None else arg if isinstance(arg, tuple) else (arg,)
        thread = threading.Thread(target=target, args=args, daemon=True, name=name)
        self._threads.append(thread)
        thread.start()

    def _finished(self) -> bool:
        return (
            self.scheduler.idle()
            and self.scoring.idle()
            and all(self._free[dc] == n for dc, n in self._workers.items())
        )

    def _dispatch(self, now: float) -> None:
        job = self.scoring.take(self._free, self._workers)
        if job is not None:
            self._score_sent = self.now()
            self._score_q.put(job)
        free = dict(self._free)
        held = self.scoring.holds()
        if held is not None:
            free[held] = 0  # the scorer holds the device; renders wait their turn
        for batch in self.scheduler.schedule(now, free):
            self._free[batch.key.device_class] -= 1
            self.listener.started(batch)
            self._sent[batch.id] = self.now()
            self._render_q[batch.key.device_class].put(batch)

    def _handle(self, msg: tuple[str, Any]) -> None:
        kind, payload = msg
        if kind == _CALL:
            self._run_call(*payload)
        elif kind == _STOP:
            if self._done is not None and not self._done.done():
                self._done.set_result(None)
        elif kind == _RENDERED:
            batch, result = payload
            self._free[batch.key.device_class] += 1
            self._on_rendered(batch, result)
        elif kind == _LOST:
            self._on_lost(*payload)
        elif kind == _SCORED:
            job, result = payload
            self.scoring.done()
            self._on_scored(job, result)
        elif kind == _SCORE_FAILED:
            job, error = payload
            failed = self.scoring.failed(job, error)
            if failed is not None:
                self._on_scored(job, failed)

    def _run_call(self, fn: Callable[[float], Any], fut: Future[Any]) -> None:
        if fut.set_running_or_notify_cancel():
            try:
                fut.set_result(fn(self.now()))
            except Exception as exc:
                fut.set_exception(exc)

    def _on_rendered(self, batch: Batch, result: BatchResult) -> None:
        before = _snapshot(self.scheduler.ledger)
        events = tuple(self.scheduler.on_result(result, self.now()))
        for ev in events:
            if isinstance(ev, ToScore):
                self.scoring.add(ev.request, ev.image)
        rows = _delta(before, self.scheduler.ledger)
        held = self.now() - self._sent.pop(batch.id, self.now())
        self.listener.step(
            Step(BatchKind.RENDER, events, rows, batch=batch, render=result, held_s=held)
        )

    def _on_lost(
        self, batch: Batch, seconds: float, error: str, worker: tuple[int, int], died: bool
    ) -> None:
        """A render worker died with ``batch`` (or its executor lost its backend).

        The batch goes back to the queue through the scheduler and its device time is
        booked as lost. ``worker``: the worker's index in its class and the batches it has
        lost in a row. A dead worker thread is started again; a worker that lost more than
        ``MAX_LOSSES`` in a row is retired (its thread has ended) while its class has other
        workers, and the run stops (resumable) when the class has none left, rather than
        losing batch after batch.
        """
        dc = batch.key.device_class
        before = _snapshot(self.scheduler.ledger)
        self.scheduler.on_lost(batch.id, self.now(), seconds, dc)
        rows = _delta(before, self.scheduler.ledger)
        self._sent.pop(batch.id, None)
        self.listener.step(Step(BatchKind.LOST, (), rows, batch=batch))
        index, streak = worker
        if streak > MAX_LOSSES:
            self._workers[dc] -= 1
            if self._workers[dc] == 0:
                raise WorkerLost(
                    f"the render worker of {dc!r} lost {streak} batches in a row (last: "
                    f"{error}); the queued work is kept: run again to resume"
                )
            return  # retired: the class goes on with one worker fewer
        if died:
            self._start_worker(self._render_worker, (dc, index, streak), f"render-{dc}-{index}")
        self._free[dc] += 1

    def _on_scored(self, job: ScoreJob, result: ScoreResult) -> None:
        before = _snapshot(self.scheduler.ledger)
        ids = [r.id for r in job.requests]
        events = tuple(self.scheduler.on_scores(ids, result, self.now()))
        rows = _delta(before, self.scheduler.ledger)
        images = dict(zip(ids, job.images, strict=True))
        self.listener.step(
            Step(
                BatchKind.SCORE,
                events,
                rows,
                scored=tuple(job.requests),
                score=result,
                images=images,
                held_s=self.now() - self._score_sent,
            )
        )

    # -- workers ------------------------------------------------------------------------

    def _render_worker(self, device_class: str, index: int, streak: int = 0) -> None:
        """Render the class's batches on executor ``index``; ``streak``: batches it has lost
        in a row so far (a restarted thread carries its predecessor's)."""
        executor = self.executors[device_class][index]
        inbox = self._render_q[device_class]
        while (batch := inbox.get()) is not None:
            start = time.perf_counter()
            try:
                result = executor.run(batch)
            except WorkerLost as exc:  # the executor's backend died; the executor lives on
                streak += 1
                gone = (batch, time.perf_counter() - start, str(exc), (index, streak), False)
                self._post((_LOST, gone))
                if streak > MAX_LOSSES:
                    return  # retired (see _on_lost)
                continue
            except Exception as exc:  # an executor must not raise; if it does, fail the items
                error = f"executor failed: {type(exc).__name__}: {exc}"
                items = tuple(ItemResult(r.id, error=error) for r in batch.requests)
                result = BatchResult(batch.id, items, time.perf_counter() - start, device_class)
            except BaseException as exc:  # this thread is dying: the batch must not die with it
                error = f"{type(exc).__name__}: {exc}"
                lost = (batch, time.perf_counter() - start, error, (index, streak + 1), True)
                self._post((_LOST, lost))
                return
            streak = 0
            self._post((_RENDERED, (batch, result)))

    def _score_worker(self) -> None:
        while (job := self._score_q.get()) is not None:
            try:
                result = self.scorer.score(job.images, [r.prompt for r in job.requests])
            except Exception as exc:
                self._post((_SCORE_FAILED, (job, f"{type(exc).__name__}: {exc}")))
                continue
            except BaseException as exc:  # the thread is dying: retry the job on a new one
                self._start_worker(self._score_worker, None, "score")
                self._post((_SCORE_FAILED, (job, f"scorer died: {type(exc).__name__}")))
                return
            self._post((_SCORED, (job, result)))


def _as_list(executors: Executor | Sequence[Executor]) -> list[Executor]:
    """One executor, or a sequence of them, as a list (a class's workers)."""
    if isinstance(executors, list | tuple):
        return list(executors)
    return [executors]  # type: ignore[list-item]


def _snapshot(ledger: Ledger) -> dict[tuple[Any, str], float]:
    return dict(ledger.entries)


def _delta(before: Mapping[tuple[Any, str], float], ledger: Ledger) -> tuple[LedgerRow, ...]:
    """Ledger rows booked since ``before`` (zero-second splits left out)."""
    rows: list[LedgerRow] = []
    for (stage, dev), secs in ledger.entries.items():
        added = secs - before.get((stage, dev), 0.0)
        if added > 0:
            rows.append(LedgerRow(Stage(stage), dev, added))
    return tuple(rows)


def _join_all(threads: Sequence[threading.Thread], timeout_s: float) -> None:
    for t in threads:
        t.join(timeout=timeout_s)
