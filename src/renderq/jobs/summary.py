"""Progress counters while a job runs, and the summary it ends with."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from renderq.core.ledger import LedgerReport
from renderq.store.sqlite import JobStore


@dataclass(slots=True)
class Progress:
    """Live counts of one run; ``accepted`` and ``escalated`` include earlier runs.

    ``regenerating`` holds the prompts whose retry is queued or rendering now.
    """

    total: int
    accepted: int = 0
    escalated: int = 0
    rendered: int = 0
    regenerating: set[str] = field(default_factory=set)
    started: float = field(default_factory=time.monotonic)
    accepted_at_start: int = -1

    def __post_init__(self) -> None:
        if self.accepted_at_start < 0:
            self.accepted_at_start = self.accepted

    @property
    def done(self) -> int:
        """Prompts in a terminal state."""
        return self.accepted + self.escalated

    def images_per_s(self) -> float:
        """Images rendered per wall-clock second in this run."""
        elapsed = time.monotonic() - self.started
        return self.rendered / elapsed if elapsed > 0 else 0.0

    def eta_s(self) -> float | None:
        """Seconds until every prompt is terminal, at this run's pace so far."""
        finished = self.done - self.accepted_at_start
        elapsed = time.monotonic() - self.started
        if finished <= 0 or elapsed <= 0:
            return None
        return (self.total - self.done) * elapsed / finished


INFLATED_BELOW = 0.6
"""A CPU share below this marks the run's device time as inflated (see ``inflation_note``)."""


@dataclass(frozen=True, slots=True)
class RunSummary:
    """What ``renderq run`` prints at the end (``--json`` prints :meth:`to_dict`)."""

    mode: str
    out: str
    prompts: int
    accepted: int
    escalated: int
    pending: int
    submitted: int
    batches: int
    mean_batch_size: float
    wall_s: float
    runs: int
    ledger: LedgerReport
    #: CPU devices: the share of the measured device time torch's threads really ran,
    #: and their count. None on CUDA or when nothing was measured.
    cpu_share: float | None = None
    threads: int | None = None

    def inflation_note(self) -> str | None:
        """A warning when the booked CPU device time looks inflated by other processes."""
        if self.cpu_share is None or self.cpu_share >= INFLATED_BELOW:
            return None
        return (
            f"device time looks inflated: torch's {self.threads} CPU thread(s) ran "
            f"{100 * self.cpu_share:.0f}% of the measured time (other processes compete for "
            "the cores), and the ledger books the waiting too; try fewer --threads"
        )

    def device_seconds_per_accepted(self) -> float | None:
        """All booked device-seconds (renders, regenerations and scoring) per accepted image."""
        if self.accepted == 0:
            return None
        return self.ledger.total_seconds / self.accepted

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready summary."""
        hours = self.ledger.gpu_hours()
        return {
            "mode": self.mode,
            "out": self.out,
            "prompts": self.prompts,
            "accepted": self.accepted,
            "escalated": self.escalated,
            "pending": self.pending,
            "submitted_this_run": self.submitted,
            "runs": self.runs,
            "batches_this_run": self.batches,
            "mean_batch_size": self.mean_batch_size,
            "wall_s": self.wall_s,
            "gpu_hours": hours,
            "device_seconds": {k: v * 3600 for k, v in hours.items()},
            "gpu_hours_per_10k_accepted": self.ledger.per_10k_accepted_hours(),
            "cost_per_10k_accepted": self.ledger.cost_per_10k_accepted(),
            "by_device_class": self.ledger.by_device_class(),
            "device_seconds_per_accepted": self.device_seconds_per_accepted(),
            "cpu_share": self.cpu_share,
            "threads": self.threads,
            "inflation_note": self.inflation_note(),
        }


def summarise(
    mode: str,
    out: str,
    store: JobStore,
    report: LedgerReport,
    batches: tuple[int, float],
    wall_s: float,
    *,
    submitted: int,
    cpu_share: float | None = None,
    threads: int | None = None,
) -> RunSummary:
    """The summary of a finished run, from the store (whole job) and this run's batches
    (``batches``: how many, and their mean size)."""
    counts = store.counts()
    return RunSummary(
        mode=mode,
        out=out,
        prompts=sum(counts.values()),
        accepted=counts.get("accepted", 0),
        # A prompt a reviewer rejected or edited escalated first; it counts as escalated.
        escalated=sum(counts.get(s, 0) for s in ("escalated", "rejected", "edited")),
        pending=counts.get("pending", 0),
        submitted=submitted,
        batches=batches[0],
        mean_batch_size=batches[1],
        wall_s=wall_s,
        runs=store.runs(),
        ledger=report,
        cpu_share=cpu_share,
        threads=threads,
    )
