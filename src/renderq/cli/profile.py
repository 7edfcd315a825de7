"""``renderq profile``: measure batch latency and memory; write a profile file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from renderq.core.cost import Profile
from renderq.core.errors import ConfigError
from renderq.core.settings import DEFAULT_MAX_BATCH_SIZE, ModelSpec

_SPEC = ModelSpec()  # the shared defaults


def _resolution(text: str | None) -> tuple[int, int] | None:
    if text is None:
        return None
    try:
        w, h = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise ConfigError(f"resolution must look like 512x512, got {text!r}") from None
    return (w, h)


def profile_command(
    model: Annotated[str, typer.Option(help="Diffusers pipeline: folder, hub id, embedded:*.")] = (
        _SPEC.model
    ),
    scorer: Annotated[str, typer.Option(help="CLIP scorer to profile alongside.")] = _SPEC.scorer,
    device: Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")] = _SPEC.device,
    precision: Annotated[str, typer.Option(help="fp32, fp16 or bf16.")] = _SPEC.precision,
    steps: Annotated[int | None, typer.Option(help="Steps (default: the pipeline's).")] = None,
    resolution: Annotated[str | None, typer.Option(help="WxH; default: the model's.")] = None,
    max_batch: Annotated[int, typer.Option(help="Largest batch to try.")] = DEFAULT_MAX_BATCH_SIZE,
    repeats: Annotated[int, typer.Option(help="Timed rounds over every size (median).")] = 3,
    warmup: Annotated[int, typer.Option(help="Untimed rounds over every size first.")] = 2,
    name: Annotated[str | None, typer.Option(help="Profile name.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the profile JSON here.")] = None,
    step_level: Annotated[
        bool,
        typer.Option(
            "--step-level", metavar="", help="Time one denoising step by running-batch size."
        ),
    ] = False,
    threads: Annotated[
        int, typer.Option(help="CPU threads for torch (0: the cores other work leaves free).")
    ] = 0,
    lora: Annotated[
        list[str] | None,
        typer.Option(
            "--lora",
            metavar="NAME=PATH",
            help="Load this LoRA adapter and time switches between adapters (repeat for more).",
        ),
    ] = None,
) -> None:
    """Time renders and scores at batch sizes 1, 2, 4, ... and write a measured profile."""
    from renderq.backends.adapters import parse_adapter_paths
    from renderq.backends.diffusers import set_cpu_threads
    from renderq.bench.model_profile import ProfileSettings, profile_model

    if threads < 0:
        raise typer.BadParameter(f"--threads must be >= 0, got {threads}")
    if threads > 0 or device == "cpu":
        set_cpu_threads(threads)  # as run does: an oversubscribed CPU misprices every batch

    try:
        adapters = tuple(parse_adapter_paths(lora or []).items())
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if step_level and adapters:
        raise typer.BadParameter("--lora is not measured with --step-level")
    if step_level:
        _step_level(model, device, precision, steps, resolution, max_batch, repeats, warmup,
                    name, out)  # fmt: skip
        return

    try:
        settings = ProfileSettings(
            ModelSpec(model, scorer, device, precision, steps), _resolution(resolution),
            max_batch, repeats, warmup, adapters,
        )  # fmt: skip
        doc = profile_model(settings, name)
        prof = Profile.from_dict(doc)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    table = Table(title=f"profile {prof.name} ({doc['source']['note']})")
    for col in ("batch", "render s", "render s/img", "score s", "score s/img"):
        table.add_column(col, justify="right")
    for (n, r), (_, sc) in zip(doc["render"]["points"], doc["score"]["points"], strict=True):
        table.add_row(str(n), f"{r:.4f}", f"{r / n:.4f}", f"{sc:.4f}", f"{sc / n:.4f}")
    if "switch_s" in doc["render"]:
        table.caption = f"LoRA adapter switch: {doc['render']['switch_s']:.4f} s (median)"
    _emit(table, doc, out)


def _emit(table: Table, doc: dict[str, Any], out: Path | None) -> None:
    """Show the table on stderr; the profile JSON to stdout, or to ``out``."""
    Console(stderr=True).print(table)
    text = json.dumps(doc, indent=2)
    if out is None:
        typer.echo(text)
    else:
        out.write_text(text + "\n")
        typer.echo(f"wrote {out}")


def _step_level(
    model: str,
    device: str,
    precision: str,
    steps: int | None,
    resolution: str | None,
    max_batch: int,
    repeats: int,
    warmup: int,
    name: str | None,
    out: Path | None,
) -> None:
    """``--step-level``: seconds per step, per decode batch and per prepare; a step profile."""
    from renderq.bench.model_profile import ProfileSettings
    from renderq.bench.step_profile import profile_steps
    from renderq.core.step import StepCost

    try:
        settings = ProfileSettings(
            ModelSpec(model, device=device, precision=precision, steps=steps),
            _resolution(resolution), max_batch, repeats, warmup,
        )  # fmt: skip
        doc = profile_steps(settings, name)
        StepCost.from_dict(doc)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    table = Table(title=f"step profile {doc['name']} (prepare {doc['prepare_s']:.4f} s/request)")
    for col in ("running batch", "step s", "step s/request", "decode s"):
        table.add_column(col, justify="right")
    for (n, st), (_, dec) in zip(doc["step"]["points"], doc["decode"]["points"], strict=True):
        table.add_row(str(n), f"{st:.4f}", f"{st / n:.4f}", f"{dec:.4f}")
    _emit(table, doc, out)
