"""The A/B harness: the same scenario run under each mode, measured against the limit.

Scenarios follow MLPerf LoadGen's names: ``offline`` (everything at t=0), ``server``
(Poisson arrivals at a rate, judged against a p99 latency bound) and ``single-stream``
(the next request the moment the last one finishes). A backend runs one mode over one
scenario and returns a ``SimResult``-shaped outcome: the simulator (cost model and
seeded failures) or the real engine on a real pipeline.

**The limit** is the best static batch size's offline render throughput from the
profile, ``max_n n / latency(n)`` images per device-second. A mode's **efficiency** is its
render throughput per device-second (every attempt counts, regenerations too) divided by
that limit: 1.0 means every batch ran at the best size. Its **utilisation** is render
device-seconds over the makespan times the workers: how busy the device was kept.

A real run also times the limit's batch size straight through the executor before and
after each mode and, outside the server scenario, in between its own batches (the
**reference**), and reports the mode's efficiency against that as well: a machine whose
speed drifts between the profile and the run, or during it (a shared or throttled one),
moves the profile's limit, not the reference timed alongside the mode. **Paired**
efficiency prices each stretch of the mode at the reference batch timed right after it.
Neither is bounded by itself on a machine that changes speed mid-run, so each real run
carries a stability verdict (:mod:`renderq.bench.stability`).
"""

from __future__ import annotations

import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from renderq.core.cost import Profile
from renderq.core.errors import ConfigError
from renderq.core.policies import Policy
from renderq.core.settings import QASettings
from renderq.core.types import Stage
from renderq.runtime.arrivals import Arrival, arrivals
from renderq.runtime.sim import SimConfig, SimResult, simulate

if TYPE_CHECKING:
    from renderq.bench.stability import Stability

SCENARIOS = ("offline", "server", "single-stream")

REFERENCE_EVERY = 2
"""Real runs: one reference batch per this many limit-sized batches' worth of mode images."""


@dataclass(frozen=True, slots=True)
class Limit:
    """The best static batch size and its offline throughput, from a profile."""

    batch_size: int
    images_per_second: float

    @classmethod
    def of(cls, profile: Profile, cap: int | None = None) -> Limit:
        """The limit of ``profile`` for batches up to ``cap`` (default: the profile's cap)."""
        top = min(cap or profile.render_cap, profile.render_cap)
        best = profile.render.curve.best_size(top)
        return cls(best, best / profile.render.latency(best))


@dataclass(frozen=True, slots=True)
class Scenario:
    """A scenario: its name, request count, arrival rate (server) and p99 bound."""

    name: str
    requests: int
    rate: float | None = None
    p99_bound_s: float | None = None
    seed: int = 0
    #: Denoising steps by turns (request i renders ``step_mix[i % len]`` steps); empty:
    #: every request at the model's steps.
    step_mix: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if any(n < 1 for n in self.step_mix):
            raise ConfigError(f"--step-mix takes step counts >= 1, got {self.step_mix}")
        if self.name not in SCENARIOS:
            raise ConfigError(f"unknown scenario {self.name!r}; choose from {', '.join(SCENARIOS)}")
        if self.requests < 1:
            raise ConfigError(f"requests must be >= 1, got {self.requests}")
        if self.name == "server" and (self.rate is None or not self.rate > 0):
            raise ConfigError(f"the server scenario needs a rate > 0, got {self.rate}")

    def arrivals(self) -> tuple[Arrival, ...]:
        """The arrival trace (single-stream: all at 0; the backend closes the loop)."""
        spec = f"poisson:{self.rate}" if self.name == "server" else "offline"
        trace = arrivals(spec, self.requests, random.Random(self.seed))
        if not self.step_mix:
            return tuple(trace)
        mix = self.step_mix
        return tuple(dataclasses.replace(a, steps=mix[i % len(mix)]) for i, a in enumerate(trace))

    @property
    def streams(self) -> int | None:
        """Outstanding requests in a closed loop (1 for single-stream), else None."""
        return 1 if self.name == "single-stream" else None


Backend = Callable[[Policy, Scenario, float], SimResult]
"""Runs one mode over a scenario at a QA failure rate (ignored by real backends)."""


def sim_backend(
    profile: Profile, *, qa: QASettings = QASettings(), workers: int = 1, seed: int = 0
) -> Backend:
    """A backend that simulates runs on ``profile``."""

    def run(policy: Policy, scenario: Scenario, failure_rate: float) -> SimResult:
        cfg = SimConfig(
            profile,
            scenario.arrivals(),
            failure_rate=failure_rate,
            qa=qa,
            render_workers=workers,
            seed=seed,
            streams=scenario.streams,
        )
        return simulate(policy, cfg)

    return run


def efficiency(result: SimResult, limit: Limit) -> float | None:
    """Render throughput per device-second over the limit's."""
    rate = _throughput(result)
    return None if rate is None else rate / limit.images_per_second


def paired_efficiency(
    stretches: Sequence[tuple[int, float]], references: Sequence[float], size: int
) -> float | None:
    """The mode's render seconds at its neighbours' speed over the seconds it took.

    ``stretches[j]`` is (images, device-seconds) the mode rendered just before reference
    batch ``references[j]`` (of ``size`` images). Each stretch is priced at the speed of
    the reference batch next to it, so a machine that slows down for a while slows both
    sides of the ratio: ``sum(images_j * references_j / size) / sum(seconds_j)``. Small
    batches anywhere in the run, its tail included, still count against it.
    """
    pairs = list(zip(stretches, references, strict=False))
    spent = sum(seconds for (_, seconds), _ in pairs)
    if not pairs or spent <= 0 or size < 1:
        return None
    return sum(images * ref / size for (images, _), ref in pairs) / spent


