"""Step-level batching: who joins, who leaves and who is paused at every denoising step.

With request-level batching a request that arrives while a batch denoises waits for all of
it. Here the running batch is re-formed at every step boundary (:meth:`StepBatcher.plan`):

- requests whose last step ran leave (:meth:`StepBatcher.on_step` names them; the shell
  decodes them, and scores and regenerates them through its usual queue);
- waiting requests of the running batch's *step key* join, up to the key's cap. The step
  key is the batch key without the step count: same model, resolution, sampler,
  precision, guidance on/off, device class and prompt bucket; step count and guidance
  scale may differ within one running batch;
- priorities apply at every boundary: a waiting request of higher priority takes the place
  of the lowest-priority running one when the batch is full, and work of a higher priority
  under another key pauses the whole running batch. A paused request keeps its latents and
  scheduler state in the shell and resumes later where it stopped (nothing recomputed).

Fairness between keys of equal priority: the running key stops taking new requests while
another key has work of the same (top) priority waiting, and hands the device over once it
has drained; a key is picked by its oldest work. Within a key, requests of equal priority
run in arrival order and a running or paused request is never displaced by an equal one,
so nothing thrashes.

The batcher is pure (no clock, no I/O): the shell passes ``now`` and reports each step's
device-seconds, which are shared out equally over the requests that rode in it, so the
per-request totals add up to the device time of every step exactly.
"""

from __future__ import annotations

import enum
import itertools
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from renderq.core.cost import LatencyCurve, Profile
from renderq.core.errors import ConfigError, ProfileError, UnknownRequest
from renderq.core.stats import medians_by_size
from renderq.core.types import BatchKey, ItemResult, Request


@dataclass(frozen=True, slots=True)
class StepKey:
    """What requests must share to ride in one running batch (a batch key less its steps)."""

    model: str
    width: int
    height: int
    guidance: bool
    sampler: str
    precision: str
    device_class: str
    prompt_bucket: int = 0

    @classmethod
    def of(cls, key: BatchKey) -> StepKey:
        """The step key of a batch key."""
        return cls(
            key.model,
            key.width,
            key.height,
            key.guidance,
            key.sampler,
            key.precision,
            key.device_class,
            key.prompt_bucket,
        )


class Phase(enum.StrEnum):
    """Where a request is in the step batcher."""

    WAITING = "waiting"
    RUNNING = "running"
    PAUSED = "paused"


class StepState(Protocol):
    """One request in a step runner: what a driver reads of it."""

    @property
    def request(self) -> Request:
        """The request."""
        ...

    @property
    def done(self) -> bool:
        """Whether its last step has run."""
        ...

    @property
    def device_seconds(self) -> float:
        """Device-seconds booked to it so far."""
        ...


