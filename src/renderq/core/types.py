"""Value types shared by every layer: keys, requests, batches, results and request states."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any

from renderq.core.errors import ConfigError, InvalidTransition
from renderq.core.seeds import seed_for
from renderq.core.windows import Windows


class Stage(enum.StrEnum):
    """Where a device-second went. Each is booked separately in the ledger."""

    RENDER = "render"
    SCORE = "score"
    REGEN = "regen"
    RESCORE = "rescore"
    #: Device time of a batch whose worker died before it came back: spent, no images.
    LOST = "lost"


class BatchKind(enum.StrEnum):
    """What a batch did, and so what an engine step that ends it reports."""

    RENDER = "render"
    SCORE = "score"
    #: Its worker died holding it: the requests are queued again.
    LOST = "lost"


class RequestState(enum.StrEnum):
    """Life cycle of one request; see ``TRANSITIONS`` for the allowed moves."""

    NEW = "new"
    QUEUED = "queued"
    RUNNING = "running"
    SCORING = "scoring"
    REGENERATING = "regenerating"
    ACCEPTED = "accepted"
    ESCALATED = "escalated"
    REJECTED = "rejected"
    CANCELLED = "cancelled"


TERMINAL: frozenset[RequestState] = frozenset(
    {RequestState.ACCEPTED, RequestState.ESCALATED, RequestState.REJECTED, RequestState.CANCELLED}
)

_S = RequestState
#: Allowed state changes. A render error goes straight from running to regenerating or
#: escalated; a request without the gate goes from running to accepted, unscored; a
#: cancel reaches running/scoring work only when its result comes back.
TRANSITIONS: dict[RequestState, frozenset[RequestState]] = {
    _S.NEW: frozenset({_S.QUEUED, _S.REJECTED}),
    _S.QUEUED: frozenset({_S.RUNNING, _S.CANCELLED}),
    _S.RUNNING: frozenset(
        {_S.SCORING, _S.ACCEPTED, _S.REGENERATING, _S.ESCALATED, _S.CANCELLED, _S.QUEUED}
    ),
    _S.SCORING: frozenset({_S.ACCEPTED, _S.REGENERATING, _S.ESCALATED, _S.CANCELLED}),
    _S.REGENERATING: frozenset({_S.QUEUED, _S.CANCELLED}),
    _S.ACCEPTED: frozenset(),
    _S.ESCALATED: frozenset(),
    _S.REJECTED: frozenset(),
    _S.CANCELLED: frozenset(),
}


def check_transition(old: RequestState, new: RequestState) -> None:
    """Raise ``InvalidTransition`` unless ``old -> new`` is in the table."""
    if new not in TRANSITIONS[old]:
        raise InvalidTransition(f"request state {old.value!r} cannot move to {new.value!r}")


@dataclass(frozen=True, slots=True)
class BatchKey:
    """Everything two requests must share to ride in one batch.

    ``guidance`` is on/off only (the scale may differ per request only where the
    executor supports it; renderq's diffusers executor batches one scale, so the
    scale is part of the request's ``RenderParams`` and checked there).
    ``prompt_bucket`` is 0 for text encoders that pad to a fixed length (CLIP).
    ``adapter`` names the LoRA adapter and its scale (``"ink@0.8"``), ``""`` for none:
    a worker switches adapters between batches, never within one.
    """

    model: str
    width: int
    height: int
    steps: int
    guidance: bool
    sampler: str
    precision: str
    device_class: str
    prompt_bucket: int = 0
    adapter: str = ""
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        if self.width <= 0 or self.height <= 0:
            raise ConfigError(f"resolution must be positive, got {self.width}x{self.height}")
        if self.steps <= 0:
            raise ConfigError(f"steps must be positive, got {self.steps}")
        # Keys are hashed on every queue lookup; hashing nine fields each time is the
        # scheduler's largest single cost, so the hash is computed once.
        fields = (self.model, self.width, self.height, self.steps, self.guidance,
                  self.sampler, self.precision, self.device_class, self.prompt_bucket,
                  self.adapter)  # fmt: skip
        object.__setattr__(self, "_hash", hash(fields))

    def __hash__(self) -> int:
        return self._hash

    def label(self) -> str:
        """A short human-readable form, used in logs and metrics labels."""
        g = "cfg" if self.guidance else "nocfg"
        return (
            f"{self.model}|{self.width}x{self.height}|{self.steps}st|{g}|{self.sampler}|"
            f"{self.precision}|{self.device_class}|b{self.prompt_bucket}"
            + (f"|lora:{self.adapter}" if self.adapter else "")
        )


@dataclass(frozen=True, slots=True)
class Request:
    """One render attempt of one prompt.

    ``id`` names the prompt's request across attempts; ``attempt`` counts from 0 and the
    attempt's seed comes from ``renderq.core.qa.seed_for(base_seed, attempt)``.
    ``arrival`` is when the caller first submitted it; ``deadline`` an absolute time or None.
    Higher ``priority`` is served first.
    """

    id: str
    prompt: str
    key: BatchKey
    base_seed: int = 0
    attempt: int = 0
    priority: int = 0
    arrival: float = 0.0
    deadline: float | None = None
    guidance_scale: float = 7.5
    negative_prompt: str = ""
    tenant: str = ""
    job: str = ""
    #: False skips the quality gate for this request: any rendered image is accepted.
    qa: bool = True
    #: Scheduled windows for this request alone: it runs only inside them, batched to fill
    #: the cap (the ``window`` policy), in a lane of its key apart from requests without.
    window: Windows | None = None

    def __post_init__(self) -> None:
        if not self.id:
            raise ConfigError("request id must be a non-empty string")
        if not self.prompt.strip():
            raise ConfigError(f"request {self.id!r}: prompt is empty")
        if self.attempt < 0:
            raise ConfigError(f"request {self.id!r}: attempt must be >= 0, got {self.attempt}")

    @property
    def seed(self) -> int:
        """The seed of this attempt (deterministic from base seed and attempt)."""
        return seed_for(self.base_seed, self.attempt)


@dataclass(frozen=True, slots=True)
class Batch:
    """A set of same-key requests cut by a policy, to be rendered together."""

    id: int
    key: BatchKey
    requests: tuple[Request, ...]
    created_at: float
    cap: int

    @property
    def size(self) -> int:
        """Number of requests in the batch."""
        return len(self.requests)


@dataclass(frozen=True, slots=True)
class ItemResult:
    """The outcome of one request in a batch: an image (opaque here) or an error."""

    request_id: str
    image: Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        """True when the item produced an image."""
        return self.error is None


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What an executor returns for a batch: one item per request plus the batch's cost."""

    batch_id: int
    items: tuple[ItemResult, ...]
    device_seconds: float
    device_class: str
    #: Set when part of the batch ran out of memory and was split: the largest size that
    #: fitted. The scheduler lowers the key's cap to it for the rest of the run.
    fitted_cap: int | None = None


@dataclass(frozen=True, slots=True)
class ScoreResult:
    """What a scorer returns: one score per image (None where scoring that item failed)."""

    scores: tuple[float | None, ...]
    device_seconds: float
    device_class: str
    errors: tuple[str | None, ...] = field(default=())
