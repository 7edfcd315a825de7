"""``renderq bench``: the A/B harness over MLPerf-style scenarios, with reports and plots."""

from __future__ import annotations

import json
from contextlib import ExitStack
from pathlib import Path
from typing import Annotated, Any

import typer

from renderq.bench.harness import (
    REFERENCE_EVERY,
    Limit,
    Scenario,
    capacity_rate,
    run_bench,
    sim_backend,
    summarise,
)
from renderq.bench.report import fidelity_table, markdown, plots
from renderq.bench.stability import STABILITY_BOUND
from renderq.cli.simulate import make_policies
from renderq.core.errors import ConfigError
from renderq.core.settings import Batching, ModelSpec, QASettings
from renderq.profiles import load_profile

_SPEC, _BATCHING, _QA = ModelSpec(), Batching(), QASettings()  # the shared defaults


def _rates(text: str) -> list[float]:
    try:
        rates = [float(p) for p in text.split(",") if p.strip()]
    except ValueError:
        raise ConfigError(f"failure rates must be numbers, got {text!r}") from None
    if not rates or any(not 0 <= r <= 1 for r in rates):
        raise ConfigError(f"failure rates must be in [0, 1], got {text!r}")
    return rates


def _step_mix(text: str | None) -> tuple[int, ...]:
    """``--step-mix 10,20,30`` as step counts (none without it)."""
    if not text:
        return ()
    try:
        return tuple(int(p) for p in text.split(","))
    except ValueError:
        raise ConfigError(f"--step-mix takes step counts like 10,20,30, got {text!r}") from None


def _pool_specs(devices: str | None) -> list[Any]:
    """The workers ``--devices`` names (none without it), checked before anything loads."""
    if not devices:
        return []
    from renderq.backends.pool import parse_devices

    specs = parse_devices(devices)
    if len({s.device_class for s in specs}) > 1:
        raise ConfigError(f"--devices {devices!r} names more than one device class")
    return specs


