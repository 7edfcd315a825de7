"""How much the scorer slows render batches inside the real-time engine, on one machine.

Runs the same offline window-mode scenario through the real engine twice per repeat,
alternating: once with the real CLIP scorer, once with a scorer that answers at once
(every image passes). It prints, per run, each full batch's render time as a ratio of
the shipped ``mini-sd-cpu`` profile's latency for that size, and the mean. Render
device-seconds are measured inside the executor, so the ratio isolates how much the
scorer's work elsewhere in the process slows rendering; the profile is only a common
yardstick (its absolute level moves with the machine).

Run: ``python bench/scorer_interference.py [--repeats 2] [--requests 48]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from importlib import resources
from typing import Any

from renderq.bench.harness import Scenario
from renderq.bench.realrun import RealSettings, load_bench
from renderq.core.cost import Profile
from renderq.core.policies import Window, Windows
from renderq.core.types import ScoreResult


class InstantScorer:
    """Passes every image at once, on the renderer's device class."""

    def __init__(self, device_class: str) -> None:
        self.device_class = device_class

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        return ScoreResult(tuple(1.0 for _ in images), 0.0, self.device_class)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--batch", type=int, default=16)
    args = ap.parse_args()
    text = resources.files("renderq").joinpath("profiles/mini-sd-cpu.json").read_text()
    profile = Profile.from_dict(json.loads(text))
    # A threshold every image clears: both runs render exactly the same batches.
    bench, _ = load_bench(
        RealSettings("embedded:mini-sd", "embedded:clip", threshold=-2.0), profile
    )
    scorers = {"clip": bench.scorer, "instant": InstantScorer(bench.scorer.device_class)}
    means: dict[str, list[float]] = {name: [] for name in scorers}
    for _ in range(args.repeats):
        for name, scorer in scorers.items():
            bench.scorer = scorer
            bench.run(Window(Windows(), args.batch), Scenario("offline", args.requests))
            assert bench.last is not None
            ratios = [
                s / profile.render.latency(n) for n, s in bench.last.batches if n == args.batch
            ]
            means[name].append(statistics.fmean(ratios))
            shown = ", ".join(f"{r:.3f}" for r in ratios)
            print(f"{name:8s} full batches / profile: mean {means[name][-1]:.3f} ({shown})")
    clip, instant = statistics.fmean(means["clip"]), statistics.fmean(means["instant"])
    print(f"mean over runs: clip {clip:.3f}, instant {instant:.3f}, ratio {clip / instant:.3f}")


if __name__ == "__main__":
    main()
