"""A render job: prompts file in, quality-gated dataset and ledger out, resumable.

``run_job`` is what ``renderq run`` does: read and check the prompts, take the output
folder's lock, open (or resume) the job store, load the model and scorer, submit every
prompt that is not finished yet and drive the real-time engine until each one is
accepted or escalated. :class:`JobListener` commits every step: accepted images (and
failed attempts' images, kept for review) are written atomically first, then the store
records the step in one transaction, then the metadata and review lines are appended.

Resuming: the store is the truth. Accepted and escalated prompts are skipped; a prompt
in flight when the previous run died is resubmitted at the attempt after its last ended
(scored or failed) attempt, or at the same attempt if that one never ended. Stray images
whose acceptance never reached the store are deleted, and the ledger continues from
the rows already booked.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from renderq.backends.diffusers import DiffusersExecutor
from renderq.backends.pool import WorkerSpec
from renderq.backends.ray_backend import check_depth
from renderq.backends.registry import (
    fingerprint,
    model_defaults,
    resolve,
    scorer_default_threshold,
    vocabulary_notice,
)
from renderq.backends.step_loop import StepLoop, step_executors, step_pool
from renderq.backends.writing import WorkerScores, WritingExecutor
from renderq.core.errors import ConfigError, StorageError
from renderq.core.events import Accepted, Escalated, Regenerating
from renderq.core.ledger import Ledger, LedgerRow
from renderq.core.protocols import Executor, Scorer
from renderq.core.seeds import MAX_SEED
from renderq.core.settings import (
    DEFAULT_MAX_BATCH_SIZE,
    Batching,
    ModelSpec,
    QASettings,
    key_for,
    request_seeds,
)
from renderq.core.types import Batch, BatchKind, Request, Stage
from renderq.jobs.prompts import PromptSpec, file_digest, generated_id, read_prompts
from renderq.jobs.summary import Progress, RunSummary, summarise
from renderq.jobs.views import metadata_row, refresh_views, review_row
from renderq.jobs.workers import check_backend, check_prices, load_scorer, scorer_load, start_pool
from renderq.output.dataset import METADATA, REVIEW, DatasetWriter
from renderq.output.images import ImageStore
from renderq.runtime.realtime import RealtimeEngine, Step
from renderq.store.lock import FolderLock
from renderq.store.sqlite import (
    NOT_ACCEPTED,
    AttemptRow,
    JobStore,
    Outcome,
    PromptRow,
    PromptState,
    StoredRequest,
    check_config,
)

STORE_NAME = "renderq.sqlite"


@dataclass(frozen=True, slots=True)
class RunSettings:
    """Everything ``renderq run`` takes on its command line.

    Unset steps, guidance and threshold are the model's own: :meth:`resolved` fills them
    (``run_job`` does, before anything is rendered or stored).
    """

    prompts: Path
    out: Path
    spec: ModelSpec = field(default_factory=ModelSpec)
    batching: Batching = field(default_factory=Batching)
    qa: QASettings = field(default_factory=QASettings)
    seed: int = 0
    scale100: bool = False
    #: T5 pipelines (SD3, Flux): each prompt at its length bucket's sequence length; False
    #: renders every prompt at the pipeline's full padding (``--no-prompt-buckets``).
    prompt_buckets: bool = True
    #: Where the images tree goes (a folder or fsspec URL) when the render workers write
    #: and score their own images (``--images``); None: this process writes into ``out``.
    images: str | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"--seed must be from 0 to {MAX_SEED}, got {self.seed}")

    def resolved(self) -> RunSettings:
        """These settings with the pipeline's steps and guidance and the scorer's threshold."""
        steps, guidance = self.spec.resolve(*model_defaults(self.spec.model))
        spec = replace(self.spec, steps=steps, guidance=guidance)
        shipped = scorer_default_threshold(self.spec.scorer, self.scale100)
        return replace(self, spec=spec, qa=self.qa.with_threshold(shipped))

    def identity(self, digest: str) -> dict[str, Any]:
        """The settings that decide the images and verdicts: a resumed job must match them."""
        spec, qa = self.spec, self.qa
        return {
            "prompts_sha256": digest,
            "model": spec.model,
            "model_fingerprint": fingerprint(spec.model),
            "scorer": spec.scorer,
            "scorer_fingerprint": fingerprint(spec.scorer),
            "threshold": qa.threshold,
            "max_attempts": qa.max_attempts,
            "steps": spec.steps,
            "guidance": spec.guidance,
            "precision": spec.precision,
            "seed": self.seed,
            "scale100": self.scale100,
            # Only when set, so that stores written before adapters existed still resume.
            **(
                {"adapters": {n: fingerprint(p) for n, p in spec.adapters}} if spec.adapters else {}
            ),
            **({} if self.prompt_buckets else {"prompt_buckets": False}),
            **({} if self.images is None else {"images": self.images}),
        }


@dataclass(slots=True)
class JobListener:
    """Commits every engine step to the dataset folder and the store; counts progress."""

    store: JobStore
    writer: DatasetWriter
    run: int
    #: The scorer's name, recorded with every score (the service's bulk jobs pass theirs).
    scorer: str
    prompts: dict[str, PromptRow]
    progress: Progress
    config: dict[str, Any] = field(default_factory=dict)
    on_progress: Callable[[Progress], None] | None = None
    batch_sizes: list[int] = field(default_factory=list)
    #: The scheduler's ledger: when set, ``ledger.json`` is rewritten after every commit,
    #: so it is current even after the process is killed.
    ledger: Ledger | None = None
    #: Price per device-hour of each device class, for the money in ``ledger.json``.
    prices: Mapping[str, float] = field(default_factory=dict)

    def started(self, batch: Batch) -> None:
        """Count the batch."""
        self.batch_sizes.append(batch.size)

    def step(self, step: Step) -> None:
        """Write accepted images, commit the step, then append the dataset lines."""
        attempts: list[AttemptRow] = []
        outcomes: list[Outcome] = []
        for ev in step.events:
            if not isinstance(ev, Accepted | Regenerating | Escalated):
                continue
            a = ev.history[-1]
            rid = ev.request.id
            attempts.append(
                AttemptRow(rid, a.attempt, a.seed, a.batch_id, a.batch_size, a.score, a.error)
            )
            if not isinstance(ev, Accepted) and rid in step.images:
                # A failed attempt's image is kept for the review page: any attempt may
                # turn out to be the last of a prompt that escalates.
                with storage_errors(self.writer.out, lost=step.ledger):
                    self.writer.write_attempt_image(rid, a.attempt, step.images[rid])
            if isinstance(ev, Accepted):
                # The image is on disk before the store says it was accepted.
                with storage_errors(self.writer.out, lost=step.ledger):
                    name = self.writer.write_image(rid, step.images[rid])
                o = Outcome(
                    rid, PromptState.ACCEPTED, a.attempt, ev.score, name, a.batch_id, a.batch_size
                )
                outcomes.append(o)
            elif isinstance(ev, Escalated):
                outcomes.append(Outcome(rid, PromptState.ESCALATED, a.attempt, a.score))
        with storage_errors(self.writer.out, lost=step.ledger):
            self.store.commit_step(self.run, attempts, outcomes, step.ledger, self.scorer)
        with storage_errors(self.writer.out):
            self._append_views(outcomes)
            if self.ledger is not None:
                self.writer.write_ledger(self.ledger.report(prices=self.prices).to_dict())
            for o in outcomes:
                if o.state == PromptState.ACCEPTED and o.attempt > 0:
                    # Accepted by the gate after all: its failed attempts need no review.
                    self.writer.drop_attempt_images(o.request_id, range(o.attempt))
        self._count(step)

    def _append_views(self, outcomes: Sequence[Outcome]) -> None:
        meta = [
            metadata_row(
                self.prompts[o.request_id],
                o.attempt,
                o.score,
                o.file_name,
                self.run,
                o.batch_id,
                o.batch_size,
                self.config,
            )
            for o in outcomes
            if o.state == PromptState.ACCEPTED
        ]
        review = [
            review_row(self.prompts[o.request_id], self.store.attempts_of(o.request_id))
            for o in outcomes
            if o.state == PromptState.ESCALATED
        ]
        self.writer.append(METADATA, meta)
        self.writer.append(REVIEW, review)

    def _count(self, step: Step) -> None:
        p = self.progress
        if step.kind is BatchKind.RENDER and step.batch is not None:
            p.rendered += sum(1 for it in (step.render.items if step.render else ()) if it.ok)
        for ev in step.events:
            if isinstance(ev, Accepted):
                p.accepted += 1
                p.regenerating.discard(ev.request.id)
            elif isinstance(ev, Escalated):
                p.escalated += 1
                p.regenerating.discard(ev.request.id)
            elif isinstance(ev, Regenerating):
                p.regenerating.add(ev.request.id)
        if self.on_progress is not None:
            self.on_progress(p)


@contextlib.contextmanager
def storage_errors(out: Path, lost: Sequence[LedgerRow] = ()) -> Iterator[None]:
    """Turn a failed write under ``out`` into a :class:`StorageError` that says what it cost.

    ``lost`` are the ledger rows of a step that could not be committed: the device time
    was spent but is not in the store, so the error names it rather than dropping it.
    Everything committed before stays (the store commits a step whole or not at all).
    """
    try:
        yield
    except (OSError, sqlite3.Error) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        where = getattr(exc, "filename", None) or out
        msg = f"cannot write to {where}: {reason}"
        if lost:
            booked = ", ".join(f"{secs:.2f} s {stage} on {dev}" for stage, dev, secs in lost)
            msg += (
                f"; the step being committed spent {booked} of device time that is not in "
                "the ledger"
            )
        msg += "; everything committed before is kept: fix this and run again to resume"
        raise StorageError(msg) from exc


def build_prompt_rows(
    specs: Sequence[PromptSpec], settings: RunSettings, executor: DiffusersExecutor
) -> list[PromptRow]:
    """Resolve each prompt's seed, size and steps; a size the model cannot do is an error."""
    default_w, default_h = executor.default_size()
    seeds = request_seeds(
        settings.seed, len(specs), [s.seed for s in specs],
        where=lambda i: f"{settings.prompts}:{specs[i].line}: seed",
    )  # fmt: skip
    rows = []
    for i, (s, seed) in enumerate(zip(specs, seeds, strict=True)):
        w, h = s.width or default_w, s.height or default_h
        try:
            executor.check_size(w, h)
            executor.check_negative_prompt(s.negative_prompt)
            if s.lora:
                executor.check_adapter(s.lora)
        except ConfigError as exc:
            raise ConfigError(f"{settings.prompts}:{s.line}: {exc}") from None
        length = executor.prompt_length(s.prompt, buckets=settings.prompt_buckets)
        spec = {
            "width": w,
            "height": h,
            "steps": s.steps or settings.spec.steps,
            "negative_prompt": s.negative_prompt,
            "prompt_bucket": length.bucket,
            "truncated": list(length.truncated),
            "adapter": s.lora,
        }
        rid = s.id if s.id is not None else generated_id(i)
        rows.append(PromptRow(rid, i, s.prompt, seed, spec))
    return rows


