"""The FastAPI application: routes, auth, error mapping. The work is in ``RenderService``."""

from __future__ import annotations

import asyncio
import base64
import io
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib import resources
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from renderq import __version__
from renderq.core.errors import ConfigError
from renderq.core.settings import request_seeds
from renderq.service.gallery import gallery_router
from renderq.service.interactive import ImageResult, Refused
from renderq.service.jobs import JobNotFound
from renderq.service.render import RenderService
from renderq.service.review import service_review_router
from renderq.service.schemas import (
    ErrorBody,
    GenerationRequest,
    GenerationResponse,
    ImageData,
    JobCreate,
    JobImage,
    JobImages,
    JobPrompt,
    JobStatus,
)

_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 429, 503)
}

#: The reason of an error that Starlette or FastAPI answer themselves, by status.
_HTTP_REASONS = {
    400: "invalid_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "too_large",
    415: "unsupported_media_type",
}
_PARSE_ERROR = "There was an error parsing the body"
INLINE_ENCODE_VALUES = 64 * 64 * 3
"""Images of at most this many values in all are encoded on the event loop, not a thread."""


def _error(
    status: int, reason: str, detail: str, headers: dict[str, str] | None = None
) -> JSONResponse:
    return JSONResponse({"error": reason, "detail": detail}, status_code=status, headers=headers)


