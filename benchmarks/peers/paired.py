"""The service's own overhead, paired request by request: a precise A/B of serving stacks.

The null pass of ``run.py`` sends a Poisson trace to one system at a time; one round's
ratio to the floor moves by 0.2-0.4 with the machine's spells. Here every system is up at
once and one client sends one request to each in turn, ``--turns`` times, one request in
flight at a time: every system meets the same spells, and a difference of a few percent
shows. Systems: ``fastapi`` (the bare floor, ``fastapi_peer.py``), ``renderq`` (this
checkout), and ``renderq@DIR`` for renderq from another source tree (for example a
``git worktree`` of another commit: its ``src`` goes first on ``PYTHONPATH``). All serve
the ``null`` model.

Run: ``python benchmarks/peers/paired.py [--systems fastapi,renderq,renderq@../other-checkout]
[--turns 3000] [--rounds 2]``; prints each system's p50 and p99 per round, and the ratio
to the first system's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from renderq.core.stats import percentile

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run import TOKEN, Server

BODY = {"prompt": "a small red circle on a blue background", "seed": 0}


def start(label: str, args: argparse.Namespace, root: Path) -> Server:
    """One system, ready; ``renderq@DIR`` runs renderq from ``DIR/src``."""
    system, _, tree = label.partition("@")
    saved = os.environ.get("PYTHONPATH")
    if tree:
        os.environ["PYTHONPATH"] = str(Path(tree).resolve() / "src")
    try:
        home = root / label.replace("/", "_").replace("@", "-")
        home.mkdir()
        server = Server(system, "null", 0.0, args, home)
    finally:
        if saved is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    server.wait_ready()
    return server


def post(client: httpx.Client, server: Server, seed: int) -> float:
    """One request's seconds, client side; a failure stops the run."""
    t0 = time.perf_counter()
    if server.system == "renderq":
        r = client.post(
            f"{server.url}/v1/images/generations",
            json={**BODY, "seed": seed, "qa": False},
            headers={"Authorization": f"Bearer {TOKEN}"},
        )
    else:
        r = client.post(f"{server.url}/predict", json={**BODY, "seed": seed})
    took = time.perf_counter() - t0
    if r.status_code != 200:
        raise SystemExit(f"{server.system} answered {r.status_code}: {r.text[:200]}")
    return took


def one_round(labels: list[str], args: argparse.Namespace) -> dict[str, tuple[float, float]]:
    """Every system up, ``args.turns`` turns; each system's (p50, p99) in seconds."""
    with tempfile.TemporaryDirectory(prefix="renderq-paired-") as tmp:
        servers: dict[str, Server] = {}
        try:
            for label in labels:
                servers[label] = start(label, args, Path(tmp))
            took: dict[str, list[float]] = {label: [] for label in labels}
            with httpx.Client(timeout=30) as client:
                for turn in range(args.warmup + args.turns):
                    for label, server in servers.items():
                        t = post(client, server, turn)
                        if turn >= args.warmup:
                            took[label].append(t)
                        time.sleep(args.gap)
        finally:
            for server in servers.values():
                server.stop()
    # The null pass's percentile (nearest rank), so a p99 here means what it means there.
    return {label: (statistics.median(v), percentile(v, 99) or 0.0) for label, v in took.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--systems", default="fastapi,renderq")
    ap.add_argument("--turns", type=int, default=3000, help="requests to each system")
    ap.add_argument("--warmup", type=int, default=300, help="turns not counted, first")
    ap.add_argument("--rounds", type=int, default=1, help="fresh servers each round")
    ap.add_argument("--gap", type=float, default=0.003, help="seconds between two requests")
    ap.add_argument("--max-batch-size", type=int, default=8)
    args = ap.parse_args()
    labels = [s for s in args.systems.split(",") if s]
    unknown = [s for s in labels if s.partition("@")[0] not in ("fastapi", "renderq")]
    if unknown or not labels:
        ap.error(f"systems are fastapi, renderq and renderq@DIR; got {unknown or labels}")
    if args.turns < 100:
        ap.error(f"--turns must be at least 100 for a p99, got {args.turns}")
    # What run.Server reads from the bench's arguments (renderq's config; QA is off).
    args.steps, args.scorer = None, "null"
    base = labels[0]
    print(f"{args.turns} turns a round, one request at a time; ratios to {base}")
    print("| round | system | p50 ms | p99 ms | p50 ratio | p99 ratio |")
    print("|---|---|---|---|---|---|")
    for k in range(args.rounds):
        got = one_round(labels, args)
        b50, b99 = got[base]
        for label, (p50, p99) in got.items():
            print(
                f"| {k + 1} | {label} | {1e3 * p50:.2f} | {1e3 * p99:.2f} | "
                f"{p50 / b50:.2f} | {p99 / b99:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
