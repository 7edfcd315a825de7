"""Scheduled windows: when the offline window mode may render.

A value type of its own, below the policies and the request types that both use it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from renderq.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Windows:
    """When scheduled windows are open: an explicit list, or a cadence.

    Explicit windows are half-open ``[start, end)`` intervals. A cadence opens a window of
    ``length`` every ``period`` seconds starting at ``offset``; ``length=inf`` with
    ``period=inf`` is one window that never closes.
    """

    explicit: tuple[tuple[float, float], ...] = ()
    period: float = math.inf
    length: float = math.inf
    offset: float = 0.0

    def __post_init__(self) -> None:
        for start, end in self.explicit:
            if not end > start:
                raise ConfigError(f"window end must be after its start, got [{start}, {end})")
        if self.explicit:
            ordered = sorted(self.explicit)
            for (_, e0), (s1, _) in itertools.pairwise(ordered):
                if s1 < e0:
                    raise ConfigError(f"windows overlap: {ordered}")
            object.__setattr__(self, "explicit", tuple(ordered))
        elif not (self.period > 0 and self.length > 0 and self.length <= self.period):
            raise ConfigError(
                f"window cadence needs 0 < length <= period, got length={self.length}, "
                f"period={self.period}"
            )

    @classmethod
    def parse(cls, text: str) -> Windows:
        """``"always"``, ``"every=3600,length=600[,offset=0]"`` or ``"0-600,3600-4200"``."""
        text = text.strip()
        if text == "always":
            return cls()
        try:
            if text.startswith("every="):
                parts = dict(p.split("=", 1) for p in text.split(","))
                return cls(
                    period=float(parts.pop("every")),
                    length=float(parts.pop("length")),
                    offset=float(parts.pop("offset", "0")),
                )
            spans = [tuple(float(v) for v in p.split("-", 1)) for p in text.split(",")]
            return cls(explicit=tuple((s[0], s[1]) for s in spans))
        except (ValueError, KeyError, IndexError):
            raise ConfigError(
                f"cannot parse windows {text!r}: use 'always', 'every=P,length=L' or 'S-E,...'"
            ) from None

    def shifted(self, delta: float) -> Windows:
        """The same windows on a clock ``delta`` seconds ahead (for example from Unix time
        to a service's monotonic clock: ``delta = monotonic_now - unix_now``)."""
        if self.explicit:
            return Windows(explicit=tuple((s + delta, e + delta) for s, e in self.explicit))
        return Windows(period=self.period, length=self.length, offset=self.offset + delta)

    def active(self, now: float) -> tuple[float, float] | None:
        """The window containing ``now``, or None."""
        if self.explicit:
            for start, end in self.explicit:
                if start <= now < end:
                    return (start, end)
            return None
        if now < self.offset:
            return None
        if math.isinf(self.period):
            return (self.offset, self.offset + self.length)
        start = self.offset + math.floor((now - self.offset) / self.period) * self.period
        return (start, start + self.length) if now < start + self.length else None

    def next_start(self, now: float) -> float | None:
        """Start of the first window opening after ``now``, or None."""
        if self.explicit:
            return next((s for s, _ in self.explicit if s > now), None)
        if now < self.offset:
            return self.offset
        if math.isinf(self.period):
            return None
        return self.offset + (math.floor((now - self.offset) / self.period) + 1) * self.period
