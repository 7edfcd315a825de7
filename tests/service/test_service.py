"""``renderq serve`` over a real socket: generation, jobs, auth, metrics, bad input."""

from __future__ import annotations

import base64
import io
import json
import time
from collections.abc import Callable
from typing import TypeVar

import pytest
from PIL import Image
from prometheus_client.parser import text_string_to_metric_families

from tests.service.conftest import Server

pytestmark = pytest.mark.slow
T = TypeVar("T")


def png(b64: str) -> Image.Image:
    return Image.open(io.BytesIO(base64.b64decode(b64)))


def wait_job(c, job_id: str, until: set[str], timeout: float = 180) -> dict:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        st = c.get(f"/v1/jobs/{job_id}").json()
        if st["state"] in until:
            return st  # type: ignore[no-any-return]
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} never reached {until}: {st}")


def wait_for(read: Callable[[], T], done: Callable[[T], bool], what: str,
             timeout: float = 60, every: float = 0.05) -> T:  # fmt: skip
    """Poll ``read()`` until ``done`` holds for it; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}: {value!r}")
        time.sleep(every)


def test_generate_returns_openai_shaped_images_deterministically(server: Server) -> None:
    with server.client() as c:
        body = {"prompt": "a small red circle on a blue background", "n": 2, "seed": 7}
        r = c.post("/v1/images/generations", json=body)
        assert r.status_code == 200, r.text
        out = r.json()
        assert isinstance(out["created"], int) and len(out["data"]) == 2
        first = out["data"][0]
        assert png(first["b64_json"]).size == (32, 32)
        assert first["seed"] == 7 and out["data"][1]["seed"] == 8
        assert first["qa"] == "accepted" and first["attempts"] == 1
        assert first["batch_size"] >= 1 and isinstance(first["clip_score"], float)
        # The same seed alone (n=1) gives the same image as inside the batch of two.
        alone = c.post("/v1/images/generations", json={**body, "n": 1}).json()["data"][0]
        assert png(alone["b64_json"]).tobytes() == png(first["b64_json"]).tobytes()


def test_qa_off_skips_the_gate(server: Server) -> None:
    with server.client() as c:
        r = c.post("/v1/images/generations", json={"prompt": "a green square", "qa": False})
        assert r.status_code == 200, r.text
        assert r.json()["data"][0]["qa"] == "skipped"


def test_auth_and_tenant_isolation(server: Server) -> None:
    with server.client(token=None) as anon:
        r = anon.post("/v1/images/generations", json={"prompt": "a red circle"})
        assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
        assert r.json()["error"] == "unauthorized"
    with server.client(token="wrong") as bad:
        assert bad.get("/v1/stats").status_code == 401
    with server.client("token-alpha") as a, server.client("token-beta") as b:
        job = a.post("/v1/jobs", json={"prompts": ["a red circle"]}).json()
        assert a.get(f"/v1/jobs/{job['id']}").status_code == 200
        for resp in (b.get(f"/v1/jobs/{job['id']}"), b.get(f"/v1/jobs/{job['id']}/images"),
                     b.delete(f"/v1/jobs/{job['id']}")):  # fmt: skip
            assert resp.status_code == 404 and resp.json()["error"] == "not_found"
        wait_job(a, job["id"], {"done"})


def test_bulk_job_progress_images_and_cancel(server: Server) -> None:
    with server.client() as c:
        prompts = [f"a small red circle number {i}" for i in range(3)]
        r = c.post("/v1/jobs", json={"prompts": prompts, "seed": 100})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["total"] == 3 and job["state"] in {"queued", "running", "done"}
        done = wait_job(c, job["id"], {"done"})
        assert done["accepted"] == 3 and done["pending"] == 0
        assert done["ledger"]["total_device_seconds"] > 0
        page = c.get(f"/v1/jobs/{job['id']}/images", params={"limit": 2}).json()
        assert page["total"] == 3 and len(page["data"]) == 2 and page["next_offset"] == 2
        assert png(page["data"][0]["b64_json"]).size == (32, 32)
        rest = c.get(f"/v1/jobs/{job['id']}/images", params={"offset": 2}).json()
        assert rest["next_offset"] is None
        ids = [d["id"] for d in page["data"] + rest["data"]]
        assert sorted(ids) == ["p000000", "p000001", "p000002"]

        big = c.post("/v1/jobs", json={"prompts": [f"a blue square {i}" for i in range(40)]})
        big_id = big.json()["id"]
        cancelled = c.delete(f"/v1/jobs/{big_id}").json()
        assert cancelled["state"] == "cancelled"
        # Batches already running finish and are kept: wait until none is left, then read.
        after = wait_for(
            lambda: c.get(f"/v1/jobs/{big_id}").json(),
            lambda st: st["in_flight"] == 0,
            what=f"job {big_id}'s running batches to finish after the cancel",
        )
        assert after["state"] == "cancelled" and after["accepted"] < 40
        assert after["accepted"] + after["escalated"] + after["pending"] == 40
        kept = c.get(f"/v1/jobs/{big_id}/images", params={"images": False}).json()
        assert kept["total"] == after["accepted"]


def test_window_job_waits_for_its_window_while_interactive_work_runs(server: Server) -> None:
    with server.client() as c:
        opens = time.time() + 3600  # windows are in Unix time: this one opens in an hour
        spec = f"{opens:.3f}-{opens + 3600:.3f}"
        prompts = [f"a green triangle number {i}" for i in range(8)]
        r = c.post("/v1/jobs", json={"prompts": prompts, "mode": "window", "windows": spec})
        assert r.status_code == 202, r.text
        job = r.json()
        assert job["mode"] == "window" and job["windows"] == spec
        gen = c.post("/v1/images/generations", json={"prompt": "a red square", "seed": 1})
        assert gen.status_code == 200, gen.text
        st = c.get(f"/v1/jobs/{job['id']}").json()
        assert st["accepted"] == st["escalated"] == 0 and st["pending"] == 8
        assert c.delete(f"/v1/jobs/{job['id']}").status_code == 200


def test_window_job_inside_its_window_fills_batches(server: Server) -> None:
    with server.client() as c:
        prompts = [f"a green triangle number {i}" for i in range(8)]
        r = c.post("/v1/jobs", json={"prompts": prompts, "mode": "window", "windows": "always"})
        assert r.status_code == 202, r.text
        done = wait_job(c, r.json()["id"], {"done"})
        assert done["accepted"] + done["escalated"] == 8
        lines = (server.data / "jobs" / done["id"] / "metadata.jsonl").read_text().splitlines()
        rows = [json.loads(line) for line in lines]
        assert len(rows) == done["accepted"]
        # First attempts ran in full batches of 4: the window policy fills to the cap.
        assert all(row["attempt"] > 0 or row["batch_size"] == 4 for row in rows)


def test_metrics_parse_and_cover_the_service(server: Server) -> None:
    with server.client() as c:
        c.post("/v1/images/generations", json={"prompt": "a yellow triangle"})
        c.post("/v1/images/generations", json={"prompt": "a yellow triangle", "deadline_s": 0.001})
        text = c.get("/metrics").text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    for name in ("renderq_queue_depth", "renderq_queue_seconds", "renderq_compute_seconds",
                 "renderq_batch_size", "renderq_device_seconds", "renderq_admission_rejections",
                 "renderq_qa", "renderq_request_seconds", "renderq_ready",
                 "renderq_latency_scale", "renderq_latency_scale_priced",
                 "renderq_renders_per_request", "renderq_admission_wait_stretch"):  # fmt: skip
        assert name in families, name
    # A batch has come back, so admission runs on a measured scale (positive, finite),
    # priced at least at its moving average.
    [scale] = families["renderq_latency_scale"].samples
    assert 0 < scale.value < 1e6 and scale.labels["device_class"]
    [priced] = families["renderq_latency_scale_priced"].samples
    assert priced.labels == scale.labels and scale.value <= priced.value < 1e6
    assert families["renderq_renders_per_request"].samples[0].value >= 1.0
    # Nothing was admitted near its deadline yet: no stretch.
    assert families["renderq_admission_wait_stretch"].samples[0].value == 1.0
    dev = {
        s.labels["stage"]: s.value
        for s in families["renderq_device_seconds"].samples
        if s.name.endswith("_total")
    }
    assert dev["render"] > 0 and dev["score"] > 0
    rejected = [s for s in families["renderq_admission_rejections"].samples
                if s.name.endswith("_total") and s.labels["reason"] == "deadline"]  # fmt: skip
    assert rejected and rejected[0].value >= 1
    qa = {s.labels["outcome"]: s.value for s in families["renderq_qa"].samples
          if s.name.endswith("_total")}  # fmt: skip
    assert qa.get("pass", 0) >= 1


def test_deadline_that_cannot_be_met_is_refused_at_once_with_retry_after(server: Server) -> None:
    with server.client() as c:
        t0 = time.monotonic()
        r = c.post("/v1/images/generations", json={"prompt": "a red circle", "deadline_s": 0.001})
        assert time.monotonic() - t0 < 5
        assert r.status_code == 429 and r.json()["error"] == "deadline"
        assert int(r.headers["retry-after"]) >= 1


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        ({"prompt": "   "}, 422, "prompt"),
        ({"prompt": ""}, 422, "prompt"),
        ({"prompt": "a circle", "size": "33x32"}, 400, "33x32"),
        ({"prompt": "a circle", "size": "huge"}, 422, "size"),
        ({"prompt": "a circle", "n": 5}, 400, "n must be at most 4"),
        ({"prompt": "a circle", "n": 0}, 422, "n"),
        ({"prompt": "a circle", "steps": 9}, 400, "steps must be at most 8"),
        ({"prompt": "a circle", "steps": 0}, 422, "steps"),
        ({"prompt": "a circle", "model": "other"}, 400, "'other'"),
        ({"prompt": "a circle", "bogus": 1}, 422, "bogus"),
        ({"prompts": []}, 422, "prompt"),
    ],
)
def test_bad_input_is_4xx_naming_the_field(
    server: Server, body: dict[str, object], status: int, field: str
) -> None:
    with server.client() as c:
        r = c.post("/v1/images/generations", json=body)
    assert r.status_code == status, r.text
    assert field in r.json()["detail"] or field in r.json().get("fields", [])


def test_malformed_json_and_bad_job_bodies(server: Server) -> None:
    with server.client() as c:
        r = c.post("/v1/images/generations", content=b"{not json",
                   headers={"content-type": "application/json"})  # fmt: skip
        assert r.status_code == 422 and r.json()["error"] == "invalid_request"
        r = c.post("/v1/jobs", json={"prompts": ["ok", " "]})
        assert r.status_code == 422 and "prompt 1 is empty" in r.text
        r = c.post("/v1/jobs", json={"prompts": ["ok"], "mode": "window", "windows": "9-3"})
        assert r.status_code == 422 and "windows" in r.text and "9-3" in r.text
        r = c.post("/v1/jobs", json={"prompts": ["ok"], "windows": "always"})
        assert r.status_code == 422 and "needs mode 'window'" in r.text
        assert c.get("/v1/jobs/job-nope").status_code == 404


def test_health_ready_openapi_and_stats(server: Server) -> None:
    with server.client(token=None) as c:
        assert c.get("/healthz").json() == {"status": "ok"}
        assert c.get("/readyz").json()["status"] == "ready"
        spec = c.get("/openapi.json").json()
        assert "/v1/images/generations" in spec["paths"] and "/v1/jobs/{job_id}" in spec["paths"]
    with server.client() as c:
        st = c.get("/v1/stats").json()
        assert st["ready"] and "queue_depth" in st and st["served"] >= 1
        assert st["ledger"]["device_seconds"]["render"] > 0