def input_notices(
    settings: RunSettings, specs: Sequence[PromptSpec], rows: Sequence[PromptRow]
) -> list[str]:
    """What the user should know about the prompts before they render (not errors)."""
    notices = []
    vocab = vocabulary_notice(settings.spec.model, [(s.line, s.prompt) for s in specs])
    if vocab is not None:
        notices.append(vocab)
    cut = [(s, r) for s, r in zip(specs, rows, strict=True) if r.spec["truncated"]]
    if not cut:
        return notices
    shown = "; ".join(f"line {s.line} ({', '.join(r.spec['truncated'])})" for s, r in cut[:3]) + (
        "; ..." if len(cut) > 3 else ""
    )
    notices.append(
        f"{len(cut)} prompt(s) of {settings.prompts} are longer than a text encoder takes and "
        f"will be cut: {shown}; metadata.jsonl lists each under 'truncated'"
    )
    return notices


def _request(
    row: StoredRequest, attempt: int, model_spec: ModelSpec, executor: Any, device_class: str
) -> Request:
    spec, guidance = row.prompt.spec, model_spec.guidance
    assert guidance is not None, "run_job resolves the settings first"
    key = key_for(
        model_spec.model, spec["width"], spec["height"], spec["steps"], guidance,
        executor.sampler, model_spec.precision, device_class,
        int(spec.get("prompt_bucket", 0)), spec.get("adapter", ""),
    )  # fmt: skip
    return Request(
        id=row.prompt.id,
        prompt=row.prompt.prompt,
        key=key,
        base_seed=row.prompt.base_seed,
        attempt=attempt,
        guidance_scale=guidance,
        negative_prompt=spec["negative_prompt"],
        priority=row.prompt.priority,
    )


