"""The real backend of the A/B harness: scenarios run on a real pipeline and scorer.

It drives the same real-time engine ``renderq run`` uses, with a listener that records
what the harness and the simulator comparison need: submit and finish times, batch
sizes, and each attempt's QA outcome (replayed by ``--compare-sim`` so the simulation
fails exactly the attempts that failed for real).
"""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from renderq.backends.diffusers import DiffusersExecutor
from renderq.backends.step_loop import StepLoop, StepTrace, step_pool
from renderq.bench.harness import Backend, Scenario
from renderq.core.errors import ConfigError
from renderq.core.events import Accepted, Cancelled, Escalated, Regenerating
from renderq.core.policies import Policy
from renderq.core.protocols import Executor, Scorer
from renderq.core.scheduler import Scheduler
from renderq.core.settings import DEFAULT_SCORE_BATCH_SIZE, Batching, QASettings
from renderq.core.types import (
    TERMINAL,
    Batch,
    BatchKey,
    BatchResult,
    Request,
    RequestState,
    ScoreResult,
)
from renderq.runtime.arrivals import Arrival
from renderq.runtime.realtime import RealtimeEngine, Step
from renderq.runtime.sim import SimResult


@dataclass(slots=True)
class Recording:
    """What one real run did, for the report and for replaying it in the simulator."""

    submitted: dict[str, float] = field(default_factory=dict)
    finished: dict[str, float] = field(default_factory=dict)
    batches: list[tuple[int, float]] = field(default_factory=list)
    """``(size, device-seconds)`` of each render batch, scaled to the bench key's steps."""
    batch_steps: list[int] = field(default_factory=list)
    """Each render batch's step count (``batches``' order)."""
    scores: list[tuple[int, float]] = field(default_factory=list)
    outcomes: dict[tuple[str, int], bool] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    renders: int = 0
    rerenders: int = 0
    accepted: int = 0
    escalated: int = 0
    shared_device: bool = False
    """Scoring and rendering took turns on one device class."""
    render_held: list[float] = field(default_factory=list)
    """Seconds the engine held the worker for each render batch (``batches``' order)."""
    render_requests: list[tuple[tuple[str, int], ...]] = field(default_factory=list)
    """Each render batch's ``(request id, attempt)`` pairs (``batches``' order)."""
    render_started: list[float] = field(default_factory=list)
    """When each render batch went to its worker (engine seconds), in step order."""
    score_held: list[float] = field(default_factory=list)
    """The same for each score batch (``scores``' order)."""
    reference_s: list[float] = field(default_factory=list)
    """Device-seconds of the reference batches run between the mode's own batches."""
    stretches: list[tuple[int, float]] = field(default_factory=list)
    """Images and render device-seconds of the mode before each reference batch, in order;
    with interleaving, a last entry holds what it rendered after the last one."""
    step_sizes: list[int] | None = None
    """Step mode: the running batch's size at every step (render batches are of one)."""
    step_trace: StepTrace | None = None
    """Step mode: the loop's steps, prepares and decodes with their seconds."""

    steps: dict[str, int] = field(default_factory=dict)
    """Each request's denoising steps, where a step mix set them (else the key's)."""

    def arrivals(self) -> tuple[Arrival, ...]:
        """The submit times (and step counts) as a trace, in request-id order (ids are
        ``r0000000``...)."""
        return tuple(
            Arrival(self.submitted[r], steps=self.steps.get(r, 0)) for r in sorted(self.submitted)
        )


