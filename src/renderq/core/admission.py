"""Admission control: refuse at once what cannot be served, instead of letting queues grow.

Two checks, both before a request is queued: a bounded queue per key, and a deadline
check. The deadline check asks the cost model when the request would finish if every
batch ahead of it (of equal or higher priority) ran full on the key's workers:
``now + (full batches * latency(cap) + latency(rest) + retries * waits * latency(b)) /
workers``.

- The work ahead is the ``ahead`` requests' renders: ``renders_per_request`` each (the
  regenerations they will still need) plus ``QUEUE_Z`` standard deviations of their sum
  (``renders_sd`` per request), so that a queue whose requests fail the gate more often
  than on average delays few admitted requests past their deadline; the request's own
  batch is priced at its own size.
- The request's own regenerations: each adds one batch (regenerations go ahead of new
  requests, so a retry does not wait for the whole queue again) of the size the queue
  would fill, ``min(cap, ahead + 1)``, and in a queue deeper than one batch a second one,
  the batch already running when the retry is queued again. ``retries`` are as many as all but
  ``MISS_SHARE`` of requests need, not the whole budget: pricing every retry the budget
  allows refuses, near its deadline, work that nearly always passes on its first render.

:class:`RenderStats` gives both from what the scheduler has seen: the renders finished
requests needed, and the failure rate of attempts at the upper end of what the attempts
so far allow (few observations are not trusted to be as good as they look; at a cold
start under overload the queue fills before anything has finished).

A request whose deadline falls before that is rejected with reason ``deadline``; callers
may retry after the queue ahead has drained.

What the cost model cannot see (cores taken by other work after a request was admitted, a
scorer's turns, the shell's own delays) makes admitted requests finish later than
expected. :class:`WaitCalibration` closes that loop: the expected wait is stretched by how
late the admitted requests that ran near their deadline have been finishing.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from renderq.core.errors import ConfigError
from renderq.core.events import Admission

MISS_SHARE = 0.01
"""The share of gated requests admission lets go without pricing the retries they need."""

QUEUE_Z = 2.33
"""Standard deviations of the queue's regenerations priced above their mean (one-sided 99%)."""

RATE_Z = 1.64
"""The one-sided 95% normal quantile of the failure rate's upper bound (Wilson's)."""

MIN_FINISHED = 20
"""Finished requests before their renders are trusted; until then every retry is priced."""

LATENCY_EWMA = 0.2
"""Weight of the newest batch in a device's :class:`LatencyScale`."""

LATENCY_SLOW_EWMA = 0.02
"""Weight of the newest batch in a :class:`LatencyScale`'s slow mean (about fifty batches)."""

SCALE_Z = 1.0
"""Standard deviations of a device's latency scale priced above its moving average."""


WAITS_KEPT = 200
"""Finished requests whose wait :class:`WaitCalibration` remembers."""

EDGE_SHARE = 0.5
"""A request counts for :class:`WaitCalibration` if admission expected it to use at least
this share of the time left to its deadline: the requests whose admission was close."""

DEEP_BATCHES = 3
"""A request counts for :class:`WaitCalibration` only if admission expected it to wait at
least this many full batches: below that, fixed costs the cost curve does not hold (a
queue delay, a score) weigh on the ratio more than on a full queue's wait."""


