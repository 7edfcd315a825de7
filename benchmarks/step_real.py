"""A real step-mode run on the embedded model, beside the simulator's replay of it.

It loads the model, measures a step profile (seconds per step by running-batch size, a
prepare, a decode batch; ``renderq profile --step-level``'s measurement), draws a Poisson
trace at ``--load`` times the capacity that profile implies, runs the trace for real
through the step loop that ``--mode step`` renders with (``StepLoop``: each request handed
to it as it arrives), then replays the same
trace in the step simulator on the measured profile, and prints p50, p99 and
device-seconds per image of both. Step counts are drawn from ``--steps`` per request.

Run: ``python benchmarks/step_real.py [--requests 40] [--load 0.5] [--steps 10,20,30]``.
"""

from __future__ import annotations

import argparse
import random
import time

from renderq.backends.diffusers import free_cores, import_torch, quiet_libraries
from renderq.backends.registry import DEFAULT_MODEL, resolve
from renderq.backends.step import StepExecutor
from renderq.backends.step_loop import StepLoop
from renderq.bench.model_profile import PROMPTS, ProfileSettings
from renderq.bench.step_profile import profile_loaded_steps
from renderq.core.settings import ModelSpec, key_for
from renderq.core.step import StepCost
from renderq.core.types import Request
from renderq.runtime.stepsim import StepSimResult, simulate_step


def capacity(cost: StepCost, steps: float, cap: int) -> float:
    """Images per second at the best running-batch size, for a mean step count."""
    return max(
        n / (steps * cost.step.latency(n) + n * cost.prepare_s + cost.decode_s(n))
        for n in range(1, cap + 1)
    )


def run_loop(ex: StepExecutor, reqs: list[Request], cap: int) -> StepSimResult:
    """The trace for real: each request handed to a step loop at its arrival."""
    done_at: dict[str, float] = {}
    loop = StepLoop(ex, cap, record=True)
    start = time.perf_counter()
    try:
        answers = []
        for r in reqs:
            time.sleep(max(0.0, start + r.arrival - time.perf_counter()))
            answer = loop.submit(r)
            answer.add_done_callback(
                lambda _, rid=r.id: done_at.setdefault(rid, time.perf_counter())
            )
            answers.append(answer)
        spent = {r.id: a.result()[1] for r, a in zip(reqs, answers, strict=True)}
    finally:
        loop.close()
    latencies = {r.id: done_at[r.id] - start - r.arrival for r in reqs}
    sizes = tuple(n for n, _ in loop.trace.steps)
    wall = time.perf_counter() - start
    return StepSimResult(latencies, sum(spent.values()), spent, sizes, loop.preemptions, wall)


def main() -> None:
    """Measure, run, replay, print."""
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--load", type=float, default=0.5)
    ap.add_argument("--steps", default="10,20,30")
    ap.add_argument("--cap", type=int, default=8)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: free cores)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    quiet_libraries()
    torch = import_torch()
    torch.set_num_threads(args.threads or free_cores())
    ex = StepExecutor.load(resolve(DEFAULT_MODEL), name=DEFAULT_MODEL)
    settings = ProfileSettings(ModelSpec(DEFAULT_MODEL), max_batch=args.cap)
    cost = StepCost.from_dict(profile_loaded_steps(ex, settings))
    step_counts = [int(s) for s in args.steps.split(",")]
    rng = random.Random(args.seed)
    rate = args.load * capacity(cost, sum(step_counts) / len(step_counts), args.cap)
    w, h = ex.default_size()
    t, reqs = 0.0, []
    for i in range(args.requests):
        t += rng.expovariate(rate)
        key = key_for(DEFAULT_MODEL, w, h, rng.choice(step_counts), 7.5, "default", "fp32", "cpu")
        reqs.append(Request(f"r{i:04d}", PROMPTS[i % len(PROMPTS)], key, i, arrival=t))
    real = run_loop(ex, reqs, args.cap)
    sim = simulate_step(cost, reqs, cap=args.cap)
    by_size = [round(s, 4) for s in cost.step.seconds]
    threads = torch.get_num_threads()
    print(f"step profile: {cost.source}; step s by size {by_size}, prepare {cost.prepare_s:.4f} s")
    print(f"{args.requests} requests, steps {args.steps}, Poisson {rate:.3f}/s "
          f"(load {args.load}), cap {args.cap}, torch threads {threads}")  # fmt: skip
    print("            p50 s    p99 s   device s/img  mean running  preemptions")
    for name, p50, p99, spi, mean, pre in (
        ("real", real.percentile(50), real.percentile(99), real.seconds_per_image,
         real.mean_running, real.preemptions),
        ("simulated", sim.percentile(50), sim.percentile(99), sim.seconds_per_image,
         sim.mean_running, sim.preemptions),
    ):  # fmt: skip
        print(f"{name:10s} {p50 or 0:7.3f} {p99 or 0:8.3f} {spi:13.4f} {mean:13.2f} {pre:12d}")
    for label, a, b in (
        ("p99", real.percentile(99) or 0.0, sim.percentile(99) or 0.0),
        ("device s/img", real.seconds_per_image, sim.seconds_per_image),
    ):
        print(f"simulated/real {label}: {b / a:.3f}")


if __name__ == "__main__":
    main()