class _Recorder:
    def __init__(self, rec: Recording, on_done: Any, steps: int) -> None:
        self.rec = rec
        self.on_done = on_done
        self.steps = steps  # the bench key's: batches of other step counts are scaled to it
        self.engine: RealtimeEngine | None = None

    def started(self, batch: Batch) -> None:
        self.rec.sizes[batch.id] = batch.size
        self.rec.renders += batch.size
        self.rec.rerenders += sum(r.attempt > 0 for r in batch.requests)

    def step(self, step: Step) -> None:
        now = self.engine.now() if self.engine else 0.0
        if step.render is not None and step.batch is not None:
            # At the bench key's step count, so that a step mix's batches compare by size.
            scale = self.steps / step.batch.key.steps
            self.rec.batches.append((step.batch.size, step.render.device_seconds * scale))
            self.rec.batch_steps.append(step.batch.key.steps)
            self.rec.render_held.append(step.held_s)
            self.rec.render_requests.append(tuple((r.id, r.attempt) for r in step.batch.requests))
            self.rec.render_started.append(now - step.held_s)
        if step.score is not None and step.scored:
            self.rec.scores.append((len(step.scored), step.score.device_seconds))
            self.rec.score_held.append(step.held_s)
        for ev in step.events:
            attempt = ev.history[-1].attempt if ev.history else ev.request.attempt
            if isinstance(ev, Accepted):
                self.rec.outcomes[(ev.request.id, attempt)] = True
            elif isinstance(ev, Regenerating | Escalated):
                self.rec.outcomes[(ev.request.id, attempt)] = False
            if isinstance(ev, Accepted | Escalated | Cancelled):
                self.rec.accepted += isinstance(ev, Accepted)
                self.rec.escalated += isinstance(ev, Escalated)
                self.rec.finished[ev.request.id] = now
                self.on_done(ev.request.id, now)