@dataclass(slots=True)
class WaitCalibration:
    """How long admitted requests took over what admission expected of them.

    Each finished request that admission priced near its deadline (expected to use at
    least ``EDGE_SHARE`` of the time it had) behind a queue (at least ``DEEP_BATCHES``
    full batches' wait; the scheduler records only those) adds its wait over the wait
    expected when it was admitted. Admission stretches every expected wait by the ``1 - MISS_SHARE``
    quantile of the last ``WAITS_KEPT`` of those ratios, never below 1 and only once
    ``MIN_FINISHED`` have been seen: where predictions run a few percent short (the device
    slowing after a request was admitted), that much more is refused, and at most about
    ``MISS_SHARE`` of admitted requests miss their deadline. Requests far from their
    deadline, or behind a short queue, do not count: their wait's relative error (a queue
    delay, a score) says nothing about a full queue's.
    """

    ratios: deque[float] = field(default_factory=lambda: deque(maxlen=WAITS_KEPT))
    _factor: float = 1.0  # kept from the last observation: every submission reads it

    def observe(self, waited: float, expected: float, budget: float) -> None:
        """A priced request finished after ``waited`` seconds; admission expected
        ``expected`` of the ``budget`` seconds it had to its deadline."""
        if expected > 0 and expected >= EDGE_SHARE * budget:
            self.ratios.append(waited / expected)
            n = len(self.ratios)
            if n >= MIN_FINISHED:
                ranked = sorted(self.ratios)
                top = ranked[min(n - 1, math.ceil((1.0 - MISS_SHARE) * n) - 1)]
                self._factor = max(1.0, top)

    def factor(self) -> float:
        """What admission multiplies an expected wait by (1.0 until enough were seen)."""
        return self._factor


@dataclass(slots=True)
class LatencyScale:
    """Observed over predicted render latency on one device class, batch by batch.

    An exponentially weighted mean (weight ``LATENCY_EWMA`` on the newest batch) and
    variance, and a slow mean (weight ``LATENCY_SLOW_EWMA``). Admission prices ``mean +
    SCALE_Z`` standard deviations: a device whose speed swings (shared cores, a scorer on
    the same card) is priced nearer its slow batches than its average, so fewer admitted
    requests finish late. Never below the slow mean: a full queue takes many batches, and
    a few fast ones (the last five weigh most in ``mean``) do not say the next twenty will
    be as fast, so a device is priced slower at once but faster only as the slow mean
    follows.
    """

    mean: float = 1.0
    var: float = 0.0
    slow: float = 1.0
    seen: int = 0

    def observe(self, ratio: float) -> None:
        """One batch's wall time over its predicted latency."""
        if self.seen == 0:
            self.mean, self.var, self.slow = ratio, 0.0, ratio
        else:
            diff = ratio - self.mean
            step = LATENCY_EWMA * diff
            self.mean += step
            self.var = (1 - LATENCY_EWMA) * (self.var + diff * step)
            self.slow += LATENCY_SLOW_EWMA * (ratio - self.slow)
        self.seen += 1

    def priced(self) -> float:
        """The scale admission multiplies its estimate by."""
        return max(self.mean + SCALE_Z * math.sqrt(self.var), self.slow)


@dataclass(frozen=True, slots=True)
class RenderCounts:
    """How many renders finished requests needed: ``needed[j]`` of them took ``j + 1``."""

    needed: tuple[int, ...] = ()

    @property
    def finished(self) -> int:
        """Finished requests counted."""
        return sum(self.needed)

    def share_above(self, renders: int) -> float:
        """The share of finished requests that needed more than ``renders`` renders."""
        n = self.finished
        return sum(self.needed[renders:]) / n if n else 0.0

    def retries_to_price(self, budget: int, miss_share: float = MISS_SHARE) -> int:
        """The fewest retries (at most ``budget``) that all but ``miss_share`` needed.

        The whole budget until ``MIN_FINISHED`` requests have finished: nothing is known yet.
        """
        if self.finished < MIN_FINISHED:
            return budget
        for retries in range(budget):
            if self.share_above(retries + 1) <= miss_share:
                return retries
        return budget


