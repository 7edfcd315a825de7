"""Measure a model's batch latency and peak memory per batch size; write a profile file.

The measurement is generic: it times a ``run(n) -> device_seconds`` callable at batch
sizes 1, 2, 4, ... (in rounds over every size: warm-up rounds, then the median of timed
rounds) and reads a peak-memory probe after each run. ``renderq profile`` plugs in the
diffusers executor and the CLIP scorer, so the profile times exactly what ``renderq run``
executes. The result is a document in the schema ``renderq.core.cost.Profile.from_dict``
reads, with ``source.kind = measured``.
"""

from __future__ import annotations

import datetime as dt
import os
import platform
import resource
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from renderq.core.cost import GIB
from renderq.core.errors import ConfigError


@dataclass(frozen=True, slots=True)
class Point:
    """One measured batch size: median seconds, every repeat, and peak memory in bytes."""

    batch_size: int
    seconds: float
    repeats: tuple[float, ...]
    peak_bytes: float | None


def doubling_sizes(max_batch: int) -> list[int]:
    """1, 2, 4, ... up to ``max_batch`` (which is included even when not a power of two)."""
    if max_batch < 1:
        raise ConfigError(f"max batch size must be >= 1, got {max_batch}")
    sizes = [1]
    while sizes[-1] * 2 <= max_batch:
        sizes.append(sizes[-1] * 2)
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return sizes


def measure(
    run: Callable[[int], float],
    sizes: Sequence[int],
    *,
    repeats: int = 3,
    warmup: int = 1,
    peak_memory: Callable[[], float | None] = lambda: None,
    is_oom: Callable[[BaseException], bool] = lambda exc: False,
) -> list[Point]:
    """Time ``run`` at each size in rounds; the median of the timed rounds per size.

    Every round runs each size once (1, 2, 4, ..., then 1, 2, 4, ... again): ``warmup``
    untimed rounds, then ``repeats`` timed ones. Rounds rather than one size at a time,
    because a process speeds up over its first batches (allocator, caches) and a machine
    drifts: in rounds, both weigh on every size alike instead of on the first sizes
    measured. A size that runs out of memory ends the measurement there (it and larger
    sizes are dropped); at the smallest size that is an error. The peak-memory probe is
    read after every run, and each size keeps its largest reading.
    """
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    if warmup < 0:
        raise ConfigError(f"warm-up rounds must be >= 0, got {warmup}")
    live = list(sizes)
    times: dict[int, list[float]] = {n: [] for n in live}
    peaks: dict[int, float] = {}
    for round_ in range(warmup + repeats):
        for n in list(live):
            try:
                seconds = run(n)
            except Exception as exc:
                if is_oom(exc) and n != live[0]:
                    live = [m for m in live if m < n]
                    break
                raise
            if round_ >= warmup:
                times[n].append(seconds)
            peak = peak_memory()
            if peak is not None:
                peaks[n] = max(peaks.get(n, peak), peak)
    return [Point(n, statistics.median(times[n]), tuple(times[n]), peaks.get(n)) for n in live]


def fit_memory(points: Sequence[Point]) -> tuple[float, float] | None:
    """Least-squares ``base + per_image * n`` over the points' peaks (bytes), or None."""
    pts = [(p.batch_size, p.peak_bytes) for p in points if p.peak_bytes is not None]
    if len(pts) < 2:
        return None
    ns = [float(n) for n, _ in pts]
    ys = [float(y) for _, y in pts]
    mean_n, mean_y = statistics.fmean(ns), statistics.fmean(ys)
    var = sum((n - mean_n) ** 2 for n in ns)
    slope = sum((n - mean_n) * (y - mean_y) for n, y in zip(ns, ys, strict=True)) / var
    # A flat or falling curve (allocator caching, a small model) still needs a positive
    # slope for the memory model; a tiny one keeps the cap at what was measured.
    slope = max(slope, 1.0)
    return max(0.0, mean_y - slope * mean_n), slope


def cpu_peak_rss() -> float:
    """This process's peak resident memory so far, in bytes (Linux reports KiB)."""
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def host_memory_bytes() -> float:
    """Physical memory of this machine."""
    return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def profile_document(
    *,
    name: str,
    model: str,
    device_class: str,
    precision: str,
    resolution: tuple[int, int],
    steps: int,
    device_memory_bytes: float,
    render: Sequence[Point],
    score: Sequence[Point],
    environment: str,
) -> dict[str, Any]:
    """The profile file's content for measured points."""
    doc: dict[str, Any] = {
        "name": name,
        "model": model,
        "device_class": device_class,
        "precision": precision,
        "resolution": list(resolution),
        "steps": steps,
        "device_memory_gib": device_memory_bytes / GIB,
        "source": {
            "kind": "measured",
            "reference": f"renderq profile, {dt.date.today().isoformat()}",
            "note": f"median of repeats after warm-up; {environment}",
        },
        "render": _stage_doc(render),
        "score": _stage_doc(score),
    }
    return doc


def _stage_doc(points: Sequence[Point]) -> dict[str, Any]:
    out: dict[str, Any] = {
        "points": [[p.batch_size, round(p.seconds, 6)] for p in points],
        "repeats": {str(p.batch_size): [round(t, 6) for t in p.repeats] for p in points},
    }
    fit = fit_memory(points)
    if fit is not None:
        out["memory_gib"] = {"base": fit[0] / GIB, "per_image": fit[1] / GIB}
    return out


def environment_line(device: str, extra: str = "") -> str:
    """Where the numbers were taken: machine, Python and library versions."""
    parts = [
        f"device {device}",
        f"{platform.machine()} {os.cpu_count()} cores",
        f"Python {platform.python_version()}",
    ]
    return ", ".join(parts) + (f", {extra}" if extra else "")
