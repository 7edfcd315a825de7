"""The review page's routes: a page, its JSON, the decisions and the attempts' images.

:func:`review_router` serves one run folder at a time, chosen per call by ``folder_of``
(``renderq review OUT`` always answers with OUT); the reviewer's name comes from
``reviewer_of``, never from the page, so a decision records who was let in, not who they
said they were. :func:`review_app` is the whole local app of ``renderq review``.

Routes, relative to the router's prefix: ``GET /`` the page (``review.html``, served from
the package: no build step, nothing fetched from elsewhere), ``GET /api`` what the page
shows, ``POST /api/{request_id}`` one decision, ``GET /files/{name}`` a kept image.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from renderq.core.errors import ConfigError
from renderq.jobs import review
from renderq.output.dataset import IMAGES, REVIEW_IMAGES
from renderq.store.lock import JobLocked
from renderq.store.sqlite import Decision, StoreError

FolderOf = Callable[[Request], Path]
ReviewerOf = Callable[[Request], str]

MAX_PROMPT_CHARS = 2000
"""Longest edited prompt the page takes (a render request's prompt has no use for more)."""


class DecisionBody(BaseModel):
    """A decision as the page sends it: accept an attempt, reject, or edit the prompt."""

    action: Literal["accept", "reject", "edit"]
    attempt: int | None = Field(default=None, ge=0)
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)


def review_router(folder_of: FolderOf, reviewer_of: ReviewerOf, prefix: str = "") -> APIRouter:
    """The review routes under ``prefix``, each on the folder ``folder_of`` picks."""
    router = APIRouter(prefix=prefix)

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        """The review page."""
        return HTMLResponse(resources.files("renderq.service").joinpath("review.html").read_text())

    @router.get("/api")
    def state(request: Request) -> JSONResponse:
        """Every escalated prompt with its attempts and decision, and the gate's view."""
        out = folder_of(request)
        return _guarded(lambda: page_state(out, reviewer_of(request)))

    @router.post("/api/{request_id}")
    def decide(request_id: str, body: DecisionBody, request: Request) -> JSONResponse:
        """Record one decision; answers the decision as stored."""
        out = folder_of(request)
        who = reviewer_of(request)

        def run() -> dict[str, Any]:
            d = review.decide(out, request_id, body.action, who, attempt=body.attempt,
                              prompt=body.prompt)  # fmt: skip
            return decision_dict(d)

        return _guarded(run)

    @router.get("/files/{name:path}", include_in_schema=False)
    def image(name: str, request: Request) -> Response:
        """A kept attempt image or an accepted image of the folder, nothing else."""
        out = folder_of(request).resolve()
        path = (out / name).resolve()
        allowed = (out / REVIEW_IMAGES, out / IMAGES)
        # Only PNGs directly inside the two image folders: no path leads elsewhere.
        if path.suffix != ".png" or path.parent not in allowed or not path.is_file():
            return _not_found(name)
        return FileResponse(path, media_type="image/png")

    return router


def review_app(out: Path, reviewer: str) -> FastAPI:
    """The app ``renderq review OUT`` serves: the review routes on ``out`` at ``/``."""
    app = FastAPI(title="renderq review", docs_url=None, redoc_url=None)
    app.include_router(review_router(lambda _: out, lambda _: reviewer))
    return app


def page_state(out: Path, reviewer: str) -> dict[str, Any]:
    """What the page shows: the folder, who reviews, each escalated prompt, the gate."""
    with review.open_store(out) as store:
        items = review.items(store)
        gate = review.gate_view(store)
        counts = store.counts()
    return {
        "folder": str(out),
        "reviewer": reviewer,
        "counts": counts,
        "gate": gate.to_dict(),
        "items": [
            {
                "id": i.id,
                "prompt": i.prompt,
                "parent": i.parent,
                "state": i.state,
                "decision": None if i.decision is None else decision_dict(i.decision),
                "resubmitted_state": i.resubmitted,
                "attempts": [
                    {
                        "attempt": a.attempt,
                        # A string: seeds go up to 2**63, past what a JS number holds.
                        "seed": str(a.seed),
                        "score": a.score,
                        "error": a.error,
                        "image": a.image if a.image and (out / a.image).is_file() else None,
                    }
                    for a in i.attempts
                ],
            }
            for i in items
        ],
    }


def decision_dict(d: Decision) -> dict[str, Any]:
    """A decision as JSON."""
    return {
        "request_id": d.request_id,
        "action": d.action,
        "reviewer": d.reviewer,
        "at": d.at,
        "attempt": d.attempt,
        "prompt": d.prompt,
        "new_request_id": d.new_request_id,
    }


def _guarded(work: Callable[[], dict[str, Any]]) -> JSONResponse:
    """Run ``work``; a refused decision answers 409 (busy or decided) or 422 (bad input)."""
    try:
        return JSONResponse(work())
    except JobLocked as exc:
        return JSONResponse({"error": "busy", "detail": str(exc)}, status_code=409)
    except StoreError as exc:
        return JSONResponse({"error": "conflict", "detail": str(exc)}, status_code=409)
    except ConfigError as exc:
        return JSONResponse({"error": "invalid_decision", "detail": str(exc)}, status_code=422)


def _not_found(name: str) -> JSONResponse:
    return JSONResponse({"error": "not_found", "detail": f"no image {name!r}"}, status_code=404)
