"""The gallery: each prompt's outcome and attempts from a job store, and, over the socket,
a tenant's gallery holds only its own work (an admin token sees every tenant's)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from renderq.service.gallery import job_rows
from renderq.store.sqlite import AttemptRow, Decision, PromptRow, StoredRequest


class _Store:
    """The three reads :func:`job_rows` makes of a job store."""

    def __init__(self, rows: list[StoredRequest], attempts: list[AttemptRow],
                 decisions: list[Decision]) -> None:  # fmt: skip
        self.rows, self.ended, self.decided = rows, attempts, decisions

    def requests(self) -> list[StoredRequest]:
        return self.rows

    def attempts(self) -> dict[str, list[AttemptRow]]:
        out: dict[str, list[AttemptRow]] = {}
        for a in self.ended:
            out.setdefault(a.request_id, []).append(a)
        return out

    def decisions(self) -> list[Decision]:
        return self.decided


def _req(i: int, state: str, attempt: int | None, file_name: str | None = None) -> StoredRequest:
    row = PromptRow(f"p{i}", i, f"prompt {i}", 100 + i, {})
    return StoredRequest(row, state, attempt, 0.3, file_name, 1, 1, 4)


def _att(i: int, k: int, score: float | None = 0.3, error: str | None = None) -> AttemptRow:
    return AttemptRow(f"p{i}", k, 1000 + k, 1, 4, score, error)


def test_rows_name_the_gate_outcome_and_each_attempts_image() -> None:
    store = _Store(
        [
            _req(0, "accepted", 0, "images/p0.png"),
            _req(1, "accepted", 1, "images/p1.png"),
            _req(2, "escalated", 1),
            _req(3, "accepted", 0, "images/p3.png"),  # accepted by a reviewer
            _req(4, "pending", None),  # failed once, queued again
            _req(5, "pending", None),  # not rendered yet: no row
        ],
        [_att(0, 0), _att(1, 0), _att(1, 1), _att(2, 0, None, "OOM"), _att(2, 1),
         _att(3, 0), _att(3, 1), _att(4, 0)],
        [Decision("p3", "accept", "ana", 1.0, attempt=0)],
    )  # fmt: skip
    rows = job_rows(store, "job-1", "alpha")  # type: ignore[arg-type]
    got = {r["id"]: (r["outcome"], r["state"]) for r in rows}
    assert got == {
        "p0": ("accepted", "accepted"), "p1": ("regenerated", "accepted"),
        "p2": ("escalated", "escalated"), "p3": ("escalated", "accepted"),
        "p4": ("pending", "pending"),
    }  # fmt: skip
    by_id = {r["id"]: r for r in rows}
    assert [a["image"] for a in by_id["p1"]["attempts"]] == ["review/p1-0.png", "images/p1.png"]
    assert [a["accepted"] for a in by_id["p1"]["attempts"]] == [False, True]
    assert [a["image"] for a in by_id["p2"]["attempts"]] == [None, "review/p2-1.png"]
    assert [a["image"] for a in by_id["p3"]["attempts"]] == ["images/p3.png", "review/p3-1.png"]
    assert by_id["p0"]["attempts"][0]["seed"] == "1000"  # a string: JS numbers stop at 2**53
    assert {r["job"] for r in rows} == {"job-1"} and {r["tenant"] for r in rows} == {"alpha"}


@pytest.mark.slow
def test_a_tenant_gallery_holds_only_its_own_work(
    tmp_path: Path, models: tuple[Path, Path]
) -> None:
    from tests.service.conftest import start_server, write_config
    from tests.service.test_service import wait_job

    # No cosine reaches 1.0: every prompt escalates after two attempts, both images kept.
    cfg = write_config(tmp_path / "renderq.toml", tmp_path / "data", *models,
                       threshold=1.0, max_attempts=2)  # fmt: skip
    text = cfg.read_text().replace("tokens = { ", 'tokens = { "token-ops" = "ops", ')
    cfg.write_text(text + 'admin_tenants = ["ops"]\n')
    srv = start_server(cfg, tmp_path / "data", tmp_path / "server.log")
    try:
        with (
            srv.client("token-alpha") as alpha,
            srv.client("token-beta") as beta,
            srv.client("token-ops") as ops,
            srv.client(None) as nobody,
        ):
            a_job = alpha.post("/v1/jobs", json={"prompts": ["a red circle", "a cat"]}).json()
            b_job = beta.post("/v1/jobs", json={"prompts": ["a green square"]}).json()
            wait_job(alpha, a_job["id"], {"done"})
            wait_job(beta, b_job["id"], {"done"})

            mine: dict[str, Any] = alpha.get("/v1/gallery").json()
            assert mine["scope"] == "alpha" and mine["interactive_kept"] is False
            assert [j["id"] for j in mine["jobs"]] == [a_job["id"]]
            assert [(r["job"], r["id"]) for r in mine["rows"]] == [
                (a_job["id"], "p000000"), (a_job["id"], "p000001")]  # fmt: skip
            assert {r["outcome"] for r in mine["rows"]} == {"escalated"}
            row = mine["rows"][0]
            assert [a["attempt"] for a in row["attempts"]] == [0, 1]
            shot = row["attempts"][1]["image"]
            assert shot == f"{a_job['id']}/review/p000000-1.png"
            assert alpha.get(f"/v1/gallery/files/{shot}").content[:4] == b"\x89PNG"

            theirs = beta.get("/v1/gallery").json()
            assert [r["job"] for r in theirs["rows"]] == [b_job["id"]]
            assert [j["id"] for j in theirs["jobs"]] == [b_job["id"]]
            # Another tenant's job is not found: neither its rows nor its images.
            assert beta.get("/v1/gallery", params={"job": a_job["id"]}).status_code == 404
            assert beta.get(f"/v1/gallery/files/{shot}").status_code == 404
            assert nobody.get("/v1/gallery").status_code == 401
            assert nobody.get(f"/v1/gallery/files/{shot}").status_code == 401

            # Filters: by outcome and by job.
            assert alpha.get("/v1/gallery", params={"outcome": "accepted"}).json()["rows"] == []
            bad = alpha.get("/v1/gallery", params={"outcome": "great"})
            assert bad.status_code == 400 and "'great'" in bad.json()["detail"]
            everyone = ops.get("/v1/gallery").json()
            assert everyone["scope"] == "all"
            assert {r["tenant"] for r in everyone["rows"]} == {"alpha", "beta"}
            only_b = ops.get("/v1/gallery", params={"job": b_job["id"]}).json()["rows"]
            assert [r["tenant"] for r in only_b] == ["beta"]
            assert ops.get(f"/v1/gallery/files/{shot}").content[:4] == b"\x89PNG"

            # The page and the vendored chart library are served from the package.
            assert "renderq gallery" in alpha.get("/gallery/").text
            js = nobody.get("/assets/uPlot.iife.min.js")
            assert js.status_code == 200 and "uPlot" in js.text
            assert nobody.get("/assets/..%2Fapp.py").status_code == 404
    finally:
        srv.stop()
