"""Images written where they are rendered, and scored beside them.

At fleet scale the driver cannot receive every image. With ``--images`` a render worker
(a pool process, a Ray actor, or this process) holds the scorer as well: it renders a
batch, scores the images on its own device, writes each one to the job's images tree
(:class:`~renderq.output.images.ImageStore`: a folder, a shared filesystem or an object
store) as ``review/<id>-<attempt>.png``, and returns :class:`StoredImage` handles (name,
score, that image's share of the scoring device-seconds) instead of pixels. Pixels cross
the network once, from the worker to the storage.

The driver's scheduler still decides everything: its score stage "scores" those handles
through :class:`WorkerScores`, which reads the scores the worker attached and books the
device-seconds the worker measured to the score stage; the job runner then moves an
accepted image to ``images/<id>.png`` (a rename, or a server-side copy on object stores)
and leaves a failed attempt's image where it is, for review.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from renderq.backends.pool import Loader, WorkerSpec
from renderq.core.protocols import Executor, Scorer
from renderq.core.types import Batch, BatchResult, ItemResult, ScoreResult
from renderq.output.dataset import attempt_file_name
from renderq.output.images import ImageStore, StoredImage


class ScorerLoader(Protocol):
    """Builds a scorer inside a worker (a picklable value)."""

    def build(self, spec: WorkerSpec, device: str) -> Scorer:
        """The scorer of the worker for ``spec``, on torch device ``device``."""
        ...


class WritingExecutor:
    """An executor that scores its renders and writes them to ``store`` itself."""

    def __init__(self, executor: Executor, scorer: Scorer, store: ImageStore) -> None:
        """Wrap ``executor``; ``scorer`` runs on the same device, after each batch."""
        self.executor = executor
        self.scorer = scorer
        self.store = store
        self.device_class = executor.device_class

    def __getattr__(self, name: str) -> Any:
        # The wrapped executor's own attributes (timer, name, prompt checks) stay reachable.
        if name == "executor":
            raise AttributeError(name)
        return getattr(self.executor, name)

    def run(self, batch: Batch) -> BatchResult:
        """Render, score and write ``batch``; each image comes back as a StoredImage."""
        result = self.executor.run(batch)
        requests = {r.id: r for r in batch.requests}
        ok = [it for it in result.items if it.ok]
        scores: list[float | None] = [None] * len(ok)
        errors: list[str | None] = [None] * len(ok)
        share = 0.0
        if ok:
            try:
                scored = self.scorer.score(
                    [it.image for it in ok], [requests[it.request_id].prompt for it in ok]
                )
            except Exception as exc:  # the driver's score stage retries or fails the attempt
                errors = [f"scoring failed in the render worker: {exc}"] * len(ok)
            else:
                scores = list(scored.scores)
                errors = list(scored.errors or (None,) * len(ok))
                share = scored.device_seconds / len(ok)
        stored = {
            it.request_id: self._write(it, requests[it.request_id].attempt, s, share, e)
            for it, s, e in zip(ok, scores, errors, strict=True)
        }
        items = tuple(stored.get(it.request_id, it) for it in result.items)
        return replace(result, items=items)

    def _write(
        self, item: ItemResult, attempt: int, score: float | None, share: float, error: str | None
    ) -> ItemResult:
        name = attempt_file_name(item.request_id, attempt)
        try:
            self.store.put(name, item.image)
        except Exception as exc:  # a failed write fails this attempt, not the worker
            return ItemResult(item.request_id, error=f"writing {self.store.path(name)}: {exc}")
        return ItemResult(item.request_id, StoredImage(name, score, share, error))


@dataclass(slots=True)
class WorkerScores:
    """The driver's scorer when the render workers score: it reads their scores."""

    device_class: str
    name: str = "render-workers"

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """The scores and scoring device-seconds the workers attached to ``images``."""
        bad = [type(i).__name__ for i in images if not isinstance(i, StoredImage)]
        if bad:
            raise TypeError(f"images the render workers scored must be StoredImage, not {bad[0]}")
        return ScoreResult(
            tuple(i.score for i in images),
            sum(i.score_seconds for i in images),
            self.device_class,
            tuple(i.score_error for i in images),
        )


@dataclass(frozen=True, slots=True)
class WriteLoad:
    """What a writing worker loads: its render executor, its scorer, and the store."""

    render: Loader
    scorer: ScorerLoader
    store: ImageStore

    def build(self, spec: WorkerSpec, device: str) -> Executor:
        """The render executor and scorer on ``device``, writing to the store."""
        executor = self.render.build(spec, device)
        return WritingExecutor(executor, self.scorer.build(spec, device), self.store)
