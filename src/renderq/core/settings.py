"""The settings every shell shares, with one set of defaults, and the rules built from them.

Every command and the service compose three frozen values, each validated once with an
error that names the flag and the bad value: :class:`ModelSpec` (what renders and scores,
where), :class:`Batching` (how batches are cut), :class:`QASettings` (the gate). Unset
steps, guidance and threshold are the model's own, filled by the shell from the loaded
pipeline and scorer. :func:`make_policy` (mode name to policy), :func:`key_for` (the batch
key, with the classifier-free guidance rule written once) and :func:`request_seeds` turn
settings into the core's objects.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from renderq.core.errors import ConfigError
from renderq.core.policies import (
    DEFAULT_MAX_QUEUE_DELAY_S,
    AdHoc,
    Dynamic,
    Policy,
    StepSlots,
    Window,
    Windows,
)
from renderq.core.qa import DEFAULT_MAX_ATTEMPTS, QAPolicy
from renderq.core.seeds import MAX_SEED
from renderq.core.types import BatchKey

MODES: tuple[str, ...] = ("adhoc", "dynamic", "window", "step")
"""Batching modes by name: one request at a time, Triton-style dynamic, offline windows,
and step-level (requests join and leave the running batch at denoising-step boundaries)."""

DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_SCORE_BATCH_SIZE = 32

DEFAULT_MODEL = "embedded:mini-sd"
"""The text-to-image model every command uses unless told otherwise."""

DEFAULT_SCORER = "embedded:clip"
"""The CLIP scorer every command uses unless told otherwise."""

PRECISIONS: tuple[str, ...] = ("fp32", "fp16", "bf16")

FALLBACK_THRESHOLD = 0.25
"""The cosine threshold when none is given and the scorer has none calibrated or shipped."""

_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """What renders and scores, on which device and precision, and how.

    ``model`` and ``scorer`` are a folder, a hub id or ``embedded:*``. ``steps`` and
    ``guidance`` of None are the pipeline's own (see :meth:`resolve`).
    """

    model: str = DEFAULT_MODEL
    scorer: str = DEFAULT_SCORER
    device: str = "cpu"
    precision: str = "fp32"
    steps: int | None = None
    guidance: float | None = None
    #: LoRA adapters a request may name, ``(name, folder or hub id)``, loaded once a worker.
    adapters: tuple[tuple[str, str], ...] = ()
    #: The denoiser under ``torch.compile`` (each batch shape warmed once, untimed).
    compile: bool = False
    #: Denoiser and VAE in channels-last memory format.
    channels_last: bool = False

    def __post_init__(self) -> None:
        names = [name for name, _ in self.adapters]
        for name, path in self.adapters:
            if not name or "@" in name or not path:
                raise ConfigError(f"--lora takes NAME=PATH (no '@' in NAME), got {name}={path}")
        if len(set(names)) != len(names):
            raise ConfigError(f"--lora names must differ, got {names}")
        for name in ("model", "scorer"):
            if not getattr(self, name):
                raise ConfigError(f"--{name} must name a model, got {getattr(self, name)!r}")
        if not _DEVICE.fullmatch(self.device):
            raise ConfigError(f"--device must be cpu, cuda or cuda:N, got {self.device!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(
                f"--precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}"
            )
        if self.steps is not None and self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {self.steps}")
        if self.guidance is not None and not (math.isfinite(self.guidance) and self.guidance >= 0):
            raise ConfigError(f"--guidance must be a number >= 0, got {self.guidance}")

    def resolve(self, steps: int, guidance: float) -> tuple[int, float]:
        """The steps and guidance to render at: those set here, else the pipeline's given."""
        return (
            steps if self.steps is None else self.steps,
            guidance if self.guidance is None else self.guidance,
        )