def restore_ledger(store: JobStore) -> Ledger:
    """A ledger holding every booking already in the store, and the accepted count."""
    ledger = Ledger()
    for stage, dev, secs in store.ledger_entries():
        ledger.book(Stage(stage), dev, secs)
    ledger.count_accepted(store.counts().get("accepted", 0))
    return ledger


def resume_points(store: JobStore, max_attempts: int) -> tuple[dict[str, int], list[str]]:
    """For each pending prompt, the attempt to submit; and those already out of attempts."""
    ended = store.attempts()
    todo: dict[str, int] = {}
    exhausted: list[str] = []
    for row in store.requests(PromptState.PENDING):
        done = ended.get(row.prompt.id, [])
        nxt = done[-1].attempt + 1 if done else 0
        if nxt >= max_attempts:
            exhausted.append(row.prompt.id)
        else:
            todo[row.prompt.id] = nxt
    return todo, exhausted


def respec_edits(store: JobStore, executor: DiffusersExecutor, buckets: bool = True) -> None:
    """Give prompts a reviewer edited the prompt-length bucket of their own text.

    An edit copies its original's render spec, bucket included; the bucket is a property
    of the text and the model's text encoders, known only here, with the model loaded
    (``buckets``: the run's ``prompt_buckets``).
    """
    for row in store.requests(PromptState.PENDING):
        if row.prompt.parent is None:
            continue
        length = executor.prompt_length(row.prompt.prompt, buckets=buckets)
        spec = {**row.prompt.spec, "prompt_bucket": length.bucket,
                "truncated": list(length.truncated)}  # fmt: skip
        if spec != row.prompt.spec:
            store.update_spec(row.prompt.id, spec)


