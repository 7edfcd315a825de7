"""Progress of ``renderq run`` on stderr: a bar on a terminal, a line every few seconds elsewhere.

Without a terminal (CI, ``nohup``, a pipe) a redrawn bar shows nothing until the end, so
one plain line is printed every ``every_s`` seconds instead. Both read the job's
counters (:class:`renderq.jobs.summary.Progress`) and nothing else.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO, Any

from renderq.jobs.summary import Progress


def detail(p: Progress) -> str:
    """The counters in a few words (fits an 80-column terminal beside a short bar)."""
    eta = p.eta_s()
    return (
        f"ok {p.accepted} regen {len(p.regenerating)} esc {p.escalated} "
        f"{p.images_per_s():.2f} img/s ETA {'?' if eta is None else f'{eta:.0f}s'}"
    )


class ProgressBar:
    """A rich progress bar on stderr, redrawn on every update."""

    def __init__(self, console: Any = None) -> None:
        """Draw on ``console`` (default: a rich console on stderr)."""
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
        from rich.progress import Progress as RichProgress

        self._progress = RichProgress(
            TextColumn("[bold]renderq"),
            BarColumn(bar_width=20),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}"),
            console=console or Console(stderr=True),
        )
        self._task: Any = None

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        return self

    def update(self, p: Progress) -> None:
        """Redraw from the job's counters."""
        if self._task is None:
            self._task = self._progress.add_task("run", total=p.total, detail=detail(p))
        self._progress.update(self._task, completed=p.done, detail=detail(p))

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()


class ProgressLines:
    """One plain line at most every ``every_s`` seconds (the first after ``every_s``)."""

    def __init__(
        self,
        every_s: float = 5.0,
        stream: IO[str] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Write to ``stream`` (default: stderr) on ``clock``."""
        self.every_s = every_s
        self.stream = stream
        self.clock = clock
        self._last = clock()

    def __enter__(self) -> ProgressLines:
        return self

    def update(self, p: Progress) -> None:
        """Print a line if ``every_s`` has passed since the last one."""
        now = self.clock()
        if now - self._last < self.every_s:
            return
        self._last = now
        stream = self.stream or sys.stderr
        stream.write(f"renderq {p.done}/{p.total} done, {detail(p)}\n")
        stream.flush()

    def __exit__(self, *exc: object) -> None:
        return None


def progress_for(terminal: bool) -> ProgressBar | ProgressLines:
    """A bar on a terminal, lines elsewhere."""
    return ProgressBar() if terminal else ProgressLines()
