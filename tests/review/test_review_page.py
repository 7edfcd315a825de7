"""The review page's routes, in process: what it shows, what it refuses, which files it serves."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("fastapi")

from fastapi.testclient import TestClient

from renderq.jobs import review
from renderq.service.review import review_app
from renderq.store.lock import FolderLock

from .conftest import REVIEW_PROMPTS, run_escalating

pytestmark = pytest.mark.slow


def test_the_page_and_its_json_show_every_attempt(escalated: Path) -> None:
    out = escalated / "out"
    with TestClient(review_app(out, "ana")) as c:
        page = c.get("/")
        assert page.status_code == 200 and "renderq review" in page.text
        assert "http" not in page.text.split("<script>")[1]  # nothing fetched from elsewhere
        s = c.get("/api").json()
        assert s["reviewer"] == "ana" and s["counts"] == {"escalated": 4}
        assert [i["id"] for i in s["items"]] == [f"p{i:06d}" for i in range(4)]
        first = s["items"][0]
        with review.open_store(out) as store:
            tries = store.attempts_of("p000000")
        assert [(a["attempt"], a["seed"], a["score"]) for a in first["attempts"]] == [
            (t.attempt, str(t.seed), t.score) for t in tries
        ]
        img = c.get("/files/" + first["attempts"][1]["image"])
        assert img.status_code == 200 and img.content[:4] == b"\x89PNG"
        assert img.headers["content-type"] == "image/png"


@pytest.mark.parametrize(
    "name",
    ["renderq.sqlite", "review/../renderq.sqlite", "review/../../escalated.png",
     "review/nope-0.png", "metadata.jsonl", "%2e%2e/prompts.txt"],
)  # fmt: skip
def test_files_outside_the_image_folders_are_not_served(escalated: Path, name: str) -> None:
    with TestClient(review_app(escalated / "out", "ana")) as c:
        r = c.get("/files/" + name)
        # Either the route refuses it or the URL, once normalised, names no route at all.
        assert r.status_code == 404 and not r.content.startswith(b"\x89PNG")


def test_decisions_over_http_and_what_is_refused(escalated: Path) -> None:
    out = escalated / "out"
    with TestClient(review_app(out, "ana")) as c:
        ok = c.post("/api/p000000", json={"action": "accept", "attempt": 0})
        assert ok.status_code == 200 and ok.json()["reviewer"] == "ana"
        again = c.post("/api/p000000", json={"action": "reject"})
        assert again.status_code == 409 and "is accepted, not escalated" in again.json()["detail"]
        bad = c.post("/api/p000001", json={"action": "approve"})
        assert bad.status_code == 422
        empty = c.post("/api/p000001", json={"action": "edit", "prompt": ""})
        assert empty.status_code == 422 and "is empty" in empty.json()["detail"]
        both = c.post("/api/p000001", json={"action": "reject", "attempt": 1})
        assert both.status_code == 422 and "takes no attempt" in both.json()["detail"]
        with FolderLock(out):  # a renderq run working on the folder
            busy = c.post("/api/p000001", json={"action": "reject"})
        assert busy.status_code == 409 and busy.json()["error"] == "busy"
        s = c.get("/api").json()
    assert s["counts"] == {"accepted": 1, "escalated": 3}
    assert s["items"][0]["decision"]["action"] == "accept"
    assert s["gate"]["accepted"]["n"] == 1


def test_the_command_refuses_a_folder_that_is_not_a_run(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from renderq.cli.main import app

    result = CliRunner().invoke(app, ["review", str(tmp_path), "--reviewer", "ana"])
    assert result.exit_code == 2 and "is not a renderq run folder" in result.stderr
    assert list(tmp_path.iterdir()) == []  # no lock file left behind
    empty = CliRunner().invoke(app, ["review", str(tmp_path), "--reviewer", " "])
    assert empty.exit_code == 2 and "--reviewer must not be empty" in empty.output


def test_the_folders_gallery_shows_each_prompts_attempts_and_filters(escalated: Path) -> None:
    from renderq.service.gallery import local_app

    out = escalated / "out"
    with TestClient(local_app(out, "ana")) as c:
        assert "renderq" in c.get("/gallery/").text
        g = c.get("/v1/gallery").json()
        assert g["jobs"] == [{"id": "out", "tenant": "local", "state": "done"}]
        assert [r["id"] for r in g["rows"]] == [f"p{i:06d}" for i in range(4)]
        assert {r["outcome"] for r in g["rows"]} == {"escalated"}
        with review.open_store(out) as store:
            tries = store.attempts_of("p000000")
        first = g["rows"][0]
        assert [a["seed"] for a in first["attempts"]] == [str(t.seed) for t in tries]
        img = c.get("/v1/gallery/files/" + first["attempts"][0]["image"])
        assert img.status_code == 200 and img.content[:4] == b"\x89PNG"
        assert c.get("/v1/gallery?outcome=accepted").json()["rows"] == []
        assert c.get("/v1/gallery?outcome=maybe").status_code == 400
        assert c.get("/v1/gallery?job=other").status_code == 404
        assert c.get("/v1/gallery/files/other/review/p000000-0.png").status_code == 404
        assert c.get("/api").status_code == 200  # the review page is still there


def test_a_run_whose_images_live_elsewhere_is_reviewed_from_there(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path
) -> None:
    tree = tmp_path / "tree"
    summary = run_escalating(tmp_path, tiny_model, tiny_clip, "--images", tree.as_uri())
    assert summary["escalated"] == len(REVIEW_PROMPTS)
    out = tmp_path / "out"
    assert not (out / "review").exists() and (tree / "review" / "p000000-1.png").is_file()
    with TestClient(review_app(out, "ana")) as c:
        kept = c.get("/files/review/p000000-1.png")
        on_disk = (tree / "review/p000000-1.png").read_bytes()
        assert kept.status_code == 200 and kept.content == on_disk
        for name in ("review/..%2Frenderq.sqlite", "review/nope-0.png", "metadata.jsonl"):
            assert c.get("/files/" + name).status_code == 404, name
        assert c.post("/api/p000000", json={"action": "accept", "attempt": 1}).status_code == 200
        accepted = c.get("/files/images/p000000.png")
    # The reviewer's accept copied the kept attempt into the tree's images, not into out/.
    assert accepted.content == (tree / "images/p000000.png").read_bytes() == kept.content
    assert not (out / "images" / "p000000.png").exists()
