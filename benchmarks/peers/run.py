"""renderq's dynamic batching side by side with Ray Serve and LitServe, on one trace.

Every system serves the same model function (``common.load_render``: renderq's diffusers
executor, one generator per request) over HTTP on loopback, with the same maximum batch
size, and is driven by the same Poisson arrival trace from the same client. Each system's
batching timeout is the best (lowest p99) of a small sweep, not its default alone:

- renderq: ``max_queue_delay_s`` (timer from the oldest queued request)
- Ray Serve ``@serve.batch``: ``batch_wait_timeout_s`` (timer from the batch's first request)
- LitServe: ``batch_timeout`` (timer from when its worker starts collecting a batch, idle
  or not, so a request that arrives into a window already open waits only its rest)

A timeout of 0 is LitServe's default (its worker then polls its queue without waiting);
renderq then cuts whatever is queued as soon as the device is free, Ray Serve at once.

A second pass with the ``null`` model (blank images at once) measures each system's own
overhead per request. ``--repeat N`` runs every system and setting N times, each round
starting at the next system, and reports medians (and p99's range), so that a slow spell of
the machine does not decide the order. Install the peers first: ``pip install -e '.[peers]'``.

Run: ``python benchmarks/peers/run.py [--model embedded:mini-sd] [--rate R | --load 0.7]
[--duration 30] [--max-batch-size 8] [--sweep 0.01,0.05,0.1] [--null-sweep ...] [--repeat N]
[--json] [--save F]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

HERE = Path(__file__).resolve().parent
TOKEN = "peers-bench"
SYSTEMS = ("renderq", "ray-serve", "litserve")
FLOOR = "fastapi"
"""The bare FastAPI endpoint (``fastapi_peer.py``): the null pass's floor, not a peer."""


