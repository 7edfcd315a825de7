"""Simulator fidelity: replay a real run in the simulator and compare the two.

The simulator gets the real run's own arrival times and QA outcomes, and a calibration
from the run itself:

- a profile: the median device-seconds per batch size seen, for rendering and scoring;
- the machine's speed over the run: each real render batch's seconds over its size's
  median, smoothed by a running mean over five batches, as a step from when that batch
  started to when the next one did. A simulated batch cut at time t takes its size's
  median times the factor in force at t. A shared or drifting machine has slow spells a
  profile of medians cannot know; queues, and so the latency tail, grow in them. The mean,
  not a median, so that the replay is charged the time the run spent: a batch's seconds
  are skewed (a slow one now and then, never a fast one), and a running median dropped
  that excess, a few percent of the run, which near full load is the latency tail. In step
  mode the trace comes from the loop's steps (each over its running size's median, smoothed
  over five requests' worth of steps) and scales each simulated step;
- the engine's hand-off time per batch: the median of how long the engine held a worker
  beyond the batch's device-seconds (the worker picking the batch up, the result coming
  back to the loop), held in the simulation too but not booked. In step mode a slot is
  held while its request shares the loop with others, so the hand-off is what the engine
  held it beyond the request's stay in the loop (:func:`step_handoff`).

What is left to compare is the scheduling and the cost model: device-seconds and p99
latency, with their relative errors. A replay on the medians alone (no speed trace, no
hand-offs) is reported beside: the best a profile, which holds medians, can do.

The real p99 is one sample of a noisy statistic, so the report carries its distribution-free
95% confidence interval (order statistics, see ``renderq.core.stats.percentile_ci``) and
whether the simulated p99 falls inside it. With 200 requests the interval has no upper end
(all 200 may lie below the true p99); a few hundred more give it one.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from renderq.backends.step_loop import StepTrace
from renderq.bench.real import Recording
from renderq.core.cost import Profile
from renderq.core.errors import ConfigError
from renderq.core.policies import Policy
from renderq.core.settings import QASettings
from renderq.core.stats import medians_by_size, percentile_ci
from renderq.core.step import StepCost
from renderq.runtime.sim import SimConfig, SimResult, simulate


def _points(pairs: Sequence[tuple[int, float]]) -> list[list[float]]:
    return [[n, max(secs, 1e-9)] for n, secs in medians_by_size(pairs)]


def step_handoff(rec: Recording, trace: StepTrace) -> float:
    """Step mode's render hand-off: the median over requests of the seconds the engine held
    a request's slot beyond its stay in the loop (the slot taking it to the loop, its answer
    coming back to the engine), never negative; 0 when no request can be matched."""
    stays = dict(trace.stays)
    return _median_excess(
        held - stays[ids[0]]
        for ids, held in zip(rec.render_requests, rec.render_held, strict=True)
        if len(ids) == 1 and ids[0] in stays
    )


def _median_gap(batches: Sequence[tuple[int, float]], held: Sequence[float]) -> float:
    """Median of held seconds minus device-seconds over batches (never negative)."""
    return _median_excess(h - secs for (_, secs), h in zip(batches, held, strict=True))


def _median_excess(gaps: Iterable[float]) -> float:
    """The median of ``gaps``, never negative; 0 when there are none."""
    found = list(gaps)
    return max(0.0, statistics.median(found)) if found else 0.0


REAL_P99_CONFIDENCE = 0.95
"""Confidence of the interval reported around the real run's p99."""

SPEED_WINDOW = 5
"""Batches in the running mean that smooths the speed trace: a slow spell lasts several
batches; one slow batch's excess is spread over its neighbours rather than landing whole
on whichever simulated batch (of whatever size) is cut while it holds."""


def speed_trace(rec: Recording, window: int = SPEED_WINDOW) -> tuple[tuple[float, float], ...]:
    """``(start, factor)`` per real render batch, by start: the running mean (over
    ``window`` batches centred on it) of each batch's seconds over its size's median."""
    return smoothed_speed(rec.batches, rec.render_started, window)


def step_speed_trace(trace: StepTrace, window: int) -> tuple[tuple[float, float], ...]:
    """The same for a step loop: each step's seconds over its running size's median,
    smoothed over ``window`` steps (step mode smooths over as many requests' steps as the
    whole-batch trace smooths batches). Empty for a trace without step times."""
    if len(trace.started) != len(trace.steps):
        return ()
    return smoothed_speed(trace.steps, trace.started, window)


def smoothed_speed(
    work: Sequence[tuple[Hashable, float]], starts: Sequence[float], window: int
) -> tuple[tuple[float, float], ...]:
    """``(start, factor)`` per piece of ``work`` (``(kind, seconds)``, begun at ``starts``),
    by start: the running mean over ``window`` pieces of its seconds over its kind's median.

    Away from the ends the factors charge each kind's median for every piece in total what
    the pieces took (a window of pieces of one kind: exactly), slow pieces included."""
    if window < 1:
        raise ConfigError(f"the speed window must be >= 1 batch, got {window}")
    by: dict[Hashable, list[float]] = {}
    for kind, secs in work:
        by.setdefault(kind, []).append(max(secs, 1e-9))
    medians = {kind: statistics.median(v) for kind, v in by.items()}
    order = sorted(range(len(work)), key=lambda i: starts[i])
    raw = [max(work[i][1], 1e-9) / medians[work[i][0]] for i in order]
    half = window // 2
    return tuple(
        (starts[i], statistics.fmean(raw[max(0, k - half) : k + half + 1]))
        for k, i in enumerate(order)
    )