class RenderStats:
    """What finished requests and ended attempts say about the renders the next ones need.

    The scheduler feeds it; admission reads the queue's renders (:meth:`ahead`) and a
    request's own retries (:meth:`retries`) from it.
    """

    def __init__(self) -> None:
        self.finished = 0
        self.renders = 0
        self.squared = 0
        self.failed = 0  # attempts that ended in a regeneration or an escalation
        self.passed = 0
        self.gated: list[int] = []  # [j]: finished gated requests that took j + 1 renders

    def finish(self, renders: int, *, gated: bool) -> None:
        """A request ended (accepted or escalated) after ``renders`` renders."""
        self.finished += 1
        self.renders += renders
        self.squared += renders * renders
        if gated and renders:
            self.gated.extend([0] * (renders - len(self.gated)))
            self.gated[renders - 1] += 1

    def attempt(self, *, passed: bool) -> None:
        """An attempt ended: accepted, or failed (regenerated or escalated)."""
        if passed:
            self.passed += 1
        else:
            self.failed += 1

    def per_request(self) -> float:
        """Mean renders per finished request (1.0 until ``MIN_FINISHED`` have finished)."""
        if self.finished < MIN_FINISHED:
            return 1.0
        return max(1.0, self.renders / self.finished)

    def sd(self) -> float:
        """Standard deviation of renders per finished request (0.0 until ``MIN_FINISHED``)."""
        n = self.finished
        if n < MIN_FINISHED:
            return 0.0
        mean = self.renders / n
        return math.sqrt(max(0.0, self.squared / n - mean * mean))

    def fail_rate(self) -> float:
        """The share of attempts that fail, at the upper end of what the attempts so far
        allow (Wilson's bound, one-sided 95%; 1.0 before any ended): few observations are
        not trusted to be as good as they look."""
        n = self.failed + self.passed
        if n == 0:
            return 1.0
        z2 = RATE_Z * RATE_Z
        p = self.failed / n
        centre = p + z2 / (2 * n)
        margin = RATE_Z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
        return min(1.0, (centre + margin) / (1 + z2 / n))

    def ahead(self, budget: int) -> tuple[float, float]:
        """Mean and standard deviation of the renders to price per request ahead.

        The larger of what finished requests needed and what the attempts' failure rate
        implies (``budget`` renders at most): early on the finished are mostly those that
        passed at once, so the first alone would be low, and at a cold start under
        overload the queue fills before anything has finished.
        """
        mean, sd = independent_renders(self.fail_rate(), budget)
        return max(mean, self.per_request()), max(sd, self.sd())

    def retries(self, budget: int) -> int:
        """The retries to price for a request's own deadline (``budget`` renders at most).

        As many as all but ``MISS_SHARE`` of the finished gated requests needed, or as the
        failure rate's upper bound implies if that is more; every retry until
        ``MIN_FINISHED`` have finished.
        """
        seen = RenderCounts(tuple(self.gated)).retries_to_price(budget - 1)
        return max(seen, independent_retries(self.fail_rate(), budget - 1))


def independent_renders(fail: float, budget: int) -> tuple[float, float]:
    """Mean and standard deviation of renders per request, each attempt failing with
    probability ``fail`` on its own, at most ``budget`` renders (the first included)."""
    probs = [fail**j * (1.0 - fail) for j in range(budget - 1)] + [fail ** (budget - 1)]
    mean = sum((j + 1) * q for j, q in enumerate(probs))
    square = sum((j + 1) ** 2 * q for j, q in enumerate(probs))
    return mean, math.sqrt(max(0.0, square - mean * mean))


