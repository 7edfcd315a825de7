"""Simulator fidelity: replay a real run in the simulator and compare the two.

The simulator gets the real run's own arrival times and QA outcomes, and a profile
calibrated from the real run's batches (median device-seconds per batch size seen, for
rendering and for scoring). What is left to compare is the scheduling and the cost model:
device-seconds and p99 latency, with their relative errors.
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

    @staticmethod
    def _err(real: float | None, sim: float | None) -> float | None:
        if real is None or sim is None or real == 0:
            return None
        return (sim - real) / real

    def to_dict(self) -> dict[str, Any]:
        """Both sides and the relative errors (sim - real) / real."""
        rs, ss = self.real.ledger.total_seconds, self.sim.ledger.total_seconds
        rp, sp = self.real.percentile(99), self.sim.percentile(99)
        return {
            "mode": self.mode,
            "device_seconds": {"real": rs, "sim": ss, "rel_error": self._err(rs, ss)},
            "p99_s": {"real": rp, "sim": sp, "rel_error": self._err(rp, sp)},
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
) -> SimResult:
    """Simulate a recorded run: same arrivals, same QA outcomes, calibrated costs.

    Scoring and rendering take turns in the simulation exactly when they did in the run.
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
    )
    return simulate(policy, cfg)
