"""Two LoRA adapters on one device in the simulator: fair share against first in, first out.

A popular adapter and a rare one share one render worker (the real scheduler on a virtual
clock, render costs from a profile, each adapter switch costing ``--switch-s``, as
measured by ``renderq profile --lora``). Two traces:

- ``poisson``: Poisson arrivals at ``--load`` times the profile's capacity, a ``--rare``
  share of them for the rare adapter;
- ``backlog``: a bulk job of the popular adapter queued at t=0 (``--backlog`` requests)
  while the rare adapter's requests trickle in (Poisson, ``--rare-rate`` per second).

``--measure-switch`` first measures the switch on the embedded mini-SD: two seeded random
rank-8 LoRA adapters for its UNet, loaded once, switched round them and none
(``renderq.bench.model_profile.measure_switches``, as ``renderq profile --lora`` does), and
a batch of 8 timed with an adapter active against one with none (``measure_adapter_factor``,
the profile's ``render.adapter_factor``); the simulation then prices both, and offers
load against the capacity with an adapter active (every request here names one).

Each trace runs twice on the same arrivals: keys of equal priority ordered by fair share
(renderq's order, ``core.fairness``) and oldest head first (first in, first out across
keys). Printed per run and adapter: p50 and p99 latency, and for the run the adapter
switches and the share of device time they took. The gate is off (latency only).

Run: ``python benchmarks/adapter_fairness.py [--measure-switch | --switch-s 0.02
--adapter-factor 1.28] [--profile mini-sd-cpu] [--load 0.9] [--requests 3000] [--json]``.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import random
from typing import Any

from renderq.core.policies import Dynamic
from renderq.core.settings import QASettings
from renderq.core.stats import percentile
from renderq.profiles import load_profile
from renderq.runtime.arrivals import Arrival, arrivals
from renderq.runtime.sim import SimConfig, SimResult, simulate

ADAPTERS = ("popular", "rare")


def poisson_trace(rate: float, n: int, rare: float, rng: random.Random) -> list[Arrival]:
    """``n`` Poisson arrivals, each for the rare adapter with probability ``rare``."""
    return [
        dataclasses.replace(a, lora="rare" if rng.random() < rare else "popular")
        for a in arrivals(f"poisson:{rate}", n, rng)
    ]


def backlog_trace(backlog: int, rare_rate: float, rare_n: int, rng: random.Random) -> list[Arrival]:
    """A popular bulk backlog at t=0 and rare requests trickling in."""
    bulk = [Arrival(0.0, lora="popular") for _ in range(backlog)]
    trickle = [
        dataclasses.replace(a, lora="rare") for a in arrivals(f"poisson:{rare_rate}", rare_n, rng)
    ]
    return sorted(bulk + trickle, key=lambda a: a.t)


def measure_switch(repeats: int = 5) -> dict[str, float]:
    """The embedded mini-SD's adapter switch and its render time with and without one."""
    import statistics
    import tempfile
    from pathlib import Path

    from renderq.backends.diffusers import DiffusersExecutor, set_cpu_threads
    from renderq.backends.registry import model_defaults, resolve
    from renderq.bench.model_profile import measure_adapter_factor, measure_switches
    from renderq.core.settings import key_for
    from renderq.core.types import Batch, Request
    from renderq.testing.tiny import build_tiny_lora

    set_cpu_threads(0)
    model = "embedded:mini-sd"
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(resolve(model))
        paths = {
            n: str(build_tiny_lora(Path(tmp) / n, folder, seed=i, rank=8))
            for i, n in enumerate(("a", "b"))
        }
        ex = DiffusersExecutor.load(str(folder), name=model, adapters=paths)
        switches = measure_switches(ex, repeats=repeats, warmup=2)
        steps, guidance = model_defaults(model)
        w, h = ex.default_size()

        def render(n: int, adapter: str) -> float:
            key = key_for(model, w, h, steps, guidance, ex.sampler, "fp32", "cpu")
            key = dataclasses.replace(key, adapter=adapter)
            reqs = tuple(Request(f"r{i}", "a red circle", key, base_seed=i) for i in range(n))
            return ex.run(Batch(0, key, reqs, 0.0, n)).device_seconds

        # As renderq profile --lora measures it: rounds of none, each adapter, none.
        factors = measure_adapter_factor(render, 8, sorted(paths), repeats)
    return {
        "switch_s": statistics.median(switches),
        "adapter_factor": statistics.median(factors),
        "adapter_factor_min": min(factors),
        "adapter_factor_max": max(factors),
    }


