"""Step mode against dynamic batching in the simulator, on the same Poisson trace.

For each load (a fraction of the whole-batch capacity, the best images per second over the
profile's batch sizes) it simulates dynamic batching at every max-queue-delay setting and
keeps the one with the lowest p99, then step mode on the same arrivals, and prints p50,
p99 and device-seconds per image of both. The quality gate is off in both (render latency
only). Every request renders the profile's steps, or with ``--step-mix 10,20,30`` the
counts by turns (in dynamic mode each count is a batch key of its own; in step mode they
share the running batch); the load is then against the capacity at their mean. Dynamic
mode's scheduler is unpriced, as in ``renderq bench``: its keys take equal turns (fair
share by device time would hold the 30-step key back and lengthen dynamic's tail).

Step costs come from ``--step-profile`` (a file written by ``renderq profile
--step-level``) or, without one, from the whole-batch profile (render latency / steps).
``--flat`` replaces the render curve with a GPU-like one whose cost does not grow with
batch size (every size costs what batch 1 costs), for both modes.

Run: ``python benchmarks/step_sim.py [--profile mini-sd-cpu] [--flat] [--requests 2000]
[--step-mix 10,20,30]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
from pathlib import Path

from renderq.core.cost import LatencyCurve, Profile, StageCost
from renderq.core.policies import Dynamic
from renderq.core.settings import QASettings
from renderq.core.step import StepCost
from renderq.core.types import Request
from renderq.profiles import load_profile
from renderq.runtime.arrivals import arrivals
from renderq.runtime.sim import SimConfig, profile_key, simulate
from renderq.runtime.stepsim import simulate_step

DELAYS = (0.0, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0)


def flat(profile: Profile) -> Profile:
    """The profile with a render cost that is the same at every batch size."""
    curve = profile.render.curve
    same = LatencyCurve(curve.sizes, tuple(curve.seconds[0] for _ in curve.sizes))
    return dataclasses.replace(profile, render=StageCost(same, profile.render.memory))


def capacity(profile: Profile) -> float:
    """Whole-batch images per second at the best batch size."""
    curve = profile.render.curve
    return max(n / s for n, s in zip(curve.sizes, curve.seconds, strict=True))


def main() -> None:
    """Print the comparison table (and JSON with ``--json``)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="mini-sd-cpu")
    ap.add_argument("--step-profile", type=Path, default=None)
    ap.add_argument("--flat", action="store_true")
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--loads", default="0.5,0.8")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--step-mix", default="")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    mix = [int(x) for x in args.step_mix.split(",") if x]
    profile = load_profile(args.profile)
    if args.flat:
        profile = flat(profile)
    if args.step_profile is not None:
        cost = StepCost.from_dict(json.loads(args.step_profile.read_text()))
    else:
        cost = StepCost.from_profile(profile)
    cap = min(profile.render_cap, cost.cap)
    rows = []
    for load in (float(x) for x in args.loads.split(",")):
        mean_steps = sum(mix) / len(mix) if mix else profile.steps
        rate = load * capacity(profile) * profile.steps / mean_steps
        trace = arrivals(f"poisson:{rate}", args.requests, random.Random(args.seed))
        if mix:
            trace = [dataclasses.replace(a, steps=mix[i % len(mix)]) for i, a in enumerate(trace)]
        best = None
        for delay in DELAYS:
            cfg = SimConfig(
                profile,
                tuple(trace),
                failure_rate=0.0,
                qa=QASettings(enabled=False),
                seed=args.seed,
                priced=False,  # as `renderq bench` runs dynamic: a step mix's keys take turns
            )
            res = simulate(Dynamic(delay, cap), cfg)
            p99 = res.percentile(99) or 0.0
            per_image = res.ledger.total_seconds / max(1, len(res.latencies))
            if best is None or p99 < best[1]:
                best = (delay, p99, res.percentile(50) or 0.0, per_image)
        key = profile_key(profile)
        keys = [dataclasses.replace(key, steps=a.steps or key.steps) for a in trace]
        reqs = [
            Request(f"r{i:07d}", f"prompt {i}", k, base_seed=i, arrival=a.t)
            for i, (a, k) in enumerate(zip(trace, keys, strict=True))
        ]
        step = simulate_step(cost, reqs, cap=cap)
        assert best is not None
        rows.append(
            {
                "load": load,
                "rate_per_s": rate,
                "dynamic": {
                    "max_queue_delay_s": best[0],
                    "p50": best[2],
                    "p99": best[1],
                    "device_s_per_image": best[3],
                },
                "step": {
                    "p50": step.percentile(50),
                    "p99": step.percentile(99),
                    "device_s_per_image": step.seconds_per_image,
                    "mean_running": step.mean_running,
                },
            }
        )
    if args.json:
        print(json.dumps({"profile": profile.name, "flat": args.flat, "cost": cost.source,
                          "step_mix": mix, "rows": rows}, indent=2))  # fmt: skip
        return
    print(f"profile {profile.name}{' (flat)' if args.flat else ''}; step cost: {cost.source}"
          f"{f'; steps by turns {mix}' if mix else ''}")  # fmt: skip
    print("load  rate/s   dyn delay  dyn p50  dyn p99  dyn s/img | step p50 step p99 step s/img"
          "  p99 change  s/img change")  # fmt: skip
    for r in rows:
        d, s = r["dynamic"], r["step"]
        print(
            f"{r['load']:.2f} {r['rate_per_s']:7.3f} {d['max_queue_delay_s']:9.2f} "
            f"{d['p50']:8.3f} {d['p99']:8.3f} {d['device_s_per_image']:9.4f} | "
            f"{s['p50']:8.3f} {s['p99']:8.3f} {s['device_s_per_image']:10.4f}  "
            f"{(s['p99'] / d['p99'] - 1) * 100:+9.1f}%  "
            f"{(s['device_s_per_image'] / d['device_s_per_image'] - 1) * 100:+10.1f}%"
        )


if __name__ == "__main__":
    main()