@dataclass
class Run:
    system: str
    setting: float
    model: str
    offered: float
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    duration: float = 0.0
    device_seconds: float = 0.0
    batch_count: int = 0
    batch_items: int = 0

    def pct(self, q: float) -> float:
        if not self.latencies:
            return math.nan
        ordered = sorted(self.latencies)
        return ordered[max(1, math.ceil(q / 100 * len(ordered))) - 1]

    def row(self) -> dict[str, Any]:
        n = len(self.latencies)
        return {
            "system": self.system,
            "setting_s": self.setting,
            "model": self.model,
            "offered_per_s": self.offered,
            "served": n,
            "errors": self.errors,
            "served_per_s": n / self.duration if self.duration else math.nan,
            "p50_s": self.pct(50),
            "p99_s": self.pct(99),
            "device_s_per_image": self.device_seconds / n if n else math.nan,
            "mean_batch": self.batch_items / self.batch_count if self.batch_count else math.nan,
        }


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Server:
    """One system under test, started as its own process group."""

    def __init__(
        self, system: str, model: str, setting: float, args: argparse.Namespace, root: Path
    ) -> None:
        self.system, self.model, self.setting = system, model, setting
        self.max_batch = args.max_batch_size
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = root / f"{system}-{model.replace(':', '_').replace('/', '_')}-{setting}.jsonl"
        self.log.unlink(missing_ok=True)
        env = {**os.environ, "RENDERQ_PEER_LOG": str(self.log)}
        steps = ["--steps", str(args.steps)] if args.steps else []
        common = [
            "--port",
            str(self.port),
            "--model",
            model,
            "--max-batch-size",
            str(args.max_batch_size),
            *steps,
        ]
        if system == "renderq":
            cfg = root / "renderq.toml"
            lines = [
                f'data_dir = "{root / "data"}"',
                f'model = "{model}"',
                f'scorer = "{args.scorer}"',
                f"max_batch_size = {args.max_batch_size}",
                f"max_queue_delay_s = {setting}",
                "max_queue_per_key = 100000",
            ]
            if args.steps:
                lines.append(f"steps = {args.steps}")
            lines += ["[auth]", f'tokens = {{ "{TOKEN}" = "bench" }}']
            cfg.write_text("\n".join(lines) + "\n")
            exe = Path(sys.executable).with_name("renderq")
            cmd = [str(exe), "serve", "--config", str(cfg), "--port", str(self.port)]
        elif system == FLOOR:
            cmd = [sys.executable, str(HERE / "fastapi_peer.py"), *common]
        elif system == "ray-serve":
            cmd = [sys.executable, str(HERE / "ray_peer.py"), *common, "--wait", str(setting)]
        else:
            cmd = [
                sys.executable,
                str(HERE / "litserve_peer.py"),
                *common,
                "--timeout",
                str(setting),
            ]
        self.out = (root / f"{system}.log").open("ab")
        self.proc = subprocess.Popen(
            cmd, stdout=self.out, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )

    def post(self, client: httpx.AsyncClient, i: int) -> Any:
        body: dict[str, Any] = {"prompt": "a small red circle on a blue background", "seed": i}
        if self.system == "renderq":
            return client.post(
                "/v1/images/generations",
                json={**body, "qa": False},
                headers={"Authorization": f"Bearer {TOKEN}"},
            )
        return client.post("/predict", json=body)

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise SystemExit(f"{self.system} exited; see its log in {self.out.name}")
            try:
                if self.system == "renderq":
                    r = httpx.get(self.url + "/readyz", timeout=2)
                    if r.status_code == 503 and "rror" in r.json().get("detail", ""):
                        raise SystemExit(f"renderq could not load: {r.json()['detail']}")
                    ok = r.status_code == 200
                else:
                    r = httpx.post(
                        self.url + "/predict", json={"prompt": "warm", "seed": 0}, timeout=120
                    )
                    ok = r.status_code == 200
                if ok:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"{self.system} never became ready")

    def device(self) -> tuple[float, int, int]:
        """Device-seconds, batches and images so far (renderq: its ledger and metrics)."""
        if self.system == "renderq":
            auth = {"Authorization": f"Bearer {TOKEN}"}
            stats = httpx.get(self.url + "/v1/stats", headers=auth).json()
            secs = sum(stats["ledger"]["device_seconds"].values())
            m = {}
            for line in httpx.get(self.url + "/metrics").text.splitlines():
                if line.startswith(("renderq_batch_size_count", "renderq_batch_size_sum")):
                    name, value = line.split()
                    m[name] = float(value)
            return secs, int(m["renderq_batch_size_count"]), int(m["renderq_batch_size_sum"])
        rows = (
            [json.loads(x) for x in self.log.read_text().splitlines()] if self.log.exists() else []
        )
        return sum(s for _, s in rows), len(rows), sum(n for n, _ in rows)

    def stop(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=60)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.system == "ray-serve":
            subprocess.run(
                [Path(sys.executable).with_name("ray"), "stop", "--force"],
                capture_output=True,
                timeout=120,
            )
        self.out.close()


async def drive(server: Server, times: list[float], run: Run) -> None:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=100)
    async with httpx.AsyncClient(base_url=server.url, timeout=600, limits=limits) as client:
        # Warm-up: one full batch, not measured.
        await asyncio.gather(*(server.post(client, 10**6 + i) for i in range(server.max_batch)))
        before = server.device()
        t0 = time.monotonic()

        async def one(i: int, at: float) -> None:
            await asyncio.sleep(max(0.0, t0 + at - time.monotonic()))
            start = time.monotonic()
            try:
                r = await server.post(client, i)
                if r.status_code == 200:
                    run.latencies.append(time.monotonic() - start)
                else:
                    run.errors += 1
            except httpx.HTTPError:
                run.errors += 1

        await asyncio.gather(*(one(i, at) for i, at in enumerate(times)))
        run.duration = time.monotonic() - t0
        after = server.device()
        run.device_seconds = after[0] - before[0]
        run.batch_count, run.batch_items = after[1] - before[1], after[2] - before[2]


