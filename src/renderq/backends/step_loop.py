"""Step mode behind the engine: one device's denoising loop, fed one request at a time.

In ``--mode step`` the scheduler cuts batches of one request (the ``step`` policy) for a
device class whose workers are *slots* of one :class:`StepLoop`: as many slots as the
running batch may hold. A slot's :meth:`run` hands its request to the loop and waits for
its image; the loop thread re-forms the running batch at every denoising step boundary
(``core.step.StepBatcher``: requests join as they arrive and leave when their own step
count ends, one step key at a time). So the scheduler keeps everything it does for the
other modes (priorities, admission, the QA gate and its regenerations, the ledger) and the
loop only decides who rides in each step.

Where the scorer shares the loop's device (a CPU, one GPU for both stages), it takes turns
with the steps: :meth:`StepLoop.beside` wraps it so that each score batch runs on the loop's
thread at the next step boundary, before the next step. (The engine's own turn-taking
waits for every render worker of the class to be free, which a busy loop's slots never
all are: scoring would wait for the queue to drain.)

A request is prepared (prompt encoded, latents drawn) when it reaches the loop, so a
failure there answers it alone; a failed step or decode answers the requests it ran,
never the others. Each request's device-seconds are its prepare, an equal share of every
step it rode in and of the decode batch it left in (``backends.step``), so the ledger
adds up to the loop's device time.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.diffusers import DiffusersExecutor, is_oom
from renderq.backends.pool import WorkerSpec
from renderq.backends.registry import resolve
from renderq.backends.step import StepExecutor, StepState
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.protocols import Executor, Scorer
from renderq.core.settings import ModelSpec
from renderq.core.step import StepBatcher, StepKey, StepRunner
from renderq.core.types import Batch, BatchResult, ItemResult, Request, ScoreResult

Answer = Future[tuple[ItemResult, float]]
"""A request's image (or error) and the device-seconds booked to it."""


@dataclass(slots=True)
class StepTrace:
    """What a step loop's device did, in order: for reports and for a simulator's costs.

    ``steps``: ``(running batch size, seconds)`` of every step; ``prepares``: seconds of
    every request's prepare; ``decodes``: ``(requests, seconds)`` of every decode batch;
    ``started``: when each step began, on the loop's clock; ``stays``: ``((request id,
    attempt), seconds)`` of every request answered, from its hand-over to the loop to its
    answer (what the engine held its slot for, less the hand-offs either side).
    """

    steps: list[tuple[int, float]] = field(default_factory=list)
    prepares: list[float] = field(default_factory=list)
    decodes: list[tuple[int, float]] = field(default_factory=list)
    started: list[float] = field(default_factory=list)
    stays: list[tuple[tuple[str, int], float]] = field(default_factory=list)

    @classmethod
    def joined(cls, traces: Sequence[StepTrace]) -> StepTrace:
        """Several loops' traces as one, each loop's after the one before."""
        return cls(
            [s for t in traces for s in t.steps],
            [p for t in traces for p in t.prepares],
            [d for t in traces for d in t.decodes],
            [b for t in traces for b in t.started],
            [s for t in traces for s in t.stays],
        )


@dataclass(slots=True)
class _Waiting:
    state: StepState
    answer: Answer
    since: float
    """When the request was handed to the loop (the loop's clock)."""


