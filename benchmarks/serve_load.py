"""Load test of ``renderq serve`` on loopback: Poisson arrivals at multiples of capacity.

Starts the service (the embedded model unless ``--model``/``--scorer`` say otherwise) on a
free loopback port, reads the capacity it measured at warm-up (images per second at its
best batch size), then for each load factor sends Poisson arrivals at ``factor x
capacity`` for ``--duration`` seconds, each request with a deadline. It prints, per load:
the served rate (images answered per second once the queue has filled: from the deadline,
or half the window, to the last arrival), the share admitted, p50/p99 latency of admitted
requests, the share of admitted requests that missed their deadline, and the service's
peak resident memory.

Bounded: at most ``--max-requests`` per load, every request times out, loopback only.
``--threads 0,2`` runs two servers one after the other in the same run (the service's
default, the cores other work leaves free, then two torch threads, torch's own default on
a 2-core machine), both offered multiples of the first one's capacity.

Run: ``python benchmarks/serve_load.py [--loads 0.5,1,2,10] [--duration 30] [--deadline 20]
[--threads 0,2]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

TOKEN = "load-test-token"


@dataclass
class Outcome:
    status: int
    latency: float
    reason: str = ""
    #: Seconds from the start of the load to the answer.
    done: float = 0.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(
    args: argparse.Namespace, root: Path, threads: int = 0
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cfg = root / "renderq.toml"
    lines = [
        f'data_dir = "{root / "data"}"',
        f"threads = {threads}",
        f"max_batch_size = {args.max_batch_size}",
        f"max_queue_delay_s = {args.max_queue_delay}",
        f"max_queue_per_key = {args.queue}",
    ]
    if args.deadline_reserve is not None:
        lines.append(f"deadline_reserve_s = {args.deadline_reserve}")
    if args.devices:
        lines.append(f'devices = "{args.devices}"')
    if args.model:
        lines.append(f'model = "{args.model}"')
    if args.scorer:
        lines.append(f'scorer = "{args.scorer}"')
    if args.steps:
        lines.append(f"steps = {args.steps}")
    lines += ["[auth]", f'tokens = {{ "{TOKEN}" = "load" }}']
    cfg.write_text("\n".join(lines) + "\n")
    exe = Path(sys.executable).with_name("renderq")
    log = (root / "server.log").open("wb")
    proc = subprocess.Popen(
        [str(exe), "serve", "--config", str(cfg), "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited:\n{(root / 'server.log').read_text()}")
        try:
            if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("server never became ready")


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return math.nan


async def one(client: httpx.AsyncClient, at: float, t0: float, body: dict[str, object]) -> Outcome:
    await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
    start = time.monotonic()
    try:
        r = await client.post("/v1/images/generations", json=body)
    except httpx.HTTPError as exc:
        end = time.monotonic()
        return Outcome(0, end - start, type(exc).__name__, end - t0)
    end = time.monotonic()
    reason = "" if r.status_code == 200 else r.json().get("error", "")
    return Outcome(r.status_code, end - start, reason, end - t0)


async def load(
    url: str, rate: float, args: argparse.Namespace, seed: int
) -> tuple[list[Outcome], float]:
    """Send the load; the outcomes and the seconds over which requests were sent (the
    duration, or less where ``--max-requests`` ended the arrivals first)."""
    rng = random.Random(seed)
    times, t = [], 0.0
    while len(times) < args.max_requests:
        t += rng.expovariate(rate)
        if t > args.duration:
            break
        times.append(t)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=args.deadline * 4 + 60, limits=limits
    ) as client:
        t0 = time.monotonic()
        body = {"prompt": "a small red circle on a blue background", "deadline_s": args.deadline}
        tasks = [one(client, at, t0, {**body, "seed": i}) for i, at in enumerate(times)]
        window = args.duration if len(times) < args.max_requests else times[-1]
        return list(await asyncio.gather(*tasks)), window


def pct(values: list[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]


def picked_threads(root: Path) -> int | None:
    """The torch threads the server says it took (``threads = 0`` picks the free cores)."""
    found = re.search(r"\((\d+) torch threads?\)", (root / "server.log").read_text())
    return int(found.group(1)) if found else None


DEVICE_SECONDS = "renderq_device_seconds_total"


def metrics(url: str) -> str:
    """The server's ``/metrics`` text."""
    return httpx.get(url + "/metrics", headers={"Authorization": f"Bearer {TOKEN}"}).text