@dataclass(slots=True)
class RealBench:
    """Runs scenarios on a loaded executor and scorer.

    ``qa`` is the gate (unset threshold: the fallback; ``enabled=False``: nothing is
    scored); ``guidance`` the scale every request renders at (``key`` says if it is on).
    """

    executor: Executor
    scorer: Scorer
    key: BatchKey
    prompts: Sequence[str]
    qa: QASettings
    guidance: float
    score_batch_size: int = DEFAULT_SCORE_BATCH_SIZE
    share_device: bool | None = None
    last: Recording | None = None
    clock: Callable[[], float] = time.monotonic
    """The engine's clock (a test may give one that its fake stages advance)."""
    pool: Sequence[Executor] = ()
    """A device pool's workers (``--devices``), all of one class: the engine renders on
    them and the reference batches run on the first; empty: on ``executor``."""
    step_pipelines: Sequence[DiffusersExecutor] = ()
    """Step mode's pipelines with a pool, one per device, loaded in this process (a step
    loop drives its pipeline here; the pool's processes idle meanwhile); empty: one loop
    on ``executor``."""

    @property
    def workers(self) -> int:
        """Render workers the modes run on."""
        return len(self.pool) or 1

    def backend(self) -> Backend:
        """This bench as a harness backend (the failure rate is what the model does)."""
        return lambda policy, scenario, _rate: self.run(policy, scenario)

    def request(self, i: int, t: float, steps: int = 0) -> Request:
        """The i-th request of a scenario (``steps``: its own step count; 0: the key's)."""
        return Request(
            f"r{i:07d}",
            self.prompts[i % len(self.prompts)],
            dataclasses.replace(self.key, steps=steps) if steps else self.key,
            base_seed=i,
            arrival=t,
            guidance_scale=self.guidance,
            qa=self.qa.enabled,
        )

    def direct_batches(self, size: int, batches: int, first: int = 1_000_000) -> list[float]:
        """Render-seconds of ``batches`` batches of ``size`` run straight through the executor.

        The requests are the scenario's (prompts and seeds from request ``first`` on), with
        no engine, scheduler or scorer around them: the best a batch of that size can do.
        """
        out = []
        for b in range(batches):
            start = first + b * size
            reqs = tuple(self.request(i, 0.0) for i in range(start, start + size))
            worker = self.pool[0] if self.pool else self.executor
            out.append(worker.run(Batch(0, self.key, reqs, 0.0, size)).device_seconds)
        return out

    def run(
        self, policy: Policy, scenario: Scenario, interleave: tuple[int, int] | None = None
    ) -> SimResult:
        """One mode over one scenario, for real.

        ``interleave=(size, every)``: each time the mode has rendered ``every * size``
        images, one batch of ``size`` runs straight through the executor (its seconds land
        in ``last.reference_s``), so the reference costs about ``1 / every`` of the mode's
        own time whatever its batch sizes. Their time is kept off the engine's clock, so
        the mode's latencies and makespan are as if they had not run. Not for the server
        scenario, whose arrivals follow the wall clock.
        """
        rec = Recording()
        executor: Executor = self.executor
        clock = self.clock
        if interleave is not None:
            if scenario.name == "server":
                raise ConfigError("reference batches cannot interleave a server scenario")
            if self.pool:
                raise ConfigError("reference batches cannot interleave a device pool's batches")
            size, every = interleave
            firsts = itertools.count(2_000_000, size)  # request ids the mode never uses
            interleaved = _Interleaved(
                self.executor,
                every * size,
                lambda: self.direct_batches(size, 1, next(firsts))[0],
                self.clock,
            )
            executor, clock = interleaved, interleaved.clock
            rec.reference_s, rec.stretches = interleaved.reference_s, interleaved.stretches
        if policy.name == "step" and interleave is not None:
            raise ConfigError("reference batches cannot interleave step mode's loop")
        arrivals = scenario.arrivals()
        pending = list(range(len(arrivals)))
        all_done = threading.Event()

        def done(_rid: str, now: float) -> None:
            if scenario.streams is not None and pending:
                submit(pending.pop(0), now)
            if len(rec.finished) == len(arrivals):
                all_done.set()

        with ExitStack() as stack:
            executors: dict[str, Any] = {executor.device_class: executor}
            if self.pool:
                executors = {self.pool[0].device_class: list(self.pool)}
            scorer = self.scorer if self.qa.enabled else _Unscored()
            share: bool | None = self.share_device
            step_turns = False
            loops: list[StepLoop] = []
            if policy.name == "step":  # a step loop per device, on the bench's pipelines
                if self.pool and len(self.step_pipelines) != len(self.pool):
                    raise ConfigError("step mode with --devices needs a pipeline per device")
                pipelines = self.step_pipelines or [pipeline_of(self.executor)]
                loops, lanes = stack.enter_context(
                    step_pool(pipelines, policy.max_batch_size or 16, clock=clock, record=True)
                )
                executors = {loops[0].device_class: lanes}
                turns = loops[0].beside(scorer)  # scoring at the first loop's step boundaries
                share, step_turns, scorer = False, turns is not scorer, turns
            recorder = _Recorder(rec, done, self.key.steps)
            # The harness made ``policy`` from the command's batching; the score part is here.
            engine = RealtimeEngine.build(
                Batching(score_batch_size=self.score_batch_size), self.qa.policy(),
                executors, scorer, recorder,
                policy=policy, default_cap=policy.max_batch_size or 64,
                share_device=share, clock=clock,
            )  # fmt: skip
            sched = engine.scheduler
            recorder.engine = engine
            rec.shared_device = self.qa.enabled and (engine.shares_device or step_turns)

            def submit(i: int, now: float) -> None:
                rec.submitted[f"r{i:07d}"] = now
                if arrivals[i].steps:
                    rec.steps[f"r{i:07d}"] = arrivals[i].steps
                sched.submit(self.request(i, now, arrivals[i].steps), now)

            if scenario.name == "offline":
                for i in pending:
                    submit(i, 0.0)
                pending.clear()
                engine.run()
            elif scenario.streams is not None:
                submit(pending.pop(0), 0.0)
                engine.run()
            else:
                feed = (engine, arrivals, submit, all_done)
                feeder = threading.Thread(target=self._feed, args=feed)
                feeder.start()
                engine.run(until_idle=False)
                feeder.join()
            if isinstance(executor, _Interleaved):
                executor.close_stretch()
            if loops:  # every loop's steps (one loop's after another's), on the run's clock
                trace = StepTrace.joined([loop.trace for loop in loops])
                t0 = clock() - engine.now()
                trace.started = [t - t0 for t in trace.started]
                rec.step_trace = trace
                rec.step_sizes = [n for n, _ in trace.steps]
        self.last = rec
        return self._result(policy, sched, rec)

    @staticmethod
    def _feed(
        engine: RealtimeEngine, arrivals: Sequence[Arrival], submit: Any, all_done: threading.Event
    ) -> None:
        t0 = time.monotonic() - engine.now()
        for i, a in enumerate(arrivals):
            time.sleep(max(0.0, t0 + a.t - time.monotonic()))
            engine.call(partial(_submit_at, submit, i))
        all_done.wait()
        engine.stop()

    @staticmethod
    def _result(policy: Policy, sched: Scheduler, rec: Recording) -> SimResult:
        states = sched.states()
        end = max(rec.finished.values(), default=0.0)
        return SimResult(
            mode=policy.name,
            ledger=sched.ledger.report(),
            latencies=tuple(rec.finished[r] - rec.submitted[r] for r in sorted(rec.finished)),
            batch_sizes=tuple(rec.step_sizes if rec.step_sizes is not None else rec.sizes.values()),
            accepted=rec.accepted,
            escalated=rec.escalated,
            rejected=sum(1 for s in states.values() if s is RequestState.REJECTED),
            unfinished=sum(1 for s in states.values() if s not in TERMINAL),
            renders=rec.renders,
            rerenders=rec.rerenders,
            makespan_s=end - min(rec.submitted.values(), default=0.0),
        )


