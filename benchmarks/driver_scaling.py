"""How many GPUs one driver keeps up with: the core's decisions and the store's commits.

Two measurements and one piece of arithmetic, printed side by side:

1. **Decisions**: the simulator runs PROFILE on WORKERS render workers (a virtual clock,
   no device), with the scheduler's methods timed in CPU seconds (``time.process_time``):
   CPU per ``schedule`` call, per batch cut, per ``on_result`` and ``on_scores``, and in
   all per accepted image. Against it: the decision rate the fleet needs (workers over the
   profile's batch latency).
2. **Commits**: the SQLite job store commits steps of BATCH accepted images (attempts,
   outcomes, a ledger row: what the job listener commits per score batch), CPU and wall
   per image, against the accepted images per second the fleet produces.
3. **Image writes**: the dataset writer encodes each accepted image as PNG in the driver;
   CPU per image of the profile's size, on a synthetic image (smooth colour ramps with
   a little noise, which compress like a picture; a real image's time differs).
4. **Arithmetic** (not measured): the score stage's capacity (the engine has one scorer
   worker) from the profile's score curve, and the bytes per second of raw images that
   would reach the driver if every image came back to it.

Run: ``python benchmarks/driver_scaling.py [--profile article-sdxl-a100] [--workers 1000]
[--renders 100000] [--mode window]``.
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from renderq.core.scheduler import Scheduler
from renderq.core.settings import Batching, make_policy
from renderq.profiles import load_profile
from renderq.runtime.arrivals import arrivals
from renderq.runtime.sim import SimConfig, simulate
from renderq.store.sqlite import AttemptRow, JobStore, Outcome, PromptRow

TIMED = ("submit", "schedule", "on_result", "on_scores", "next_wakeup")


def timed_scheduler() -> dict[str, list[float]]:
    """Wrap the scheduler's entry points; returns ``name -> [calls, cpu seconds, batches]``."""
    stats = {name: [0.0, 0.0, 0.0] for name in TIMED}

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(self: Scheduler, *args: Any, **kwargs: Any) -> Any:
            start = time.process_time()
            out = fn(self, *args, **kwargs)
            s = stats[name]
            s[0] += 1
            s[1] += time.process_time() - start
            if name == "schedule":
                s[2] += len(out)
            return out

        return timed

    for name in TIMED:
        setattr(Scheduler, name, wrap(name, getattr(Scheduler, name)))
    return stats


def decisions(profile: str, workers: int, renders: int, mode: str) -> dict[str, Any]:
    prof = load_profile(profile)
    stats = timed_scheduler()
    cfg = SimConfig(
        prof, tuple(arrivals("offline", renders, random.Random(0))), render_workers=workers
    )
    start = time.process_time()
    # No batch cap of our own: the profile's memory model caps it, as in renderq simulate.
    result = simulate(make_policy(Batching(mode, None)), cfg)
    total = time.process_time() - start
    return {"profile": prof, "result": result, "stats": stats, "sim_cpu_s": total}


def commits(batch: int, steps: int) -> tuple[float, float]:
    """CPU and wall seconds per accepted image committed, in steps of ``batch``."""
    with tempfile.TemporaryDirectory() as tmp:
        store = JobStore.open(Path(tmp) / "renderq.sqlite")
        n = batch * steps
        rows = [PromptRow(f"p{i:07d}", i, f"prompt {i}", i, {"steps": 30}) for i in range(n)]
        store.create_job({"bench": True}, rows)
        run = store.start_run(0, "window")
        cpu, wall = time.process_time(), time.perf_counter()
        for s in range(steps):
            ids = [r.id for r in rows[s * batch : (s + 1) * batch]]
            attempts = [AttemptRow(i, 0, 0, s, batch, 0.9, None) for i in ids]
            outcomes = [Outcome(i, "accepted", 0, 0.9, f"images/{i}.png", s, batch) for i in ids]
            store.commit_step(run, attempts, outcomes, [("score", "a100", 1.28)], "clip")
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        store.close()
    return cpu / n, wall / n


