"""The served model: loading it, what it renders by default, its input checks and its cost.

Requests are checked against the loaded model (sizes, negative prompts, prompt-length
buckets) by the rules ``renderq run`` uses; the warm-up times it at the service's batch
sizes, and admission prices every key from that curve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from renderq.backends.registry import model_defaults, resolve, scorer_default_threshold
from renderq.bench.profiling import measure
from renderq.core.cost import LatencyCurve, StageCost
from renderq.core.errors import ConfigError
from renderq.core.protocols import Executor, Scorer
from renderq.core.settings import key_for
from renderq.core.types import Batch, BatchKey, Request
from renderq.service.config import ServiceConfig


@dataclass(slots=True)
class Defaults:
    """What the loaded model renders unless a request says otherwise."""

    width: int
    height: int
    steps: int
    guidance: float
    threshold: float
    sampler: str


@dataclass(frozen=True, slots=True)
class Served:
    """The loaded model as requests see it: their batch keys, checked against it.

    ``executor`` (in this process) checks requests; ``device_class`` is the class of the
    workers that render them (a ``devices`` pool's, else the executor's own).
    """

    config: ServiceConfig
    executor: Executor
    defaults: Defaults
    render_class: str = ""

    @property
    def device_class(self) -> str:
        """The device class of the render workers: every request's key carries it."""
        return self.render_class or self.executor.device_class

    def key_of(self, opts: dict[str, Any]) -> tuple[BatchKey, float]:
        """The batch key (prompt bucket 0) and guidance of a request's size/steps/guidance;
        :meth:`prompt_key` adds the prompt's own part."""
        d = self.defaults
        width, height = opts.get("size") or (d.width, d.height)
        self.check("check_size", width, height)
        steps = opts.get("steps") or d.steps
        if steps > self.config.max_steps:
            raise ConfigError(f"steps must be at most {self.config.max_steps}, got {steps}")
        guidance = d.guidance if opts.get("guidance") is None else float(opts["guidance"])
        adapter = self.adapter(opts.get("lora") or "")
        spec = self.config.spec  # the key rule ``renderq run`` uses
        key = key_for(
            spec.model, width, height, steps, guidance, d.sampler, spec.precision,
            self.device_class, adapter=adapter,
        )  # fmt: skip
        return key, guidance

    def adapter(self, label: str) -> str:
        """``label`` (``NAME`` or ``NAME@SCALE``) in its key form, checked against the
        adapters the service loaded (ConfigError naming it otherwise)."""
        if not label:
            return ""
        if getattr(self.executor, "check_adapter", None) is None:
            raise ConfigError(f"lora {label!r}: the model {self.config.spec.model!r} takes none")
        from renderq.backends.adapters import adapter_label, parse_label

        self.check("check_adapter", label)
        return adapter_label(*parse_label(label))

    def prompt_key(
        self, key: BatchKey, prompt: str, negative_prompt: str = ""
    ) -> tuple[BatchKey, list[str]]:
        """``key`` with the prompt's length bucket, and the encoders that would cut it.

        The negative prompt is checked by the executor first: a model that would ignore
        one refuses it (ConfigError naming it), as ``renderq run`` does.
        """
        self.check("check_negative_prompt", negative_prompt)
        bucket, truncated = prompt_length(self.executor, prompt)
        if bucket != key.prompt_bucket:
            key = dataclasses.replace(key, prompt_bucket=bucket)
        return key, truncated

    def check(self, name: str, *args: Any) -> None:
        """Run the executor's input check ``name`` where it has one (the null model has not)."""
        check = getattr(self.executor, name, None)
        if check is not None:
            check(*args)