@dataclass(frozen=True, slots=True)
class Calibration:
    """What a real run says about the machine beyond its cost curve."""

    render_overhead_s: float = 0.0
    """Median seconds a render worker was held per batch beyond the batch's device-seconds."""
    score_overhead_s: float = 0.0
    """The same for the scorer."""
    speed: tuple[tuple[float, float], ...] = ()
    """The machine's speed over the run (see :func:`speed_trace`)."""

    @classmethod
    def of(cls, rec: Recording) -> Calibration:
        """A real run's hand-offs (medians, never negative) and speed trace."""
        return cls(
            _median_gap(rec.batches, rec.render_held),
            _median_gap(rec.scores, rec.score_held),
            speed_trace(rec),
        )

    def to_dict(self) -> dict[str, Any]:
        """The hand-offs, and the speed trace's size and range."""
        factors = [f for _, f in self.speed]
        return {
            "render_overhead_s": self.render_overhead_s,
            "score_overhead_s": self.score_overhead_s,
            "speed_steps": len(factors),
            "speed_min": min(factors, default=None),
            "speed_max": max(factors, default=None),
        }


def calibrated_profile(rec: Recording, like: Profile, name: str) -> Profile:
    """A profile from a real run's batches, with ``like``'s model, device and resolution.

    Sizes above the largest batch the run made, up to ``like``'s largest, follow ``like``'s
    curve from there (the simulator may cut a batch the real run never did, when its
    timing differs).
    """
    render = _points(rec.batches)
    curve = like.render.curve
    if render and int(render[-1][0]) < curve.max_size:
        top, top_s = int(render[-1][0]), render[-1][1]
        render.append([curve.max_size, top_s * curve.latency(curve.max_size) / curve.latency(top)])
    score = _points(rec.scores) or [[1, 1e-9]]
    return Profile.from_dict(
        {
            "name": name,
            "model": like.model,
            "device_class": like.device_class,
            "precision": like.precision,
            "resolution": [like.width, like.height],
            "steps": like.steps,
            "device_memory_gib": 1024,
            "source": {"kind": "measured", "note": "calibrated from the real run's own batches"},
            "render": {"points": render},
            "score": {"points": score},
        }
    )


def _err(real: float | None, sim: float | None) -> float | None:
    if real is None or sim is None or real == 0:
        return None
    return (sim - real) / real


@dataclass(frozen=True, slots=True)
class Fidelity:
    """Real against simulated, for one mode (and against a replay on medians alone)."""

    mode: str
    real: SimResult
    sim: SimResult
    calibration: Calibration = Calibration()
    medians_only: SimResult | None = None
    step_cost: StepCost | None = None
    """Step mode: the loop's cost the simulator ran on (from the real loop's own steps)."""

    def to_dict(self) -> dict[str, Any]:
        """Both sides and the relative errors (sim - real) / real."""
        out: dict[str, Any] = {"mode": self.mode}
        measures: tuple[tuple[str, Callable[[SimResult], float | None]], ...] = (
            ("device_seconds", lambda r: r.ledger.total_seconds),
            ("p99_s", lambda r: r.percentile(99)),
        )
        for name, get in measures:
            real, sim = get(self.real), get(self.sim)
            row = {"real": real, "sim": sim, "rel_error": _err(real, sim)}
            if self.medians_only is not None:
                plain = get(self.medians_only)
                row |= {"sim_medians_only": plain, "rel_error_medians_only": _err(real, plain)}
            out[name] = row
        # The real p99 is itself a sample: within its confidence interval, a simulated p99
        # differs from it by no more than another run of the same trace might.
        lo, hi = percentile_ci(self.real.latencies, 99, REAL_P99_CONFIDENCE)
        sim_p99 = out["p99_s"]["sim"]
        out["p99_s"]["real_ci"] = {"confidence": REAL_P99_CONFIDENCE, "low": lo, "high": hi}
        out["p99_s"]["sim_in_real_ci"] = (
            None
            if sim_p99 is None or lo is None
            else lo <= sim_p99 and (hi is None or sim_p99 <= hi)
        )
        out["calibration"] = self.calibration.to_dict()
        out["mean_batch_size"] = {
            "real": self.real.mean_batch_size,
            "sim": self.sim.mean_batch_size,
        }
        out["renders"] = {"real": self.real.renders, "sim": self.sim.renders}
        if self.step_cost is not None:
            c = self.step_cost
            out["step_cost"] = {
                "step_points": [list(p) for p in zip(c.step.sizes, c.step.seconds, strict=True)],
                "prepare_s": c.prepare_s,
                "source": c.source,
            }
        return out


def replay(
    policy: Policy,
    rec: Recording,
    profile: Profile,
    *,
    qa: QASettings,
    score_batch_size: int,
    calibration: Calibration = Calibration(),
    step_cost: StepCost | None = None,
    workers: int = 1,
    priced: bool = False,
) -> SimResult:
    """Simulate a recorded run: same arrivals, same QA outcomes, calibrated costs.

    Scoring and rendering take turns in the simulation exactly when they did in the run;
    ``calibration`` adds the run's speed trace and hand-offs (none: medians alone);
    ``step_cost`` prices step mode's loop (default: derived from ``profile``);
    ``workers``: the run's render workers (a device pool's); ``priced``: whether the run's
    scheduler priced batches by a cost model (a ``RealBench`` run's does not, so by default
    the replay's fair share across keys charges images, as the run's did).
    """
    cfg = SimConfig(
        profile,
        rec.arrivals(),
        failure_rate=0.0,
        qa=qa,
        outcomes=rec.outcomes,
        score_batch_size=score_batch_size,
        share_device=rec.shared_device,
        render_overhead_s=calibration.render_overhead_s,
        score_overhead_s=calibration.score_overhead_s,
        speed=calibration.speed,
        step_cost=step_cost,
        render_workers=workers,
        priced=priced,
    )
    return simulate(policy, cfg)
