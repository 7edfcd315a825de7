"""A fair order across batch keys: start-time fair queuing in device-seconds, by turns.

Keys of the same priority compete for one device class's workers. Served oldest head
first, a rare key's request waits behind a popular key's whole backlog (first in, first
out across keys); served by fair share, it waits for about one turn of each other key.
Each key (a *lane* of the scheduler) carries the device time its batches were charged so
far; the next batch goes to the lane charged least. A lane that had no work starts at the
class's current virtual time, so idle time earns no credit to spend later in a burst.

A batch is charged what the cost model says it takes (its latency, or its size in images
where no cost model is known) plus, where the device holds another key's LoRA adapter,
the switch (``StageCost.switch_s``). A turn lasts one batch, or, where switching costs
time, until the lane has been charged ``switch_s / MAX_SWITCH_SHARE`` seconds: switching
then takes at most that share of the device, and fairness holds over turns.

Pure and clock-free like the rest of the core: the scheduler calls :meth:`activate` when a
lane gets work, :meth:`rank` to order candidates and :meth:`charge` for each batch it cuts.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

MAX_SWITCH_SHARE = 0.1
"""The largest share of a device that switching between keys' adapters may take."""

L = TypeVar("L", bound=Hashable)


class FairShare(Generic[L]):
    """Virtual device time per lane and per device class (see the module docstring)."""

    def __init__(self) -> None:
        self._served: dict[L, float] = {}
        self._now: dict[str, float] = {}  # per device class: the largest start tag cut
        self._turn: dict[str, tuple[L, float]] = {}  # per device class: (lane, charged at start)

    def served(self, lane: L) -> float:
        """The device-seconds charged to ``lane`` (in virtual time)."""
        return self._served.get(lane, 0.0)

    def activate(self, lane: L, device_class: str) -> None:
        """``lane`` had no queued work and has some now: it starts no earlier than the class."""
        self._served[lane] = max(self.served(lane), self._now.get(device_class, 0.0))

    def rank(self, lane: L, device_class: str, quantum_s: float) -> tuple[int, float]:
        """Sort key among candidates of equal priority (lowest goes first).

        The lane whose turn it is keeps it while it has been charged less than
        ``quantum_s`` in this turn; otherwise the lane charged least goes first.
        """
        turn = self._turn.get(device_class)
        if turn is not None and turn[0] == lane and self.served(lane) - turn[1] < quantum_s:
            return (0, 0.0)
        return (1, self.served(lane))

    def charge(self, lane: L, device_class: str, seconds: float) -> None:
        """A batch of ``lane`` was cut, expected to take ``seconds`` of the device."""
        start = self.served(lane)
        self._now[device_class] = max(self._now.get(device_class, 0.0), start)
        turn = self._turn.get(device_class)
        if turn is None or turn[0] != lane:
            self._turn[device_class] = (lane, start)
        self._served[lane] = start + seconds
