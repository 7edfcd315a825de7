"""Render batches inside the running engine against the same batches run directly.

In one process, alternating: full batches of the embedded mini-SD run directly through
the executor (no engine, no scorer), then an offline window-mode run through the real
engine with a scorer that answers at once (every image passes), then one with the real
CLIP scorer. It prints each full batch's render time, the median per variant, and each
median as a ratio of the direct one: 1.0 means the engine and the QA loop cost render
batches nothing. Alternating cancels the machine's slow drift; the medians absorb its
batch-to-batch jitter.

``--without-device-thread`` measures the engine as it was before CPU devices got their
own thread: the models load on the main thread, render on the engine's render worker and
score on its score worker, each thread with its own OpenMP team.

Run: ``python benchmarks/engine_batches.py [--repeats 3] [--requests 48] [--batch 16]
[--without-device-thread]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from importlib import resources
from itertools import count
from typing import Any

from renderq.backends import device
from renderq.backends.device import DeviceThread
from renderq.bench.harness import Scenario
from renderq.bench.real import RealBench
from renderq.bench.realrun import RealSettings, load_bench
from renderq.core.cost import Profile
from renderq.core.policies import Window, Windows
from renderq.core.settings import QASettings
from renderq.core.types import ScoreResult


class InstantScorer:
    """Passes every image at once, on the renderer's device class."""

    def __init__(self, device_class: str) -> None:
        self.device_class = device_class

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        return ScoreResult(tuple(1.0 for _ in images), 0.0, self.device_class)


def _no_thread(device: str) -> DeviceThread | None:
    """In place of ``device_thread``: every call runs on the thread that makes it."""
    return None


def in_engine(bench: RealBench, scorer: Any, batch: int, requests: int) -> list[float]:
    """Render-seconds of the full batches of one offline window run through the engine."""
    bench.scorer = scorer
    bench.run(Window(Windows(), batch), Scenario("offline", requests))
    assert bench.last is not None
    return [s for n, s in bench.last.batches if n == batch]


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--without-device-thread", action="store_true")
    args = ap.parse_args()
    if args.without_device_thread:
        device.device_thread = _no_thread
    text = resources.files("renderq").joinpath("profiles/mini-sd-cpu.json").read_text()
    profile = Profile.from_dict(json.loads(text))
    # A threshold every image clears: every variant renders the same full batches.
    bench, _ = load_bench(RealSettings(qa=QASettings(-2.0)), profile)
    clip = bench.scorer
    firsts = count(10_000, 1_000)
    full = args.requests // args.batch
    variants: dict[str, Callable[[], list[float]]] = {
        "direct": lambda: bench.direct_batches(args.batch, full, next(firsts)),
        "instant": lambda: in_engine(
            bench, InstantScorer(clip.device_class), args.batch, args.requests
        ),
        "clip": lambda: in_engine(bench, clip, args.batch, args.requests),
    }
    variants["direct"]()  # warm-up: the first batches of a process run slower
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(args.repeats):
        for name, run in variants.items():
            got = run()
            times[name] += got
            print(
                f"{name:8s} batch of {args.batch}: " + ", ".join(f"{t:.3f}" for t in got),
                flush=True,
            )
    base = statistics.median(times["direct"])
    for name, got in times.items():
        med = statistics.median(got)
        print(f"median {name:8s} {med:.3f} s ({len(got)} batches), {med / base:.3f} of direct")


if __name__ == "__main__":
    main()
