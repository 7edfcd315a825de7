"""The gallery of ``renderq serve``: recent bulk renders with their attempts, and the assets.

Routes: ``GET /gallery/`` the page (``gallery.html``, served from the package),
``GET /v1/gallery`` what it shows (filterable by ``job`` and ``outcome``),
``GET /v1/gallery/files/{job_id}/{name}`` a job's image, and ``GET /assets/{name}`` the
files the service's pages load (the vendored uPlot chart library and its licence: the
pages work offline, nothing is fetched from elsewhere).

A tenant sees only its own jobs (another tenant's job is not found, as everywhere in the
service); an admin token (``admin_tenants``) sees every tenant's. Interactive renders are
answered and not kept by the service, so the gallery shows bulk jobs only.

Each row is one prompt with every ended attempt side by side. Its ``outcome`` is what the
gate did: ``accepted`` at the first attempt, ``regenerated`` (accepted after failing at
least once), ``escalated`` (every attempt failed; a reviewer may have decided since:
``state`` says so), or ``pending`` (failed so far and still in the queue).
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from fastapi import APIRouter, Depends, FastAPI, Query
from fastapi.responses import HTMLResponse, JSONResponse, Response

from renderq.output.dataset import attempt_file_name
from renderq.service.jobs import JobNotFound
from renderq.service.review import image_response, review_app
from renderq.store.sqlite import NOT_ACCEPTED, PromptState

if TYPE_CHECKING:
    from renderq.service.jobs import ServiceJob
    from renderq.service.render import RenderService
    from renderq.store.sqlite import JobStore

Outcome = Literal["accepted", "regenerated", "escalated", "pending"]
OUTCOMES: tuple[str, ...] = ("accepted", "regenerated", "escalated", "pending")
"""The outcomes a gallery row can have, in the order the page offers them."""

#: Vendored files ``/assets/`` serves, with their media types; nothing else is reachable.
ASSETS = {
    "uPlot.iife.min.js": "text/javascript; charset=utf-8",
    "uPlot.min.css": "text/css; charset=utf-8",
    "uPlot-LICENSE.txt": "text/plain; charset=utf-8",
}


def job_rows(store: JobStore, job_id: str, tenant: str) -> list[dict[str, Any]]:
    """One gallery row per prompt of a job that has rendered at least once, in job order.

    Images are named relative to the job folder: the accepted image, and each failed
    attempt's kept image (``review/``); ``None`` where none is kept (a regenerated
    prompt's failed attempts are deleted once a later one passes).
    """
    decided = {d.request_id for d in store.decisions()}
    ended = store.attempts()
    rows = []
    for r in store.requests():
        attempts = ended.get(r.prompt.id, [])
        if not attempts:
            continue  # nothing rendered yet
        outcome: Outcome
        if r.state in NOT_ACCEPTED or r.prompt.id in decided:
            outcome = "escalated"
        elif r.state == PromptState.ACCEPTED:
            outcome = "accepted" if r.attempt == 0 else "regenerated"
        else:
            outcome = "pending"
        views = []
        for a in attempts:
            if a.error is not None:
                image = None
            elif r.state == PromptState.ACCEPTED and a.attempt == r.attempt and r.file_name:
                image = r.file_name
            else:
                image = attempt_file_name(r.prompt.id, a.attempt)
            views.append({
                # A string: seeds go up to 2**63, past what a JS number holds.
                "attempt": a.attempt, "seed": str(a.seed), "score": a.score, "error": a.error,
                "image": image,
                "accepted": r.state == PromptState.ACCEPTED and a.attempt == r.attempt,
            })  # fmt: skip
        rows.append({
            "job": job_id, "tenant": tenant, "id": r.prompt.id, "prompt": r.prompt.prompt,
            "parent": r.prompt.parent, "outcome": outcome, "state": r.state,
            "attempt": r.attempt, "score": r.score, "attempts": views,
        })  # fmt: skip
    return rows


def gallery(
    jobs: list[ServiceJob], job: str | None, outcome: str | None, limit: int
) -> dict[str, Any]:
    """The page's data over ``jobs`` (those the caller may see): newest job first.

    ``job`` and ``outcome`` filter the rows; ``jobs`` in the answer lists every visible
    job, so the page can offer them all whatever the filter.
    """
    ordered = sorted(jobs, key=lambda j: -float(j.meta["created"]))
    rows: list[dict[str, Any]] = []
    for j in ordered:
        if job is not None and j.id != job:
            continue
        for row in job_rows(j.store, j.id, j.tenant):
            if outcome is None or row["outcome"] == outcome:
                rows.append(row)
    folders = {j.id: j.folder for j in ordered}
    jobs_seen = [{"id": j.id, "tenant": j.tenant, "state": j.state} for j in ordered]
    return _page(rows, folders, jobs_seen, limit)


def _page(
    rows: list[dict[str, Any]],
    folders: dict[str, Path],
    jobs: list[dict[str, Any]],
    limit: int,
) -> dict[str, Any]:
    page = rows[:limit]
    for row in page:  # image names relative to the gallery's file route; None if not kept
        for a in row["attempts"]:
            kept = a["image"] is not None and (folders[row["job"]] / a["image"]).is_file()
            a["image"] = f"{row['job']}/{a['image']}" if kept else None
    return {
        "jobs": jobs,
        "outcomes": list(OUTCOMES),
        "interactive_kept": False,
        "total": len(rows),
        "rows": page,
    }


def folder_gallery(out: Path, outcome: str | None, limit: int) -> dict[str, Any]:
    """The gallery of one ``renderq run`` folder: its prompts as one job named like it."""
    from renderq.jobs.review import open_store

    with open_store(out) as store:
        rows = [
            r for r in job_rows(store, out.name, "local")
            if outcome is None or r["outcome"] == outcome
        ]  # fmt: skip
        pending = store.counts().get("pending", 0)
    jobs = [{"id": out.name, "tenant": "local", "state": "running" if pending else "done"}]
    return _page(rows, {out.name: out}, jobs, limit)


def folder_gallery_router(out: Path) -> APIRouter:
    """The gallery's routes over run folder ``out`` (``renderq review OUT`` serves them)."""
    router = APIRouter()

    router.add_api_route(
        "/gallery/", gallery_page, response_class=HTMLResponse, include_in_schema=False
    )

    @router.get("/v1/gallery")
    def state(
        job: str | None = Query(default=None, description="The folder's name (one job)."),
        outcome: str | None = Query(default=None, description="accepted, regenerated, …"),
        limit: int = Query(default=200, ge=1, le=2000),
    ) -> JSONResponse:
        """The folder's prompts, a prompt's attempts on one row."""
        if outcome is not None and outcome not in OUTCOMES:
            return bad_outcome(outcome)
        if job is not None and job != out.name:
            detail = f"no job {job!r} here; this folder's is {out.name!r}"
            return JSONResponse({"error": "not_found", "detail": detail}, status_code=404)
        return JSONResponse({"scope": "local", **folder_gallery(out, outcome, limit)})

    @router.get("/v1/gallery/files/{job_id}/{name:path}", include_in_schema=False)
    def image(job_id: str, name: str) -> Response:
        """An accepted or kept attempt image of the folder."""
        if job_id != out.name:
            detail = f"no job {job_id!r} here"
            return JSONResponse({"error": "not_found", "detail": detail}, status_code=404)
        return image_response(out, name)

    return router