def png_cpu_s(width: int, height: int, repeats: int = 5) -> tuple[float, float]:
    """Least CPU seconds of ``repeats`` PNG encodings of a synthetic image, and its MB."""
    import io

    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    ramps = np.stack([(x / 4) % 256, (y / 4) % 256, ((x + y) / 8) % 256], -1).astype(int)
    pixels = np.clip(ramps + rng.integers(-3, 4, ramps.shape), 0, 255).astype(np.uint8)
    image, best, size = Image.fromarray(pixels), float("inf"), 0
    for _ in range(repeats):
        buf = io.BytesIO()
        start = time.process_time()
        image.save(buf, format="PNG")
        best = min(best, time.process_time() - start)
        size = len(buf.getvalue())
    return best, size / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--profile", default="article-sdxl-a100")
    ap.add_argument("--workers", type=int, default=1000)
    ap.add_argument("--renders", type=int, default=100_000)
    ap.add_argument("--mode", default="window")
    ap.add_argument("--commit-steps", type=int, default=300)
    args = ap.parse_args()
    d = decisions(args.profile, args.workers, args.renders, args.mode)
    prof, res, stats = d["profile"], d["result"], d["stats"]
    cap = prof.render.cap()
    batch_s = prof.render.latency(cap)
    print(f"profile {prof.name}: batch {cap} takes {batch_s:.2f} s on {prof.device_class}")
    print(
        f"simulated {args.renders} prompts ({args.mode}) on {args.workers} workers: "
        f"{res.accepted} accepted, {len(res.batch_sizes)} render batches, "
        f"makespan {res.makespan_s:.0f} s (virtual), simulator CPU {d['sim_cpu_s']:.2f} s"
    )
    core = sum(s[1] for s in stats.values())
    for name, (calls, secs, cut) in stats.items():
        extra = f", {1e6 * secs / cut:.1f} us per batch cut" if cut else ""
        print(f"  {name:12} {int(calls):8d} calls {1e6 * secs / max(calls, 1):9.1f} us/call{extra}")
    per_image = core / max(res.accepted, 1)
    print(f"  core CPU in all {core:.2f} s = {1e6 * per_image:.1f} us per accepted image")
    need_batches = args.workers / batch_s
    need_images = need_batches * cap
    print(
        f"fleet of {args.workers}: {need_batches:.1f} batches/s, {need_images:.0f} images/s "
        f"-> core CPU {100 * per_image * need_images:.1f}% of one core"
    )
    score_cap = prof.score.cap()
    score_rate = score_cap / prof.score.latency(score_cap)
    print(
        f"score stage (one scorer worker per engine): {score_rate:.0f} images/s at batch "
        f"{score_cap}, {100 * score_rate / need_images:.1f}% of what the fleet renders"
    )
    cpu_img, wall_img = commits(cap, args.commit_steps)
    print(
        f"store commits (steps of {cap} accepted): {1e6 * cpu_img:.1f} us CPU, "
        f"{1e6 * wall_img:.1f} us wall per image -> {100 * wall_img * need_images:.1f}% "
        f"of the driver's time at {need_images:.0f} images/s"
    )
    png_s, png_mb = png_cpu_s(prof.width, prof.height)
    print(
        f"PNG writes in the driver: {1000 * png_s:.0f} ms CPU per image ({png_mb:.2f} MB) "
        f"-> {png_s * need_images:.0f} cores busy at {need_images:.0f} images/s"
    )
    raw = prof.width * prof.height * 3
    print(
        f"images to the driver (arithmetic): {raw / 1e6:.1f} MB raw each x {need_images:.0f}/s "
        f"= {raw * need_images / 1e9:.2f} GB/s"
    )


if __name__ == "__main__":
    main()
