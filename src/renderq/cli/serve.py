"""``renderq serve``: the HTTP service (FastAPI on uvicorn)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from renderq.backends.adapters import parse_adapter_paths
from renderq.core.errors import ConfigError

DRAIN_S = 120
"""Longest a SIGTERM waits for running batches and admitted requests before it stops."""
SWITCH_INTERVAL_S = 0.0005
"""The GIL switch interval serve runs with (Python's default is 0.005 s)."""


def serve_command(
    host: Annotated[str | None, typer.Option(help="Address to bind (default 127.0.0.1).")] = None,
    port: Annotated[int | None, typer.Option(help="Port (default 8000; 0 picks one).")] = None,
    config: Annotated[Path | None, typer.Option(help="TOML config file.")] = None,
    data_dir: Annotated[Path | None, typer.Option(help="Where bulk jobs are kept.")] = None,
    model: Annotated[str | None, typer.Option(help="Diffusers pipeline to serve.")] = None,
    scorer: Annotated[str | None, typer.Option(help="CLIP scorer.")] = None,
    device: Annotated[str | None, typer.Option(help="cpu, cuda or cuda:N.")] = None,
    mode: Annotated[
        str | None,
        typer.Option(
            help="dynamic (default: batches of up to --max-batch-size) or step (requests "
            "join and leave the running batch at every denoising step)."
        ),
    ] = None,
    max_batch_size: Annotated[
        int | None, typer.Option(help="Largest render batch (step: running batch).")
    ] = None,
    max_queue_delay: Annotated[
        float | None, typer.Option(help="Dynamic batching delay, s.")
    ] = None,
    threads: Annotated[
        int | None,
        typer.Option(help="Torch CPU threads (default 0: the cores other work leaves free)."),
    ] = None,
    devices: Annotated[
        str | None,
        typer.Option(
            help="Render on a pool, one worker per device, all of one class: cuda:0,cuda:1, "
            "cuda (every GPU), cpu:1,cpu:1 (one-thread CPU workers) or, on Ray, auto.",
        ),
    ] = None,
    backend: Annotated[
        str | None,
        typer.Option(help="Where --devices workers run: local (processes) or ray (actors)."),
    ] = None,
    address: Annotated[
        str | None, typer.Option(help="With --backend ray: the cluster (default: a new one).")
    ] = None,
    lora: Annotated[
        list[str] | None,
        typer.Option(
            "--lora",
            metavar="NAME=PATH",
            help="A LoRA adapter requests and jobs may name ('lora'); repeat for more.",
        ),
    ] = None,
) -> None:
    """Serve interactive renders and bulk jobs over HTTP, batched dynamically or by step.

    Bearer tokens come from the config file's [auth] tokens and from the
    RENDERQ_API_TOKENS environment variable (comma-separated, each TOKEN or
    TENANT:TOKEN); without any token the service binds 127.0.0.1 only. SIGTERM
    drains: new requests answer 503 draining while running batches finish.
    See docs/serve.md.
    """
    try:
        import uvicorn

        from renderq.service.app import create_app
        from renderq.service.config import load_config
        from renderq.service.render import RenderService
        from renderq.service.server import DrainingServer
    except ImportError as exc:
        raise typer.BadParameter(
            f"serve needs the serve extra: pip install 'renderq[serve]' ({exc})"
        ) from None
    try:
        adapters = tuple(parse_adapter_paths(lora).items()) if lora else None
        cfg = load_config(
            config,
            host=host,
            port=port,
            data_dir=data_dir,
            model=model,
            scorer=scorer,
            device=device,
            mode=mode,
            max_batch_size=max_batch_size,
            max_queue_delay_s=max_queue_delay,
            threads=threads,
            devices=devices,
            backend=backend,
            address=address,
            adapters=adapters,
        )
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    bind, warning = cfg.safe_host()
    if warning:
        typer.echo(f"renderq serve: {warning}", err=True)
    auth = f"{len(cfg.tokens)} API token(s)" if cfg.auth_enabled else "no auth (loopback only)"
    on = cfg.spec.device
    try:
        from renderq.backends.diffusers import quiet_libraries, set_cpu_threads
    except ImportError:  # the null model needs no diffusers
        pass
    else:
        quiet_libraries()
        if cfg.spec.device == "cpu" and cfg.spec.model != "null":
            n = set_cpu_threads(cfg.threads)
            on = f"cpu ({n} torch thread{'s' if n > 1 else ''})"
    if cfg.devices:  # the scorer (and the request checks) stay in this process, on ``on``
        on = f"devices {cfg.devices} ({cfg.backend}), scoring on {on}"
    typer.echo(f"renderq serve: {cfg.spec.model} on {on}, {auth}, jobs in {cfg.data_dir}", err=True)
    # A thread woken by another (the engine by a request, the event loop by an answer, the
    # render worker after each torch kernel) waits for the GIL until its holder's switch
    # interval runs out: 5 ms by default, about the whole of the service's own overhead.
    sys.setswitchinterval(SWITCH_INTERVAL_S)
    service = RenderService(cfg)
    server_config = uvicorn.Config(
        create_app(service),
        host=bind,
        port=cfg.port,
        log_level="warning",
        timeout_graceful_shutdown=DRAIN_S,
    )
    DrainingServer(server_config, service, drain_s=float(DRAIN_S)).run()
