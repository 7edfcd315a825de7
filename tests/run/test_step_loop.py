"""Step mode through the scheduler: the real engine renders through a step loop's slots.

The embedded mini-SD in float64 (see tests/run/test_step_executor.py for why: requests
ride in running batches of changing sizes, and float32 kernels round differently by batch
size), a scorer that fails one prompt's first image, and the engine as ``run`` drives it.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest

from renderq.backends.diffusers import DiffusersExecutor
from renderq.backends.registry import resolve
from renderq.backends.step import StepExecutor
from renderq.backends.step_loop import StepLoop, StepTrace
from renderq.core.errors import ConfigError, WorkerLost
from renderq.core.events import Accepted, Escalated, Regenerating
from renderq.core.policies import StepSlots
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Reserve, Scheduler
from renderq.core.settings import key_for
from renderq.core.types import Batch, BatchKind, Request, ScoreResult
from renderq.runtime.realtime import RealtimeEngine
from renderq.testing.fakes import RecordingListener

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.slow

PROMPTS = ["a small red circle", "a large green square", "a small blue triangle", "a red square"]
FAILS_FIRST = "a large green square"


@pytest.fixture(scope="module")
def mini64() -> DiffusersExecutor:
    ex = DiffusersExecutor.load(resolve("embedded:mini-sd"), name="mini-sd")
    ex.pipeline.to(torch.float64)
    return ex


class FirstImageFails:
    """Fails the first image scored for ``prompt``, passes everything else."""

    device_class = "cpu"

    def __init__(self, prompt: str) -> None:
        self.prompt, self.seen = prompt, 0

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        scores = []
        for p in prompts:
            first = p == self.prompt and self.seen == 0
            self.seen += p == self.prompt
            scores.append(0.0 if first else 1.0)
        return ScoreResult(tuple(scores), 0.001, "cpu")


def _req(ex: DiffusersExecutor, i: int, steps: int) -> Request:
    w, h = ex.default_size()
    key = key_for(ex.model, w, h, steps, 7.5, ex.sampler, "fp32", ex.device_class)
    return Request(f"r{i}", PROMPTS[i % len(PROMPTS)], key, 500 + i, guidance_scale=7.5)


def test_step_mode_renders_each_attempt_as_alone_and_books_every_step(
    mini64: DiffusersExecutor,
) -> None:
    loop = StepLoop(StepExecutor(mini64.pipeline, mini64.model), cap=3, record=True)
    listener = RecordingListener()
    sched = Scheduler(StepSlots(3), qa=QAPolicy(threshold=0.5, max_attempts=2))
    engine = RealtimeEngine(sched, {"cpu": loop.slots()}, FirstImageFails(FAILS_FIRST), listener)
    # Five requests for three slots, 3 or 4 steps: the last two join as the first leave.
    reqs = [_req(mini64, i, 3 + i % 2) for i in range(5)]
    for r in reqs:
        engine.submit(r)
    try:
        engine.run()
    finally:
        loop.close()
    accepted = listener.events(Accepted)
    assert sorted(ev.request.id for ev in accepted) == [r.id for r in reqs]
    assert not listener.events(Escalated)
    [regen] = listener.events(Regenerating)
    assert regen.request.prompt == FAILS_FIRST
    # Each accepted attempt is the image its request and seed give alone, whole-batch.
    images = {rid: im for st in listener.steps for rid, im in st.images.items()}
    for ev in accepted:
        r = ev.request
        ref = mini64.run(Batch(0, r.key, (r,), 0.0, 1)).items[0].image
        assert np.abs(images[r.id].astype(int) - ref.astype(int)).max() <= 1, r.id
    assert {ev.request.attempt for ev in accepted} == {0, 1}
    # Requests shared steps, and the ledger holds every request's share of the loop.
    sizes = [n for n, _ in loop.trace.steps]
    assert max(sizes) == 3 and len(sizes) == loop.steps_run < sum(r.key.steps for r in reqs)
    assert sum(sizes) == loop.rows_run
    # The loop times each attempt's stay, which the engine's hold of its slot contains.
    held = {
        (r.id, r.attempt): st.held_s
        for st in listener.steps
        if st.kind is BatchKind.RENDER and st.batch is not None
        for r in st.batch.requests
    }
    stays = dict(loop.trace.stays)
    assert len(loop.trace.stays) == len(stays) == len(held) == len(reqs) + 1
    assert all(0 < stays[k] <= held[k] for k in held)
    rendered = sum(st.render.device_seconds for st in listener.steps if st.kind is BatchKind.RENDER)
    booked = sched.ledger.report().seconds
    assert booked["render"] + booked["regen"] == pytest.approx(rendered)
    assert rendered > 0


def test_a_loop_that_does_not_record_keeps_counts_not_a_trace(mini64: DiffusersExecutor) -> None:
    # A service's loop lives for months: it must not grow with every step it runs.
    loop = StepLoop(StepExecutor(mini64.pipeline, mini64.model), cap=2)
    [slot, _] = loop.slots()
    try:
        r = _req(mini64, 0, 3)
        assert slot.run(Batch(1, r.key, (r,), 0.0, 1)).items[0].ok
    finally:
        loop.close()
    assert (loop.steps_run, loop.rows_run) == (3, 3)
    assert loop.trace == StepTrace()


def test_a_request_that_cannot_be_prepared_fails_alone(mini64: DiffusersExecutor) -> None:
    loop = StepLoop(StepExecutor(mini64.pipeline, mini64.model), cap=2)
    [slot_a, slot_b] = loop.slots()
    good = _req(mini64, 0, 3)
    bad = dataclasses.replace(_req(mini64, 1, 3), key=dataclasses.replace(good.key, width=4))
    try:
        result = slot_b.run(Batch(1, bad.key, (bad,), 0.0, 1))
        assert result.items[0].error and result.device_seconds == 0.0
        result = slot_a.run(Batch(2, good.key, (good,), 0.0, 1))
        assert result.items[0].ok and result.device_seconds > 0
    finally:
        loop.close()
    with pytest.raises(WorkerLost, match="not running"):
        slot_a.run(Batch(3, good.key, (good,), 0.0, 1))


def test_run_in_step_mode_gates_regenerates_and_resumes(tmp_path, tiny_model, tiny_clip):  # type: ignore[no-untyped-def]
    import json

    from renderq.jobs.runner import run_job

    from .conftest import run_settings, write_prompts

    prompts = write_prompts(tmp_path / "p.txt")
    outs = {}
    for mode in ("dynamic", "step"):
        out = tmp_path / mode
        summary = run_job(run_settings(prompts, out, tiny_model, tiny_clip, mode=mode))
        lines = [json.loads(x) for x in (out / "metadata.jsonl").read_text().splitlines()]
        outs[mode] = (summary, {(m["id"], m["seed"]) for m in lines})
    step, dynamic = outs["step"][0], outs["dynamic"][0]
    assert step.accepted + step.escalated == 8 == dynamic.accepted + dynamic.escalated
    assert step.ledger.seconds["regen"] > 0  # the gate sent some back, through the scheduler
    # The same prompts accepted with the same seeds: the gate judged the same images.
    assert outs["step"][1] == outs["dynamic"][1]
    assert step.mean_batch_size > 1  # requests shared steps
    again = run_job(run_settings(prompts, tmp_path / "step", tiny_model, tiny_clip, mode="step"))
    assert again.submitted == 0


def test_step_mode_refuses_a_ray_pool(tmp_path, tiny_model, tiny_clip):  # type: ignore[no-untyped-def]
    from renderq.backends.pool import WorkerSpec
    from renderq.core.errors import ConfigError
    from renderq.jobs.runner import run_job

    from .conftest import run_settings, write_prompts

    settings = run_settings(write_prompts(tmp_path / "p.txt"), tmp_path / "o", tiny_model,
                            tiny_clip, mode="step")  # fmt: skip
    # A loop per device runs in this process (tests/run/test_pool.py); not on Ray actors.
    with pytest.raises(ConfigError, match="--mode step runs a step loop per device in this"):
        run_job(settings, devices=[WorkerSpec("cpu", "cpu", 1)], backend="ray")


def test_an_interactive_request_takes_a_reserved_slot_and_preempts_a_running_bulk_one(
    mini64: DiffusersExecutor,
) -> None:
    # A running batch of 2, plus 1 slot that only priority >= 10 may take.
    loop = StepLoop(StepExecutor(mini64.pipeline, mini64.model), cap=2, record=True)
    listener = RecordingListener()
    sched = Scheduler(
        StepSlots(2), qa=QAPolicy(enabled=False), reserve=Reserve(workers=1, min_priority=10)
    )
    engine = RealtimeEngine(sched, {"cpu": loop.slots(3)}, FirstImageFails(""), listener)
    bulk = [_req(mini64, i, 6) for i in range(4)]
    for r in bulk:
        engine.submit(r)
    urgent = dataclasses.replace(_req(mini64, 9, 2), id="urgent", priority=10)

    def submit_when_running() -> None:
        while loop.steps_run < 2:  # the bulk batch has taken two steps
            time.sleep(0.005)
        assert engine.call(lambda now: sched.submit(urgent, now)).result().admitted

    helper = threading.Thread(target=submit_when_running)
    helper.start()
    try:
        engine.run()
    finally:
        helper.join()
        loop.close()
    done = [ev.request.id for ev in listener.events(Accepted)]
    assert sorted(done) == sorted([*(r.id for r in bulk), "urgent"])
    # Only two bulk requests ever ran at once (the third slot was kept), the urgent one
    # displaced one of them and finished first; the displaced one resumed where it stopped.
    assert loop.preemptions >= 1 and max(n for n, _ in loop.trace.steps) == 2
    assert done[0] == "urgent"
    images = {rid: im for st in listener.steps for rid, im in st.images.items()}
    for r in [*bulk, urgent]:
        ref = mini64.run(Batch(0, r.key, (r,), 0.0, 1)).items[0].image
        assert np.abs(images[r.id].astype(int) - ref.astype(int)).max() <= 1, r.id


def test_a_reserve_keeps_its_workers_from_work_below_its_priority() -> None:
    from renderq.core.scheduler import Reserve as R

    assert R(1, 10).admits(0, 2) and not R(1, 10).admits(0, 1) and R(1, 10).admits(10, 1)
    with pytest.raises(ConfigError, match="at least one worker, got 0"):
        R(0, 10)
