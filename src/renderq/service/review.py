"""The review page's routes: a page, its JSON, the decisions and the attempts' images.

:func:`review_app` is the local app of ``renderq review OUT``: the routes of
:func:`review_router` over one run folder. The reviewer's name is the command's, never the
page's, so a decision records who was let in, not who they said they were.

Routes: ``GET /`` the page (``review.html``, served from the package: no build step,
nothing fetched from elsewhere), ``GET /api`` what the page shows, ``POST /api/{request_id}``
one decision, ``GET /files/{name}`` a kept image.

:func:`service_review_router` puts the same page over each bulk job of ``renderq serve``
at ``/v1/jobs/{job_id}/review/``: a tenant sees and decides only its own jobs (another
tenant's job is not found, as everywhere in the service), each decision runs on the
service's jobs thread (where the job's listener writes the same files), and an edited
prompt is queued at once, at review priority.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Depends, FastAPI
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from pydantic import BaseModel, Field

from renderq.core.errors import ConfigError
from renderq.core.types import Request as RenderRequest
from renderq.jobs import review
from renderq.output.dataset import IMAGES, REVIEW_IMAGES
from renderq.output.images import ImageStore
from renderq.store.lock import JobLocked
from renderq.store.sqlite import Decision, PromptState, StoreError

if TYPE_CHECKING:
    from renderq.service.jobs import ServiceJob
    from renderq.service.render import RenderService

BULK_REVIEW_PRIORITY = 9
"""Priority of an edited bulk prompt in the service: the highest of bulk work (0-9), so it
goes ahead of every job's own prompts and still behind interactive requests (10-19)."""

MAX_PROMPT_CHARS = 2000
"""Longest edited prompt the page takes (a render request's prompt has no use for more)."""


class DecisionBody(BaseModel):
    """A decision as the page sends it: accept an attempt, reject, or edit the prompt."""

    action: Literal["accept", "reject", "edit"]
    attempt: int | None = Field(default=None, ge=0)
    prompt: str | None = Field(default=None, max_length=MAX_PROMPT_CHARS)


#: A file name inside one of the two image folders: no separator, no "..", a PNG.
_SAFE_FILE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\.png")


def review_router(out: Path, reviewer: str) -> APIRouter:
    """The review routes over run folder ``out``, deciding as ``reviewer``."""
    router = APIRouter()

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        """The review page."""
        return HTMLResponse(resources.files("renderq.service").joinpath("review.html").read_text())

    @router.get("/api")
    def state() -> JSONResponse:
        """Every escalated prompt with its attempts and decision, and the gate's view."""
        return _guarded(lambda: page_state(out, reviewer))

    @router.post("/api/{request_id}")
    def decide(request_id: str, body: DecisionBody) -> JSONResponse:
        """Record one decision; answers the decision as stored."""

        def run() -> dict[str, Any]:
            d = review.decide(out, request_id, body.action, reviewer, attempt=body.attempt,
                              prompt=body.prompt)  # fmt: skip
            return decision_dict(d)

        return _guarded(run)

    @router.get("/files/{name:path}", include_in_schema=False)
    def image(name: str) -> Response:
        """A kept attempt image or an accepted image of the folder, nothing else."""
        return image_response(out, name)

    return router


def review_app(out: Path, reviewer: str) -> FastAPI:
    """The app ``renderq review OUT`` serves: the review routes on ``out`` at ``/``."""
    app = FastAPI(title="renderq review", docs_url=None, redoc_url=None)
    app.include_router(review_router(out, reviewer))
    return app