def gallery_page() -> HTMLResponse:
    """The gallery page (one HTML file served by the package)."""
    return HTMLResponse(resources.files("renderq.service").joinpath("gallery.html").read_text())


def bad_outcome(outcome: str) -> JSONResponse:
    """The 400 answer to an outcome filter the gallery does not know, naming it."""
    detail = f"outcome must be one of {', '.join(OUTCOMES)}, got {outcome!r}"
    return JSONResponse({"error": "invalid_request", "detail": detail}, status_code=400)


def gallery_router(service: RenderService, tenant: Callable[..., Any]) -> APIRouter:
    """The gallery's routes over ``service``; ``tenant`` is the auth dependency."""
    router = APIRouter()
    who_is = Depends(tenant)  # a default, not ``Annotated``: see service_review_router

    def visible(who: str) -> list[ServiceJob]:
        everyone = service.config.is_admin(who)
        return [j for j in service.jobs.jobs.values() if everyone or j.tenant == who]

    def on_jobs(fn: Callable[[float], Any]) -> Any:
        # Job stores are written on the service's jobs thread; read them there too (a
        # decision runs there, so it never interleaves with a step's commit).
        return service.on_jobs(fn).result(timeout=60)

    router.add_api_route(
        "/gallery/", gallery_page, response_class=HTMLResponse, include_in_schema=False
    )

    @router.get("/v1/gallery")
    def state(
        who: str = who_is,
        job: str | None = Query(default=None, description="Only this job's prompts."),
        outcome: str | None = Query(default=None, description="accepted, regenerated, …"),
        limit: int = Query(default=200, ge=1, le=2000),
    ) -> JSONResponse:
        """The caller's recent bulk renders, a prompt's attempts on one row."""
        if outcome is not None and outcome not in OUTCOMES:
            return bad_outcome(outcome)

        def read(now: float) -> dict[str, Any]:
            mine = visible(who)
            if job is not None and job not in {j.id for j in mine}:
                raise JobNotFound(job)
            return {"scope": "all" if service.config.is_admin(who) else who,
                    **gallery(mine, job, outcome, limit)}  # fmt: skip

        return JSONResponse(on_jobs(read))

    @router.get("/v1/gallery/files/{job_id}/{name:path}", include_in_schema=False)
    def image(job_id: str, name: str, who: str = who_is) -> Response:
        """An accepted or kept attempt image of a job the caller may see."""

        def folder(now: float) -> Path:
            found = next((j for j in visible(who) if j.id == job_id), None)
            if found is None:
                raise JobNotFound(job_id)
            return found.folder

        return image_response(on_jobs(folder), name)

    @router.get("/assets/{name}", include_in_schema=False)
    def asset(name: str) -> Response:
        """A vendored file of the pages (allow-listed by name)."""
        media = ASSETS.get(name)
        if media is None:
            detail = f"no asset {name!r}"
            return JSONResponse({"error": "not_found", "detail": detail}, status_code=404)
        data = resources.files("renderq.service").joinpath("assets", name).read_bytes()
        return Response(data, media_type=media, headers={"Cache-Control": "max-age=3600"})

    return router


def local_app(out: Path, reviewer: str) -> FastAPI:
    """What ``renderq review OUT`` serves: the review page at ``/``, the gallery at ``/gallery/``.

    Here the gallery's "dashboard" link leads back to the review page.
    """
    app = review_app(out, reviewer)
    app.include_router(folder_gallery_router(out))
    return app
