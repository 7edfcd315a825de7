"""``renderq simulate``: what each batching mode would cost, on a virtual clock."""

from __future__ import annotations

import json
import random
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from renderq.backends import registry
from renderq.core.errors import ConfigError
from renderq.core.policies import Policy, Windows, parse_sizes
from renderq.core.settings import MODES, Batching, QASettings, make_policy
from renderq.core.step import StepCost
from renderq.profiles import load_profile
from renderq.runtime.arrivals import arrivals
from renderq.runtime.sim import SimConfig, SimResult, simulate

_BATCHING, _QA = Batching(), QASettings()  # the shared defaults


def make_policies(modes: str, batching: Batching, windows: str) -> dict[str, Policy]:
    """The policy of each mode named in ``modes`` over the same knobs, by mode."""
    names = parse_modes(modes)
    win = Windows.parse(windows) if "window" in names else None
    return {m: make_policy(replace(batching, mode=m), win) for m in names}


def load_step_cost(path: Path | None) -> StepCost | None:
    """A step profile's costs (None: derive them from the whole-batch profile)."""
    if path is None:
        return None
    try:
        return StepCost.from_dict(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read the step profile {str(path)!r}: {exc}") from None


def parse_modes(text: str) -> list[str]:
    """Split ``"adhoc,dynamic"`` and check each name."""
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES]
    if bad or not modes:
        raise ConfigError(f"unknown mode(s) {bad or text!r}; choose from {', '.join(MODES)}")
    return modes


def _fmt(v: float | None, spec: str = ".3f") -> str:
    return "-" if v is None else format(v, spec)


def render_table(results: dict[str, SimResult], console: Console) -> None:
    """A column per mode: GPU-hours by stage, money, latency, batching and outcomes."""
    base = results.get("adhoc")
    table = Table(title="GPU-hours by stage, cost and latency per mode")
    table.add_column("")
    for mode in results:
        table.add_column(mode, justify="right")
    hours = {m: r.ledger.gpu_hours() for m, r in results.items()}
    rows: list[tuple[str, list[str]]] = [
        (f"{stage} GPU-h", [_fmt(hours[m][stage]) for m in results])
        for stage in ("render", "score", "regen", "rescore", "total")
    ]
    res = list(results.values())
    rows += [
        ("cost $", [_fmt(r.ledger.cost(), ",.2f") for r in res]),
        ("$ per 10k accepted", [_fmt(r.ledger.cost_per_10k_accepted(), ",.2f") for r in res]),
        ("p50 latency s", [_fmt(r.percentile(50), ",.1f") for r in results.values()]),
        ("p99 latency s", [_fmt(r.percentile(99), ",.1f") for r in results.values()]),
        ("mean batch size", [f"{r.mean_batch_size:.1f}" for r in results.values()]),
        ("re-renders", [str(r.rerenders) for r in results.values()]),
        ("accepted", [str(r.accepted) for r in results.values()]),
        ("escalated", [str(r.escalated) for r in results.values()]),
        ("rejected", [str(r.rejected) for r in results.values()]),
    ]  # fmt: skip
    if base is not None and base.ledger.total_seconds > 0:
        base_s = base.ledger.total_seconds
        rows.append(("total vs adhoc", [f"{r.ledger.total_seconds / base_s:.3f}x" for r in res]))
    for label, cells in rows:
        table.add_row(label, *cells)
    console.print(table)


def parse_workers(text: str, device_class: str) -> int:
    """``--workers``: ``N``, or ``CLASS=N`` where CLASS must be the profile's device class."""
    name, eq, count = text.rpartition("=")
    if eq and name.strip() != device_class:
        raise ConfigError(
            f"--workers {text!r}: the profile's workers are {device_class!r}, not {name!r}"
        )
    if not count.strip().isdigit() or int(count) < 1:
        raise ConfigError(f"--workers must be N or CLASS=N with N >= 1, got {text!r}")
    return int(count)


