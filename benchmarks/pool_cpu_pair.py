"""Two one-thread CPU workers against one two-thread worker, paired in one run.

Both pools render the same prompts on the embedded mini-SD, each worker a process of its
own with its own loaded pipeline (``--devices cpu:1,cpu:1`` against ``--devices cpu:2``),
through the real-time engine with a scorer that passes every image at once (rendering
only is measured). Rounds alternate A B B A ... so a drift of the machine's speed falls on
both. Printed per run: wall seconds, images per wall second, device-seconds booked, and
images per core-second (device-seconds times the worker's threads: what the cores gave).

Run: ``python benchmarks/pool_cpu_pair.py [--rounds 2] [--requests 32] [--steps 8]
[--batch 8]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
from pathlib import Path

from renderq.backends.null import NullScorer
from renderq.backends.pool import DevicePool, LoadSpec, WorkerSpec
from renderq.backends.registry import DEFAULT_MODEL, model_defaults, resolve
from renderq.core.qa import QAPolicy
from renderq.core.settings import Batching
from renderq.core.types import BatchKey, Request, Stage
from renderq.jobs.prompts import read_prompts
from renderq.runtime.realtime import RealtimeEngine
from renderq.testing.fakes import RecordingListener

EXAMPLES = Path(__file__).resolve().parents[1] / "src" / "renderq" / "examples" / "shapes-200.txt"


def one_run(pool: DevicePool, requests: list[Request], batch: int) -> tuple[float, float]:
    """Wall seconds and booked render device-seconds for ``requests`` on ``pool``."""
    engine = RealtimeEngine.build(
        Batching("window", max_batch_size=batch), QAPolicy(threshold=0.5, max_attempts=1),
        pool.executors(), NullScorer(), RecordingListener(),
    )  # fmt: skip
    for r in requests:
        engine.submit(r)
    start = engine.now()
    engine.run()
    wall = engine.now() - start
    return wall, engine.scheduler.ledger.report().seconds.get(Stage.RENDER, 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    _, guidance = model_defaults(DEFAULT_MODEL)
    load = LoadSpec(resolve(DEFAULT_MODEL), DEFAULT_MODEL)
    key = BatchKey(DEFAULT_MODEL, 64, 64, args.steps, True, "default", "fp32", "cpu")
    prompts = [s.prompt for s in read_prompts(EXAMPLES)]

    def requests(tag: str) -> list[Request]:
        return [
            Request(f"{tag}{i}", prompts[i % len(prompts)], key, base_seed=i,
                    guidance_scale=guidance)
            for i in range(args.requests)
        ]  # fmt: skip

    pools = {
        "2 x cpu:1": DevicePool.start([WorkerSpec("cpu", "cpu", 1)] * 2, load),
        "1 x cpu:2": DevicePool.start([WorkerSpec("cpu", "cpu", 2)], load),
    }
    threads = {"2 x cpu:1": 1, "1 x cpu:2": 2}
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in pools}
    try:
        for pool in pools.values():  # warm-up: one batch per worker, not counted
            one_run(pool, requests("w")[: args.batch * len(pool.workers)], args.batch)
        names = list(pools)
        for rnd in range(args.rounds):
            order = names if rnd % 2 == 0 else names[::-1]
            for name in order:
                wall, dev = one_run(pools[name], requests(f"r{rnd}-"), args.batch)
                results[name].append((wall, dev))
                n = args.requests
                print(
                    f"round {rnd + 1} {name}: wall {wall:6.2f} s, {n / wall:5.2f} img/s, "
                    f"{dev:6.2f} device-s, {n / (dev * threads[name]):5.2f} img per core-s"
                )
    finally:
        for pool in pools.values():
            pool.close()
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    for name, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        dev = statistics.median(d for _, d in runs)
        n = args.requests
        print(
            f"median {name}: wall {wall:.2f} s, {n / wall:.2f} img/s, "
            f"{n / dev:.2f} img per device-s, {n / (dev * threads[name]):.2f} img per core-s"
        )


if __name__ == "__main__":
    main()
