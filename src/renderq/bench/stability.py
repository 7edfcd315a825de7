"""Whether a real bench run measured the modes or the machine, and figures over rounds.

A real run is **unstable** when any of these holds (``bound`` is the stated tolerance,
:data:`STABILITY_BOUND` unless the caller gives another):

- **reference spread**: the slowest reference batch (the limit's batch size timed straight
  through the executor before, between and after the mode's own batches) took more than
  ``1 + bound`` times the fastest. Every reference batch is the same work, so their spread
  is the machine's, and paired efficiency prices each stretch of the mode at one of them;
- **drift**: the mode's own batches, each over its size's median and smoothed by a running
  median over :data:`DRIFT_WINDOW` batches (one slow batch alone is noise), range over
  more than ``1 + bound`` (slowest smoothed factor over the fastest): the machine changed
  speed under the mode;
- **above the best static batch**: efficiency against the reference, or paired, above
  ``1 + bound``. No mode renders faster than the best static batch; a figure above it is a
  broken measurement, not a result.

A target (the p99 bound) is never called met or missed on an unstable run. ``--repeat N``
runs N rounds, each starting at the next mode, and reports each figure's median and range.
"""

from __future__ import annotations

import statistics
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from renderq.core.errors import ConfigError

STABILITY_BOUND = 0.25
"""Default tolerance: the slowest reference batch within 1.25x the fastest, the mode's
smoothed speed within 1.25x, and no figure above 1.25 against the best static batch."""

DRIFT_WINDOW = 5
"""Batches in the running median that smooths the mode's per-batch speed factors."""


def spread(seconds: Sequence[float]) -> float | None:
    """Slowest over fastest (1.0: all equal); None for fewer than two positive values."""
    vals = [s for s in seconds if s > 0]
    return max(vals) / min(vals) if len(vals) >= 2 else None


def drift(batches: Sequence[tuple[Hashable, float]], window: int = DRIFT_WINDOW) -> float | None:
    """How far a mode's speed moved over its run: the range (max over min) of each batch's
    seconds over its size's median, smoothed by a running median over ``window`` batches
    in run order. None when fewer than two batches share a size (nothing to compare).

    A batch's "size" is whatever makes two batches the same work: its size, or its size
    and step count where a step mix runs batches of different steps."""
    if window < 1:
        raise ConfigError(f"the drift window must be >= 1 batch, got {window}")
    by: dict[Hashable, list[float]] = {}
    for n, secs in batches:
        by.setdefault(n, []).append(secs)
    if not any(len(v) >= 2 for v in by.values()):
        return None
    medians = {n: max(statistics.median(v), 1e-12) for n, v in by.items()}
    raw = [max(secs, 1e-12) / medians[n] for n, secs in batches]
    half = window // 2
    smooth = [statistics.median(raw[max(0, k - half) : k + half + 1]) for k in range(len(raw))]
    return max(smooth) / min(smooth)


@dataclass(frozen=True, slots=True)
class Stability:
    """The verdict on one real run of one mode, with what it rests on."""

    bound: float
    reference_spread: float | None
    drift: float | None
    reasons: tuple[str, ...] = ()

    @property
    def stable(self) -> bool:
        """No check failed."""
        return not self.reasons

    @classmethod
    def check(
        cls,
        mode: str,
        reference_s: Sequence[float],
        batches: Sequence[tuple[Hashable, float]],
        efficiencies: Sequence[tuple[str, float | None]] = (),
        bound: float = STABILITY_BOUND,
        window: int = DRIFT_WINDOW,
    ) -> Stability:
        """Check a run's reference batches, its own batches and its figures against ``bound``.

        ``window``: the batches the drift's running median spans (step mode passes its
        steps: :data:`DRIFT_WINDOW` requests' worth, about the time as many whole
        batches take, so that a stall of a few tens of milliseconds is not a drift)."""
        if not bound > 0:
            raise ConfigError(f"the stability bound must be > 0, got {bound}")
        top = 1 + bound
        ref, moved = spread(reference_s), drift(batches, window)
        reasons = []
        if ref is not None and ref > top:
            reasons.append(
                f"reference batches {min(reference_s):.2f}-{max(reference_s):.2f} s, "
                f"spread {ref:.2f}x > {top:.2f}x"
            )
        if moved is not None and moved > top:
            reasons.append(
                f"{mode}'s batches drifted {moved:.2f}x against their size's median > {top:.2f}x"
            )
        for name, value in efficiencies:
            if value is not None and value > top:
                reasons.append(f"{name} efficiency {value:.3f} above the best static batch")
        return cls(bound, ref, moved, tuple(reasons))

    def verdict(self) -> str:
        """``stable`` or ``UNSTABLE``, as the report prints it next to the figures."""
        return "stable" if self.stable else "UNSTABLE"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready."""
        return {
            "stable": self.stable,
            "bound": self.bound,
            "reference_spread": self.reference_spread,
            "drift": self.drift,
            "reasons": list(self.reasons),
        }


def round_order(names: Sequence[str], r: int) -> list[str]:
    """The modes' order in round ``r`` (from 0): each round starts at the next mode."""
    if not names:
        return []
    k = r % len(names)
    return [*names[k:], *names[:k]]
