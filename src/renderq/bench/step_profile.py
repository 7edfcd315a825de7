"""Profile step-level batching: seconds per denoising step by running-batch size.

It times the step executor's three calls apart, through the same generic rounds as the
whole-batch profile (:func:`renderq.bench.profiling.measure`): one denoising step of a
running batch of 1, 2, 4, ... requests, a decode batch of each size, and the prepare of one
request (text encoding, latents, its scheduler). The document it returns is what
:meth:`renderq.core.step.StepCost.from_dict` reads, so the step simulator runs on it.
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from renderq.backends.registry import model_defaults, resolve
from renderq.backends.step import StepExecutor, StepState
from renderq.bench.model_profile import PROMPTS, ProfileSettings
from renderq.bench.profiling import doubling_sizes, environment_line, measure
from renderq.core.settings import key_for
from renderq.core.types import Request


def profile_steps(s: ProfileSettings, name: str | None = None) -> dict[str, Any]:
    """Load the model and measure its step, prepare and decode costs."""
    spec = s.spec
    ex = StepExecutor.load(
        resolve(spec.model), device=spec.device, precision=spec.precision, name=spec.model
    )
    return profile_loaded_steps(ex, s, name)


def profile_loaded_steps(
    ex: StepExecutor, s: ProfileSettings, name: str | None = None
) -> dict[str, Any]:
    """Measure a loaded step executor; returns the step profile document."""
    width, height = s.resolution or ex.default_size()
    spec = s.spec
    ex.rules.check_size(spec.model, width, height)
    steps, guidance = spec.resolve(*model_defaults(spec.model))
    key = key_for(spec.model, width, height, steps, guidance, "default", spec.precision,
                  spec.device)  # fmt: skip
    seeds = itertools.count()
    prepares: list[float] = []

    def request(i: int) -> Request:
        return Request(f"p{i}", PROMPTS[i % len(PROMPTS)], key, base_seed=next(seeds),
                       guidance_scale=guidance)  # fmt: skip

    def fresh(n: int) -> list[StepState]:
        states = [ex.prepare(request(i)) for i in range(n)]
        prepares.extend(st.device_seconds for st in states)
        return states

    def step(n: int) -> float:
        return ex.step(fresh(n))

    def decode(n: int) -> float:
        states = fresh(n)
        for st in states:  # mark them finished: decode cost does not depend on the step
            st.index = st.total_steps
        before = sum(st.device_seconds for st in states)
        ex.images(states)
        return sum(st.device_seconds for st in states) - before

    sizes = doubling_sizes(s.max_batch)
    step_pts = measure(step, sizes, repeats=s.repeats, warmup=s.warmup)
    decode_pts = measure(decode, sizes, repeats=s.repeats, warmup=s.warmup)
    return {
        "name": name
        or f"{spec.model.split(':')[-1].split('/')[-1]}-{spec.device.split(':')[0]}-step",
        "model": spec.model,
        "device_class": spec.device,
        "precision": spec.precision,
        "resolution": [width, height],
        "guidance": guidance,
        "source": {
            "kind": "measured",
            "note": "renderq profile --step-level: median of repeats after warm-up; "
            + environment_line(spec.device),
        },
        "step": {"points": [[p.batch_size, round(p.seconds, 6)] for p in step_pts]},
        "prepare_s": round(statistics.median(prepares), 6),
        "decode": {"points": [[p.batch_size, round(p.seconds, 6)] for p in decode_pts]},
    }
