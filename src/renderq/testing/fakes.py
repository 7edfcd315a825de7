"""The fakes every test shares: an executor, a scripted scorer, a listener, a manual clock.

They implement the same protocols as the real parts (``Executor``, ``Scorer``, the
engine's ``Listener``, a ``Clock``) and are deterministic: an image is its request's
``(id, attempt)``, a score is decided by a set of attempts that fail.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.core.types import Batch, BatchResult, ItemResult, ScoreResult


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
            reqs: Iterable[Any] = st.batch.requests if st.kind == "render" else st.scored
            if st.kind in ("render", "score"):
                out.append((st.kind, tuple((r.id, r.attempt) for r in reqs)))
        return out
