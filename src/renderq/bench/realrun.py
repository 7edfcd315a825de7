"""Wiring for ``renderq bench --executor real``: load, profile, run, compare with the sim."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from renderq.backends.registry import model_defaults, resolve, scorer_default_threshold
from renderq.bench.fidelity import (
    Calibration,
    Fidelity,
    calibrated_profile,
    replay,
    step_handoff,
    step_speed_trace,
)
from renderq.bench.harness import (
    REFERENCE_EVERY,
    Limit,
    ModeRun,
    Scenario,
    efficiency,
    paired_efficiency,
    utilisation,
)
from renderq.bench.model_profile import ProfileSettings, profile_loaded
from renderq.bench.real import RealBench
from renderq.bench.stability import DRIFT_WINDOW, STABILITY_BOUND, Stability, round_order
from renderq.core.cost import Profile
from renderq.core.errors import ConfigError
from renderq.core.policies import Policy
from renderq.core.settings import DEFAULT_MAX_BATCH_SIZE, Batching, ModelSpec, QASettings, key_for
from renderq.core.step import StepCost


@dataclass(frozen=True, slots=True)
class RealSettings:
    """The real model to bench and how.

    ``batching`` gives the batch caps (its max batch size is also the largest batch the
    profile measures); its mode is not used, each mode runs in turn.
    """

    spec: ModelSpec = field(default_factory=ModelSpec)
    batching: Batching = field(default_factory=Batching)
    qa: QASettings = field(default_factory=QASettings)
    profile_repeats: int = 2


def shipped_prompts() -> list[str]:
    """The example prompts shipped with renderq (the shapes world)."""
    from importlib import resources

    text = resources.files("renderq").joinpath("examples/shapes-200.txt").read_text()
    return [line for line in text.splitlines() if line.strip()]


def load_bench(s: RealSettings, profile: Profile | None) -> tuple[RealBench, Profile]:
    """Load the model and scorer; measure a profile unless one is given."""
    from renderq.backends.clip import ClipScorer
    from renderq.backends.diffusers import DiffusersExecutor

    spec = s.spec
    steps, guidance = spec.resolve(*model_defaults(spec.model))
    qa = s.qa.with_threshold(scorer_default_threshold(spec.scorer))
    ex = DiffusersExecutor.load(
        resolve(spec.model), device=spec.device, precision=spec.precision, name=spec.model
    )
    sc = ClipScorer.load(resolve(spec.scorer), device=spec.device, name=spec.scorer)
    if profile is None:
        cap = s.batching.max_batch_size or DEFAULT_MAX_BATCH_SIZE
        measured = ProfileSettings(spec, max_batch=cap, repeats=s.profile_repeats)
        profile = Profile.from_dict(profile_loaded(ex, sc, measured))
    key = key_for(
        spec.model, profile.width, profile.height, steps, guidance, ex.sampler, spec.precision,
        ex.device_class,
    )  # fmt: skip
    prompts = shipped_prompts()
    return RealBench(ex, sc, key, prompts, qa, guidance, s.batching.score_batch_size), profile


def check_real_options(
    repeat: int, workers: int, reference_every: int, bound: float, pool: int = 0
) -> None:
    """Refuse, by value, what the real bench cannot take (before any model loads);
    ``pool``: the workers ``--devices`` names (``--workers`` must then match or be 1)."""
    if reference_every < 0:
        raise ConfigError(f"--reference-every must be >= 0, got {reference_every}")
    if repeat < 1:
        raise ConfigError(f"--repeat must be >= 1, got {repeat}")
    if not bound > 0:
        raise ConfigError(f"--stability-bound must be > 0, got {bound}")
    if workers != 1 and workers != pool:
        raise ConfigError(
            f"--workers {workers} is for the simulator: the real bench drives one render "
            "worker per --devices entry (one loaded pipeline each); give --devices or "
            "--executor sim"
        )


def run_real(
    bench: RealBench,
    profile: Profile,
    policies: Mapping[str, Policy],
    scenario: Scenario,
    limit: Limit,
    compare_sim: bool,
    reference_every: int = REFERENCE_EVERY,
    *,
    repeat: int = 1,
    stability_bound: float = STABILITY_BOUND,
) -> tuple[list[ModeRun], list[dict[str, Any]]]:
    """Every mode for real (and replayed in the simulator when asked), ``repeat`` rounds.

    The mode's reference: the limit's batch size timed straight through the executor, two
    batches before the mode, two after, and (``reference_every`` > 0, scenarios other than
    server) one each time the mode has rendered ``reference_every`` such batches' worth of
    images; the median of them all. Interleaved, they see the machine the mode saw, even
    one whose speed drifts from minute to minute. Each run gets a stability verdict
    against ``stability_bound``; an unstable run's p99 bound is not judged. Round ``r``
    starts at the ``r``-th mode, so no mode always runs first (on a cold machine) or last.
    On a device pool (``bench.pool``) the references run on its first worker, before and
    after the mode only (its batches run side by side on every worker).
    """
    workers = bench.workers  # a device pool's, else one
    check_real_options(repeat, 1, reference_every, stability_bound)
    runs: list[ModeRun] = []
    fidelity: list[dict[str, Any]] = []
    for r in range(repeat):
        for name in round_order(list(policies), r):
            run, row = _one_mode(
                bench, profile, name, policies[name], scenario, limit, compare_sim,
                0 if workers > 1 else reference_every, stability_bound,
            )  # fmt: skip
            runs.append(replace(run, round=r))
            if row is not None:
                fidelity.append({**row, "round": r})
    return runs, fidelity


def _one_mode(
    bench: RealBench,
    profile: Profile,
    name: str,
    policy: Policy,
    scenario: Scenario,
    limit: Limit,
    compare_sim: bool,
    reference_every: int,
    bound: float,
) -> tuple[ModeRun, dict[str, Any] | None]:
    size = limit.batch_size
    # A server trace follows the wall clock; step mode's loop has no batch boundary to
    # slip a reference batch in: both are timed against references before and after only.
    every = 0 if scenario.name == "server" or policy.name == "step" else reference_every
    before = bench.direct_batches(size, 2)
    result = bench.run(policy, scenario, (size, every) if every else None)
    rec = bench.last
    assert rec is not None
    first = [ok for (_, attempt), ok in rec.outcomes.items() if attempt == 0]
    fail = 1 - sum(first) / len(first) if first else 0.0
    after = bench.direct_batches(size, 2, first=3_000_000)
    timed = (*before, *rec.reference_s, *after)
    # The tail (after the last interleaved reference) pairs with the first batch after.
    paired = paired_efficiency(rec.stretches, [*rec.reference_s, after[0]], size)
    run = ModeRun(
        name,
        fail,
        result,
        efficiency(result, limit),
        utilisation(result, bench.workers),
        None,
        size / statistics.median(timed),
        timed,
        paired,
    )
    # Step mode's render batches are single requests whose device-seconds are shares of
    # steps they rode with others: its device's own batches are the loop's steps.
    trace = rec.step_trace
    # The same work is a batch of the same size and step count (a step mix runs several).
    own: list[tuple[Any, float]] = [
        ((n, steps), secs) for (n, secs), steps in zip(rec.batches, rec.batch_steps, strict=True)
    ]
    window = DRIFT_WINDOW
    if trace is not None:
        own = list(trace.steps)
        # A step is a request's 1/steps: smooth over as many requests' steps as batches.
        window *= max(1, round(statistics.median(rec.batch_steps or [1])))
    stability = Stability.check(
        name,
        timed,
        own,
        (("against the reference", run.efficiency_reference), ("paired", paired)),
        bound,
        window,
    )
    p99 = result.percentile(99)
    meets = None
    if stability.stable and scenario.p99_bound_s is not None and p99 is not None:
        meets = p99 <= scenario.p99_bound_s
    run = replace(run, meets_p99=meets, stability=stability)
    if not compare_sim:
        return run, None
    cal = calibrated_profile(rec, profile, f"{profile.name}-calibrated")
    calibration = Calibration.of(rec)
    step_cost = None
    if trace is not None:
        # The loop's own steps price the simulated loop (its single-request shares are no
        # batch speed). A slot's hold time is mostly its request's stay in the loop beside
        # others; only what the engine held it beyond that stay is a hand-off.
        step_cost = StepCost.from_trace(
            trace.steps, trace.prepares, trace.decodes, cap=policy.max_batch_size
        )
        # A scorer that takes turns with the loop waits for its next step boundary, which
        # the simulated loop models itself: that wait is no hand-off either.
        # The machine's speed over the run is read from the loop's steps, as the drift is.
        score_s = 0.0 if rec.shared_device else calibration.score_overhead_s
        calibration = Calibration(
            step_handoff(rec, trace), score_s, step_speed_trace(trace, window)
        )
    sims = [
        replay(
            policy,
            rec,
            cal,
            qa=bench.qa,
            score_batch_size=bench.score_batch_size,
            calibration=c,
            step_cost=step_cost,
            workers=bench.workers,
        )
        for c in (calibration, Calibration())
    ]
    return run, Fidelity(name, result, sims[0], calibration, sims[1], step_cost).to_dict()
