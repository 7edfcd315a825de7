"""Wiring for ``renderq bench --executor real``: load, profile, run, compare with the sim."""

from __future__ import annotations

import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from renderq.bench.fidelity import Calibration, Fidelity, calibrated_profile, replay
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
from renderq.core.cost import Profile
from renderq.core.errors import ConfigError
from renderq.core.policies import Policy
from renderq.core.types import BatchKey
from renderq.engine.models import model_defaults, resolve, scorer_default_threshold


@dataclass(frozen=True, slots=True)
class RealSettings:
    """The real model to bench and how."""

    model: str
    scorer: str
    device: str = "cpu"
    precision: str = "fp32"
    steps: int | None = None
    guidance: float | None = None
    threshold: float | None = None
    max_attempts: int = 3
    max_batch_size: int = 16
    qa: bool = True
    score_batch_size: int = 32
    profile_repeats: int = 2


def shipped_prompts() -> list[str]:
    """The example prompts shipped with renderq (the shapes world)."""
    from importlib import resources

    text = resources.files("renderq").joinpath("examples/shapes-200.txt").read_text()
    return [line for line in text.splitlines() if line.strip()]


def load_bench(s: RealSettings, profile: Profile | None) -> tuple[RealBench, Profile]:
    """Load the model and scorer; measure a profile unless one is given."""
    from renderq.executors.diffusers import DiffusersExecutor
    from renderq.scoring.clip import ClipScorer

    steps, guidance = model_defaults(s.model)
    steps = s.steps or steps
    guidance = guidance if s.guidance is None else s.guidance
    threshold = s.threshold
    if threshold is None:
        threshold = scorer_default_threshold(s.scorer) or 0.25
    ex = DiffusersExecutor.load(
        resolve(s.model), device=s.device, precision=s.precision, name=s.model
    )
    sc = ClipScorer.load(resolve(s.scorer), device=s.device, name=s.scorer)
    if profile is None:
        doc = profile_loaded(
            ex,
            sc,
            ProfileSettings(
                s.model,
                s.scorer,
                s.device,
                s.precision,
                steps,
                guidance=guidance,
                max_batch=s.max_batch_size,
                repeats=s.profile_repeats,
            ),
        )
        profile = Profile.from_dict(doc)
    width, height = profile.width, profile.height
    key = BatchKey(
        s.model, width, height, steps, guidance > 1.0, ex.sampler, s.precision, ex.device_class
    )
    bench = RealBench(
        ex,
        sc,
        key,
        shipped_prompts(),
        threshold,
        guidance,
        s.max_attempts,
        s.qa,
        s.score_batch_size,
    )
    return bench, profile


def run_real(
    bench: RealBench,
    profile: Profile,
    policies: Mapping[str, Policy],
    scenario: Scenario,
    limit: Limit,
    compare_sim: bool,
    reference_every: int = REFERENCE_EVERY,
) -> tuple[list[ModeRun], list[dict[str, Any]]]:
    """Every mode for real (and replayed in the simulator when asked).

    The mode's reference: the limit's batch size timed straight through the executor, two
    batches before the mode, two after, and (``reference_every`` > 0, scenarios other than
    server) one each time the mode has rendered ``reference_every`` such batches' worth of
    images; the median of them all. Interleaved, they see the machine the mode saw, even
    one whose speed drifts from minute to minute.
    """
    if reference_every < 0:
        raise ConfigError(f"--reference-every must be >= 0, got {reference_every}")
    size = limit.batch_size
    every = 0 if scenario.name == "server" else reference_every
    runs: list[ModeRun] = []
    fidelity: list[dict[str, Any]] = []
    for name, policy in policies.items():
        before = bench.direct_batches(size, 2)
        result = bench.run(policy, scenario, (size, every) if every else None)
        rec = bench.last
        assert rec is not None
        first = [ok for (_, attempt), ok in rec.outcomes.items() if attempt == 0]
        fail = 1 - sum(first) / len(first) if first else 0.0
        p99 = result.percentile(99)
        meets = None if scenario.p99_bound_s is None or p99 is None else p99 <= scenario.p99_bound_s
        after = bench.direct_batches(size, 2, first=3_000_000)
        timed = (*before, *rec.reference_s, *after)
        # The tail (after the last interleaved reference) pairs with the first batch after.
        paired = paired_efficiency(rec.stretches, [*rec.reference_s, after[0]], size)
        runs.append(
            ModeRun(
                name,
                fail,
                result,
                efficiency(result, limit),
                utilisation(result),
                meets,
                size / statistics.median(timed),
                timed,
                paired,
            )
        )
        if compare_sim:
            cal = calibrated_profile(rec, profile, f"{profile.name}-calibrated")
            calibration = Calibration.of(rec)
            sims = [
                replay(
                    policy,
                    rec,
                    cal,
                    max_attempts=bench.max_attempts,
                    qa=bench.qa,
                    score_batch_size=bench.score_batch_size,
                    calibration=c,
                )
                for c in (calibration, Calibration())
            ]
            fidelity.append(Fidelity(name, result, sims[0], calibration, sims[1]).to_dict())
    return runs, fidelity
