"""The served model: loading it, what it renders by default, its input checks and its cost.

Requests are checked against the loaded model (sizes, negative prompts, prompt-length
buckets) by the rules ``renderq run`` uses; the warm-up times it at the service's batch
sizes, and admission prices every key from that curve.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from contextlib import ExitStack
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
    """The service's render workers, all of one device class: its own executor, a
    ``devices`` pool, or (``mode = "step"``) the slots of a step loop on each device
    (its own pipeline alone, or one per ``devices`` entry, loaded in its process).

    ``owner`` is what :meth:`close` ends (the pool, or the step loops); ``loops`` the step
    loops.
    """

    device_class: str = ""
    executors: Sequence[Executor] = ()
    owner: Any = None
    loops: Sequence[Any] = ()

    @classmethod
    def start(cls, config: ServiceConfig, executor: Executor) -> Workers:
        """Start the pool of ``config.devices`` (returns once every worker has loaded), the
        step loops of step mode, or take ``executor`` alone."""
        from renderq.backends.null import NULL_MODEL

        if config.batching.mode == "step":
            return cls._step(config, executor)
        if not config.devices:
            return cls(executor.device_class, [executor])
        from renderq.jobs.workers import device_specs, start_pool

        if config.spec.model == NULL_MODEL:
            raise ConfigError("devices: the null model renders in the service's own process")
        specs = device_specs(config.devices, config.backend, config.address)
        pool = start_pool(config.spec, specs, backend=config.backend, address=config.address)
        [(device_class, executors)] = pool.executors().items()
        return cls(device_class, executors, pool)

    @classmethod
    def _step(cls, config: ServiceConfig, executor: Executor) -> Workers:
        """A step loop driving ``executor``'s own pipeline, or one per ``config.devices``
        entry (refused for a pipeline it cannot drive)."""
        from renderq.backends.diffusers import DiffusersExecutor
        from renderq.backends.step_loop import step_executors, step_pool

        if not isinstance(executor, DiffusersExecutor):
            raise ConfigError(
                f"mode 'step' drives a diffusers pipeline's denoising loop; "
                f"{config.spec.model!r} has none (serve it with mode 'dynamic')"
            )
        specs: list[Any] = []
        if config.devices:
            from renderq.jobs.workers import device_specs

            specs = device_specs(config.devices, config.backend, config.address)
        cap = config.render_cap
        with ExitStack() as stack:  # closed here only if a loop fails to start
            # As many slots again as each running batch holds, kept for interactive work:
            # an interactive request enters a loop at once and displaces a running bulk one.
            loops, lanes = stack.enter_context(
                step_pool(step_executors(executor, specs, config.spec), cap, reserved=cap)
            )
            return cls(loops[0].device_class, lanes, stack.pop_all(), loops)

    def close(self) -> None:
        """End the pool's workers or the step loop (nothing for the service's own executor)."""
        if self.owner is not None:
            self.owner.close()
            self.owner = None


def prompt_length(executor: Any, prompt: str) -> tuple[int, list[str]]:
    """The executor's length bucket of ``prompt`` and what would truncate it (0, none: an
    executor without text-encoder buckets)."""
    measure_length = getattr(executor, "prompt_length", None)
    if measure_length is None:
        return 0, []
    length = measure_length(prompt)
    return int(length.bucket), list(length.truncated)


def warm_up(executor: Executor, d: Defaults, cap: int) -> LatencyCurve:
    """Time render batches of 1 and of ``cap`` (``renderq profile``'s timer: two warm-up
    rounds, then three timed): the cost curve.

    Each size is priced at the median of its three timed runs, as ``renderq profile``
    prices it: a one-off stall should not price every request, and the fastest run of a
    process that has just loaded its models over-reads the device as often. Admission
    corrects the curve later by the latency it observes (``Scheduler.latency_scale``).
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

    points = measure(render, sorted({1, cap}), repeats=3, warmup=2)
    return LatencyCurve.from_points([(p.batch_size, p.seconds) for p in points])


def step_curve(curve: LatencyCurve, cap: int) -> LatencyCurve:
    """The price of one request in step mode: a full running batch's latency, at any size.

    In step mode the scheduler hands the loop one request per free slot; a request then
    rides in the running batch, which under load holds ``cap`` requests, so its slot is
    held about as long as a whole batch of ``cap`` takes. Priced flat at that latency, with
    the loop counted as one worker of batches of ``cap``, admission expects the queue ahead
    of a request to clear ``cap`` at a time (an upper bound: requests also join mid-way);
    on a lightly loaded loop the observed latency scale falls below 1 and corrects it.
    """
    full = curve.latency(cap)
    return LatencyCurve.from_points([(1, full), (cap, full)]) if cap > 1 else curve


def scaled_cost(curve: LatencyCurve, key: BatchKey, d: Defaults) -> StageCost:
    """The warm-up curve scaled to a key's steps and pixels (linear in both, an estimate)."""
    factor = (key.steps / d.steps) * (key.width * key.height) / (d.width * d.height)
    return StageCost(LatencyCurve(curve.sizes, tuple(s * factor for s in curve.seconds)))
