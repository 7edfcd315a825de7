"""The fakes every test shares: an executor, a scripted scorer, a listener, a manual clock.

They implement the same protocols as the real parts (``Executor``, ``Scorer``, the
engine's ``Listener``, a ``Clock``) and are deterministic: an image is its request's
``(id, attempt)``, a score is decided by a set of attempts that fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.core.types import Batch, BatchKind, BatchResult, ItemResult, ScoreResult


@dataclass(slots=True)
class FakeExecutor:
    """Renders each request as the tuple ``(id, attempt)``, booking ``seconds`` a batch."""

    device_class: str = "cpu"
    seconds: float = 0.001
    batches: list[Batch] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        """One image per request, never an error."""
        self.batches.append(batch)
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, self.seconds, self.device_class)


@dataclass(slots=True)
class ScriptedScorer:
    """Scores ``fail_score`` for the ``(id, attempt)`` images in ``fails``, else ``pass_score``."""

    fails: frozenset[tuple[str, int]] = frozenset()
    device_class: str = "cpu"
    seconds: float = 0.001
    pass_score: float = 1.0
    fail_score: float = 0.0

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """A score per image, from the script."""
        scores = tuple(
            self.fail_score if tuple(im) in self.fails else self.pass_score for im in images
        )
        return ScoreResult(scores, self.seconds, self.device_class)


@dataclass(slots=True)
class ManualClock:
    """A clock that moves only when told to."""

    t: float = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        """Move the clock forward."""
        self.t += seconds


@dataclass(slots=True)
class RecordingListener:
    """An engine listener that keeps every batch started and every step."""

    batches: list[Batch] = field(default_factory=list)
    steps: list[Any] = field(default_factory=list)

    def started(self, batch: Batch) -> None:
        """Keep the batch."""
        self.batches.append(batch)

    def step(self, step: Any) -> None:
        """Keep the step."""
        self.steps.append(step)

    def events(self, kind: type | tuple[type, ...]) -> list[Any]:
        """Every event of ``kind`` in step order."""
        return [ev for st in self.steps for ev in st.events if isinstance(ev, kind)]

    def log(self) -> list[tuple[str, tuple[tuple[str, int], ...]]]:
        """Each render and score batch that came back: ``(kind, ((id, attempt), ...))``."""
        out = []
        for st in self.steps:
            reqs: Iterable[Any] = st.batch.requests if st.kind is BatchKind.RENDER else st.scored
            if st.kind is not BatchKind.LOST:
                out.append((st.kind, tuple((r.id, r.attempt) for r in reqs)))
        return out


@dataclass(slots=True)
class FakeStepState:
    """One request in a :class:`FakeStepExecutor`: how many of its steps have run."""

    request: Any
    total_steps: int
    index: int = 0
    device_seconds: float = 0.0

    @property
    def done(self) -> bool:
        """Whether every step has run."""
        return self.index >= self.total_steps


@dataclass(slots=True)
class FakeStepExecutor:
    """A step executor without a model: a step costs ``base_s + row_s`` per request.

    It keeps every step's running ids (``steps``) and refuses what the real one refuses:
    stepping a finished request, decoding an unfinished one, preparing one twice at once.
    """

    device_class: str = "cpu"
    base_s: float = 0.01
    row_s: float = 0.002
    decode_s: float = 0.001
    steps: list[tuple[str, ...]] = field(default_factory=list)
    prepared: list[str] = field(default_factory=list)

    def prepare(self, request: Any) -> FakeStepState:
        """A new state at step 0 of the request's own step count."""
        self.prepared.append(request.id)
        return FakeStepState(request, int(request.key.steps))

    def step(self, running: Sequence[FakeStepState]) -> float:
        """One step of each running state; returns the step's seconds, shared equally."""
        if any(s.done for s in running):
            raise ValueError(f"stepped a finished request: {[s.request.id for s in running]}")
        seconds = self.base_s + self.row_s * len(running) if running else 0.0
        for s in running:
            s.index += 1
            s.device_seconds += seconds / len(running)
        self.steps.append(tuple(s.request.id for s in running))
        return seconds

    def images(self, finished: Sequence[FakeStepState]) -> list[tuple[str, int]]:
        """The image of each finished state: ``(id, attempt)``."""
        if any(not s.done for s in finished):
            raise ValueError("decoded an unfinished request")
        for s in finished:
            s.device_seconds += self.decode_s / len(finished)
        return [(s.request.id, s.request.attempt) for s in finished]

    def decode(self, finished: Sequence[FakeStepState]) -> list[ItemResult]:
        """:meth:`images` as the step loop reads them: an item result each."""
        return [ItemResult(img[0], image=img) for img in self.images(finished)]
