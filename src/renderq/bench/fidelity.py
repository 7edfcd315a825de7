"""Simulator fidelity: replay a real run in the simulator and compare the two.

The simulator gets the real run's own arrival times and QA outcomes, a profile
calibrated from the real run's batches (median device-seconds per batch size seen, for
rendering and for scoring), and the engine's hand-off time per batch: the median of how
long the engine held a worker for a batch beyond the batch's device-seconds (the worker
thread picking it up, the result coming back to the loop). Device-seconds alone leave
that out, and a device kept busy by many small batches queues on it. What is left to
compare is the scheduling and the cost model: device-seconds and p99 latency, with their
relative errors; the p99 of a replay without the hand-offs is reported beside.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from renderq.bench.real import Recording
from renderq.core.cost import Profile
from renderq.core.policies import Policy
from renderq.engine.sim import SimConfig, SimResult, simulate


def _points(pairs: Sequence[tuple[int, float]]) -> list[list[float]]:
    by: dict[int, list[float]] = {}
    for n, secs in pairs:
        by.setdefault(n, []).append(secs)
    return [[n, max(statistics.median(v), 1e-9)] for n, v in sorted(by.items())]


def _median_gap(held: Sequence[tuple[float, float]]) -> float:
    return max(0.0, statistics.median(h - d for d, h in held)) if held else 0.0


@dataclass(frozen=True, slots=True)
class Overheads:
    """Seconds the engine held a worker per batch beyond the batch's device-seconds."""

    render_s: float = 0.0
    score_s: float = 0.0

    @classmethod
    def of(cls, rec: Recording) -> Overheads:
        """The medians over a real run's render and score batches (never negative)."""
        return cls(_median_gap(rec.render_held), _median_gap(rec.score_held))


def calibrated_profile(rec: Recording, like: Profile, name: str) -> Profile:
    """A profile from a real run's batches, with ``like``'s model, device and resolution."""
    render = _points(rec.batches)
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


@dataclass(frozen=True, slots=True)
class Fidelity:
    """Real against simulated, for one mode."""

    mode: str
    real: SimResult
    sim: SimResult
    overheads: Overheads = Overheads()
    sim_without_overheads: SimResult | None = None

    @staticmethod
    def _err(real: float | None, sim: float | None) -> float | None:
        if real is None or sim is None or real == 0:
            return None
        return (sim - real) / real

    def to_dict(self) -> dict[str, Any]:
        """Both sides and the relative errors (sim - real) / real."""
        rs, ss = self.real.ledger.total_seconds, self.sim.ledger.total_seconds
        rp, sp = self.real.percentile(99), self.sim.percentile(99)
        bare = self.sim_without_overheads
        bp = bare.percentile(99) if bare is not None else None
        return {
            "mode": self.mode,
            "device_seconds": {"real": rs, "sim": ss, "rel_error": self._err(rs, ss)},
            "p99_s": {
                "real": rp,
                "sim": sp,
                "rel_error": self._err(rp, sp),
                "sim_without_overheads": bp,
                "rel_error_without_overheads": self._err(rp, bp),
            },
            "overheads_s": {"render": self.overheads.render_s, "score": self.overheads.score_s},
            "mean_batch_size": {"real": self.real.mean_batch_size, "sim": self.sim.mean_batch_size},
            "renders": {"real": self.real.renders, "sim": self.sim.renders},
        }


def replay(
    policy: Policy,
    rec: Recording,
    profile: Profile,
    *,
    max_attempts: int,
    qa: bool,
    score_batch_size: int,
    overheads: Overheads = Overheads(),
) -> SimResult:
    """Simulate a recorded run: same arrivals, same QA outcomes, calibrated costs.

    Scoring and rendering take turns in the simulation exactly when they did in the run;
    ``overheads`` hold each worker that much longer per batch (not booked as device time).
    """
    cfg = SimConfig(
        profile,
        rec.arrivals(),
        failure_rate=0.0,
        max_attempts=max_attempts,
        qa=qa,
        outcomes=rec.outcomes,
        score_batch_size=score_batch_size,
        share_device=rec.shared_device,
        render_overhead_s=overheads.render_s,
        score_overhead_s=overheads.score_s,
    )
    return simulate(policy, cfg)