def simulate_command(
    profile: Annotated[str, typer.Option(help="Profile name (shipped) or path to a JSON file.")],
    renders: Annotated[int, typer.Option(help="Number of prompts to render.")] = 10_000,
    failure_rate: Annotated[float, typer.Option(help="Per-attempt QA failure probability.")] = 0.08,
    modes: Annotated[str, typer.Option(help="Comma-separated: adhoc,dynamic,window,step.")] = (
        "adhoc,dynamic,window"
    ),
    arrival: Annotated[
        str, typer.Option(help="offline | poisson:RATE | burst:SIZE@PERIOD | trace:PATH")
    ] = "offline",
    hard_share: Annotated[float, typer.Option(help="Share of prompts that never pass.")] = 0.0,
    fix_curve: Annotated[
        str,
        typer.Option(
            help="Retries pass by a measured curve: 'embedded' (the embedded model's) or "
            "chances by attempt, e.g. 0.35,0.14,0.12; the first attempt fails at --failure-rate."
        ),
    ] = "",
    max_attempts: Annotated[
        int, typer.Option(help="Attempts per prompt, first included.")
    ] = _QA.max_attempts,
    max_batch_size: Annotated[int | None, typer.Option(help="Cap below the profile's.")] = None,
    max_queue_delay: Annotated[
        float, typer.Option(help="Dynamic mode delay cap, s.")
    ] = _BATCHING.max_queue_delay_s,
    preferred_sizes: Annotated[str, typer.Option(help="Dynamic mode, e.g. 16,32,64.")] = "",
    windows: Annotated[
        str, typer.Option(help="Window mode: always | every=P,length=L | S-E,...")
    ] = "always",
    workers: Annotated[
        str, typer.Option(help="Render workers of the profile's device: N or CLASS=N.")
    ] = "1",
    deadline_s: Annotated[float | None, typer.Option(help="Per-request deadline, s.")] = None,
    jitter: Annotated[float, typer.Option(help="Relative latency noise, 0..1.")] = 0.0,
    price_per_hour: Annotated[float, typer.Option(help="Price of one device-hour.")] = 2.0,
    step_profile: Annotated[
        Path | None,
        typer.Option(
            help="Step mode's costs (renderq profile --step-level); default: the profile's "
            "render latency spread over its steps."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of arrivals, failures and noise.")] = 0,
    score_in_workers: Annotated[
        bool,
        typer.Option(
            metavar="",
            help="Each render worker scores its own batch after rendering it (run --images) "
            "instead of one scorer worker scoring for all.",
        ),
    ] = False,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print one JSON object.")
    ] = False,
) -> None:
    """Simulate each mode on the profile's cost curve and compare GPU-hours and latency."""
    try:
        prof = load_profile(profile)
        preferred = tuple(parse_sizes(preferred_sizes))
        batching = Batching(max_batch_size=max_batch_size, max_queue_delay_s=max_queue_delay,
                            preferred=preferred)  # fmt: skip
        policies = make_policies(modes, batching, windows)
        arr = tuple(arrivals(arrival, renders, random.Random(seed)))
        cfg = SimConfig(
            prof, arr, failure_rate=failure_rate, hard_share=hard_share,
            fix_curve=registry.fix_curve(fix_curve), qa=QASettings(max_attempts=max_attempts),
            render_workers=parse_workers(workers, prof.device_class), seed=seed,
            jitter=jitter, deadline_s=deadline_s, price_per_hour=price_per_hour,
            step_cost=load_step_cost(step_profile), score_in_workers=score_in_workers,
        )  # fmt: skip
        results = {m: simulate(p, cfg) for m, p in policies.items()}
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    if as_json:
        out: dict[str, Any] = {
            "profile": {"name": prof.name, "source": dict(prof.source)},
            "renders": renders,
            "failure_rate": failure_rate,
            "fix_curve": list(cfg.fix_curve),
            "arrival": arrival,
            "seed": seed,
            "modes": {m: r.to_dict() for m, r in results.items()},
        }
        typer.echo(json.dumps(out, indent=2, sort_keys=True))
        return
    console = Console()
    console.print(
        f"profile [bold]{prof.name}[/] ({prof.source['kind']}): {prof.model} on "
        f"{prof.device_class} {prof.precision}, {prof.width}x{prof.height}; "
        f"{renders} prompts, failure rate {failure_rate}, arrival {arrival}"
        + (f", retries fixed by attempt {list(cfg.fix_curve)}" if cfg.fix_curve else "")
    )
    render_table(results, console)
