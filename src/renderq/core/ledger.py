"""The ledger: every device-second booked to a stage and a device class.

A batch's device-seconds are split between its first attempts and its retries by head
count (a render batch of 60 first attempts and 4 regenerations books 60/64 of its time to
``render`` and 4/64 to ``regen``), so stage totals always add up to the batch totals.

Each device class may have its own price per hour (``parse_prices``: ``cpu=0.05,
cuda-a100=1.9``): the report then gives GPU-hours and money per 10k accepted images per
class, next to the totals.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple, TypeVar

from renderq.core.errors import ConfigError
from renderq.core.types import BatchKind, Stage

_FIRST = {BatchKind.RENDER: Stage.RENDER, BatchKind.SCORE: Stage.SCORE}
_RETRY = {BatchKind.RENDER: Stage.REGEN, BatchKind.SCORE: Stage.RESCORE}


class LedgerRow(NamedTuple):
    """Device-seconds booked to one stage on one device class (as the store keeps them)."""

    stage: Stage
    device_class: str
    seconds: float


K = TypeVar("K", bound=Hashable)


def stage_split(
    kind: BatchKind, attempts: Iterable[int], device_seconds: float
) -> dict[Stage, float]:
    """One batch's device-seconds split between first attempts and retries by head count.

    ``kind`` is ``"render"`` or ``"score"``; the two values add up to ``device_seconds``
    exactly (the retry part is the remainder), so stage totals add up to batch totals.
    """
    if kind not in _FIRST:
        raise ValueError(f"batch kind must be 'render' or 'score', got {kind!r}")
    if not math.isfinite(device_seconds) or device_seconds < 0:
        raise ValueError(f"device_seconds must be finite and >= 0, got {device_seconds}")
    counts = [0, 0]
    for a in attempts:
        counts[a > 0] += 1
    n = counts[0] + counts[1]
    if n == 0:
        raise ValueError("cannot book a batch with no items")
    # All of it when every item is a first attempt: s * n / n need not equal s in floats.
    first = device_seconds if counts[1] == 0 else device_seconds * counts[0] / n
    return {_FIRST[kind]: first, _RETRY[kind]: device_seconds - first}


def shares_by(
    items: Iterable[tuple[K | None, int]], device_seconds: float, kind: BatchKind
) -> dict[K, dict[Stage, float]]:
    """Each group's head-count share of one batch's device-seconds, split as the ledger books it.

    ``items`` are the batch's ``(group, attempt)`` pairs, one per request; a request of no
    group (``None``: an interactive request beside a bulk job's) counts in the head count
    but its share goes to nobody here. Stages a group has no requests in are left out.
    """
    groups: dict[K, list[int]] = {}
    n = 0
    for group, attempt in items:
        n += 1
        if group is not None:
            groups.setdefault(group, []).append(attempt)
    if n == 0:
        return {}
    out: dict[K, dict[Stage, float]] = {}
    for group, attempts in groups.items():
        split = stage_split(kind, attempts, device_seconds * len(attempts) / n)
        out[group] = {stage: s for stage, s in split.items() if s > 0}
    return out


def parse_prices(text: str) -> dict[str, float]:
    """Prices per device-hour by device class, from ``CLASS=PRICE[,CLASS=PRICE...]``."""
    prices: dict[str, float] = {}
    for entry in (e.strip() for e in text.split(",")):
        name, eq, value = entry.partition("=")
        name = name.strip()
        try:
            price = float(value)
        except ValueError:
            price = math.nan
        if not eq or not name or not math.isfinite(price) or price < 0:
            raise ConfigError(
                f"--price entry {entry!r} is not CLASS=PRICE with a price per hour >= 0"
            )
        if name in prices:
            raise ConfigError(f"--price names device class {name!r} twice")
        prices[name] = price
    return prices


@dataclass(frozen=True, slots=True)
class LedgerReport:
    """Totals of a ledger, in seconds and GPU-hours, with money at a price per device-hour.

    ``price_per_hour`` prices every device-hour alike; ``prices`` prices each device class
    (a class without a price has no money figures, and then neither has the total).
    """

    seconds: Mapping[Stage, float]
    seconds_by_device: Mapping[str, float]
    batch_seconds: float
    accepted: int
    price_per_hour: float | None
    prices: Mapping[str, float] = field(default_factory=dict)
    #: Seconds per device class and stage.
    seconds_by_class_stage: Mapping[str, Mapping[Stage, float]] = field(default_factory=dict)

    @property
    def total_seconds(self) -> float:
        """All device-seconds booked."""
        return math.fsum(self.seconds.values())

    def gpu_hours(self) -> dict[str, float]:
        """GPU-hours per stage plus ``total``."""
        hours = {stage.value: self.seconds.get(stage, 0.0) / 3600 for stage in Stage}
        hours["total"] = self.total_seconds / 3600
        return hours

    def per_10k_accepted_hours(self) -> float | None:
        """GPU-hours per 10,000 accepted images (None before anything was accepted)."""
        if self.accepted == 0:
            return None
        return self.total_seconds / 3600 / self.accepted * 10_000

    def cost(self) -> float | None:
        """Money for all booked time: at ``price_per_hour``, else at each class's price."""
        if self.price_per_hour is not None:
            return self.total_seconds / 3600 * self.price_per_hour
        if not self.prices or any(dev not in self.prices for dev in self.seconds_by_device):
            return None
        return math.fsum(
            secs / 3600 * self.prices[dev] for dev, secs in self.seconds_by_device.items()
        )

    def cost_per_10k_accepted(self) -> float | None:
        """Money per 10,000 accepted images."""
        cost = self.cost()
        if cost is None or self.accepted == 0:
            return None
        return cost / self.accepted * 10_000

    def by_device_class(self) -> dict[str, dict[str, object]]:
        """Per device class: seconds by stage, GPU-hours (per 10k accepted) and money."""
        out: dict[str, dict[str, object]] = {}
        for dev in sorted(self.seconds_by_device):
            secs = self.seconds_by_device[dev]
            hours = secs / 3600
            price = self.prices.get(dev, self.price_per_hour)
            per10k = hours / self.accepted * 10_000 if self.accepted else None
            stages = self.seconds_by_class_stage.get(dev, {})
            out[dev] = {
                "device_seconds": {s.value: stages[s] for s in Stage if s in stages},
                "gpu_hours": hours,
                "gpu_hours_per_10k_accepted": per10k,
                "price_per_hour": price,
                "cost": None if price is None else hours * price,
                "cost_per_10k_accepted": None
                if price is None or per10k is None
                else per10k * price,
            }
        return out

    def to_dict(self) -> dict[str, object]:
        """A JSON-ready summary."""
        return {
            "device_seconds": {s.value: self.seconds.get(s, 0.0) for s in Stage},
            "device_seconds_by_device": dict(self.seconds_by_device),
            "gpu_hours": self.gpu_hours(),
            "accepted": self.accepted,
            "gpu_hours_per_10k_accepted": self.per_10k_accepted_hours(),
            "price_per_hour": self.price_per_hour,
            "cost": self.cost(),
            "cost_per_10k_accepted": self.cost_per_10k_accepted(),
            "by_device_class": self.by_device_class(),
        }


@dataclass(slots=True)
class Ledger:
    """Accumulates device-seconds per (stage, device class)."""

    entries: dict[tuple[Stage, str], float] = field(default_factory=dict)
    batch_seconds: float = 0.0
    batches: int = 0
    accepted: int = 0

    def book_batch(
        self, kind: BatchKind, attempts: Iterable[int], device_seconds: float, device_class: str
    ) -> None:
        """Book one batch of ``kind`` (``"render"`` or ``"score"``) whose items had ``attempts``."""
        for stage, seconds in stage_split(kind, attempts, device_seconds).items():
            self._add(stage, device_class, seconds)
        self.batch_seconds += device_seconds
        self.batches += 1

    def book(self, stage: Stage, device_class: str, device_seconds: float) -> None:
        """Book time directly to a stage (for restored ledgers and custom stages)."""
        self._add(stage, device_class, device_seconds)
        self.batch_seconds += device_seconds
        self.batches += 1

    def count_accepted(self, n: int = 1) -> None:
        """Count accepted images (the denominator of per-10k figures)."""
        self.accepted += n

    def _add(self, stage: Stage, device_class: str, seconds: float) -> None:
        k = (stage, device_class)
        self.entries[k] = self.entries.get(k, 0.0) + seconds

    def report(
        self, price_per_hour: float | None = None, prices: Mapping[str, float] | None = None
    ) -> LedgerReport:
        """Totals so far; ``prices``: a price per hour for each device class."""
        for price in (price_per_hour, *(prices or {}).values()):
            if price is not None and (not math.isfinite(price) or price < 0):
                raise ValueError(f"price per hour must be >= 0, got {price}")
        by_stage: dict[Stage, float] = {}
        by_device: dict[str, float] = {}
        by_both: dict[str, dict[Stage, float]] = {}
        for (stage, dev), secs in self.entries.items():
            by_stage[stage] = by_stage.get(stage, 0.0) + secs
            by_device[dev] = by_device.get(dev, 0.0) + secs
            cls = by_both.setdefault(dev, {})
            cls[stage] = cls.get(stage, 0.0) + secs
        return LedgerReport(
            seconds=by_stage,
            seconds_by_device=by_device,
            batch_seconds=self.batch_seconds,
            accepted=self.accepted,
            price_per_hour=price_per_hour,
            prices=dict(prices or {}),
            seconds_by_class_stage=by_both,
        )
