"""The review page in ``renderq serve``, over the socket: a tenant sees and decides only its
own jobs' escalated prompts; an edit is rendered through the queue; a restart keeps all."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.service.conftest import start_server, write_config
from tests.service.test_service import wait_for, wait_job

pytestmark = pytest.mark.slow

PROMPTS = ["a red circle", "a green square", "a blue triangle"]


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_tenants_review_only_their_own_jobs_and_an_edit_is_rendered(
    tmp_path: Path, models: tuple[Path, Path]
) -> None:
    # No cosine reaches 1.0: every prompt escalates after two attempts.
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models,
                       threshold=1.0, max_attempts=2)  # fmt: skip
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        with srv.client("token-alpha") as alpha, srv.client("token-beta") as beta:
            job = alpha.post("/v1/jobs", json={"prompts": PROMPTS}).json()["id"]
            assert wait_job(alpha, job, {"done"})["escalated"] == 3
            base = f"/v1/jobs/{job}/review"
            page = alpha.get(base + "/")
            assert page.status_code == 200 and "renderq review" in page.text
            state = alpha.get(base + "/api").json()
            assert [i["id"] for i in state["items"]] == ["p000000", "p000001", "p000002"]
            assert state["reviewer"] == "alpha" and state["folder"] == f"job {job}"
            shot = state["items"][0]["attempts"][1]["image"]
            assert alpha.get(f"{base}/files/{shot}").content[:4] == b"\x89PNG"

            # Another tenant can neither see nor decide alpha's prompts, nor fetch an image.
            assert beta.get(base + "/api").status_code == 404
            assert beta.get(f"{base}/files/{shot}").status_code == 404
            stolen = beta.post(base + "/api/p000000", json={"action": "reject"})
            assert stolen.status_code == 404 and stolen.json()["error"] == "not_found"
            with srv.client(token=None) as nobody:
                assert nobody.get(base + "/api").status_code == 401
                assert (
                    nobody.post(base + "/api/p000000", json={"action": "reject"}).status_code == 401
                )

            ok = alpha.post(base + "/api/p000000", json={"action": "accept", "attempt": 1})
            assert ok.status_code == 200 and ok.json()["reviewer"] == "alpha", ok.text
            assert alpha.post(base + "/api/p000001", json={"action": "reject"}).status_code == 200
            edit = alpha.post(base + "/api/p000002", json={"action": "edit", "prompt": "a red dot"})
            assert edit.json()["new_request_id"] == "p000002-r1", edit.text

            # The edit is queued at once and rendered: it escalates too (threshold 1.0).
            def resubmitted() -> str | None:
                items = alpha.get(base + "/api").json()["items"]
                return next(i["resubmitted_state"] for i in items if i["id"] == "p000002")

            wait_for(resubmitted, lambda s: s == "escalated", "the edited prompt to be rendered",
                     timeout=120)  # fmt: skip
            status = alpha.get(f"/v1/jobs/{job}").json()
            # Every prompt is counted once: the rejected and the edited one are not accepted.
            counts = [status[k] for k in ("total", "accepted", "escalated", "pending")]
            assert counts == [4, 1, 3, 0], status
            assert (status["rejected"], status["edited"], status["state"]) == (1, 1, "done")
            images = alpha.get(f"/v1/jobs/{job}/images", params={"images": False}).json()
            assert [d["id"] for d in images["data"]] == ["p000000"]
            assert beta.get(f"/v1/jobs/{job}/images").status_code == 404
            before = alpha.get(base + "/api").json()
    finally:
        srv.stop()

    folder = tmp_path / "data" / "jobs" / job
    [meta] = _lines(folder / "metadata.jsonl")
    assert (meta["id"], meta["attempt"], meta["accepted_by"]) == ("p000000", 1, "review")
    rev = {r["id"]: r for r in _lines(folder / "review.jsonl")}
    assert rev["p000001"]["review"]["decision"] == "rejected"
    assert rev["p000001"]["review"]["reviewer"] == "alpha"
    assert rev["p000002"]["review"]["resubmitted_as"] == "p000002-r1"
    assert rev["p000002-r1"]["parent"] == "p000002" and len(rev["p000002-r1"]["attempts"]) == 2

    again = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        with again.client("token-alpha") as alpha, again.client("token-beta") as beta:
            assert alpha.get(base + "/api").json() == before
            assert beta.get(base + "/api").status_code == 404
    finally:
        again.stop()