class _Interleaved:
    """An executor that runs a reference batch each time it has rendered ``images`` images.

    Its :meth:`clock` is the wall clock with the reference batches taken out (frozen while
    one runs), for the engine, so the mode's own timeline is not stretched by them.
    """

    def __init__(
        self,
        inner: Executor,
        images: int,
        reference: Callable[[], float],
        wall: Callable[[], float] = time.monotonic,
    ) -> None:
        if images < 1:
            raise ConfigError(f"reference batches need an interval >= 1 image, got {images}")
        self.inner = inner
        self.device_class = inner.device_class
        self.images = images
        self.reference = reference
        self._wall = wall
        self._lock = threading.Lock()
        self._paused = 0.0
        self._since: float | None = None
        self._rendered = 0
        self._stretch = (0, 0.0)
        self.stretches: list[tuple[int, float]] = []
        """Images and device-seconds rendered before each reference batch (then the rest)."""
        self.reference_s: list[float] = []
        """Device-seconds of each reference batch, as ``reference`` returned them."""

    def close_stretch(self) -> None:
        """Record what was rendered since the last reference batch (the run's tail)."""
        if self._stretch[0]:
            self.stretches.append(self._stretch)
            self._stretch = (0, 0.0)

    def clock(self) -> float:
        """Monotonic seconds, not counting the reference batches."""
        with self._lock:
            now = self._wall() if self._since is None else self._since
            return now - self._paused

    def run(self, batch: Batch) -> BatchResult:
        """Render ``batch``; then, once ``images`` more images are done, a reference batch."""
        result = self.inner.run(batch)
        self._rendered += batch.size
        images, seconds = self._stretch
        self._stretch = (images + batch.size, seconds + result.device_seconds)
        if self._rendered >= self.images:
            self._rendered -= self.images
            self.close_stretch()
            with self._lock:
                self._since = self._wall()
            try:
                self.reference_s.append(self.reference())
            finally:
                with self._lock:
                    assert self._since is not None
                    self._paused += self._wall() - self._since
                    self._since = None
        return result


def _submit_at(submit: Any, i: int, now: float) -> None:
    submit(i, now)


class _Unscored:
    """Never called when the gate is off (nothing goes to scoring); a placeholder."""

    device_class = "none"

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """No scores, no time."""
        return ScoreResult((None,) * len(images), 0.0, self.device_class)


def pipeline_of(executor: Executor) -> DiffusersExecutor:
    """The diffusers executor step mode drives (step mode needs a loaded pipeline)."""
    if not isinstance(executor, DiffusersExecutor):
        raise ConfigError(f"step mode needs a diffusers pipeline; the bench has {executor!r}")
    return executor
