"""The service checks and buckets prompts as ``renderq run`` does (a tiny Flux pipeline).

Flux has no classifier-free guidance, so it refuses a negative prompt it would ignore;
its T5 encoder takes prompts in length buckets, and the bucket is part of the batch key,
for interactive requests and bulk job prompts alike. Over a real socket.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest

from renderq.core.settings import INTERACTIVE, ModelSpec, QASettings
from renderq.service.config import ServiceConfig
from renderq.testing import tiny
from tests.service.test_edges import Live

pytestmark = pytest.mark.slow

SHORT = "a red circle"
LONG = "a small red circle on a blue background next to a green square " * 2


@pytest.fixture(scope="module")
def flux(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("flux-serve")
    spec = ModelSpec(
        str(tiny.build_tiny_flux(root / "flux")), str(tiny.build_tiny_clip(root / "clip")), steps=2
    )
    cfg = ServiceConfig(
        spec=spec, qa=QASettings(threshold=-1.0), data_dir=root / "data",
        batching=replace(INTERACTIVE, max_batch_size=2), max_steps=4,
    )  # fmt: skip
    live = Live(cfg, ready_s=180)
    yield live
    live.stop()


def test_a_negative_prompt_flux_would_ignore_is_a_400_naming_it(flux: Live) -> None:
    with flux.client() as c:
        body = {"prompt": SHORT, "size": "32x32", "negative_prompt": "blurry"}
        r = c.post("/v1/images/generations", json=body)
        assert r.status_code == 400, r.text
        assert r.json()["error"] == "invalid_request" and "'blurry'" in r.json()["detail"]
        prompts = [SHORT, {"prompt": SHORT, "negative_prompt": "washed out"}]
        r = c.post("/v1/jobs", json={"prompts": prompts, "size": "32x32"})
        assert r.status_code == 400, r.text
        detail = r.json()["detail"]
        assert detail.startswith("prompt 1:") and "'washed out'" in detail
        # Nothing of the refused job was kept.
        assert not list((flux.service.config.data_dir / "jobs").glob("job-*"))


def test_prompts_ride_in_their_text_encoders_length_bucket(flux: Live) -> None:
    svc = flux.service
    assert svc.model is not None
    ex = svc.model.executor
    short, long = (ex.prompt_length(p) for p in (SHORT, LONG))  # type: ignore[union-attr]
    assert 0 < short.bucket < long.bucket and long.truncated and not short.truncated
    [a] = svc.build_requests("local", prompt=SHORT, n=1, size=(32, 32))
    [b] = svc.build_requests("local", prompt=LONG, n=1, size=(32, 32))
    assert (a.key.prompt_bucket, b.key.prompt_bucket) == (short.bucket, long.bucket)
    with flux.client() as c:
        r = c.post("/v1/images/generations", json={"prompt": LONG, "size": "32x32", "seed": 3})
        assert r.status_code == 200, r.text
        # A bulk job of one short and one long prompt: two keys, so two batches of one
        # (the cap is 2: one key would have made one batch of both).
        r = c.post("/v1/jobs", json={"prompts": [SHORT, LONG], "size": "32x32"})
        assert r.status_code == 202, r.text
        job = r.json()["id"]
        deadline = time.monotonic() + 120
        while c.get(f"/v1/jobs/{job}").json()["state"] != "done":
            assert time.monotonic() < deadline, c.get(f"/v1/jobs/{job}").json()
            time.sleep(0.1)
    lines = (svc.config.data_dir / "jobs" / job / "metadata.jsonl").read_text().splitlines()
    rows = {row["prompt"]: row for row in map(json.loads, lines)}
    assert rows[SHORT]["prompt_bucket"] == short.bucket and rows[SHORT]["truncated"] == []
    assert rows[LONG]["prompt_bucket"] == long.bucket
    assert rows[LONG]["truncated"] == list(long.truncated)
    assert rows[SHORT]["batch_id"] != rows[LONG]["batch_id"]
    assert rows[SHORT]["batch_size"] == rows[LONG]["batch_size"] == 1


def test_bad_size_is_refused_before_rendering(flux: Live) -> None:
    # Flux needs multiples of vae_scale_factor x 2; the service asks the pipeline.
    with flux.client() as c:
        r = c.post("/v1/images/generations", json={"prompt": SHORT, "size": "33x32"})
    assert r.status_code == 400 and "33x32" in r.json()["detail"]
