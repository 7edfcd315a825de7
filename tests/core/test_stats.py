"""The distribution-free confidence interval of a percentile (order statistics)."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from renderq.core.errors import ConfigError
from renderq.core.stats import percentile, percentile_ci, quantile_ci_ranks


def _below(n: int, q: float, k: int) -> float:
    """P(Y <= k) for Y ~ Binomial(n, q), summed directly."""
    return sum(math.comb(n, j) * q**j * (1 - q) ** (n - j) for j in range(k + 1))


def test_two_hundred_samples_cannot_bound_a_p99_from_above() -> None:
    assert 0.99**200 > 0.025  # all 200 below the true p99 is too likely to rule out
    lo, hi = quantile_ci_ranks(200, 0.99)
    assert hi is None and lo is not None and lo <= math.ceil(0.99 * 200)


def test_six_hundred_samples_bound_it_on_both_sides_as_tightly_as_allowed() -> None:
    n, q = 600, 0.99
    lo, hi = quantile_ci_ranks(n, q)
    assert lo is not None and hi is not None
    assert lo <= math.ceil(q * n) <= hi
    # Each end gives up at most 2.5%, and one rank further in would give up more.
    assert _below(n, q, lo - 1) <= 0.025 < _below(n, q, lo)
    assert 1 - _below(n, q, hi - 1) <= 0.025 < 1 - _below(n, q, hi - 2)
    assert _below(n, q, hi - 1) - _below(n, q, lo - 1) >= 0.95


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(1, 300),
    q=st.floats(0.01, 0.99),
    confidence=st.floats(0.5, 0.99),
)
def test_the_interval_covers_with_at_least_its_confidence(
    n: int, q: float, confidence: float
) -> None:
    lo, hi = quantile_ci_ranks(n, q, confidence)
    tail = (1 - confidence) / 2
    if lo is not None:
        assert 1 <= lo <= n and _below(n, q, lo - 1) <= tail + 1e-9
        assert lo == n or _below(n, q, lo) > tail - 1e-9  # as far in as allowed
    else:
        assert (1 - q) ** n > tail - 1e-9  # even the smallest sample may lie above it
    if hi is not None:
        assert 1 <= hi <= n and 1 - _below(n, q, hi - 1) <= tail + 1e-9
        assert hi == 1 or 1 - _below(n, q, hi - 2) > tail - 1e-9
    else:
        assert q**n > tail - 1e-9  # even the largest sample may lie below it
    if lo is not None and hi is not None:
        assert lo < hi
        assert _below(n, q, hi - 1) - _below(n, q, lo - 1) >= confidence - 1e-9


def test_on_samples_the_interval_holds_the_true_quantile_about_as_often_as_it_says() -> None:
    rng = random.Random(7)
    trials, hits = 2000, 0
    for _ in range(trials):
        lo, hi = percentile_ci([rng.random() for _ in range(100)], 90, 0.9)
        assert lo is not None and hi is not None
        hits += lo <= 0.9 <= hi
    # Exact coverage of these ranks is >= 0.9; 2000 trials put 0.88 about 3 s.d. below.
    assert hits / trials > 0.88


def test_percentile_ci_reads_the_order_statistics() -> None:
    values = [float(v) for v in range(600, 0, -1)]  # unsorted on purpose
    lo, hi = quantile_ci_ranks(600, 0.99)
    assert lo is not None and hi is not None
    assert percentile_ci(values, 99) == (float(lo), float(hi))
    point = percentile(values, 99)
    assert point is not None and lo <= point <= hi
    assert percentile_ci([], 99) == (None, None)


@pytest.mark.parametrize(
    ("n", "q", "confidence", "bad"),
    [(0, 0.5, 0.9, "n must be >= 1, got 0"), (10, 1.0, 0.9, "q must be in \\(0, 1\\), got 1.0"),
     (10, 0.5, 1.5, "confidence must be in \\(0, 1\\), got 1.5")],
)  # fmt: skip
def test_bad_arguments_are_named(n: int, q: float, confidence: float, bad: str) -> None:
    with pytest.raises(ConfigError, match=bad):
        quantile_ci_ranks(n, q, confidence)
