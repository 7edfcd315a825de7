"""The device pool's dispatch measured apart from compute: workers that only sleep.

Every worker is a ``SleepExecutor``: each batch SLEEPS a fixed time and returns blank 8x8
images; nothing is rendered. With 1, 2, 4 and 8 workers, in the local pool (a process per
worker) and on Ray (an actor per worker, on a local Ray with one logical CPU per actor),
the real-time engine pushes the same number of batches per worker through the scheduler.
Printed per run: images per second against the linear ideal (workers x batch / sleep),
and the hop's overhead per batch (the driver's time for ``run`` minus the sleep: pickling,
the pipe or Ray's transport, and the worker's wake-up). Pool start-up is not counted, nor
is one untimed warm-up batch per worker (first calls pay imports and connection set-up).

With ``--depths 1,2`` each Ray run is repeated with every actor handed two batches at once
(``renderq run --actor-depth 2``): the next batch waits on the actor while one sleeps, so
the hop is hidden; its "hop" column is then not a hop (a run's time includes its wait on
the actor) and is not printed.

Run: ``python benchmarks/pool_dispatch.py [--sleep 0.2] [--batches 10] [--batch 8]
[--workers 1,2,4,8] [--backends local,ray] [--depths 1]``.
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.null import NullScorer, SleepLoad
from renderq.backends.pool import DevicePool, WorkerSpec
from renderq.core.qa import QAPolicy
from renderq.core.settings import Batching
from renderq.core.types import Batch, BatchKey, BatchResult, Request
from renderq.runtime.realtime import RealtimeEngine
from renderq.testing.fakes import RecordingListener

KEY = BatchKey("null", 8, 8, 1, True, "null", "fp32", "sleep")


@dataclass
class Timed:
    """Wraps a pool executor and records the driver's seconds per ``run``."""

    inner: Any
    spans: list[float] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def device_class(self) -> str:
        return str(self.inner.device_class)

    def run(self, batch: Batch) -> BatchResult:
        start = time.perf_counter()
        out: BatchResult = self.inner.run(batch)
        with self.lock:
            self.spans.append(time.perf_counter() - start)
        return out


def one_run(pool: Any, workers: int, batches: int, size: int) -> tuple[float, list[float]]:
    """Wall seconds for ``workers * batches`` batches of ``size``, and each run's seconds."""
    [lanes] = pool.executors().values()  # each worker once, or depth times on Ray
    timed = [Timed(w) for w in lanes]
    engine = RealtimeEngine.build(
        Batching("window", max_batch_size=size), QAPolicy(threshold=0.5, max_attempts=1),
        {"sleep": timed}, NullScorer(), RecordingListener(),
    )  # fmt: skip
    for i in range(workers * batches * size):
        engine.submit(Request(f"r{i}", "a red circle", KEY, base_seed=i))
    start = time.perf_counter()
    engine.run()
    wall = time.perf_counter() - start
    return wall, [s for t in timed for s in t.spans]


def start_pool(backend: str, workers: int, sleep: float, depth: int = 1) -> Any:
    specs = [WorkerSpec("cpu", "sleep", 1)] * workers
    if backend == "local":
        return DevicePool.start(specs, SleepLoad(sleep))
    from renderq.backends.ray_backend import RayPool

    return RayPool.start(specs, SleepLoad(sleep), depth=depth)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sleep", type=float, default=0.2, help="seconds each batch sleeps")
    ap.add_argument("--batches", type=int, default=10, help="batches per worker")
    ap.add_argument("--batch", type=int, default=8, help="requests per batch")
    ap.add_argument("--workers", default="1,2,4,8")
    ap.add_argument("--backends", default="local,ray")
    ap.add_argument("--depths", default="1", help="batches per Ray actor at once, e.g. 1,2")
    args = ap.parse_args()
    depths = [int(x) for x in args.depths.split(",")]
    counts = [int(x) for x in args.workers.split(",")]
    backends = args.backends.split(",")
    if "ray" in backends:
        import ray

        # Logical CPUs, one per sleeping actor: the actors compute nothing.
        ray.init(num_cpus=max(counts), include_dashboard=False, logging_level="ERROR")
    print(
        f"SLEEP executor ({args.sleep * 1000:.0f} ms per batch, nothing rendered), "
        f"{args.batches} batches of {args.batch} per worker"
    )
    print(
        f"{'backend':8} {'depth':>5} {'workers':>7} {'wall s':>8} {'img/s':>8} {'ideal':>8} "
        f"{'of linear':>9} {'hop ms/batch (median, p90)':>28}"
    )
    runs = [(b, d) for b in backends for d in (depths if b == "ray" else [1])]
    for backend, depth in runs:
        for n in counts:
            with start_pool(backend, n, args.sleep, depth) as pool:
                one_run(pool, n, 1, args.batch)  # warm-up, not counted
                wall, spans = one_run(pool, n, args.batches, args.batch)
            images = n * args.batches * args.batch
            rate, ideal = images / wall, n * args.batch / args.sleep
            hops = sorted((s - args.sleep) * 1000 for s in spans)
            p90 = hops[min(len(hops) - 1, int(0.9 * len(hops)))]
            hop = f"{statistics.median(hops):14.2f} {p90:12.2f}"
            if depth > 1:  # a run's time includes its wait on the actor: not a hop
                hop = f"{'-':>14} {'-':>12}"
            print(
                f"{backend:8} {depth:5d} {n:7d} {wall:8.2f} {rate:8.1f} {ideal:8.1f} "
                f"{100 * rate / ideal:8.1f}% {hop}"
            )


if __name__ == "__main__":
    main()