def _size(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    w, h = text.lower().split("x")
    return (int(w), int(h))


def _png_b64(image: Any) -> str:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()


async def tenant(request: Request) -> str:
    """The caller's tenant from its bearer token (everyone is ``local`` without tokens)."""
    cfg = request.app.state.service.config
    if not cfg.auth_enabled:
        return "local"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    found = cfg.tokens.get(token.strip()) if scheme.lower() == "bearer" else None
    if found is None:
        raise Refused(401, "unauthorized", "missing or unknown bearer token")
    return str(found)


Tenant = Annotated[str, Depends(tenant)]


class BodyLimit:
    """Refuse a request body over ``limit`` bytes with 413 ``too_large``, before the app.

    A declared ``Content-Length`` over the limit is refused unread; a body without one
    (chunked) is read up to the limit here, then handed on, so the app never sees more.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None:
            if length.isdigit() and int(length) > self.limit:
                await self._refuse(scope, receive, send)
                return
            await self.app(scope, receive, send)
            return
        chunks: list[bytes] = []
        size, more = 0, True
        while more:
            msg = await receive()
            if msg["type"] != "http.request":  # the client left
                return
            chunks.append(msg.get("body", b""))
            size += len(chunks[-1])
            more = bool(msg.get("more_body", False))
            if size > self.limit:
                await self._refuse(scope, receive, send)
                return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": b"".join(chunks), "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        detail = f"the request body is larger than the limit of {self.limit} bytes"
        await _error(413, "too_large", detail, {"Connection": "close"})(scope, receive, send)


def create_app(service: RenderService) -> FastAPI:
    """The app for one service; starting it loads the model, stopping it drains."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        service.start()
        yield
        await asyncio.to_thread(service.drain)

    app = FastAPI(
        title="renderq",
        version=__version__,
        lifespan=lifespan,
        description="Batched text-to-image rendering with a CLIP quality gate and a ledger.",
    )
    cfg = service.config
    app.state.service = service
    app.add_middleware(BodyLimit, limit=cfg.max_body_bytes)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        detail = str(exc.detail)
        if exc.status_code == 400 and detail == _PARSE_ERROR:
            detail = "the request body could not be parsed: it must be JSON in UTF-8"
        reason = _HTTP_REASONS.get(exc.status_code, "http_error")
        return _error(exc.status_code, reason, detail, dict(exc.headers or {}) or None)

    @app.exception_handler(Refused)
    async def refused(_: Request, exc: Refused) -> JSONResponse:
        headers = {"Retry-After": str(max(1, round(exc.retry_after_s)))}
        if exc.status == 401:
            headers = {"WWW-Authenticate": "Bearer"}
        return _error(exc.status, exc.reason, exc.detail, headers)

    @app.exception_handler(ConfigError)
    async def invalid(_: Request, exc: ConfigError) -> JSONResponse:
        return _error(400, "invalid_request", str(exc))

    @app.exception_handler(JobNotFound)
    async def not_found(_: Request, exc: JobNotFound) -> JSONResponse:
        return _error(404, "not_found", f"no job {exc.args[0]!r}")

    @app.exception_handler(RequestValidationError)
    async def unprocessable(_: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        text = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in errors
        )
        fields = [".".join(str(p) for p in e.get("loc", ()) if p != "body") for e in errors]
        return JSONResponse(
            {"error": "invalid_request", "detail": text, "fields": fields}, status_code=422
        )

    @app.post("/v1/images/generations", response_model=GenerationResponse, responses=_ERRORS)
    async def generate(body: GenerationRequest, who: Tenant) -> Response:
        """Render ``n`` images of one prompt, gated by CLIP unless ``qa`` is false."""
        if body.model is not None and body.model != cfg.spec.model:
            raise ConfigError(
                f"model {body.model!r} is not served here; this serves {cfg.spec.model!r}"
            )
        reqs = service.build_requests(
            who,
            prompt=body.prompt,
            n=body.n,
            size=_size(body.size),
            steps=body.steps,
            guidance=body.guidance,
            seed=body.seed,
            priority=body.priority,
            negative_prompt=body.negative_prompt,
            lora=body.lora,
            qa=body.qa,
        )
        results = await service.generate(reqs, body.deadline_s)
        pixels = sum(getattr(r.image, "size", 0) for r in results)
        if pixels <= INLINE_ENCODE_VALUES:  # a thread hop would cost more than encoding
            data = [_image_data(r, body.prompt) for r in results]
        else:
            data = await asyncio.to_thread(lambda: [_image_data(r, body.prompt) for r in results])
        out = GenerationResponse(created=int(time.time()), data=data)
        return Response(out.model_dump_json(), media_type="application/json")

    @app.post("/v1/jobs", response_model=JobStatus, status_code=202, responses=_ERRORS)
    async def create_job(body: JobCreate, who: Tenant) -> JobStatus:
        """Queue a bulk job at bulk priority; poll ``GET /v1/jobs/{id}``."""
        given = [None if isinstance(p, str) else p.seed for p in body.prompts]
        prompts = [
            (p, seed, "") if isinstance(p, str) else (p.prompt, seed, p.negative_prompt or "")
            for p, seed in zip(
                body.prompts, request_seeds(body.seed, len(given), given), strict=True
            )
        ]
        job_id = await asyncio.to_thread(
            service.create_job,
            who,
            prompts,
            size=_size(body.size),
            steps=body.steps,
            guidance=body.guidance,
            lora=body.lora,
            priority=body.priority,
            mode=body.mode,
            windows=(body.windows or "always") if body.mode == "window" else None,
        )
        return JobStatus(**await asyncio.to_thread(service.job_status, who, job_id))

    @app.get("/v1/jobs/{job_id}", response_model=JobStatus, responses=_ERRORS)
    async def job_status(job_id: str, who: Tenant) -> JobStatus:
        """Progress and ledger of a job."""
        return JobStatus(**await asyncio.to_thread(service.job_status, who, job_id))

    @app.get("/v1/jobs/{job_id}/images", response_model=JobImages, responses=_ERRORS)
    async def job_images(
        job_id: str,
        who: Tenant,
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=100)] = 20,
        images: Annotated[bool, Query(description="Include base64 PNG data.")] = True,
    ) -> JobImages:
        """A page of the job's accepted images."""
        page, total = await asyncio.to_thread(
            service.job_images, who, job_id, offset, limit, images
        )
        nxt = offset + len(page)
        return JobImages(
            data=[JobImage(**p) for p in page],
            offset=offset,
            next_offset=nxt if nxt < total else None,
            total=total,
        )

    @app.delete("/v1/jobs/{job_id}", response_model=JobStatus, responses=_ERRORS)
    async def cancel_job(job_id: str, who: Tenant) -> JobStatus:
        """Cancel: queued prompts are dropped, finished images are kept."""
        return JobStatus(**await asyncio.to_thread(service.cancel_job, who, job_id))

    @app.get("/v1/stats", responses=_ERRORS)
    async def stats(who: Tenant) -> dict[str, Any]:
        """The caller's tenant's queue, batch sizes, latency and ledger (an admin: all)."""
        return await asyncio.to_thread(service.stats, who, cfg.is_admin(who))

    @app.get("/metrics", response_class=Response)
    async def metrics() -> Response:
        """Prometheus metrics."""
        body = await asyncio.to_thread(service.metrics_text)
        return Response(body, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        """The process is up."""
        return {"status": "ok"}

    @app.get("/readyz", responses={503: {"model": ErrorBody}})
    async def readyz() -> JSONResponse:
        """The model is loaded and the service admits work."""
        if service.ready.is_set() and not service.draining:
            return JSONResponse({"status": "ready", "model": cfg.spec.model})
        if service.draining:
            return _error(503, "draining", "the service is shutting down; retry elsewhere")
        return _error(503, "not_ready", service.load_error or "loading the model")

    @app.get("/", response_class=HTMLResponse, include_in_schema=False)
    async def dashboard() -> HTMLResponse:
        """The live dashboard."""
        page = resources.files("renderq.service").joinpath("dashboard.html").read_text()
        return HTMLResponse(page)

    app.include_router(service_review_router(service, tenant))
    app.include_router(gallery_router(service, tenant))
    _ = JobPrompt  # documented in the schema through JobCreate
    return app


def _image_data(r: ImageResult, prompt: str) -> ImageData:
    if r.image is None:
        raise Refused(409, "no_image", f"no image could be rendered for {r.request_id!r}", 0)
    return ImageData(
        b64_json=_png_b64(r.image),
        revised_prompt=prompt,
        seed=r.seed,
        attempts=r.attempts,
        clip_score=r.score,
        qa=r.state if r.state != "cancelled" else "escalated",  # type: ignore[arg-type]
        batch_id=r.batch_id,
        batch_size=r.batch_size,
    )
