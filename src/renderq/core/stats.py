"""Small statistics shared by the simulator, the service and the benches."""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

from renderq.core.errors import ConfigError


def percentile(values: Iterable[float], q: float) -> float | None:
    """Nearest-rank percentile ``q`` (0-100) of ``values``, or None when there are none."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def quantile_ci_ranks(n: int, q: float, confidence: float = 0.95) -> tuple[int | None, int | None]:
    """1-based ranks ``(lo, hi)`` of the order statistics that bracket the ``q`` quantile
    (``0 < q < 1``) of ``n`` independent samples with at least ``confidence``.

    Distribution-free: the number of samples below the true quantile is Binomial(n, q), so
    ``P(X_(lo) <= quantile < X_(hi)) = P(lo <= Y < hi)``; each end gives up at most half of
    ``1 - confidence``. An end is None when no sample is far enough out: too few samples
    to bound the quantile on that side (200 samples never bound a p99 from above: with
    probability 0.99**200 = 13% all of them lie below it).
    """
    if n < 1:
        raise ConfigError(f"n must be >= 1, got {n}")
    if not 0 < q < 1:
        raise ConfigError(f"q must be in (0, 1), got {q}")
    if not 0 < confidence < 1:
        raise ConfigError(f"confidence must be in (0, 1), got {confidence}")
    tail = (1 - confidence) / 2
    log_q, log_p = math.log(q), math.log1p(-q)
    cdf, total = [], 0.0  # cdf[k] = P(Y <= k)
    for k in range(n + 1):
        log_pmf = (
            math.lgamma(n + 1)
            - math.lgamma(k + 1)
            - math.lgamma(n - k + 1)
            + k * log_q
            + (n - k) * log_p
        )
        total += math.exp(log_pmf)
        cdf.append(total)
    # lo: the largest rank r with P(Y <= r - 1) <= tail; hi: the smallest s with
    # P(Y >= s) = 1 - P(Y <= s - 1) <= tail.
    lo = max((r for r in range(1, n + 1) if cdf[r - 1] <= tail), default=None)
    hi = min((s for s in range(1, n + 1) if 1 - cdf[s - 1] <= tail), default=None)
    return lo, hi


def percentile_ci(
    values: Iterable[float], q: float, confidence: float = 0.95
) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval for percentile ``q`` (0-100) of ``values``
    (see :func:`quantile_ci_ranks`; an end is None when the samples cannot bound it).

    The samples are taken as independent; latencies in a queue are not (a slow spell
    delays many requests at once), so the true uncertainty is wider than this.
    """
    ordered = sorted(values)
    if not ordered:
        return None, None
    lo, hi = quantile_ci_ranks(len(ordered), q / 100, confidence)
    return (
        None if lo is None else ordered[lo - 1],
        None if hi is None else ordered[hi - 1],
    )


def medians_by_size(points: Iterable[tuple[int, float]]) -> list[tuple[int, float]]:
    """``(size, median seconds)`` for each size among ``(size, seconds)`` points, by size."""
    by: dict[int, list[float]] = {}
    for n, secs in points:
        by.setdefault(int(n), []).append(float(secs))
    return [(n, statistics.median(v)) for n, v in sorted(by.items())]