def trace(rate: float, duration: float, limit: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    out, t = [], 0.0
    while len(out) < limit:
        t += rng.expovariate(rate)
        if t > duration:
            break
        out.append(t)
    return out


def measure(
    system: str,
    model: str,
    setting: float,
    rate: float,
    times: list[float],
    args: argparse.Namespace,
    root: Path,
) -> Run:
    server = Server(system, model, setting, args, root)
    try:
        server.wait_ready()
        run = Run(system, setting, model, rate)
        asyncio.run(drive(server, times, run))
        return run
    finally:
        server.stop()


def capacity(args: argparse.Namespace, root: Path) -> float:
    """renderq's warm-up measure of images per second at the best batch size."""
    server = Server("renderq", args.model, 0.05, args, root)
    try:
        server.wait_ready()
        stats = httpx.get(
            server.url + "/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"}
        ).json()
        return float(stats["capacity_images_per_s"])
    finally:
        server.stop()


def summary(runs: list[Run]) -> dict[str, Any]:
    """One system at one setting over the rounds: medians, errors summed, p99's range."""
    rows = [r.row() for r in runs]
    out = dict(rows[0])
    for k in ("served", "served_per_s", "p50_s", "p99_s", "device_s_per_image", "mean_batch"):
        out[k] = statistics.median(x[k] for x in rows)
    out["errors"] = sum(x["errors"] for x in rows)
    out["rounds"] = len(rows)
    out["p99_range_s"] = [min(x["p99_s"] for x in rows), max(x["p99_s"] for x in rows)]
    return out


