"""Profile a real diffusers pipeline and CLIP scorer through renderq's own executors."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.diffusers import DiffusersExecutor, import_torch, is_oom
from renderq.backends.registry import model_defaults, resolve
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
from renderq.core.settings import DEFAULT_MAX_BATCH_SIZE, ModelSpec, key_for
from renderq.core.types import Batch, Request

PROMPTS = (
    "a small red circle on a blue background",
    "a large green square on a white background",
    "a small yellow triangle on a black background",
    "a large blue circle and a small red square on a purple background",
)


@dataclass(frozen=True, slots=True)
class ProfileSettings:
    """What to profile: the model, where, and over which batch sizes.

    Unset steps and guidance are the pipeline's own, as ``renderq run`` renders them.
    ``adapters``: LoRA adapters ``(name, path)`` to load; with any, the profile also holds
    the seconds a switch between them takes (``render.switch_s``).
    """

    spec: ModelSpec = field(default_factory=ModelSpec)
    resolution: tuple[int, int] | None = None
    max_batch: int = DEFAULT_MAX_BATCH_SIZE
    repeats: int = 3
    warmup: int = 2
    adapters: tuple[tuple[str, str], ...] = ()


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

    spec = s.spec
    executor = DiffusersExecutor.load(
        resolve(spec.model), device=spec.device, precision=spec.precision,
        adapters=dict(s.adapters),
    )  # fmt: skip
    scorer = ClipScorer.load(resolve(spec.scorer), device=spec.device)
    return profile_loaded(executor, scorer, s, name)


def profile_loaded(
    executor: DiffusersExecutor, scorer: Scorer, s: ProfileSettings, name: str | None = None
) -> dict[str, Any]:
    """Measure render and score latency per batch size of loaded models."""
    width, height = s.resolution or executor.default_size()
    executor.check_size(width, height)
    spec = s.spec
    steps, guidance = spec.resolve(*model_defaults(spec.model))
    key = key_for(
        spec.model, width, height, steps, guidance, executor.sampler, spec.precision, spec.device
    )
    peak, reset = _peak_probe(spec.device)
    images: list[Any] = []
    counter = iter(range(1 << 62))

    def render(n: int, adapter: str = "") -> float:
        reset()
        batch_key = dataclasses.replace(key, adapter=adapter) if adapter else key
        reqs = tuple(
            Request(
                f"p{i}",
                PROMPTS[i % len(PROMPTS)],
                batch_key,
                base_seed=next(counter),
                guidance_scale=guidance,
            )
            for i in range(n)
        )
        result = executor.run(Batch(0, batch_key, reqs, 0.0, n))
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
    mem, env = _device_memory(spec.device)
    doc = profile_document(
        name=name or f"{spec.model.split(':')[-1].split('/')[-1]}-{spec.device.split(':')[0]}",
        model=spec.model,
        device_class=spec.device,
        precision=spec.precision,
        resolution=(width, height),
        steps=steps,
        device_memory_bytes=mem,
        render=render_pts,
        score=score_pts,
        environment=environment_line(spec.device, env),
    )
    if executor.lora.paths:
        switches = measure_switches(executor, repeats=s.repeats, warmup=s.warmup)
        doc["render"]["switch_s"] = round(statistics.median(switches), 6)
        doc["render"]["switch_repeats"] = [round(t, 6) for t in switches]
        largest = max(p.batch_size for p in render_pts)
        factors = measure_adapter_factor(render, largest, sorted(executor.lora.paths), s.repeats)
        doc["render"]["adapter_factor"] = round(statistics.median(factors), 4)
        doc["render"]["adapter_factor_repeats"] = [round(f, 4) for f in factors]
    return doc


def measure_adapter_factor(
    render: Callable[[int, str], float], n: int, adapters: Sequence[str], repeats: int
) -> list[float]:
    """Each round's ratio of a batch of ``n`` with an adapter active to one with none.

    A round renders with no adapter, then with each adapter, then with none again (so a
    slow spell falls on both sides); its ratio is the adapters' mean over the two plain
    batches' mean. One untimed round first (the first activation loads kernels).
    """
    ratios: list[float] = []
    for round_ in range(1 + max(repeats, 3)):
        plain = render(n, "")
        withs = [render(n, a) for a in adapters]
        plain = (plain + render(n, "")) / 2
        if round_ > 0:
            ratios.append(statistics.fmean(withs) / plain)
    return ratios


def measure_switches(executor: DiffusersExecutor, *, repeats: int, warmup: int) -> list[float]:
    """Seconds of each timed LoRA adapter switch, round the loaded adapters and none.

    A round activates every adapter in turn and then none, so each switch leaves a
    different adapter; ``warmup`` rounds go untimed, then ``max(repeats, 3)`` are timed.
    """
    labels = [*sorted(executor.lora.paths), ""]
    times: list[float] = []
    for round_ in range(warmup + max(repeats, 3)):
        for label in labels:
            start = time.perf_counter()
            executor.lora.activate(executor.pipeline, label)
            if round_ >= warmup:
                times.append(time.perf_counter() - start)
    return times