class StepRunner(Protocol):
    """Runs step-level batches: the seam between a step loop and a step executor."""

    #: The device class its device belongs to.
    device_class: str

    def prepare(self, request: Request) -> Any:
        """A new state for ``request`` (a :class:`StepState`), ready for its first step."""
        ...

    def step(self, running: Sequence[Any]) -> float:
        """One denoising step of every state in ``running``; returns its seconds."""
        ...

    def decode(self, finished: Sequence[Any]) -> list[ItemResult]:
        """An image (or an error) for each finished state, decoded in one batch."""
        ...


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What to do at one step boundary, in this order.

    ``preempt``: pause these running requests (keep their state); ``resume``: paused
    requests that run again; ``join``: new requests to prepare; ``run``: the running batch
    of the next step (empty: nothing to do). Every id in ``run`` shares ``key``.
    """

    key: StepKey | None
    run: tuple[str, ...]
    join: tuple[Request, ...] = ()
    resume: tuple[str, ...] = ()
    preempt: tuple[str, ...] = ()


@dataclass(slots=True)
class _Entry:
    request: Request
    key: StepKey
    seq: int
    phase: Phase = Phase.WAITING


@dataclass(slots=True)
class StepBatcher:
    """The step policy's state machine for one device (one running batch at a time).

    ``cap`` is the largest running batch for a step key (an int for every key, or a
    function of the key, e.g. from the memory model).
    """

    cap: int | Callable[[StepKey], int]
    name: str = "step"
    _entries: dict[str, _Entry] = field(default_factory=dict)
    _running: list[str] = field(default_factory=list)
    _key: StepKey | None = None
    _seq: itertools.count[int] = field(default_factory=itertools.count)
    #: Device-seconds booked to each request still here or finished (see ``on_step``).
    spent: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.cap, int) and self.cap < 1:
            raise ConfigError(f"step batch cap must be >= 1, got {self.cap}")

    # -- what the shell tells it -------------------------------------------------------

    def submit(self, request: Request, now: float) -> None:
        """Queue ``request`` (a new id, or the next attempt of one that has left)."""
        if request.id in self._entries:
            raise ConfigError(f"request {request.id!r} is already in the step batcher")
        self._entries[request.id] = _Entry(request, StepKey.of(request.key), next(self._seq))

    def on_step(self, finished: Iterable[str], seconds: float, now: float) -> list[Request]:
        """The step of the current running batch ran; ``finished`` had their last step.

        ``seconds`` (the step's device time) is shared out equally over the running batch.
        Returns the requests that leave (to decode); the rest keep running.
        """
        if not self._running:
            raise ConfigError("on_step called with no running batch")
        if not seconds >= 0:
            raise ConfigError(f"step seconds must be >= 0, got {seconds}")
        done = list(dict.fromkeys(finished))
        for rid in done:
            if rid not in self._entries:
                raise UnknownRequest(rid)
            if self._entries[rid].phase is not Phase.RUNNING:
                raise ConfigError(f"request {rid!r} finished a step it did not run in")
        share = seconds / len(self._running)
        for rid in self._running:
            self.spent[rid] = self.spent.get(rid, 0.0) + share
        left = [self._entries.pop(rid).request for rid in done]
        gone = set(done)
        self._running = [rid for rid in self._running if rid not in gone]
        return left

    def forget(self, request_id: str) -> None:
        """Drop the seconds booked to a request that has left (a shell that lives long calls
        this to bound its memory, as with ``Scheduler.forget``); one still here is refused."""
        if request_id in self._entries:
            raise ConfigError(f"request {request_id!r} is still in the step batcher")
        self.spent.pop(request_id, None)

    def cancel(self, request_id: str) -> Phase:
        """Drop a waiting or paused request (a running one leaves at its next boundary).

        Returns the phase it was in; the shell frees a paused request's state.
        """
        entry = self._entries.get(request_id)
        if entry is None:
            raise UnknownRequest(request_id)
        if entry.phase is Phase.RUNNING:
            raise ConfigError(f"request {request_id!r} is running; cancel it at a boundary")
        del self._entries[request_id]
        return entry.phase

    # -- the decision --------------------------------------------------------------------

    def plan(self, now: float) -> StepPlan:
        """Re-form the running batch for the next step (see the module docstring)."""
        key = self._choose_key()
        if key is None:
            return StepPlan(None, ())
        cap = self._cap(key)
        mine = [e for e in self._entries.values() if e.key == key]
        top_elsewhere = max(
            (e.request.priority for e in self._entries.values() if e.key != key), default=None
        )
        top_mine = self._top(mine)
        # Drain only while the running batch itself holds the key's top work; otherwise
        # that work is waiting or paused and takes its place below.
        drain = (
            top_elsewhere is not None
            and top_elsewhere >= top_mine
            and key == self._key
            and self._top(self._entries[rid] for rid in self._running) >= top_mine
        )
        # Candidates in the order they deserve a place: priority, then those already
        # running, then paused, then waiting, each in arrival order.
        order = {Phase.RUNNING: 0, Phase.PAUSED: 1, Phase.WAITING: 2}
        ranked = sorted(mine, key=lambda e: (-e.request.priority, order[e.phase], e.seq))
        if drain:
            # Another key's top work waits: take no one new, let the running ones finish.
            ranked = [e for e in ranked if e.phase is Phase.RUNNING]
        chosen = ranked[:cap]
        chosen_ids = {e.request.id for e in chosen}
        preempt = tuple(rid for rid in self._running if rid not in chosen_ids)
        resume = tuple(e.request.id for e in chosen if e.phase is Phase.PAUSED)
        join = tuple(e.request for e in chosen if e.phase is Phase.WAITING)
        for rid in preempt:
            self._entries[rid].phase = Phase.PAUSED
        for e in chosen:
            e.phase = Phase.RUNNING
        kept = [rid for rid in self._running if rid in chosen_ids]
        self._running = [*kept, *resume, *(r.id for r in join)]
        self._key = key
        return StepPlan(key, tuple(self._running), join, resume, preempt)

    def _choose_key(self) -> StepKey | None:
        """The key to run next: the running one while it holds top-priority work."""
        if not self._entries:
            return None
        top = self._top(self._entries.values())
        if self._key is not None and any(
            self._entries[rid].request.priority >= top for rid in self._running
        ):
            return self._key
        best = min(
            (e for e in self._entries.values() if e.request.priority >= top),
            key=lambda e: e.seq,
        )
        return best.key

    @staticmethod
    def _top(entries: Iterable[_Entry]) -> int:
        return max((e.request.priority for e in entries), default=-(2**63))

    def _cap(self, key: StepKey) -> int:
        cap = self.cap(key) if callable(self.cap) else self.cap
        if cap < 1:
            raise ConfigError(f"step batch cap for {key} must be >= 1, got {cap}")
        return cap

    # -- what it holds ----------------------------------------------------------------

    @property
    def running(self) -> tuple[str, ...]:
        """Ids of the running batch, in row order."""
        return tuple(self._running)

    @property
    def key(self) -> StepKey | None:
        """The step key of the running batch (None before the first plan)."""
        return self._key

    def phases(self) -> dict[str, Phase]:
        """Every request still here and its phase."""
        return {rid: e.phase for rid, e in self._entries.items()}

    def idle(self) -> bool:
        """True when no request is waiting, paused or running."""
        return not self._entries


@dataclass(frozen=True, slots=True)
class StepCost:
    """What step-level batching costs on one device: the simulator's model of it.

    ``step``: seconds of one denoising step by running-batch size; ``prepare_s``: seconds to
    prepare one request (text encoding, latents); ``decode``: seconds of a decode batch by
    size (None: counted in the steps). ``source`` says where the numbers came from.
    """

    step: LatencyCurve
    prepare_s: float = 0.0
    decode: LatencyCurve | None = None
    source: str = "assumption"

    def __post_init__(self) -> None:
        if not self.prepare_s >= 0:
            raise ProfileError(f"prepare seconds must be >= 0, got {self.prepare_s}")

    @classmethod
    def from_profile(cls, profile: Profile) -> StepCost:
        """A step cost derived from a whole-batch profile: its render latency over its steps.

        An approximation (prepare and decode are spread over the steps), labelled as such.
        """
        curve = profile.render.curve
        steps = tuple(s / profile.steps for s in curve.seconds)
        return cls(
            LatencyCurve(curve.sizes, steps),
            source=f"derived from {profile.name}: render latency / {profile.steps} steps",
        )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> StepCost:
        """Parse a step profile (``renderq profile --step-level``); errors name the field."""
        try:
            decode = data.get("decode")
            source = data.get("source", {})
            return cls(
                LatencyCurve.from_points(data["step"]["points"]),
                prepare_s=float(data.get("prepare_s", 0.0)),
                decode=None if decode is None else LatencyCurve.from_points(decode["points"]),
                source=str(source.get("kind", "assumption")) + ": " + str(data.get("name", "")),
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ProfileError(f"step profile is missing or has a bad field: {exc}") from None

    @classmethod
    def from_trace(
        cls,
        steps: Sequence[tuple[int, float]],
        prepares: Sequence[float] = (),
        decodes: Sequence[tuple[int, float]] = (),
        source: str = "measured: a real step loop's own steps",
        *,
        cap: int | None = None,
    ) -> StepCost:
        """A step cost from what a real loop did: the median seconds of its steps at each
        running-batch size, of its prepares, and of its decodes at each size.

        ``cap``: the loop's running-batch cap; a step or decode size the loop never reached
        up to it is priced per request at the largest size it did reach (an upper bound
        where a step costs less than in proportion to its batch, as on a GPU).
        """
        if not steps:
            raise ProfileError("a step cost needs at least one measured step")
        points = _extended(medians_by_size(steps), cap)
        decode = _extended(medians_by_size(decodes), cap)
        return cls(
            LatencyCurve.from_points(points),
            prepare_s=statistics.median(prepares) if prepares else 0.0,
            decode=LatencyCurve.from_points(decode) if decode else None,
            source=source,
        )

    @property
    def cap(self) -> int:
        """The largest running batch the cost model covers."""
        return self.step.max_size

    def decode_s(self, n: int) -> float:
        """Seconds to decode ``n`` finished requests in one batch."""
        return 0.0 if self.decode is None or n == 0 else self.decode.latency(n)


def _extended(points: list[tuple[int, float]], cap: int | None) -> list[tuple[int, float]]:
    """``points`` with one more at ``cap``, per request at the largest size, if beyond it."""
    if points and cap is not None and cap > points[-1][0]:
        top, top_s = points[-1]
        points.append((cap, top_s * cap / top))
    return points
