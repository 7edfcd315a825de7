"""``renderq run``: a prompts file in, a quality-gated image dataset out."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer

from renderq.backends.adapters import parse_adapter_paths
from renderq.backends.calibrate import CALIBRATION_FILE, lookup, scale_name
from renderq.backends.ray_backend import check_depth
from renderq.cli.progress import ProgressLines, progress_for
from renderq.core.errors import ConfigError, RenderqError
from renderq.core.settings import Batching, ModelSpec, QASettings
from renderq.jobs.summary import RunSummary

_SPEC, _BATCHING, _QA = ModelSpec(), Batching(), QASettings()  # the shared defaults


def qa_settings(
    threshold: float | None, max_attempts: int, calibration: Path, scorer: str, scale100: bool
) -> QASettings:
    """The gate: the threshold given, else the one calibrated for the scorer, else unset."""
    if threshold is None:
        threshold = lookup(calibration, scorer, scale_name(scale100))
    return QASettings(threshold, max_attempts)


def run(
    prompts: Path = typer.Argument(..., help="Text file (one prompt a line) or JSONL file."),
    out: Path = typer.Option(..., "--out", help="Output folder (re-run to resume)."),
    mode: str = typer.Option(_BATCHING.mode, help="Batching: adhoc, dynamic, window or step."),
    model: str = typer.Option(_SPEC.model, help="Pipeline: folder, hub id, embedded:*."),
    scorer: str = typer.Option(_SPEC.scorer, help="CLIP model: folder, hub id, embedded:*."),
    threshold: float = typer.Option(
        None, help="Accept scores >= this (default: calibrated, else the scorer's, else 0.25)."
    ),
    calibration: Path = typer.Option(Path(CALIBRATION_FILE), help="Calibration file to read."),
    max_attempts: int = typer.Option(
        _QA.max_attempts, help="Renders per prompt in all, first one included."
    ),
    max_batch_size: int = typer.Option(_BATCHING.max_batch_size, help="Largest render batch."),
    steps: int = typer.Option(
        None, help="Denoising steps (default: the pipeline's, else 20; JSONL may set)."
    ),
    guidance: float = typer.Option(
        None, help="Guidance scale (default: the pipeline's own, else 7.5)."
    ),
    device: str = typer.Option(_SPEC.device, help="cpu or cuda[:N]."),
    devices: str = typer.Option(
        "",
        help="Render on a pool, one worker process per device: cuda:0,cuda:1 or cuda (every "
        "GPU), cpu:1,cpu:1 (two one-thread CPU workers); =CLASS names a device's class. With "
        "--backend ray, auto[=CLASS]: every GPU of the cluster, classed by its node.",
    ),
    scorer_devices: str = typer.Option(
        "", help="Score on this device (one), e.g. cuda:1=cuda-l4 (default: --device)."
    ),
    price: str = typer.Option(
        "", help="Price per device-hour of each device class: cpu=0.05,cuda-a100=1.9."
    ),
    backend: str = typer.Option(
        "local", help="Where --devices workers run: local (processes) or ray (actors)."
    ),
    address: str = typer.Option(
        None, help="Ray cluster to join (auto: the running one; default: start a local one)."
    ),
    actor_depth: int = typer.Option(
        1,
        help="Batches handed to each Ray actor at once: 2 queues the next batch on the actor "
        "while one renders, hiding Ray's hop between batches (batches are cut sooner).",
    ),
    precision: str = typer.Option(_SPEC.precision, help="fp32, fp16 or bf16."),
    lora: list[str] = typer.Option(
        [],
        "--lora",
        metavar="NAME=PATH",
        help="A LoRA adapter prompts may name (JSONL 'lora'); repeat for more.",
    ),
    compile_: bool = typer.Option(
        False, "--compile", metavar="", help="The denoiser under torch.compile (GPU)."
    ),
    channels_last: bool = typer.Option(
        False, "--channels-last", metavar="", help="Channels-last denoiser and VAE (GPU)."
    ),
    seed: int = typer.Option(0, help="Base seed; prompt i gets seed + i unless its line sets one."),
    images: str = typer.Option(
        "",
        help="Where the workers write the images (a folder or fsspec URL: s3://, gs://, "
        "file://); each worker scores its own renders beside them and only scores and "
        "metadata reach this process (default: this process writes into --out).",
    ),
    prompt_buckets: bool = typer.Option(
        True,
        "--prompt-buckets/--no-prompt-buckets",
        metavar="",
        help="T5 pipelines (SD3, Flux): render each prompt at its length bucket's sequence "
        "length (default), or all at the pipeline's full padding.",
    ),
    clipscore_scale: bool = typer.Option(
        False, "--clipscore-scale", metavar="", help="Score as 100*max(cos, 0) instead of cosine."
    ),
    max_queue_delay: float = typer.Option(
        _BATCHING.max_queue_delay_s, help="Dynamic mode: longest wait for a batch, s."
    ),
    threads: int = typer.Option(
        0, help="CPU threads for torch (0: the cores that other work is not using at start)."
    ),
    as_json: bool = typer.Option(
        False, "--json", metavar="", help="Print the summary as one JSON object."
    ),
) -> None:
    """Render every prompt, gate it with CLIP, regenerate failures, write a dataset."""
    from renderq.backends.diffusers import quiet_libraries, set_cpu_threads
    from renderq.backends.pool import parse_devices
    from renderq.core.ledger import parse_prices
    from renderq.jobs.runner import RunSettings, run_job
    from renderq.jobs.workers import device_specs

    try:
        settings = RunSettings(
            prompts,
            out,
            ModelSpec(
                model,
                scorer,
                device,
                precision,
                steps,
                guidance,
                tuple(parse_adapter_paths(lora).items()),
                compile_,
                channels_last,
            ),
            Batching(mode, max_batch_size, max_queue_delay),
            qa_settings(threshold, max_attempts, calibration, scorer, clipscore_scale),
            seed=seed,
            scale100=clipscore_scale,
            prompt_buckets=prompt_buckets,
            images=images or None,
        )
        check_depth(actor_depth)  # before a Ray cluster is joined or started
        ray = backend == "ray"  # on Ray, --device alone is one actor's device
        pool = device_specs(devices or device, backend, address) if devices or ray else []
        scoring = parse_devices(scorer_devices) if scorer_devices else [None]
        if len(scoring) != 1:
            raise ConfigError(f"--scorer-devices takes one device, got {scorer_devices!r}")
        prices = parse_prices(price) if price else {}
        quiet_libraries()
        if threads > 0 or device == "cpu":
            set_cpu_threads(threads)
        terminal = sys.stderr.isatty()
        shown = progress_for(terminal) if not (terminal and as_json) else ProgressLines(1e18)
        with shown as bar:
            summary = run_job(
                settings, on_progress=bar.update, warn=_warn, devices=pool,
                scorer_device=scoring[0], prices=prices, backend=backend, address=address,
                depth=actor_depth,
            )  # fmt: skip
    except RenderqError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    except KeyboardInterrupt:
        typer.echo(f"interrupted; run the same command again to resume {out}", err=True)
        raise typer.Exit(130) from None
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), sort_keys=True))
    else:
        print_summary(summary)


def _warn(message: str) -> None:
    typer.echo(f"warning: {message}", err=True)


def print_summary(summary: RunSummary) -> None:
    """The end-of-run table: device time by stage, per 10k accepted, outcomes, batch size."""
    from rich.console import Console
    from rich.table import Table

    d = summary.to_dict()
    runs = "1 run" if summary.runs == 1 else f"{summary.runs} runs"
    table = Table(title=f"renderq run ({summary.mode}) -> {summary.out}")
    table.add_column("stage")
    table.add_column("device-seconds", justify="right")
    table.add_column("GPU-hours", justify="right")
    lost = ("lost",) if d["device_seconds"].get("lost") else ()
    for stage in ("render", "regen", "score", "rescore", *lost, "total"):
        table.add_row(stage, f"{d['device_seconds'][stage]:.2f}", f"{d['gpu_hours'][stage]:.5f}")
    console = Console()
    console.print(table)
    per10k = d["gpu_hours_per_10k_accepted"]
    per_img = d["device_seconds_per_accepted"]
    console.print(
        f"whole job ({runs}): accepted {summary.accepted}/{summary.prompts}, "
        f"escalated {summary.escalated}, "
        f"pending {summary.pending}; GPU-hours per 10k accepted: "
        f"{'-' if per10k is None else f'{per10k:.3f}'}; device-s per accepted image: "
        f"{'-' if per_img is None else f'{per_img:.3f}'}"
    )
    by_class = d["by_device_class"]
    if len(by_class) > 1 or any(v["price_per_hour"] is not None for v in by_class.values()):
        for dc, v in by_class.items():
            per10k, money = v["gpu_hours_per_10k_accepted"], v["cost_per_10k_accepted"]
            console.print(
                f"{dc}: {', '.join(f'{k} {s:.2f}s' for k, s in v['device_seconds'].items())}; "
                f"GPU-hours per 10k accepted {'-' if per10k is None else f'{per10k:.3f}'}, "
                f"money per 10k accepted {'-' if money is None else f'{money:.2f}'}"
            )
    if summary.batches:
        console.print(
            f"this run: {summary.submitted} prompts submitted, mean batch size "
            f"{summary.mean_batch_size:.2f} over {summary.batches} batches, "
            f"wall {summary.wall_s:.1f}s"
        )
    else:
        console.print(f"this run: nothing left to render (wall {summary.wall_s:.1f}s)")
    note = summary.inflation_note()
    if note:
        console.print(f"note: {note}")