def run_job(
    settings: RunSettings,
    *,
    executor: DiffusersExecutor | None = None,
    scorer: Scorer | None = None,
    on_progress: Callable[[Progress], None] | None = None,
    warn: Callable[[str], None] | None = None,
    devices: Sequence[WorkerSpec] = (),
    scorer_device: WorkerSpec | None = None,
    prices: Mapping[str, float] | None = None,
    backend: str = "local",
    address: str | None = None,
    depth: int = 1,
) -> RunSummary:
    """Run (or resume) the job described by ``settings``; returns the summary.

    ``warn`` receives notices about the input that do not stop the job (prompts a text
    encoder will truncate). ``devices``: render on a pool of worker processes, one per
    device (:mod:`renderq.backends.pool`), instead of on ``executor`` in this process,
    which then only checks the prompts (sizes, prompt lengths). ``scorer_device``: the
    device and device class the scorer runs on (in this process, or an actor with the
    ``ray`` backend; default: the run's device, in this process). ``prices``: each device
    class's price per hour; every class the run uses must have one. ``backend``: ``local``
    (worker processes) or ``ray`` (an actor per device, on the Ray cluster at ``address``;
    a new local one when None). ``depth``: batches handed to each Ray actor at once.
    """
    check_backend(backend)
    check_depth(depth)
    if depth != 1 and backend != "ray":
        raise ConfigError(f"--actor-depth {depth} queues batches on Ray actors: add --backend ray")
    if devices and settings.batching.mode == "step" and backend != "local":
        raise ConfigError(
            "--mode step runs a step loop per device in this process; --backend "
            f"{backend} is not supported with it"
        )
    writes = None if settings.images is None else ImageStore.at(settings.images)
    if writes is not None and settings.batching.mode == "step":
        raise ConfigError(f"--images {settings.images!r} is not supported with --mode step")
    if writes is not None and scorer_device is not None:
        raise ConfigError(
            f"--images scores each image where it is rendered: drop --scorer-devices "
            f"{scorer_device.device}"
        )
    specs = read_prompts(settings.prompts)
    settings = settings.resolved()
    spec = settings.spec
    with storage_errors(settings.out):
        if settings.out.exists() and not settings.out.is_dir():
            raise NotADirectoryError(20, "it exists and is not a folder", str(settings.out))
        settings.out.mkdir(parents=True, exist_ok=True)
        lock = FolderLock(settings.out)
        lock.acquire()
    try:
        with storage_errors(settings.out):
            store = JobStore.open(settings.out / STORE_NAME)
        try:
            wanted = settings.identity(file_digest(settings.prompts))
            stored = store.job_config()
            if stored is not None:
                check_config(stored, wanted, settings.out)
            executor = executor or DiffusersExecutor.load(
                resolve(spec.model), device=spec.device, precision=spec.precision,
                name=spec.model, compile=spec.compile, channels_last=spec.channels_last,
                adapters=dict(spec.adapters),
            )  # fmt: skip
            rows = build_prompt_rows(specs, settings, executor)
            if warn is not None:
                for notice in input_notices(settings, specs, rows):
                    warn(notice)
            # With Ray, a scorer on a device of its own is an actor, started with the pool.
            remote = None
            if writes is not None and devices:
                # Each worker loads the scorer beside its pipeline; the driver reads scores.
                scorer = WorkerScores(devices[0].device_class)
            elif scorer is None and scorer_device is not None and backend == "ray":
                if not devices:
                    raise ConfigError("--backend ray needs --devices for its render actors")
                remote = (scorer_device, scorer_load(spec.scorer, settings.scale100))
            else:
                scorer = scorer or load_scorer(
                    spec.scorer, spec.device, settings.scale100, scorer_device
                )
            score_class = remote[0].device_class if remote else getattr(scorer, "device_class", "")
            render_classes = {d.device_class for d in devices} or {executor.device_class}
            check_prices(prices, render_classes | {score_class})
            if stored is None:
                with storage_errors(settings.out):
                    store.create_job(wanted, rows)
            prices = dict(prices or {})
            if settings.batching.mode == "step":
                assert scorer is not None
                cap = settings.batching.max_batch_size or DEFAULT_MAX_BATCH_SIZE
                with step_pool(step_executors(executor, devices, spec), cap) as (loops, lanes):
                    return _drive(
                        settings, store, executor, scorer, on_progress, prices,
                        {loops[0].device_class: lanes}, loops,
                    )  # fmt: skip
            if not devices:
                assert scorer is not None  # loaded above unless remote, which needs devices
                if writes is not None:  # this process is the one worker that writes
                    here = WritingExecutor(executor, scorer, writes)
                    return _drive(
                        settings, store, executor, WorkerScores(executor.device_class),
                        on_progress, prices, {executor.device_class: [here]},
                    )  # fmt: skip
                return _drive(settings, store, executor, scorer, on_progress, prices)
            scoring = scorer_load(spec.scorer, settings.scale100)
            write_to = None if writes is None else (writes, scoring)
            with start_pool(
                spec,
                devices,
                backend=backend,
                address=address,
                scoring=remote,
                write_to=write_to,
                depth=depth,
            ) as pool:
                scorer = scorer or getattr(pool, "scorer", None)
                assert scorer is not None  # the pool started the scorer actor
                watch = getattr(pool, "watch", None)  # a Ray pool read from the cluster grows
                grow = None if watch is None else lambda eng: watch(eng.add_workers, prices=prices)
                return _drive(
                    settings, store, executor, scorer, on_progress, prices, pool.executors(),
                    on_engine=grow,
                )  # fmt: skip
        finally:
            store.close()
    finally:
        lock.release()


