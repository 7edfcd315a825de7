"""Scheduler overhead: requests through submit -> schedule -> on_result -> on_scores.

The executor and scorer are null (they return at once), so the figure is the core's own
cost per request: queueing, batch cutting, state transitions, QA decisions and ledger
bookings. Run: ``python benchmarks/scheduler_overhead.py [--requests 100000] [--mode dynamic]``.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

from renderq.core.events import ToScore
from renderq.core.policies import AdHoc, Dynamic, Policy, Window
from renderq.core.qa import QAPolicy
from renderq.core.scheduler import Scheduler
from renderq.core.types import BatchKey, BatchResult, ItemResult, Request, ScoreResult

KEY = BatchKey("null", 512, 512, 20, True, "ddim", "fp16", "gpu")


def one_run(policy: Policy, n: int, batch: int) -> float:
    """Seconds to push ``n`` requests through the scheduler with a null executor."""
    sched = Scheduler(policy, qa=QAPolicy(threshold=0.5), default_cap=batch)
    reqs = [Request(f"r{i}", "a red circle", KEY, base_seed=i) for i in range(n)]
    free = {"gpu": 1}
    gc.collect()
    start = time.perf_counter()
    now = 0.0
    for r in reqs:
        sched.submit(r, now)
    while True:
        batches = sched.schedule(now, free)
        if not batches:
            wake = sched.next_wakeup(now)
            if wake is None:
                break
            now = wake
            continue
        for b in batches:
            items = tuple(ItemResult(q.id, None) for q in b.requests)
            events = sched.on_result(BatchResult(b.id, items, 0.0, "gpu"), now)
            ids = [e.request.id for e in events if isinstance(e, ToScore)]
            sched.on_scores(ids, ScoreResult((1.0,) * len(ids), 0.0, "gpu"), now)
    elapsed = time.perf_counter() - start
    assert sched.ledger.accepted == n, "every request must be accepted"
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=100_000)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--mode", choices=["adhoc", "dynamic", "window", "all"], default="all")
    args = ap.parse_args()
    modes: dict[str, Policy] = {
        "adhoc": AdHoc(),
        "dynamic": Dynamic(0.01, args.batch),
        "window": Window(batch_size=args.batch),
    }
    chosen = modes if args.mode == "all" else {args.mode: modes[args.mode]}
    print(f"scheduler overhead, {args.requests} requests, null executor, median of {args.repeats}")
    for name, policy in chosen.items():
        runs = [one_run(policy, args.requests, args.batch) for _ in range(args.repeats)]
        us = sorted(r / args.requests * 1e6 for r in runs)
        print(
            f"  {name:8s} {statistics.median(us):7.2f} us/request "
            f"(min {us[0]:.2f}, max {us[-1]:.2f})"
        )


if __name__ == "__main__":
    main()