def samples(text: str, name: str, where: str = "") -> list[float]:
    """Every sample of ``name`` in a ``/metrics`` text whose labels hold ``where``."""
    found = re.findall(rf"^{name}(?:{{([^}}]*)}})? (\S+)$", text, re.M)
    return [float(v) for labels, v in found if where in labels]


def gauge(url: str, name: str) -> float:
    """A gauge's first sample (NaN if none; the service's labelled gauges have one device
    class)."""
    return next(iter(samples(metrics(url), name)), math.nan)


def totals(url: str) -> dict[str, float]:
    """The service's running totals a load's row is the difference of: device-seconds (all,
    and those of regenerations), render batches and the requests in them (one read)."""
    text = metrics(url)
    return {
        "device_s": sum(samples(text, DEVICE_SECONDS)),
        "regen_s": sum(samples(text, DEVICE_SECONDS, 'stage="regen"'))
        + sum(samples(text, DEVICE_SECONDS, 'stage="rescore"')),
        "batches": sum(samples(text, "renderq_batch_size_count")),
        "batched": sum(samples(text, "renderq_batch_size_sum")),
    }


def measure(
    args: argparse.Namespace, root: Path, threads: int, capacity: float | None
) -> tuple[float, float, list[dict[str, Any]]]:
    """One server (``threads`` torch threads) through every load; its capacity and rows.

    The loads are multiples of ``capacity`` when given (the first server's), so that every
    setting is offered the same rates; else of the capacity this server measured.
    """
    proc, url = start(args, root, threads)
    try:
        stats = httpx.get(url + "/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"}).json()
        own = float(stats["capacity_images_per_s"])
        base = own if capacity is None else capacity
        rows = []
        for i, factor in enumerate(float(f) for f in args.loads.split(",")):
            busy_before = os.getloadavg()[0]
            before, started = totals(url), time.monotonic()
            outs, window = asyncio.run(load(url, factor * base, args, seed=i))
            used = {k: v - before[k] for k, v in totals(url).items()}
            took = time.monotonic() - started
            ok = [o for o in outs if o.status == 200]
            # Images answered per second once the queue has filled: from the deadline (or
            # half the window) to the end of the arrivals. Counting every admitted image
            # over the window would credit the queue's last deadline's worth to it.
            since = min(args.deadline, window / 2)
            steady = sum(since <= o.done <= window for o in ok) / (window - since)
            rows.append(
                {
                    "threads": threads,
                    "load": factor,
                    "offered_per_s": factor * base,
                    "sent": len(outs),
                    # Over the seconds the load was offered: at high rates --max-requests
                    # ends the arrivals before --duration.
                    "served_per_s": steady,
                    "window_s": [since, window],
                    "admitted_share": len(ok) / len(outs) if outs else math.nan,
                    "p50_s": pct([o.latency for o in ok], 50),
                    "p99_s": pct([o.latency for o in ok], 99),
                    "max_s": max((o.latency for o in ok), default=math.nan),
                    "missed_deadline_share": (
                        sum(o.latency > args.deadline for o in ok) / len(ok) if ok else math.nan
                    ),
                    "refusals": sorted({o.reason for o in outs if o.status != 200}),
                    "peak_rss_mib": peak_rss_mib(proc.pid),
                    # The one-minute load average around the load: other work on the
                    # cores shows here (the bench and the server add their own share).
                    "loadavg": [busy_before, os.getloadavg()[0]],
                    # What admission stretched its expected waits by at the end of the load.
                    "wait_stretch": gauge(url, "renderq_admission_wait_stretch"),
                    # The device's seconds booked over the load's wall time (its answers
                    # included): below 1 it idled; and how much slower its batches ran
                    # than the warm-up said, as admission prices it.
                    "device_busy": used["device_s"] / took,
                    # Where the device's time went: per image answered, the share spent on
                    # regenerations, and the render batches' mean size.
                    "device_s_per_image": used["device_s"] / len(ok) if ok else math.nan,
                    "regen_share": used["regen_s"] / used["device_s"] if used["device_s"] else 0.0,
                    "mean_batch": used["batched"] / used["batches"] if used["batches"] else 0.0,
                    "latency_scale": gauge(url, "renderq_latency_scale_priced"),
                }
            )
            time.sleep(args.deadline)  # let the queue drain between loads
        return own, base, rows
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=300)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--loads", default="0.5,1,2,10")
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--deadline", type=float, default=20.0)
    ap.add_argument("--max-requests", type=int, default=2000)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--max-queue-delay", type=float, default=0.1)
    ap.add_argument("--queue", type=int, default=512)
    ap.add_argument(
        "--deadline-reserve",
        type=float,
        help="the service's deadline_reserve_s (default: the service's own)",
    )
    ap.add_argument(
        "--devices",
        help="the service's render pool (e.g. cpu:1: one worker process with one torch "
        "thread, away from the service's interpreter); default: render in the service",
    )
    ap.add_argument("--model")
    ap.add_argument("--scorer")
    ap.add_argument("--steps", type=int)
    ap.add_argument(
        "--threads",
        default="0",
        help="torch threads of the server, comma-separated for several servers side by side "
        "(0: the cores other work leaves free, the default); every server is offered "
        "multiples of the first one's capacity",
    )
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    settings = [int(t) for t in args.threads.split(",")]
    servers, rows = [], []
    with tempfile.TemporaryDirectory(prefix="renderq-load-") as tmp:
        base: float | None = None
        for threads in settings:
            root = Path(tmp) / f"threads-{threads}"
            root.mkdir()
            own, base, got = measure(args, root, threads, base)
            servers.append(
                {
                    "threads": threads,
                    "torch_threads": picked_threads(root),
                    "capacity_images_per_s": own,
                }
            )
            rows += got
    if args.json:
        print(
            json.dumps(
                {
                    "servers": servers,
                    "offered_base_images_per_s": base,
                    "deadline_s": args.deadline,
                    "duration_s": args.duration,
                    "loads": rows,
                },
                indent=2,
            )
        )
        return
    caps = ", ".join(
        f"threads {s['threads']} (took {s['torch_threads']}): {s['capacity_images_per_s']:.2f}"
        for s in servers
    )
    print(
        f"capacity (warm-up, best batch) {caps} images/s; loads are multiples of {base:.2f}; "
        f"deadline {args.deadline} s, {args.duration} s per load, {os.cpu_count()} CPU cores"
    )
    print(
        "| threads | load | offered/s | sent | served/s | admitted | p50 s | p99 s | max s "
        "| missed deadline | refusals | wait stretch | device busy | latency scale "
        "| device-s/image | regen share | mean batch | peak RSS MiB | load average |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['threads']} | {r['load']}x | {r['offered_per_s']:.2f} | {r['sent']} | "
            f"{r['served_per_s']:.2f} | {r['admitted_share']:.1%} | {r['p50_s']:.2f} | "
            f"{r['p99_s']:.2f} | {r['max_s']:.2f} | {r['missed_deadline_share']:.1%} | "
            f"{', '.join(r['refusals']) or '-'} | {r['wait_stretch']:.3f} | "
            f"{r['device_busy']:.0%} | {r['latency_scale']:.2f} | "
            f"{r['device_s_per_image']:.3f} | {r['regen_share']:.0%} | {r['mean_batch']:.2f} | "
            f"{r['peak_rss_mib']:.0f} | "
            f"{r['loadavg'][0]:.1f}-{r['loadavg'][1]:.1f} |"
        )


if __name__ == "__main__":
    main()