def bench_command(
    scenario: Annotated[str, typer.Option(help="offline | server | single-stream")] = "offline",
    modes: Annotated[str, typer.Option(help="Comma-separated modes.")] = "adhoc,dynamic,window",
    requests: Annotated[int, typer.Option(help="Requests in the scenario.")] = 2000,
    profile: Annotated[str, typer.Option(help="Profile for the simulator and the limit.")] = (
        "article-sdxl-a100"
    ),
    rate: Annotated[float | None, typer.Option(help="Server: arrivals per second.")] = None,
    load: Annotated[
        float | None, typer.Option(help="Server: rate as a share of the limit.")
    ] = None,
    p99_bound: Annotated[float | None, typer.Option(help="Server: p99 latency bound, s.")] = None,
    qa: Annotated[
        bool, typer.Option("--qa/--no-qa", metavar="", help="Score and regenerate.")
    ] = True,
    failure_rates: Annotated[str, typer.Option(help="Simulated QA failure sweep.")] = "0.08",
    max_batch_size: Annotated[int | None, typer.Option(help="Cap below the profile's.")] = None,
    max_queue_delay: Annotated[
        float, typer.Option(help="Dynamic mode delay cap, s.")
    ] = _BATCHING.max_queue_delay_s,
    windows: Annotated[str, typer.Option(help="Window mode windows.")] = "always",
    workers: Annotated[
        int, typer.Option(help="Sim: render workers (real: one per --devices entry).")
    ] = 1,
    devices: Annotated[
        str | None,
        typer.Option(
            help="Real: render on a pool, one worker process per device, all of one class "
            "(cuda:0,cuda:1, cuda, cpu:1,cpu:1); --load is then a share of the pool's limit."
        ),
    ] = None,
    seed: Annotated[int, typer.Option(help="Seed of arrivals and failures.")] = 0,
    step_mix: Annotated[
        str | None,
        typer.Option(
            help="Denoising steps by turns, e.g. 10,20,30: request i renders the i-th count "
            "(default: every request at the model's steps).",
        ),
    ] = None,
    executor: Annotated[str, typer.Option(help="sim (cost model) or real (a pipeline).")] = "sim",
    model: Annotated[str, typer.Option(help="Real: diffusers pipeline.")] = _SPEC.model,
    scorer: Annotated[str, typer.Option(help="Real: CLIP scorer.")] = _SPEC.scorer,
    device: Annotated[str, typer.Option(help="Real: cpu or cuda[:N].")] = _SPEC.device,
    precision: Annotated[str, typer.Option(help="Real: fp32, fp16 or bf16.")] = _SPEC.precision,
    steps: Annotated[int | None, typer.Option(help="Real: denoising steps.")] = None,
    threads: Annotated[
        int,
        typer.Option(
            help="Real, on a CPU: torch threads (0: the cores other work leaves free, less "
            "one for the bench's own engine threads, which run in its process)."
        ),
    ] = 0,
    threshold: Annotated[float | None, typer.Option(help="Real: QA threshold.")] = None,
    max_attempts: Annotated[
        int, typer.Option(help="Attempts per prompt in all.")
    ] = _QA.max_attempts,
    compare_sim: Annotated[
        bool,
        typer.Option("--compare-sim", metavar="", help="Real: replay each run in the simulator."),
    ] = False,
    reference_every: Annotated[
        int,
        typer.Option(
            help="Real, not server: time one batch of the limit's size straight through the "
            "executor each time the mode has rendered N such batches' worth of images "
            "(0: only before and after the mode)."
        ),
    ] = REFERENCE_EVERY,
    repeat: Annotated[
        int,
        typer.Option(
            help="Real: run every mode N times, each round starting at the next mode; "
            "report each figure's median and range."
        ),
    ] = 1,
    stability_bound: Annotated[
        float,
        typer.Option(
            help="Real: a run is unstable when its slowest reference batch took over "
            "1+B times its fastest, its own batches drifted over 1+B against their size's "
            "median, or an efficiency came out above 1+B."
        ),
    ] = STABILITY_BOUND,
    out: Annotated[Path | None, typer.Option(help="Write bench.json, bench.md, plots.")] = None,
    as_json: Annotated[
        bool, typer.Option("--json", metavar="", help="Print the JSON report.")
    ] = False,
) -> None:
    """Run each mode over one scenario; report efficiency against the limit, cost, latency."""
    fidelity: list[dict[str, Any]] = []
    stack = ExitStack()
    try:
        if executor not in ("sim", "real"):
            raise ConfigError(f"--executor must be sim or real, got {executor!r}")
        if compare_sim and executor != "real":
            raise ConfigError("--compare-sim needs --executor real")
        if devices and executor != "real":
            raise ConfigError("--devices needs --executor real (the simulator takes --workers)")
        bench = None
        gate = QASettings(threshold, max_attempts, enabled=qa)
        batching = Batching(max_batch_size=max_batch_size, max_queue_delay_s=max_queue_delay)
        policies = make_policies(modes, batching, windows)  # a bad mode is named before loading
        if executor == "real":
            from renderq.bench.realrun import RealSettings, check_real_options, load_bench

            pool = _pool_specs(devices)
            if threads < 0:
                raise ConfigError(f"--threads must be >= 0, got {threads}")
            if device == "cpu" or threads > 0:
                from renderq.backends.diffusers import free_cores, set_cpu_threads

                # The engine, the arrival feeder and the recorder are Python threads of
                # this process: a torch team on every core waits on their time slices
                # and the mode's speed moves under it (an unstable run).
                set_cpu_threads(threads or max(1, free_cores() - 1))
            check_real_options(repeat, workers, reference_every, stability_bound, len(pool))
            given = None if profile == "article-sdxl-a100" else load_profile(profile)
            spec = ModelSpec(model, scorer, device, precision, steps)
            bench, prof = load_bench(RealSettings(spec, batching, gate), given)
            if pool:
                from renderq.jobs.workers import start_pool

                started = start_pool(spec, pool)
                stack.callback(started.close)
                [bench.pool] = started.executors().values()
                if "step" in policies:
                    from renderq.backends.step_loop import step_executors
                    from renderq.bench.real import pipeline_of

                    # Step mode's loops drive pipelines in this process, one per device.
                    bench.step_pipelines = step_executors(pipeline_of(bench.executor), pool, spec)
        elif repeat != 1:
            raise ConfigError(
                f"--repeat {repeat} needs --executor real (a simulated round repeats exactly)"
            )
        else:
            prof = load_profile(profile)
        limit = Limit.of(prof, max_batch_size)
        if scenario == "server" and rate is None:
            share = load if load is not None else 0.5
            rate = capacity_rate(limit, share) * (bench.workers if bench is not None else 1)
        scen = Scenario(scenario, requests, rate, p99_bound, seed, _step_mix(step_mix))
        if bench is not None:
            from renderq.bench.realrun import run_real

            runs, fidelity = run_real(
                bench, prof, policies, scen, limit, compare_sim, reference_every,
                repeat=repeat, stability_bound=stability_bound,
            )  # fmt: skip
        else:
            backend = sim_backend(prof, qa=gate, workers=workers, seed=seed)
            runs = run_bench(backend, policies, scen, limit, _rates(failure_rates), workers)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None
    finally:
        stack.close()  # a device pool's workers
    title = f"{scenario}, {requests} requests, profile {prof.name}, QA {'on' if qa else 'off'}"
    if bench is not None:
        title += f", real runs of {model} on {devices or device}"
    if rate is not None:
        title += f", {rate:.3f} req/s"
    if step_mix:
        title += f", steps by turns {step_mix}"
    report: dict[str, Any] = {
        "scenario": scenario,
        "requests": requests,
        "rate": rate,
        "p99_bound_s": p99_bound,
        "step_mix": list(_step_mix(step_mix)),
        "qa": qa,
        "executor": "simulated" if bench is None else "real",
        "model": None if bench is None else model,
        "profile": {"name": prof.name, "source": dict(prof.source)},
        "limit": {"batch_size": limit.batch_size, "images_per_second": limit.images_per_second},
        "runs": [r.to_dict() for r in runs],
        "modes": {
            r.mode: r.to_dict()
            for r in runs
            if r.failure_rate == runs[0].failure_rate and r.round == 0
        },
    }
    if bench is not None:
        report["repeat"] = repeat
        report["stability_bound"] = stability_bound
        report["summary"] = summarise(runs, p99_bound)
    if fidelity:
        report["compare_sim"] = fidelity
    table = markdown(runs, limit, title, p99_bound) + (fidelity_table(fidelity) if fidelity else "")
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "bench.json").write_text(json.dumps(report, indent=2) + "\n")
        (out / "bench.md").write_text(table)
        report["plots"] = [str(p) for p in plots(runs, prof, out)]
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        typer.echo(table)
