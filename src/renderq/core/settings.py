"""The settings every shell shares, with one set of defaults, and the rules built from them.

``renderq run``, ``simulate``, ``bench`` and ``serve`` read the same knobs under the
same names; this module holds their defaults, validates them once, and turns them into
the core's objects: :func:`make_policy` (mode name to batching policy), :func:`key_for`
(the batch key of a request, with the classifier-free guidance rule written once) and
:func:`request_seeds`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from renderq.core.errors import ConfigError
from renderq.core.policies import DEFAULT_MAX_QUEUE_DELAY_S, AdHoc, Dynamic, Policy, Window, Windows
from renderq.core.seeds import MAX_SEED
from renderq.core.types import BatchKey

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "DEFAULT_MAX_QUEUE_DELAY_S",
    "DEFAULT_SCORE_BATCH_SIZE",
    "MODES",
    "Batching",
    "key_for",
    "make_policy",
    "request_seeds",
    "uses_cfg",
]

MODES: tuple[str, ...] = ("adhoc", "dynamic", "window")
"""Batching modes by name: one request at a time, Triton-style dynamic, offline windows."""

DEFAULT_MAX_BATCH_SIZE = 16
DEFAULT_SCORE_BATCH_SIZE = 32


@dataclass(frozen=True, slots=True)
class Batching:
    """How render and score batches are cut.

    ``max_batch_size`` caps a render batch (the memory model may cap it lower per key;
    None leaves the cap to the memory model alone);
    ``max_queue_delay_s`` is the dynamic mode's longest wait for a batch to fill;
    ``preferred`` are batch sizes the dynamic mode cuts at without waiting.
    """

    mode: str = "window"
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


def make_policy(batching: Batching, windows: Windows | None = None) -> Policy:
    """The batching policy of ``batching.mode`` (``windows``: the window mode's schedule)."""
    if batching.mode == "adhoc":
        return AdHoc()
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
    )


def request_seeds(base_seed: int, n: int, given: Sequence[int | None] = ()) -> list[int]:
    """The first seed of each of ``n`` prompts: ``given[i]`` where set, else base + i."""
    if not 0 <= base_seed <= MAX_SEED:
        raise ConfigError(f"seed must be from 0 to {MAX_SEED}, got {base_seed}")
    seeds = []
    for i in range(n):
        own = given[i] if i < len(given) else None
        seed = base_seed + i if own is None else own
        if not 0 <= seed <= MAX_SEED:
            raise ConfigError(f"seed of prompt {i} ({seed}) is outside 0..{MAX_SEED}")
        seeds.append(seed)
    return seeds