def independent_retries(fail: float, budget: int, miss_share: float = MISS_SHARE) -> int:
    """The fewest retries (at most ``budget``) after which at most ``miss_share`` of
    requests still fail, each attempt failing with probability ``fail`` on its own."""
    for retries in range(budget):
        if fail ** (retries + 1) <= miss_share:
            return retries
    return budget


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Limits for admission. ``None`` disables the corresponding check.

    ``deadline_reserve_s`` is kept back from every deadline: the time an answer takes to
    reach its caller after its last batch (encoding, the HTTP way back, a busy event loop),
    which the cost model does not see. A request is admitted only if it is expected to
    finish that long before its deadline.
    """

    max_queue_per_key: int | None = None
    workers_per_device: int = 1
    deadline_reserve_s: float = 0.0

    def __post_init__(self) -> None:
        if self.max_queue_per_key is not None and self.max_queue_per_key < 1:
            raise ConfigError(f"max_queue_per_key must be >= 1, got {self.max_queue_per_key}")
        if self.workers_per_device < 1:
            raise ConfigError(f"workers_per_device must be >= 1, got {self.workers_per_device}")
        if not 0.0 <= self.deadline_reserve_s < math.inf:
            raise ConfigError(f"deadline_reserve_s must be >= 0, got {self.deadline_reserve_s}")


def expected_finish(
    now: float,
    ahead: int,
    cap: int,
    latency: Callable[[int], float],
    workers: int,
    *,
    renders_per_request: float = 1.0,
    renders_sd: float = 0.0,
    retries: int = 0,
    setup_s: float = 0.0,
) -> float:
    """When a request with ``ahead`` requests before it would finish, batches running full.

    ``renders_per_request`` and ``renders_sd`` (mean and standard deviation per request)
    price the regenerations of the queue ahead, ``QUEUE_Z`` deviations of their sum above
    the mean; ``retries`` the request's own (one batch each, as full as the queue would
    make it). ``setup_s``: device time before the key's batches can start (a LoRA adapter
    switch on a device that holds another), once: the key's batches run in turns.
    """
    spread = QUEUE_Z * renders_sd * math.sqrt(ahead)
    total = math.ceil(ahead * renders_per_request + spread) + 1
    full, rest = divmod(total, cap)
    busy = full * latency(cap) + (latency(rest) if rest else 0.0)
    # A retry is queued again when its score comes back. Where scoring overlaps rendering,
    # a queue deeper than one batch has its next batch running by then: the retry waits
    # for that batch and then rides in its own.
    waits = 2 if total > cap else 1
    busy += retries * waits * latency(min(cap, total)) + setup_s
    return now + busy / workers


def admit(
    config: AdmissionConfig,
    *,
    now: float,
    queued: int,
    ahead: int,
    deadline: float | None,
    cap: int,
    latency: Callable[[int], float] | None,
    renders_per_request: float = 1.0,
    renders_sd: float = 0.0,
    retries: int = 0,
    setup_s: float = 0.0,
    stretch: float = 1.0,
) -> Admission:
    """The admission verdict for one request (pure); see :func:`expected_finish`.

    ``stretch`` multiplies the expected wait (:meth:`WaitCalibration.factor`); an admitted
    request's ``expected_s`` is the wait before it."""
    limit = config.max_queue_per_key
    if limit is not None and queued >= limit:
        return Admission(
            False, "queue_full", f"{queued} requests already queued for this key (limit {limit})"
        )
    if deadline is not None:
        reserve = config.deadline_reserve_s
        if deadline <= now:
            return Admission(False, "deadline", f"deadline {deadline:.3f} is already past")
        if deadline - reserve <= now:
            return Admission(
                False,
                "deadline",
                f"deadline in {deadline - now:.2f}s leaves no time before the answer's "
                f"reserve of {reserve:.2f}s",
            )
        if latency is not None:
            finish = expected_finish(
                now,
                ahead,
                cap,
                latency,
                config.workers_per_device,
                renders_per_request=renders_per_request,
                renders_sd=renders_sd,
                retries=retries,
                setup_s=setup_s,
            )
            expected = finish - now
            finish = now + expected * stretch
            if finish > deadline - reserve:
                wait = finish - now
                return Admission(
                    False,
                    "deadline",
                    f"expected to finish in {wait:.2f}s, after the deadline in "
                    f"{deadline - now:.2f}s"
                    + (f" less the answer's reserve of {reserve:.2f}s" if reserve else ""),
                    retry_after_s=max(0.0, math.ceil(wait + reserve - (deadline - now))),
                )
            return Admission(True, expected_s=expected)
    return Admission(True)