def page_state(out: Path, reviewer: str, label: str | None = None) -> dict[str, Any]:
    """What the page shows: the folder (or ``label``), who reviews, each prompt, the gate."""
    with review.open_store(out) as store:
        items = review.items(store)
        gate = review.gate_view(store)
        counts = store.counts()
    return {
        "folder": label if label is not None else str(out),
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


def image_response(folder: Path, name: str) -> Response:
    """The PNG ``name`` of ``folder`` if it is a kept attempt or an accepted image; else 404.

    A folder whose images live elsewhere (``run --images``) answers from there."""
    elsewhere = review.images_of(folder)
    if elsewhere is not None:
        return _stored_image(elsewhere, name)
    out = folder.resolve()
    path = (out / name).resolve()
    allowed = (out / REVIEW_IMAGES, out / IMAGES)
    # Only PNGs directly inside the two image folders: no path leads elsewhere.
    if path.suffix != ".png" or path.parent not in allowed or not path.is_file():
        return _not_found(name)
    return FileResponse(path, media_type="image/png")


def _stored_image(images: str, name: str) -> Response:
    """The PNG ``name`` of an images tree elsewhere: ``images/X.png`` or ``review/X.png``."""
    folder, _, file = name.partition("/")
    if folder not in (IMAGES, REVIEW_IMAGES) or not _SAFE_FILE.fullmatch(file):
        return _not_found(name)
    store = ImageStore.at(images)
    if not store.exists(name):
        return _not_found(name)
    return Response(store.read(name), media_type="image/png")


def service_review_router(service: RenderService, tenant: Callable[..., Any]) -> APIRouter:
    """The review page over each bulk job of ``service``; ``tenant`` is the auth dependency.

    The page itself is static (its calls carry the token from the URL's ``#token=``); its
    JSON, decisions and images answer the job's own tenant only.
    """
    router = APIRouter(prefix="/v1/jobs/{job_id}/review")
    # A default, not an ``Annotated`` alias: annotations are strings here (``from
    # __future__``), and FastAPI cannot resolve a name local to this function.
    who_is = Depends(tenant)

    def on_jobs(fn: Callable[[float], Any]) -> Any:
        # Job stores are written on the service's jobs thread; read them there too (a
        # decision runs there, so it never interleaves with a step's commit).
        return service.on_jobs(fn).result(timeout=60)

    @router.get("/", response_class=HTMLResponse, include_in_schema=False)
    def page() -> HTMLResponse:
        """The review page of one job."""
        return HTMLResponse(resources.files("renderq.service").joinpath("review.html").read_text())

    @router.get("/api")
    def state(job_id: str, who: str = who_is) -> JSONResponse:
        """The job's escalated prompts with their attempts and decisions, and the gate."""

        def read(now: float) -> dict[str, Any]:
            # The job's id, not its folder: a tenant has no business with server paths.
            return page_state(service.jobs.get(who, job_id).folder, who, f"job {job_id}")

        return _guarded(lambda: on_jobs(read))

    @router.post("/api/{request_id}")
    def decide(job_id: str, request_id: str, body: DecisionBody, who: str = who_is) -> JSONResponse:
        """Record one decision on the job; an edit is queued at once."""

        def run(now: float) -> dict[str, Any]:
            job = service.jobs.get(who, job_id)
            d = review.decide(job.folder, request_id, body.action, who, attempt=body.attempt,
                              prompt=body.prompt)  # fmt: skip
            if d.new_request_id is not None:
                queue_edit(service, job, d.new_request_id)
            return decision_dict(d)

        return _guarded(lambda: on_jobs(run))

    @router.get("/files/{name:path}", include_in_schema=False)
    def image(job_id: str, name: str, who: str = who_is) -> Response:
        """A kept attempt image or an accepted image of the tenant's job."""
        folder: Path = on_jobs(lambda now: service.jobs.get(who, job_id).folder)
        return image_response(folder, name)

    return router


def queue_edit(service: RenderService, job: ServiceJob, request_id: str) -> None:
    """Queue a job's resubmitted prompt now, at :data:`BULK_REVIEW_PRIORITY` (jobs thread).

    The job's open store already holds the new prompt (the decision committed it); its
    cached rows and listener learn it here, then the request joins the job's backlog,
    which flows into the queue as room frees, like the job's own prompts. A cancelled
    job's edit stays pending in its store.
    """
    from renderq.service.jobs import SEP

    pending = job.store.requests(PromptState.PENDING)
    row = next(r.prompt for r in pending if r.prompt.id == request_id)
    job.rows[row.id] = row
    job.listener.prompts[row.id] = row
    job.listener.progress.total += 1
    if job.meta["state"] == "cancelled":
        return
    request = RenderRequest(
        id=f"{job.id}{SEP}{row.id}", prompt=row.prompt, key=job.key, base_seed=row.base_seed,
        priority=BULK_REVIEW_PRIORITY, guidance_scale=float(job.meta["guidance"]),
        negative_prompt=str(row.spec.get("negative_prompt", "")), tenant=job.tenant, job=job.id,
    )  # fmt: skip
    service._call(partial(service.bulk.queue, request))  # on the loop: the scheduler's


def _not_found(name: str) -> JSONResponse:
    return JSONResponse({"error": "not_found", "detail": f"no image {name!r}"}, status_code=404)