def load_models(config: ServiceConfig) -> tuple[Executor, Scorer, Defaults]:
    """Load the configured diffusers pipeline and CLIP scorer."""
    from renderq.backends.clip import ClipScorer
    from renderq.backends.diffusers import DiffusersExecutor
    from renderq.backends.null import NULL_MODEL, NullExecutor, NullScorer

    spec = config.spec
    if spec.model == NULL_MODEL:  # pure service overhead: instant blank images
        null = NullExecutor()
        return null, NullScorer(), Defaults(null.size, null.size, 1, 0.0, 0.0, null.sampler)

    executor = DiffusersExecutor.load(
        resolve(spec.model), device=spec.device, precision=spec.precision, name=spec.model,
        adapters=dict(spec.adapters),
    )  # fmt: skip
    scorer = ClipScorer.load(resolve(spec.scorer), device=spec.device, name=spec.scorer)
    width, height = executor.default_size()
    steps, guidance = spec.resolve(*model_defaults(spec.model))
    threshold = config.qa.policy(scorer_default_threshold(spec.scorer)).threshold
    defaults = Defaults(width, height, steps, guidance, threshold, executor.sampler)
    return executor, scorer, defaults


@dataclass(slots=True)
class Workers:
    """The service's render workers: its own executor, or a ``devices`` pool of one class."""

    device_class: str = ""
    executors: Sequence[Executor] = ()
    pool: Any = None

    @classmethod
    def start(cls, config: ServiceConfig, executor: Executor) -> Workers:
        """Start the pool of ``config.devices`` (returns once every worker has loaded), or
        take ``executor`` alone."""
        if not config.devices:
            return cls(executor.device_class, [executor])
        from renderq.backends.null import NULL_MODEL
        from renderq.backends.pool import parse_devices
        from renderq.jobs.workers import start_pool

        if config.spec.model == NULL_MODEL:
            raise ConfigError("devices: the null model renders in the service's own process")
        gpus = None
        if config.backend == "ray":
            from renderq.backends.ray_backend import cluster_gpus, connect

            connect(config.address)  # devices = "cuda" counts the cluster's GPUs
            gpus = cluster_gpus
        specs = parse_devices(config.devices, cuda_count=gpus)
        pool = start_pool(config.spec, specs, backend=config.backend, address=config.address)
        [(device_class, executors)] = pool.executors().items()
        return cls(device_class, executors, pool)

    def close(self) -> None:
        """End the pool's workers (nothing to end for the service's own executor)."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None


def prompt_length(executor: Any, prompt: str) -> tuple[int, list[str]]:
    """The executor's length bucket of ``prompt`` and what would truncate it (0, none: an
    executor without text-encoder buckets)."""
    measure_length = getattr(executor, "prompt_length", None)
    if measure_length is None:
        return 0, []
    length = measure_length(prompt)
    return int(length.bucket), list(length.truncated)


def warm_up(executor: Executor, d: Defaults, cap: int) -> LatencyCurve:
    """Time render batches of 1 and of ``cap`` (``renderq profile``'s timer: one warm-up
    round, then two timed): the cost curve.

    Each size is priced at the faster of its two timed runs: a one-off stall should not
    price every request. Admission corrects the curve later by the latency it observes
    (``Scheduler.latency_scale``).
    """
    prompt = "a red circle"
    key = key_for(
        "warm-up", d.width, d.height, d.steps, d.guidance, d.sampler, "-",
        executor.device_class, prompt_length(executor, prompt)[0],
    )  # fmt: skip

    def render(n: int) -> float:
        reqs = tuple(
            Request(f"w{i}", prompt, key, base_seed=i, guidance_scale=d.guidance) for i in range(n)
        )
        return executor.run(Batch(0, key, reqs, 0.0, n)).device_seconds

    points = measure(render, sorted({1, cap}), repeats=2, warmup=1)
    return LatencyCurve.from_points([(p.batch_size, min(p.repeats)) for p in points])


def scaled_cost(curve: LatencyCurve, key: BatchKey, d: Defaults) -> StageCost:
    """The warm-up curve scaled to a key's steps and pixels (linear in both, an estimate)."""
    factor = (key.steps / d.steps) * (key.width * key.height) / (d.width * d.height)
    return StageCost(LatencyCurve(curve.sizes, tuple(s * factor for s in curve.seconds)))
