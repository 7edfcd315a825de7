"""The model function every peer serves: the same renderq executor, one call per batch.

``load_render(model)`` returns ``render(prompts, seeds) -> images``: a batch through
``DiffusersExecutor.run`` (one generator per request, as renderq renders), or blank 8x8
images at once for the ``null`` model. Each call appends ``[batch_size, seconds]`` to the
file named by ``RENDERQ_PEER_LOG``, so every server's device-seconds are counted alike.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
from collections.abc import Callable
from typing import Any

Render = Callable[[list[str], list[int]], list[Any]]


def peer_args(timeout_flag: str) -> argparse.Namespace:
    """The command line every peer server takes; ``timeout_flag`` is its batching knob."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--steps", type=int)
    ap.add_argument("--max-batch-size", type=int, default=8)
    ap.add_argument(timeout_flag, type=float, default=0.01, dest="timeout")
    ap.add_argument("--threads", type=int, default=2)
    return ap.parse_args()


def load_render(model: str, steps: int | None = None, threads: int = 2) -> Render:
    """The batch render function for ``model`` (``null`` for instant blank images)."""
    import torch

    from renderq.backends.diffusers import DiffusersExecutor, quiet_libraries
    from renderq.backends.null import NULL_MODEL, NullExecutor
    from renderq.backends.registry import model_defaults, resolve
    from renderq.core.types import Batch, BatchKey, Request

    torch.set_num_threads(threads)
    quiet_libraries()
    if model == NULL_MODEL:
        executor: Any = NullExecutor()
        width, height, steps, guidance, sampler = 8, 8, 1, 0.0, "null"
    else:
        executor = DiffusersExecutor.load(resolve(model), name=model)
        default_steps, guidance = model_defaults(model)
        steps = steps or default_steps
        width, height = executor.default_size()
        sampler = executor.sampler
    key = BatchKey(
        model, width, height, steps, guidance > 1.0, sampler, "fp32", executor.device_class
    )
    log = os.environ.get("RENDERQ_PEER_LOG")

    def render(prompts: list[str], seeds: list[int]) -> list[Any]:
        reqs = tuple(
            Request(f"p{i}", p, key, base_seed=s, guidance_scale=guidance)
            for i, (p, s) in enumerate(zip(prompts, seeds, strict=True))
        )
        result = executor.run(Batch(0, key, reqs, 0.0, len(reqs)))
        if log:
            with open(log, "a") as fh:
                fh.write(json.dumps([len(reqs), result.device_seconds]) + "\n")
        return [it.image for it in result.items]

    return render


def png_b64(image: Any) -> str:
    """A uint8 HWC image as base64 PNG."""
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode()