def best(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Lowest (median) p99 among settings that served everything (then most throughput)."""
    full = [r for r in summaries if r["errors"] == 0] or summaries
    return min(full, key=lambda r: (r["p99_s"], -r["served_per_s"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="embedded:mini-sd")
    ap.add_argument("--steps", type=int)
    ap.add_argument("--scorer", default="embedded:clip", help="renderq loads it (QA is off)")
    ap.add_argument("--rate", type=float, help="Arrivals per second (default: --load x capacity)")
    ap.add_argument("--load", type=float, default=0.7)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--max-requests", type=int, default=1000)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument("--sweep", default="0.01,0.05,0.1")
    ap.add_argument(
        "--systems",
        default=",".join((*SYSTEMS, FLOOR)),
        help=f"systems to run; {FLOOR!r} (a bare FastAPI endpoint) runs in the null pass only",
    )
    ap.add_argument("--null-rate", type=float, default=50.0)
    ap.add_argument("--null-duration", type=float, default=10.0)
    ap.add_argument("--null-sweep", help="timeouts for the null pass (default: --sweep)")
    ap.add_argument("--only-null", action="store_true", help="just the overhead pass")
    ap.add_argument(
        "--repeat",
        type=int,
        default=1,
        help="rounds of every system and setting (each round starts at the next system); "
        "each system is reported at its setting of lowest median p99",
    )
    ap.add_argument("--json", action="store_true", help="print the report as JSON, no tables")
    ap.add_argument("--save", type=Path, help="also write the report as JSON to this file")
    args = ap.parse_args()
    if args.repeat < 1:
        ap.error(f"--repeat must be >= 1, got {args.repeat}")
    sweep = [float(x) for x in args.sweep.split(",")]
    systems = [s for s in args.systems.split(",") if s]
    report: dict[str, Any] = {"settings": vars(args)}
    with tempfile.TemporaryDirectory(prefix="renderq-peers-") as tmp:
        root = Path(tmp)
        null_sweep = [float(x) for x in (args.null_sweep or args.sweep).split(",")]
        passes = [("null", "null", args.null_rate, args.null_duration, null_sweep)]
        if not args.only_null:
            rate = args.rate or args.load * capacity(args, root)
            passes.insert(0, ("model", args.model, rate, args.duration, sweep))
        for label, model, r, duration, timeouts in passes:
            times = trace(r, duration, args.max_requests, seed=1)
            here = [sy for sy in systems if label == "null" or sy != FLOOR]
            runs: dict[tuple[str, float], list[Run]] = {}
            busy_before = os.getloadavg()[0]
            for k in range(args.repeat):
                for system in here[k % len(here) :] + here[: k % len(here)]:
                    # The floor has no batching timeout: one setting is all it has.
                    for s in timeouts[:1] if system == FLOOR else timeouts:
                        got = measure(system, model, s, r, times, args, root)
                        runs.setdefault((system, s), []).append(got)
            rows = [dict(x.row(), round=i) for rs in runs.values() for i, x in enumerate(rs)]
            chosen = [
                best([summary(runs[(sy, s)]) for s in timeouts if (sy, s) in runs]) for sy in here
            ]
            report[label] = {
                "rate": r,
                "requests": len(times),
                "timeouts_s": timeouts,
                "sweep": rows,
                "best": chosen,
                "over_floor": over_floor(runs, chosen, timeouts),
                # The one-minute load average before and after the pass: other work on the
                # cores shows here (the bench and the servers add their own share).
                "loadavg": [busy_before, os.getloadavg()[0]],
            }
    if args.save:
        args.save.write_text(json.dumps(report, indent=2, default=str) + "\n")
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return
    for label in ("model", "null"):
        if label not in report:
            continue
        part = report[label]
        title = args.model if label == "model" else "null model (pure overhead)"
        print(
            f"\n{title}: {part['requests']} Poisson arrivals at {part['rate']:.2f}/s, "
            f"max batch {args.max_batch_size}, best timeout of "
            f"{','.join(map(str, part['timeouts_s']))} s per system, "
            f"medians of {args.repeat} round(s); load average "
            f"{part['loadavg'][0]:.1f} before, {part['loadavg'][1]:.1f} after"
        )
        print(
            "| system | timeout s | served/s | p50 s | p99 s | p99 range s | device-s/image "
            "| mean batch | errors |"
        )
        print("|---|---|---|---|---|---|---|---|---|")
        for x in part["best"]:
            lo, hi = x["p99_range_s"]
            print(
                f"| {x['system']} | {x['setting_s']} | {x['served_per_s']:.2f} | "
                f"{x['p50_s']:.4f} | {x['p99_s']:.4f} | {lo:.4f}-{hi:.4f} | "
                f"{x['device_s_per_image']:.4f} | {x['mean_batch']:.2f} | {x['errors']} |"
            )
        for system, ratios in part["over_floor"].items():
            rounds = ", ".join(f"{a:.2f}/{b:.2f}" for a, b in ratios["rounds"])
            print(
                f"{system} over the bare FastAPI floor: p50 {ratios['p50']:.2f}x, p99 "
                f"{ratios['p99']:.2f}x (medians of the rounds' p50/p99 ratios: {rounds})"
            )


def over_floor(
    runs: dict[tuple[str, float], list[Run]], chosen: list[dict[str, Any]], timeouts: list[float]
) -> dict[str, dict[str, Any]]:
    """Each system's p50 and p99 over the floor's, round by round, and their medians.

    Each round runs the systems one after the other, so a round's ratio compares runs
    minutes apart, not a run against the floor of a slower or quieter spell.
    """
    floor = runs.get((FLOOR, timeouts[0]))
    if not floor:
        return {}
    out = {}
    for x in chosen:
        if x["system"] == FLOOR:
            continue
        pairs = [
            (r.pct(50) / f.pct(50), r.pct(99) / f.pct(99))
            for r, f in zip(runs[(x["system"], x["setting_s"])], floor, strict=False)
        ]
        out[x["system"]] = {
            "p50": statistics.median(a for a, _ in pairs),
            "p99": statistics.median(b for _, b in pairs),
            "rounds": pairs,
        }
    return out


if __name__ == "__main__":
    main()
