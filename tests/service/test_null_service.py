"""The service wired in-process on the null model: instant, so it tests the plumbing."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

from renderq.core.settings import INTERACTIVE, Batching, ModelSpec
from renderq.service.config import ServiceConfig
from renderq.service.render import RenderService

NULL = ModelSpec("null")


def batches_of(n: int) -> Batching:
    return replace(INTERACTIVE, max_batch_size=n)


def test_null_model_service_renders_batches_and_drains(tmp_path: Path) -> None:
    svc = RenderService(ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batches_of(4)))
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    reqs = svc.build_requests("local", prompt="a red circle", n=3, seed=5, qa=False)
    assert {r.key.device_class for r in reqs} == {"null"}

    async def go() -> list[object]:
        return list(await svc.generate(reqs, None))

    results = asyncio.run(go())
    assert [r.state for r in results] == ["skipped"] * 3  # type: ignore[attr-defined]
    assert [r.seed for r in results] == [5, 6, 7]  # type: ignore[attr-defined]
    stats = svc.stats()
    assert stats["served"] == 3 and stats["capacity_images_per_s"] > 0
    svc.drain(timeout_s=30)
    assert svc.draining


def test_a_bulk_job_ten_times_the_per_key_queue_finishes_without_a_restart(
    tmp_path: Path,
) -> None:
    import time

    cfg = ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batches_of(4), max_queue_per_key=8)
    svc = RenderService(cfg)
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    prompts = [(f"a red circle {i}", i, "") for i in range(80)]
    job_id = svc.create_job("local", prompts)
    deadline = time.monotonic() + 60
    status = svc.job_status("local", job_id)
    while status["state"] != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
        status = svc.job_status("local", job_id)
    assert status["state"] == "done", status
    assert status["accepted"] + status["escalated"] == 80 and status["pending"] == 0
    svc.drain(timeout_s=30)


def test_a_drain_reports_the_bulk_prompts_it_really_kept(tmp_path: Path, capsys: object) -> None:
    import re
    import time

    from renderq.backends.null import NullExecutor, NullScorer
    from renderq.core.types import Batch, BatchResult
    from renderq.service.loading import Defaults
    from renderq.store.sqlite import JobStore

    class Slow(NullExecutor):
        def run(self, batch: Batch) -> BatchResult:
            time.sleep(0.2)
            return super().run(batch)

    def load(config: ServiceConfig) -> tuple[object, object, Defaults]:
        ex = Slow()
        return ex, NullScorer(), Defaults(ex.size, ex.size, 1, 0.0, 0.0, ex.sampler)

    cfg = ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batches_of(2), max_queue_per_key=4)
    svc = RenderService(cfg, load=load)  # type: ignore[arg-type]
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    job_id = svc.create_job("local", [(f"p {i}", i, "") for i in range(20)])
    svc.drain(timeout_s=30)
    err = capsys.readouterr().err  # type: ignore[attr-defined]
    kept = int(re.search(r"drained; (\d+) queued bulk prompts kept", err).group(1))  # type: ignore[union-attr]
    store = JobStore.open(tmp_path / "jobs" / job_id / "renderq.sqlite")
    try:
        pending = store.counts().get("pending", 0)
    finally:
        store.close()
    assert kept == pending > 0


def test_bulk_job_scores_are_recorded_with_the_services_scorer(tmp_path: Path) -> None:
    import time

    from renderq.store.sqlite import JobStore

    cfg = ServiceConfig(
        spec=ModelSpec("null", "my/scorer"), data_dir=tmp_path, batching=batches_of(4)
    )
    svc = RenderService(cfg)
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    job_id = svc.create_job("local", [("a red circle", 1, ""), ("a blue square", 2, "")])
    deadline = time.monotonic() + 30
    while svc.job_status("local", job_id)["state"] != "done" and time.monotonic() < deadline:
        time.sleep(0.05)
    svc.drain(timeout_s=30)
    store = JobStore.open(tmp_path / "jobs" / job_id / "renderq.sqlite")
    try:
        scorers = {scorer for _, _, scorer, _ in store.scores()}
    finally:
        store.close()
    assert scorers == {"my/scorer"}


def test_n_above_the_tenant_limit_is_a_bad_request_not_a_retry(tmp_path: Path) -> None:
    import pytest

    from renderq.core.errors import ConfigError

    cfg = ServiceConfig(spec=NULL, data_dir=tmp_path, tenant_max_queued=4)
    svc = RenderService(cfg)
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    with pytest.raises(ConfigError, match="n=5 is above this tenant's limit of 4"):
        svc.outstanding.check_admission("local", 5, draining=False)
    svc.outstanding.check_admission("local", 4, draining=False)
    svc.drain(timeout_s=30)


def test_a_call_refused_part_way_answers_the_refusal_and_keeps_nothing(tmp_path: Path) -> None:
    import pytest

    from renderq.service.interactive import Refused

    cfg = ServiceConfig(spec=NULL, data_dir=tmp_path, max_n=8, max_queue_per_key=2)
    svc = RenderService(cfg)
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    reqs = svc.build_requests("local", prompt="a red circle", n=3, seed=1, qa=False)

    async def go() -> object:
        return await svc.generate(reqs, None)

    # The first two are queued, the third finds the queue full: the call is refused as a
    # whole (429 queue_full, not the "cancelled" of the two taken back).
    with pytest.raises(Refused) as info:
        asyncio.run(go())
    assert (info.value.status, info.value.reason) == (429, "queue_full")
    assert svc.outstanding.waiters == {} and svc.outstanding.tenant_queued.get("local", 0) == 0
    ok = asyncio.run(svc.generate(svc.build_requests("local", prompt="a", n=2, qa=False), None))
    assert [r.state for r in ok] == ["skipped", "skipped"]
    svc.drain(timeout_s=30)


def test_workers_that_join_a_running_service_count_for_admission_and_capacity(
    tmp_path: Path, monkeypatch: object
) -> None:
    import pytest

    from renderq.core.errors import ConfigError
    from renderq.service import loading
    from renderq.testing.fakes import FakeExecutor

    watched: list[object] = []

    class GrowingPool:
        """A pool read from a cluster: it hands joining workers to whoever watches it."""

        def watch(self, add: object) -> None:
            watched.append(add)

        def close(self) -> None:
            pass

    start = loading.Workers.start

    def with_pool(config: ServiceConfig, executor: object) -> loading.Workers:
        workers = start(config, executor)  # type: ignore[arg-type]
        workers.owner = GrowingPool()
        return workers

    monkeypatch.setattr(loading.Workers, "start", with_pool)  # type: ignore[attr-defined]
    svc = RenderService(ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batches_of(4)))
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    assert watched == [svc.add_workers]  # the service watches its pool once it serves
    before = svc.stats()
    assert before["render_workers"] == {"null": 1}
    joined = FakeExecutor(device_class="null")
    assert svc.add_workers("null", [joined]).result(timeout=10) == 2
    svc._call(lambda now: None).result(timeout=10)  # the count is applied after the start
    after = svc.stats()
    assert after["render_workers"] == {"null": 2}
    assert svc._engine is not None
    assert svc._engine.scheduler._admission.workers_per_device == 2  # admission counts it
    assert after["capacity_images_per_s"] == pytest.approx(2 * before["capacity_images_per_s"])
    with pytest.raises(ConfigError, match="renders on 'null'; workers of 'cuda'"):
        svc.add_workers("cuda", [FakeExecutor(device_class="cuda")])
    reqs = svc.build_requests("local", prompt="a red circle", n=8, seed=1, qa=False)

    async def go() -> list[object]:
        return list(await svc.generate(reqs, None))

    assert len(asyncio.run(go())) == 8  # every request answered with two workers
    svc.drain(timeout_s=30)


def test_a_bulk_commit_that_blocks_holds_up_neither_the_loop_nor_interactive_answers(
    tmp_path: Path, monkeypatch: object
) -> None:
    # Started on an event loop, the engine steps on that loop and the job stores' commits
    # (SQLite, image writes and fsyncs) run on the jobs thread: an interactive call is
    # answered while a bulk commit is stuck, and the commit still lands afterwards.
    import threading
    import time

    import pytest

    from renderq.service.jobs import ServiceJob

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    entered, release = threading.Event(), threading.Event()
    threads: set[str] = set()
    real_step = ServiceJob.step

    def stuck_step(self: ServiceJob, step: object) -> None:
        threads.add(threading.current_thread().name)
        entered.set()
        release.wait(timeout=30)
        real_step(self, step)  # type: ignore[arg-type]

    monkeypatch.setattr(ServiceJob, "step", stuck_step)
    svc = RenderService(ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batches_of(4)))

    async def main() -> dict[str, object]:
        svc.start()
        assert await asyncio.to_thread(svc.ready.wait, 60), svc.load_error
        job_id = await asyncio.to_thread(svc.create_job, "local", [("a red circle", 1, "")] * 4)
        assert await asyncio.to_thread(entered.wait, 30)
        reqs = svc.build_requests("local", prompt="a blue square", n=2, seed=3, qa=False)
        results = await asyncio.wait_for(svc.generate(reqs, None), 10)
        assert [r.seed for r in results] == [3, 4] and not release.is_set()
        release.set()
        deadline = time.monotonic() + 30
        status = await asyncio.to_thread(svc.job_status, "local", job_id)
        while status["state"] != "done" and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            status = await asyncio.to_thread(svc.job_status, "local", job_id)
        await asyncio.to_thread(svc.drain, 30)
        return status

    status = asyncio.run(main())
    assert status["state"] == "done" and status["accepted"] + status["escalated"] == 4
    assert threads and all(t.startswith("renderq-jobs") for t in threads), threads


def test_an_engine_that_stops_fails_the_calls_waiting_on_it_and_refuses_later_ones(
    tmp_path: Path, monkeypatch: object
) -> None:
    # Nothing may wait for ever on an engine that is gone: the calls it held answer 503
    # with the reason, later calls are refused at once, and the service still drains.
    import pytest

    from renderq.service.interactive import Refused

    assert isinstance(monkeypatch, pytest.MonkeyPatch)

    def broken_step(self: RenderService, step: object) -> None:
        raise RuntimeError("listener broke")

    monkeypatch.setattr(RenderService, "step", broken_step)
    svc = RenderService(ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batches_of(4)))

    async def main() -> tuple[Refused, Refused, Refused]:
        svc.start()
        assert await asyncio.to_thread(svc.ready.wait, 60), svc.load_error
        reqs = svc.build_requests("local", prompt="a red circle", n=2, seed=1, qa=False)
        with pytest.raises(Refused) as waited:
            await asyncio.wait_for(svc.generate(reqs, None), 10)
        with pytest.raises(Refused) as later:
            svc.build_requests("local", prompt="a red circle", n=1, seed=1, qa=False)
        with pytest.raises(Refused) as stats:
            await asyncio.wait_for(asyncio.to_thread(svc.stats), 10)
        await asyncio.wait_for(asyncio.to_thread(svc.drain, 10), 30)
        return waited.value, later.value, stats.value

    for refused in asyncio.run(main()):
        assert refused.status == 503 and "RuntimeError: listener broke" in refused.detail
    assert not svc.ready.is_set()