def utilisation(result: SimResult, workers: int = 1) -> float | None:
    """Render device-seconds over the makespan times the workers."""
    render_s = _render_seconds(result)
    if result.makespan_s <= 0:
        return None
    return render_s / (result.makespan_s * workers)


@dataclass(frozen=True, slots=True)
class ModeRun:
    """One mode at one failure rate: its outcome and the figures derived from it."""

    mode: str
    failure_rate: float
    result: SimResult
    efficiency: float | None
    utilisation: float | None
    meets_p99: bool | None
    reference: float | None = None
    """Real runs: images per device-second of the limit's batch size, timed around the run."""
    reference_batch_s: tuple[float, ...] = ()
    """Real runs: the seconds of each reference batch (the reference is from their median)."""
    paired: float | None = None
    """Real runs with interleaved references: each stretch of the mode's batches against the
    reference batch timed right after it (see :func:`paired_efficiency`)."""
    round: int = 0
    """Real runs with ``--repeat``: which round (from 0) this run belongs to."""
    stability: Stability | None = None
    """Real runs: whether the run measured the mode or a machine changing under it; an
    unstable run's ``meets_p99`` is None (see :mod:`renderq.bench.stability`)."""

    @property
    def efficiency_reference(self) -> float | None:
        """Render throughput per device-second over the reference's (None without one)."""
        rate = _throughput(self.result)
        if rate is None or self.reference is None or self.reference <= 0:
            return None
        return rate / self.reference

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, the simulator's fields plus efficiency, utilisation and the bound."""
        out = self.result.to_dict()
        out.update(
            mode=self.mode,
            failure_rate=self.failure_rate,
            efficiency=self.efficiency,
            utilisation=self.utilisation,
            meets_p99_bound=self.meets_p99,
            reference_images_per_second=self.reference,
            reference_batch_s=list(self.reference_batch_s),
            efficiency_paired=self.paired,
            efficiency_against_reference=self.efficiency_reference,
            throughput_accepted_per_s=(
                self.result.accepted / self.result.makespan_s if self.result.makespan_s else None
            ),
            round=self.round,
            stability=None if self.stability is None else self.stability.to_dict(),
        )
        return out


def run_bench(
    backend: Backend,
    policies: Mapping[str, Policy],
    scenario: Scenario,
    limit: Limit,
    failure_rates: Sequence[float] = (0.08,),
    workers: int = 1,
) -> list[ModeRun]:
    """Every mode at every failure rate, in that order."""
    runs = []
    for rate in failure_rates:
        for name, policy in policies.items():
            result = backend(policy, scenario, rate)
            p99 = result.percentile(99)
            meets = None
            if scenario.p99_bound_s is not None and p99 is not None:
                meets = p99 <= scenario.p99_bound_s
            runs.append(
                ModeRun(
                    name,
                    rate,
                    result,
                    efficiency(result, limit),
                    utilisation(result, workers),
                    meets,
                )
            )
    return runs


def capacity_rate(limit: Limit, fraction: float) -> float:
    """An arrival rate at ``fraction`` of the limit's throughput."""
    if not (fraction > 0 and math.isfinite(fraction)):
        raise ConfigError(f"load fraction must be > 0, got {fraction}")
    return limit.images_per_second * fraction


def _throughput(result: SimResult) -> float | None:
    """Renders (every attempt) per render device-second; None when nothing rendered."""
    render_s = _render_seconds(result)
    return result.renders / render_s if render_s > 0 else None


def _render_seconds(result: SimResult) -> float:
    secs = result.ledger.seconds
    return secs.get(Stage.RENDER, 0.0) + secs.get(Stage.REGEN, 0.0)


FIGURES: tuple[tuple[str, str], ...] = (
    ("efficiency", "efficiency"),
    ("efficiency_against_reference", "vs reference"),
    ("efficiency_paired", "paired"),
    ("utilisation", "utilisation"),
    ("p50_s", "p50 s"),
    ("p99_s", "p99 s"),
    ("device_seconds", "device-s"),
)
"""The figures summarised over rounds: the key in a run's dict and the report's label."""


def _figures(run: ModeRun) -> dict[str, float | None]:
    return {
        "efficiency": run.efficiency,
        "efficiency_against_reference": run.efficiency_reference,
        "efficiency_paired": run.paired,
        "utilisation": run.utilisation,
        "p50_s": run.result.percentile(50),
        "p99_s": run.result.percentile(99),
        "device_seconds": run.result.ledger.total_seconds,
    }


def summarise(runs: Sequence[ModeRun], p99_bound_s: float | None) -> dict[str, dict[str, Any]]:
    """Per mode over its rounds: each figure's median, min, max and values; how many
    rounds were stable; and the p99 bound judged on the median p99, only when every round
    was stable (None otherwise, or without a bound)."""
    by: dict[str, list[ModeRun]] = {}
    for r in runs:
        by.setdefault(r.mode, []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for mode, rs in by.items():
        figs: dict[str, Any] = {}
        for key, _ in FIGURES:
            vals = [v for v in (_figures(r)[key] for r in rs) if v is not None]
            figs[key] = {
                "median": statistics.median(vals) if vals else None,
                "min": min(vals, default=None),
                "max": max(vals, default=None),
                "values": vals,
            }
        stable = sum(r.stability is None or r.stability.stable for r in rs)
        p99 = figs["p99_s"]["median"]
        meets = None
        if stable == len(rs) and p99_bound_s is not None and p99 is not None:
            meets = p99 <= p99_bound_s
        out[mode] = {
            "rounds": len(rs),
            "rounds_stable": stable,
            "stable": stable == len(rs),
            "meets_p99_bound": meets,
            "figures": figs,
        }
    return out
