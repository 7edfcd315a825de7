"""The shared model function behind Ray Serve's ``@serve.batch`` (a peer for the bench).

Run: ``python benchmarks/peers/ray_peer.py --port P --max-batch-size 8 --wait 0.05 --model M``;
prints READY once the HTTP route ``/predict`` answers, then serves until killed.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import peer_args


def main() -> None:
    args = peer_args("--wait")
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])

    import ray
    from ray import serve
    from starlette.requests import Request

    ray.init(
        num_cpus=os.cpu_count(),
        include_dashboard=False,
        log_to_driver=False,
        runtime_env={"env_vars": {"PYTHONPATH": os.environ["PYTHONPATH"]}},
    )
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})

    @serve.deployment(max_ongoing_requests=100_000, ray_actor_options={"num_cpus": 1})
    class Renderer:
        def __init__(self, model: str, steps: int | None, threads: int) -> None:
            sys.path.insert(0, here)
            from common import load_render, png_b64

            self.render = load_render(model, steps, threads)
            self.png = png_b64

        @serve.batch(max_batch_size=args.max_batch_size, batch_wait_timeout_s=args.timeout)
        async def batched(self, prompts: list[str], seeds: list[int]) -> list[str]:
            images = await asyncio.to_thread(self.render, prompts, seeds)
            return [self.png(im) for im in images]

        async def __call__(self, request: Request) -> dict[str, str]:
            body = await request.json()
            return {"b64_json": await self.batched(body["prompt"], int(body["seed"]))}

    serve.run(Renderer.bind(args.model, args.steps, args.threads), route_prefix="/predict")
    print("READY", flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