def summarise(res: SimResult, trace: list[Arrival], switch_s: float) -> dict[str, Any]:
    """Latency per adapter, and the switches the render batches needed."""
    adapter = {f"r{i:07d}": a.lora for i, a in enumerate(trace)}
    out: dict[str, Any] = {}
    for name in ADAPTERS:
        lat = [t for rid, t in zip(res.ids, res.latencies, strict=True) if adapter[rid] == name]
        out[name] = {"n": len(lat), "p50_s": percentile(lat, 50), "p99_s": percentile(lat, 99)}
    order = [adapter[batch[0][0]] for stage, batch in res.log if stage == "render"]
    switches = sum(1 for a, b in itertools.pairwise(order) if a != b) + bool(order)
    device = res.ledger.total_seconds
    out["batches"] = len(order)
    out["switches"] = switches
    out["switch_share"] = switches * switch_s / device if device else 0.0
    out["makespan_s"] = res.makespan_s
    return out


def main() -> None:
    """Print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--profile", default="mini-sd-cpu")
    ap.add_argument("--switch-s", type=float, default=0.02)
    ap.add_argument("--adapter-factor", type=float, default=1.0)
    ap.add_argument("--measure-switch", action="store_true")
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--rare", type=float, default=0.05)
    ap.add_argument("--backlog", type=int, default=2000)
    ap.add_argument("--rare-rate", type=float, default=0.5)
    ap.add_argument("--max-queue-delay", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    measured = measure_switch() if args.measure_switch else None
    if measured is not None:
        args.switch_s, args.adapter_factor = measured["switch_s"], measured["adapter_factor"]
    base = load_profile(args.profile)
    render = dataclasses.replace(
        base.render, switch_s=args.switch_s, adapter_factor=args.adapter_factor
    )
    profile = dataclasses.replace(base, render=render)
    curve = render.for_adapter("any").curve  # every request here names an adapter
    capacity = max(n / s for n, s in zip(curve.sizes, curve.seconds, strict=True))
    traces = {
        "poisson": poisson_trace(
            args.load * capacity, args.requests, args.rare, random.Random(args.seed)
        ),
        "backlog": backlog_trace(
            args.backlog, args.rare_rate, max(1, args.backlog // 20), random.Random(args.seed)
        ),
    }
    policy = Dynamic(args.max_queue_delay, profile.render_cap)
    rows = []
    for name, trace in traces.items():
        for fair in (True, False):
            cfg = SimConfig(
                profile, tuple(trace), failure_rate=0.0, qa=QASettings(enabled=False),
                seed=args.seed, fair_share=fair,
            )  # fmt: skip
            res = simulate(policy, cfg)
            rows.append({"trace": name, "order": "fair share" if fair else "oldest first",
                         **summarise(res, trace, args.switch_s)})  # fmt: skip
    if args.json:
        print(json.dumps({"profile": profile.name, "switch_s": args.switch_s,
                          "adapter_factor": args.adapter_factor,
                          "measured": measured, "capacity_per_s": capacity, "rows": rows},
                         indent=2))  # fmt: skip
        return
    if measured is not None:
        print(f"embedded mini-SD, two rank-8 LoRA adapters: switch {measured['switch_s']:.4f} s "
              f"(median); a batch of 8 with an adapter takes {measured['adapter_factor']:.3f}x "
              f"one without (rounds {measured['adapter_factor_min']:.3f}-"
              f"{measured['adapter_factor_max']:.3f})")  # fmt: skip
    print(f"profile {profile.name}: capacity {capacity:.2f} images/s, switch {args.switch_s} s; "
          f"poisson at {args.load}x with {args.rare:.0%} rare; backlog {args.backlog} popular "
          f"at t=0, rare at {args.rare_rate}/s")  # fmt: skip
    print("| trace | order | popular p50 s | popular p99 s | rare p50 s | rare p99 s | "
          "batches | switches | switch share |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        p, q = r["popular"], r["rare"]
        print(f"| {r['trace']} | {r['order']} | {p['p50_s']:.2f} | {p['p99_s']:.2f} | "
              f"{q['p50_s']:.2f} | {q['p99_s']:.2f} | {r['batches']} | {r['switches']} | "
              f"{r['switch_share']:.1%} |")  # fmt: skip


if __name__ == "__main__":
    main()