class StepLoop:
    """One device's step loop (a thread) and the slots the engine renders through."""

    def __init__(
        self,
        runner: StepRunner,
        cap: int,
        *,
        clock: Callable[[], float] = time.monotonic,
        record: bool = False,
    ) -> None:
        """``record``: keep every step, prepare, decode and stay in :attr:`trace` (a bench
        and its replay read them); otherwise only counts, so that a loop that lives as long
        as a service does not grow with every step it runs."""
        if cap < 1:
            raise ConfigError(f"the step batch cap must be >= 1, got {cap}")
        self.runner = runner
        self.cap = cap
        self.device_class = runner.device_class
        self._clock = clock
        self._inbox: queue.SimpleQueue[tuple[Request, Answer, float] | _Call | None] = (
            queue.SimpleQueue()
        )
        #: Running-batch caps lowered by an out-of-memory step, per step key.
        self.fitted_caps: dict[StepKey, int] = {}
        self._batcher = StepBatcher(cap=lambda key: self.fitted_caps.get(key, self.cap))
        self._states: dict[str, _Waiting] = {}
        #: Steps run, and the requests they ran in all (their ratio: the mean running batch).
        self.steps_run = 0
        self.rows_run = 0
        #: With ``record``: each step's, prepare's, decode's and stay's seconds.
        self.record = record
        self.trace = StepTrace()
        self.preemptions = 0
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="step-loop")
        self._thread.start()

    def slots(self, n: int | None = None) -> list[Executor]:
        """``n`` executors (default: the cap) that render through this loop."""
        return [_Slot(self) for _ in range(self.cap if n is None else n)]

    def submit(self, request: Request) -> Answer:
        """Hand ``request`` to the loop; the future holds its image (or error) and seconds."""
        if self._closed or not self._thread.is_alive():
            raise WorkerLost(f"the step loop of {self.device_class!r} is not running")
        answer: Answer = Future()
        self._inbox.put((request, answer, self._now()))
        return answer

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the loop's thread between two steps (at once when it is idle) and
        return its result: work that must not overlap the steps on the device."""
        if self._closed or not self._thread.is_alive():
            raise WorkerLost(f"the step loop of {self.device_class!r} is not running")
        done: Future[Any] = Future()
        self._inbox.put(_Call(fn, done))
        return done.result()

    def beside(self, scorer: Scorer) -> Scorer:
        """``scorer``, taking turns with the steps when it scores on the loop's device class."""
        if scorer.device_class != self.device_class:
            return scorer
        return _TurnScorer(scorer, self)

    def close(self) -> None:
        """Stop the loop after the step in progress; requests still in it fail."""
        self._closed = True
        self._inbox.put(None)
        self._thread.join(timeout=60)

    # -- the loop thread ----------------------------------------------------------------

    def _loop(self) -> None:
        try:
            while self._take(block=self._batcher.idle()):
                if not self._batcher.idle():
                    self._boundary()
        except BaseException as exc:  # the loop is dying: no request may wait for ever
            for w in self._states.values():
                if not w.answer.done():
                    w.answer.set_exception(WorkerLost(f"the step loop died: {exc!r}"))
            raise
        for w in self._states.values():
            if not w.answer.done():
                w.answer.set_exception(WorkerLost("the step loop was closed"))

    def _take(self, *, block: bool) -> bool:
        """Prepare and queue what has arrived (waiting for one if ``block``); False: close."""
        while True:
            try:
                msg = self._inbox.get(block=block)
            except queue.Empty:
                return True
            if msg is None:
                return False
            if isinstance(msg, _Call):
                msg.run()
                block = False
                continue
            request, answer, since = msg
            try:
                state = self.runner.prepare(request)
            except Exception as exc:
                answer.set_result(
                    (ItemResult(request.id, error=f"{type(exc).__name__}: {exc}"), 0.0)
                )
            else:
                if self.record:
                    self.trace.prepares.append(state.device_seconds)  # its prepare, so far
                self._states[request.id] = _Waiting(state, answer, since)
                self._batcher.submit(request, self._now())
            block = False

    def _boundary(self) -> None:
        """Re-form the running batch, run one step, decode and answer who finished."""
        plan = self._batcher.plan(self._now())
        self.preemptions += len(plan.preempt)
        running = [self._states[rid].state for rid in plan.run]
        if not running:
            return
        began = self._now()
        try:
            seconds = self.runner.step(running)
        except Exception as exc:
            if is_oom(exc) and len(running) > 1 and plan.key is not None:
                # The denoiser ran out of memory before any state moved: run this key at
                # half the batch from now on; the next plan pauses the rest, and every
                # request goes on from the step it is at (nothing lost, nothing repeated).
                self.fitted_caps[plan.key] = len(running) // 2
                return
            self._batcher.on_step([s.request.id for s in running], 0.0, self._now())
            self._answer(running, [_error(s, exc) for s in running])
            return
        self.steps_run += 1
        self.rows_run += len(running)
        if self.record:
            self.trace.steps.append((len(running), seconds))
            self.trace.started.append(began)
        done = [s for s in running if s.done]
        self._batcher.on_step([s.request.id for s in done], seconds, self._now())
        if not done:
            return
        self._answer(done, self._decode(done))

    def _decode(self, done: Sequence[StepState]) -> list[ItemResult]:
        """Decode ``done`` in one batch; one that runs out of memory, in halves."""
        before = sum(s.device_seconds for s in done)
        try:
            items = self.runner.decode(done)
        except Exception as exc:
            if is_oom(exc) and len(done) > 1:
                half = len(done) // 2
                return [*self._decode(done[:half]), *self._decode(done[half:])]
            return [_error(s, exc) for s in done]
        if self.record:
            self.trace.decodes.append((len(done), sum(s.device_seconds for s in done) - before))
        return list(items)

    def _answer(self, states: Sequence[StepState], items: Sequence[ItemResult]) -> None:
        now = self._now()
        for s, item in zip(states, items, strict=True):
            waiting = self._states.pop(s.request.id)
            self._batcher.forget(s.request.id)  # the loop books from its states' seconds
            if self.record:
                self.trace.stays.append(((s.request.id, s.request.attempt), now - waiting.since))
            waiting.answer.set_result((item, s.device_seconds))

    def _now(self) -> float:
        return self._clock()