@dataclass(frozen=True, slots=True)
class QASettings:
    """The quality gate: the CLIP threshold, renders per prompt in all, on or off.

    ``threshold`` of None is the scorer's calibrated one (see :meth:`policy`);
    ``max_attempts`` counts the first render, so 1 means "never regenerate".
    """

    threshold: float | None = None
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    enabled: bool = True

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"--max-attempts must be >= 1, got {self.max_attempts}")
        if self.threshold is not None and not math.isfinite(self.threshold):
            raise ConfigError(f"--threshold must be a finite number, got {self.threshold}")

    def with_threshold(self, calibrated: float | None) -> QASettings:
        """Threshold given, else ``calibrated`` (the scorer's own), else the fallback."""
        if self.threshold is not None:
            return self
        return replace(self, threshold=FALLBACK_THRESHOLD if calibrated is None else calibrated)

    def policy(self, calibrated: float | None = None) -> QAPolicy:
        """The core's QA decision for these settings (threshold by :meth:`with_threshold`)."""
        threshold = self.with_threshold(calibrated).threshold
        assert threshold is not None  # with_threshold always sets one
        return QAPolicy(threshold, self.max_attempts, self.enabled)


@dataclass(frozen=True, slots=True)
class Batching:
    """How render and score batches are cut.

    ``max_batch_size`` caps a render batch (the memory model may cap it lower per key;
    None leaves the cap to the memory model alone);
    ``max_queue_delay_s`` is the dynamic mode's longest wait for a batch to fill;
    ``preferred`` are batch sizes the dynamic mode cuts at without waiting.
    """

    mode: str = "window"  # a bulk job has every prompt up front: it waits for full batches
    max_batch_size: int | None = DEFAULT_MAX_BATCH_SIZE
    max_queue_delay_s: float = DEFAULT_MAX_QUEUE_DELAY_S
    score_batch_size: int = DEFAULT_SCORE_BATCH_SIZE
    preferred: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"--mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        for name in ("max_batch_size", "score_batch_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be >= 1, got {value}")
        if not self.max_queue_delay_s >= 0:
            raise ConfigError(f"--max-queue-delay must be >= 0, got {self.max_queue_delay_s}")


INTERACTIVE = Batching("dynamic", max_batch_size=8, max_queue_delay_s=0.05)
"""The service's batching. A caller waits on each answer, so a batch leaves after at most
50 ms (a bulk run waits 0.5 s for fuller ones) and holds at most 8 images, so one batch's
render time does not stretch a single request's latency; see docs/serve.md."""


def make_policy(batching: Batching, windows: Windows | None = None) -> Policy:
    """The batching policy of ``batching.mode`` (``windows``: the window mode's schedule)."""
    if batching.mode == "adhoc":
        return AdHoc()
    if batching.mode == "step":
        return StepSlots(batching.max_batch_size)
    if batching.mode == "dynamic":
        return Dynamic(batching.max_queue_delay_s, batching.max_batch_size, batching.preferred)
    return Window(windows or Windows(), batching.max_batch_size)


def uses_cfg(guidance: float) -> bool:
    """Whether a guidance scale turns classifier-free guidance on (the pipelines' rule)."""
    return guidance > 1.0


def key_for(
    model: str,
    width: int,
    height: int,
    steps: int,
    guidance: float,
    sampler: str,
    precision: str,
    device_class: str,
    prompt_bucket: int = 0,
    adapter: str = "",
) -> BatchKey:
    """The batch key of a request: what it must share with its batch-mates."""
    return BatchKey(
        model=model,
        width=width,
        height=height,
        steps=steps,
        guidance=uses_cfg(guidance),
        sampler=sampler,
        precision=precision,
        device_class=device_class,
        prompt_bucket=prompt_bucket,
        adapter=adapter,
    )


def request_seeds(
    base_seed: int,
    n: int,
    given: Sequence[int | None] = (),
    where: Callable[[int], str] | None = None,
) -> list[int]:
    """The first seed of each of ``n`` prompts: ``given[i]`` where set, else base + i.
    ``where(i)`` names prompt ``i``'s seed in an error (default ``seed of prompt i``)."""
    if not 0 <= base_seed <= MAX_SEED:
        raise ConfigError(f"seed must be from 0 to {MAX_SEED}, got {base_seed}")
    seeds = []
    for i in range(n):
        own = given[i] if i < len(given) else None
        seed = base_seed + i if own is None else own
        if not 0 <= seed <= MAX_SEED:
            at = where(i) if where else f"seed of prompt {i}"
            how = f" (seed {base_seed} + index {i})" if own is None else ""
            raise ConfigError(f"{at} {seed}{how} is above the largest seed {MAX_SEED}")
        seeds.append(seed)
    return seeds