def _drive(
    settings: RunSettings,
    store: JobStore,
    executor: DiffusersExecutor,
    scorer: Scorer,
    on_progress: Callable[[Progress], None] | None,
    prices: Mapping[str, float],
    workers: dict[str, list[Executor]] | None = None,
    steps: Sequence[StepLoop] = (),
    on_engine: Callable[[RealtimeEngine], object] | None = None,
) -> RunSummary:
    """Drive one run to the end. ``steps``: step mode's loops, one per device (``workers``
    are their slots, scoring takes turns with the first); the summary's batch sizes are
    then their running batches at every step. ``on_engine``:
    called with the engine before it runs (a Ray pool's node watcher adds workers to it)."""
    started = time.monotonic()
    with storage_errors(settings.out):
        writer = DatasetWriter(settings.out, settings.images)
        run, todo = _begin_run(settings, store, writer)
        respec_edits(store, executor, settings.prompt_buckets)
    ledger = restore_ledger(store)
    with storage_errors(settings.out):
        writer.write_ledger(ledger.report(prices=prices).to_dict())
    all_rows = store.requests()
    counts = store.counts()
    # Prompts a reviewer rejected or edited escalated first: they are done here too.
    ended = sum(counts.get(s, 0) for s in NOT_ACCEPTED)
    progress = Progress(len(all_rows), accepted=counts.get("accepted", 0), escalated=ended)
    prompts = {r.prompt.id: r.prompt for r in all_rows}
    config = store.job_config() or {}
    listener = JobListener(
        store,
        writer,
        run,
        settings.spec.scorer,
        prompts,
        progress,
        config,
        on_progress,
        ledger=ledger,
        prices=prices,
    )
    executors: dict[str, Any] = workers or {executor.device_class: executor}
    engine = RealtimeEngine.build(
        settings.batching, settings.qa.policy(), executors,
        steps[0].beside(scorer) if steps else scorer, listener, ledger=ledger,
        share_device=False if steps else None,  # the loop takes turns with the scorer itself
    )  # fmt: skip
    [render_class] = executors
    for row in all_rows:
        if row.prompt.id in todo:
            req = _request(row, todo[row.prompt.id], settings.spec, executor, render_class)
            engine.submit(req)
    if on_progress is not None:
        on_progress(progress)
    if on_engine is not None:
        on_engine(engine)
    engine.run()
    report = ledger.report(prices=prices)
    with storage_errors(settings.out):
        refresh_views(store, writer)
        writer.write_ledger(report.to_dict())
        store.finish_run(run)
    wall = time.monotonic() - started
    runners: list[Any] = [s.runner for s in steps] or [executor]
    share, threads = _cpu_share(*runners, scorer)
    if steps:  # in step mode a batch is a step of the running batch
        n, rows = sum(s.steps_run for s in steps), sum(s.rows_run for s in steps)
    else:
        n, rows = len(listener.batch_sizes), sum(listener.batch_sizes)
    return summarise(
        settings.batching.mode, str(settings.out), store, report, (n, rows / n if n else 0.0), wall,
        submitted=len(todo), cpu_share=share, threads=threads,
    )  # fmt: skip


def _cpu_share(*workers: Any) -> tuple[float | None, int | None]:
    """How much of the measured CPU device time torch's threads ran (see DeviceTimer)."""
    import torch

    timers = [t for w in workers if (t := getattr(w, "timer", None)) is not None]
    wall = sum(float(getattr(t, "wall_s", 0.0)) for t in timers)
    core = sum(float(getattr(t, "core_s", 0.0)) for t in timers)
    return (core / wall if wall > 0 else None), int(torch.get_num_threads())


def _begin_run(
    settings: RunSettings, store: JobStore, writer: DatasetWriter
) -> tuple[int, dict[str, int]]:
    """Record the run, settle what a crash left behind, and say what to submit."""
    run = store.start_run(os.getpid(), settings.batching.mode)
    todo, exhausted = resume_points(store, settings.qa.max_attempts)
    if exhausted:
        last = settings.qa.max_attempts - 1
        store.commit_step(run, [], [Outcome(r, PromptState.ESCALATED, last) for r in exhausted], [])
    refresh_views(store, writer)
    return run, todo