@dataclass(frozen=True, slots=True)
class _Call:
    """Work for the loop's thread between steps, and where its result goes."""

    fn: Callable[[], Any]
    done: Future[Any]

    def run(self) -> None:
        try:
            self.done.set_result(self.fn())
        except BaseException as exc:  # handed to the caller, who raises it
            self.done.set_exception(exc)


class _TurnScorer:
    """A scorer whose batches run on a step loop's thread, between its steps."""

    def __init__(self, scorer: Scorer, loop: StepLoop) -> None:
        self.inner, self.loop = scorer, loop
        self.device_class = scorer.device_class

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """Score at the loop's next step boundary."""
        result: ScoreResult = self.loop.call(lambda: self.inner.score(images, prompts))
        return result


def _error(state: StepState, exc: BaseException) -> ItemResult:
    return ItemResult(state.request.id, error=f"{type(exc).__name__}: {exc}")


class _Slot:
    """An executor that renders its batch's requests through a :class:`StepLoop`."""

    def __init__(self, loop: StepLoop) -> None:
        self.loop = loop
        self.device_class = loop.device_class

    def run(self, batch: Batch) -> BatchResult:
        """Every request of the batch through the loop; their device-seconds summed."""
        answers = [self.loop.submit(r).result() for r in batch.requests]
        seconds = sum(s for _, s in answers)
        return BatchResult(batch.id, tuple(i for i, _ in answers), seconds, self.device_class)


@contextmanager
def step_workers(
    executor: DiffusersExecutor,
    cap: int,
    reserved: int = 0,
    clock: Callable[[], float] = time.monotonic,
    record: bool = False,
) -> Iterator[tuple[StepLoop, dict[str, list[Executor]]]]:
    """Step mode on a loaded pipeline: its loop and the slots to hand the engine, by class.

    The loop drives ``executor``'s own pipeline (nothing is loaded twice); a pipeline the
    step executor cannot drive (LCM-style UNets, other families) is refused with a ConfigError.
    ``reserved``: slots beyond the running batch's ``cap``, for the scheduler to keep for
    urgent work (``core.scheduler.Reserve``), so that it can preempt a running request.
    ``clock``: the loop's (its trace's step times); ``record``: whether it keeps its trace
    (:class:`StepLoop`).
    """
    runner = StepExecutor(
        executor.pipeline, executor.model, device=executor.device,
        precision=executor.precision, device_class=executor.device_class,
    )  # fmt: skip
    loop = StepLoop(runner, cap, clock=clock, record=record)
    try:
        yield loop, {loop.device_class: loop.slots(cap + reserved)}
    finally:
        loop.close()


@contextmanager
def step_pool(
    executors: Sequence[DiffusersExecutor],
    cap: int,
    reserved: int = 0,
    clock: Callable[[], float] = time.monotonic,
    record: bool = False,
) -> Iterator[tuple[list[StepLoop], list[Executor]]]:
    """A step loop on each of ``executors`` (one device each, of one class) and all their
    slots, interleaved so that the free ones of every loop are taken in turn: bulk work
    spreads over the loops instead of filling the first. ``cap``, ``reserved``: per loop,
    and ``clock`` and ``record``, as :func:`step_workers`."""
    with ExitStack() as stack:
        loops, slots = [], []
        for ex in executors:
            loop, by_class = stack.enter_context(step_workers(ex, cap, reserved, clock, record))
            loops.append(loop)
            slots.append(by_class[loop.device_class])
        yield loops, [s for group in zip(*slots, strict=True) for s in group]


def step_executors(
    executor: DiffusersExecutor, devices: Sequence[WorkerSpec], spec: ModelSpec
) -> list[DiffusersExecutor]:
    """The pipelines step mode runs a loop on: ``executor`` alone, or one per ``devices``
    entry, loaded in this process (``executor`` itself for the device it is on)."""
    if not devices:
        return [executor]
    classes = sorted({d.device_class for d in devices})
    if len(classes) > 1:
        raise ConfigError(
            f"--devices names the device classes {classes}: the render stage runs on one class"
        )
    threads = sorted({d.threads for d in devices if d.device == "cpu"})
    if len(threads) > 1:
        raise ConfigError(
            f"--mode step runs its CPU loops in one process, whose torch threads are shared: "
            f"give every cpu worker the same threads, not {threads}"
        )
    if threads and threads[0] > 0:
        import torch

        torch.set_num_threads(threads[0])
    out = []
    for d in devices:
        if d.device == executor.device and executor not in out:
            ex = executor
        else:
            ex = DiffusersExecutor.load(
                resolve(spec.model), device=d.device, precision=spec.precision,
                name=spec.model, compile=spec.compile, channels_last=spec.channels_last,
                adapters=dict(spec.adapters),
            )  # fmt: skip
        ex.device_class = d.device_class
        out.append(ex)
    return out
