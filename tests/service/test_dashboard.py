"""The numbers behind the dashboard: ``/v1/stats`` job progress, the bulk backlog in the
queue count, the charts' series and refusals by reason (null model, in-process)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from renderq.core.settings import INTERACTIVE, ModelSpec
from renderq.service.config import ServiceConfig
from renderq.service.interactive import Refused
from renderq.service.metrics import recent_series
from renderq.service.render import RenderService

NULL = ModelSpec("null")


def test_series_buckets_images_by_age_and_takes_the_median_latency() -> None:
    now = 1000.0
    finished = [
        (now - 1, 0.2), (now - 2, 0.4), (now - 3, None),  # the newest bucket
        (now - 15, 1.0),  # the one before
        (now - 300, 9.0), (now + 1, 9.0),  # outside the window: left out
    ]  # fmt: skip
    s = recent_series(finished, now, window_s=300, bucket_s=10)
    assert s["t"][0] == -290 and s["t"][-1] == 0 and len(s["t"]) == 30
    assert s["throughput_per_s"][-1] == pytest.approx(0.3)
    assert s["throughput_per_s"][-2] == pytest.approx(0.1)
    assert sum(s["throughput_per_s"][:-2]) == 0
    assert s["latency_p50_s"][-1] == pytest.approx(0.3)  # the bulk image has no latency
    assert s["latency_p50_s"][-2] == 1.0
    assert s["latency_p50_s"][0] is None  # no image: a gap, not a zero
    with pytest.raises(ValueError, match="must be positive"):
        recent_series([], now, bucket_s=0)


@given(st.lists(st.floats(min_value=0, max_value=600, allow_nan=False), max_size=50))
def test_series_counts_every_image_of_the_window_once(ages: list[float]) -> None:
    s = recent_series([(500.0 - a, None) for a in ages], 500.0, window_s=120, bucket_s=10)
    counted = sum(round(v * 10) for v in s["throughput_per_s"])
    assert counted == sum(1 for a in ages if a < 120)


@pytest.fixture
def service(tmp_path: Path) -> RenderService:
    batching = replace(INTERACTIVE, max_batch_size=4)
    svc = RenderService(ServiceConfig(spec=NULL, data_dir=tmp_path, batching=batching,
                                      max_queue_per_key=8))  # fmt: skip
    svc.start()
    assert svc.ready.wait(timeout=60), svc.load_error
    return svc


def test_stats_count_a_waiting_bulk_job_as_queued_and_show_its_progress(
    service: RenderService,
) -> None:
    opens = time.time() + 3600  # windows are in Unix time: this one opens in an hour
    prompts = [(f"a red circle {i}", i, "") for i in range(40)]
    job = service.create_job("local", prompts, mode="window", windows=f"{opens}-{opens + 3600}")
    s = service.stats()
    # Room for 6 of the key's 8 queue slots (bulk_room); the other 34 wait in the backlog.
    assert (s["queued"], s["bulk_waiting"]) == (40, 34)
    [row] = s["jobs"]
    assert row == {"id": job, "tenant": "local", "state": "queued", "mode": "window",
                   "total": 40, "accepted": 0, "escalated": 0, "pending": 40,
                   "waiting": 34}  # fmt: skip
    mine = service.stats("local", admin=False)
    assert (mine["queued"], mine["bulk_waiting"], mine["jobs"]) == (40, 34, [row])
    other = service.stats("someone", admin=False)
    assert (other["queued"], other["bulk_waiting"], other["jobs"]) == (0, 0, [])
    assert b"renderq_bulk_waiting 34.0" in service.metrics_text()
    service.drain(timeout_s=30)


def test_stats_chart_finished_images_and_count_refusals_by_reason(
    service: RenderService,
) -> None:
    reqs = service.build_requests("local", prompt="a red circle", n=3, seed=1, qa=False)
    asyncio.run(service.generate(reqs, None))
    job = service.create_job("local", [("a blue square", 1, "")])
    deadline = time.monotonic() + 60
    while service.job_status("local", job)["state"] != "done":
        assert time.monotonic() < deadline, "the job never finished"
        time.sleep(0.05)
    s = service.stats()
    series = s["series"]
    assert len(series["t"]) == len(series["throughput_per_s"]) == len(series["latency_p50_s"])
    # Four images finished (three interactive, one bulk) within the last buckets.
    assert sum(round(v * series["bucket_s"]) for v in series["throughput_per_s"]) == 4
    latencies = [v for v in series["latency_p50_s"] if v is not None]
    assert latencies and all(v >= 0 for v in latencies)
    [row] = s["jobs"]
    assert (row["state"], row["accepted"], row["pending"], row["waiting"]) == ("done", 1, 0, 0)
    assert s["refusals"] == {}
    service.begin_drain()
    with pytest.raises(Refused):
        service.create_job("local", [("late", 1, "")])
    assert service.stats()["refusals"] == {"draining": 1}
    assert service.stats("local", admin=False)["refusals"] == {"draining": 1}
    assert service.stats("someone", admin=False)["refusals"] == {}
    service.drain(timeout_s=30)
