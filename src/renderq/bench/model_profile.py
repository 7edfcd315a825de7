"""Profile a real diffusers pipeline and CLIP scorer through renderq's own executors."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from renderq.backends.diffusers import DiffusersExecutor, import_torch, is_oom
from renderq.backends.registry import resolve
from renderq.bench.profiling import (
    Point,
    cpu_peak_rss,
    doubling_sizes,
    environment_line,
    host_memory_bytes,
    measure,
    profile_document,
)
from renderq.core.protocols import Scorer
from renderq.core.types import Batch, BatchKey, Request

PROMPTS = (
    "a small red circle on a blue background",
    "a large green square on a white background",
    "a small yellow triangle on a black background",
    "a large blue circle and a small red square on a purple background",
)


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What to profile: the model, where, and over which batch sizes."""

    model: str
    scorer: str
    device: str = "cpu"
    precision: str = "fp32"
    steps: int = 20
    resolution: tuple[int, int] | None = None
    guidance: float = 7.5
    max_batch: int = 16
    repeats: int = 3
    warmup: int = 2


def _peak_probe(device: str) -> tuple[Callable[[], float | None], Callable[[], None]]:
    if device.startswith("cuda"):
        torch = import_torch()
        return (
            lambda: float(torch.cuda.max_memory_allocated(device)),
            lambda: torch.cuda.reset_peak_memory_stats(device),
        )
    return cpu_peak_rss, lambda: None


def _device_memory(device: str) -> tuple[float, str]:
    if device.startswith("cuda"):
        torch = import_torch()
        props = torch.cuda.get_device_properties(device)
        return float(props.total_memory), f"{props.name}, torch {torch.__version__}"
    return host_memory_bytes(), f"torch {import_torch().__version__}"


def profile_model(s: ProfileSettings, name: str | None = None) -> dict[str, Any]:
    """Load the model and scorer, measure them; return the profile document."""
    from renderq.backends.clip import ClipScorer

    executor = DiffusersExecutor.load(resolve(s.model), device=s.device, precision=s.precision)
    scorer = ClipScorer.load(resolve(s.scorer), device=s.device)
    return profile_loaded(executor, scorer, s, name)


def profile_loaded(
    executor: DiffusersExecutor, scorer: Scorer, s: ProfileSettings, name: str | None = None
) -> dict[str, Any]:
    """Measure render and score latency per batch size of loaded models."""
    width, height = s.resolution or executor.default_size()
    executor.check_size(width, height)
    key = BatchKey(
        s.model, width, height, s.steps, s.guidance > 1.0, executor.sampler, s.precision, s.device
    )
    peak, reset = _peak_probe(s.device)
    images: list[Any] = []
    counter = iter(range(1 << 62))

    def render(n: int) -> float:
        reset()
        reqs = tuple(
            Request(
                f"p{i}",
                PROMPTS[i % len(PROMPTS)],
                key,
                base_seed=next(counter),
                guidance_scale=s.guidance,
            )
            for i in range(n)
        )
        result = executor.run(Batch(0, key, reqs, 0.0, n))
        images[:] = [it.image for it in result.items if it.ok]
        if result.fitted_cap is not None:
            raise MemoryError(f"batch of {n} ran out of memory")
        return result.device_seconds

    sizes = doubling_sizes(s.max_batch)
    oom = lambda exc: isinstance(exc, MemoryError) or is_oom(exc)  # noqa: E731
    render_pts = measure(
        render, sizes, repeats=s.repeats, warmup=s.warmup, peak_memory=peak, is_oom=oom
    )
    pool = images or []

    def score(n: int) -> float:
        batch = [pool[i % len(pool)] for i in range(n)]
        return scorer.score(batch, [PROMPTS[i % len(PROMPTS)] for i in range(n)]).device_seconds

    score_pts: list[Point] = measure(
        score, [p.batch_size for p in render_pts], repeats=s.repeats, warmup=s.warmup
    )
    mem, env = _device_memory(s.device)
    return profile_document(
        name=name or f"{s.model.split(':')[-1].split('/')[-1]}-{s.device.split(':')[0]}",
        model=s.model,
        device_class=s.device,
        precision=s.precision,
        resolution=(width, height),
        steps=s.steps,
        device_memory_bytes=mem,
        render=render_pts,
        score=score_pts,
        environment=environment_line(s.device, env),
    )
