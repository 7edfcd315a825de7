"""``renderq review OUT``: a local page to review the escalated prompts of a run folder."""

from __future__ import annotations

import getpass
from pathlib import Path
from typing import Annotated

import typer

from renderq.core.errors import RenderqError

DEFAULT_PORT = 8765


def review_command(
    out: Annotated[Path, typer.Argument(help="A renderq run output folder.")],
    host: Annotated[str, typer.Option(help="Address to bind; the page has no login.")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(help="Port to serve the page on.")] = DEFAULT_PORT,
    reviewer: Annotated[
        str | None, typer.Option(help="Name recorded with each decision (default: your login).")
    ] = None,
) -> None:
    """Serve a page to accept, reject or edit and resubmit each escalated prompt.

    Decisions are recorded in the folder's job store and rewrite metadata.jsonl and
    review.jsonl at once; an edited prompt is rendered by the next ``renderq run`` on the
    folder (same command as before: it resumes). See docs/review.md.
    """
    try:
        import uvicorn

        from renderq.jobs.review import open_store
        from renderq.service.gallery import local_app
    except ImportError as exc:
        raise typer.BadParameter(
            f"review needs the serve extra: pip install 'renderq[serve]' ({exc})"
        ) from None
    who = reviewer if reviewer is not None else getpass.getuser()
    try:
        if not who.strip():
            raise typer.BadParameter("--reviewer must not be empty")
        with open_store(out) as store:
            waiting = store.counts().get("escalated", 0)
    except RenderqError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    if host not in ("127.0.0.1", "localhost", "::1"):
        typer.echo(f"renderq review: warning: {host} is reachable by others and the page "
                   "has no login", err=True)  # fmt: skip
    typer.echo(f"renderq review: {waiting} prompt(s) of {out} await review at "
               f"http://{host}:{port}/ (Ctrl-C stops)", err=True)  # fmt: skip
    uvicorn.run(local_app(out, who), host=host, port=port, log_level="warning")
