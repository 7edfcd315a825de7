"""Reviewing escalated prompts of an output folder: what to show and what a decision does.

A prompt escalates when every attempt failed the gate. A reviewer looks at each attempt's
image, seed and score and decides once:

- **accept** attempt *k*: its kept image (``review/<id>-<k>.png``) is copied into
  ``images/`` atomically, then the store marks the prompt accepted at *k*; it joins
  ``metadata.jsonl`` with ``accepted_by: review`` and leaves ``review.jsonl``;
- **reject**: the prompt stays out of the dataset, marked rejected in ``review.jsonl``;
- **edit**: the edited text becomes a new pending request linked to the original
  (``parent``), at :data:`REVIEW_PRIORITY`; the next ``renderq run`` on the folder (a
  resume) renders it through the normal queue, ahead of first renders of its key.

The store records the decision first (one transaction with the state change), then the
views are rewritten from it, so a restart shows the same state and a crash in between
leaves nothing that the next refresh does not repair. A decision takes the folder's lock,
so it never races a ``renderq run`` working on the same folder.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from renderq.core.errors import ConfigError
from renderq.jobs.runner import STORE_NAME
from renderq.jobs.views import refresh_views
from renderq.output.dataset import DatasetWriter, attempt_file_name
from renderq.store.lock import FolderLock
from renderq.store.sqlite import Decision, JobStore, PromptRow

REVIEW_PRIORITY = 1
"""Scheduler priority of a resubmitted prompt: a reviewer is waiting for it."""

#: States of a prompt that reached review (``accepted`` only with a decision).
_REVIEWED = ("escalated", "rejected", "edited")


@dataclass(frozen=True, slots=True)
class AttemptView:
    """One attempt as the page shows it; ``image`` is None where none was kept."""

    attempt: int
    seed: int
    score: float | None
    error: str | None
    image: str | None


@dataclass(frozen=True, slots=True)
class ReviewItem:
    """A prompt that escalated: its attempts, its state and the decision on it, if any.

    ``resubmitted`` is the state of the request an edit created (``pending`` until a run
    renders it).
    """

    id: str
    prompt: str
    parent: str | None
    state: str
    attempts: tuple[AttemptView, ...]
    decision: Decision | None
    resubmitted: str | None = None


@dataclass(frozen=True, slots=True)
class GateView:
    """How the job's gate scores what reviewers decided.

    ``accepted`` are the scores of attempts reviewers accepted; ``rejected`` those of every
    scored attempt of prompts they rejected or edited. ``*_passing`` count the scores at or
    above ``threshold`` (what the gate would have let through).
    """

    threshold: float | None
    accepted: tuple[float, ...]
    rejected: tuple[float, ...]

    @property
    def accepted_passing(self) -> int:
        """Reviewer-accepted attempts the gate passes."""
        return self._passing(self.accepted)

    @property
    def rejected_passing(self) -> int:
        """Reviewer-rejected attempts the gate passes."""
        return self._passing(self.rejected)

    def _passing(self, scores: Sequence[float]) -> int:
        t = self.threshold
        return 0 if t is None else sum(s >= t for s in scores)

    def to_dict(self) -> dict[str, Any]:
        """JSON form, with each side's count, median and passing count."""

        def side(scores: Sequence[float], passing: int) -> dict[str, Any]:
            med = statistics.median(scores) if scores else None
            return {"n": len(scores), "median": med, "passing": passing, "scores": list(scores)}

        return {
            "threshold": self.threshold,
            "accepted": side(self.accepted, self.accepted_passing),
            "rejected": side(self.rejected, self.rejected_passing),
        }


def images_of(out: Path) -> str | None:
    """Where the images of run folder ``out`` live when not in it (``run --images``)."""
    if not (out / STORE_NAME).is_file():
        return None
    with open_store(out) as store:
        images = (store.job_config() or {}).get("images")
    return None if images is None else str(images)


@contextmanager
def open_store(out: Path) -> Iterator[JobStore]:
    """The folder's job store, closed after use; a folder without one is an error."""
    path = out / STORE_NAME
    if not path.is_file():
        raise ConfigError(f"{out} is not a renderq run folder (no {STORE_NAME})")
    store = JobStore.open(path)
    try:
        yield store
    finally:
        store.close()


def items(store: JobStore) -> list[ReviewItem]:
    """Every prompt that escalated, decided or not, in job order."""
    decided = {d.request_id: d for d in store.decisions()}
    rows = store.requests()
    state = {r.prompt.id: r.state for r in rows}
    ended = store.attempts()
    out = []
    for r in rows:
        if r.state not in _REVIEWED and r.prompt.id not in decided:
            continue
        d = decided.get(r.prompt.id)
        views = tuple(
            AttemptView(a.attempt, a.seed, a.score, a.error,
                        attempt_file_name(a.request_id, a.attempt) if a.error is None else None)
            for a in ended.get(r.prompt.id, [])
        )  # fmt: skip
        new = d.new_request_id if d is not None else None
        out.append(ReviewItem(r.prompt.id, r.prompt.prompt, r.prompt.parent, r.state, views, d,
                              state.get(new) if new else None))  # fmt: skip
    return out


def gate_view(store: JobStore) -> GateView:
    """How the job's threshold scores what reviewers accepted and rejected."""
    config = store.job_config() or {}
    labels = review_labels(store)
    threshold = config.get("threshold")
    return GateView(
        None if threshold is None else float(threshold),
        tuple(s for s, ok in labels if ok),
        tuple(s for s, ok in labels if not ok),
    )


def review_labels(store: JobStore) -> list[tuple[float, bool]]:
    """Reviewer decisions as labelled scores, for calibrating the gate.

    The attempt a reviewer accepted is a positive; every scored attempt of a prompt they
    rejected or edited is a negative. The other attempts of an accepted prompt carry no
    label: choosing one attempt says nothing about the rest.
    """
    ended = store.attempts()
    out: list[tuple[float, bool]] = []
    for d in store.decisions():
        for a in ended.get(d.request_id, []):
            if a.score is None:
                continue
            if d.action == "accept" and a.attempt == d.attempt:
                out.append((a.score, True))
            elif d.action != "accept":
                out.append((a.score, False))
    return out


def decide(
    out: Path,
    request_id: str,
    action: str,
    reviewer: str,
    *,
    attempt: int | None = None,
    prompt: str | None = None,
) -> Decision:
    """Record one reviewer decision on ``out`` and rewrite its views (see the module doc)."""
    # The store first: a folder that is not a run folder is refused before a lock file
    # is left in it.
    with open_store(out) as store, FolderLock(out):
        writer = DatasetWriter(out, (store.job_config() or {}).get("images"))
        if action == "accept":
            decision = _accept(store, writer, request_id, reviewer, attempt)
        elif action == "edit":
            decision = _edit(store, request_id, reviewer, prompt)
        else:
            if attempt is not None or prompt is not None:
                raise ConfigError(f"{action!r} takes no attempt and no prompt")
            decision = store.decide(request_id, action, reviewer)
        refresh_views(store, writer)
    return decision


def _accept(
    store: JobStore, writer: DatasetWriter, rid: str, reviewer: str, attempt: int | None
) -> Decision:
    if attempt is None:
        raise ConfigError(f"accepting {rid!r} needs the attempt to accept")
    # Checked before the image is copied: ``images/<id>.png`` of an accepted prompt must
    # never be overwritten. The store checks again inside its transaction.
    store.check_reviewable(rid)
    kept = attempt_file_name(rid, attempt)
    if not writer.store.exists(kept):
        raise ConfigError(f"no image was kept for attempt {attempt} of {rid!r}")
    import io

    from PIL import Image

    # The image joins the dataset before the store says so, as for the gate's accepts.
    with Image.open(io.BytesIO(writer.read_image(kept))) as im:
        name = writer.write_image(rid, im.copy())
    try:
        return store.decide(rid, "accept", reviewer, attempt=attempt, file_name=name)
    except BaseException:
        writer.store.delete(name)  # the prompt was escalated: no image of its own
        raise


def _edit(store: JobStore, rid: str, reviewer: str, prompt: str | None) -> Decision:
    text = (prompt or "").strip()
    if not text:
        raise ConfigError(f"the edited prompt for {rid!r} is empty")
    rows = {r.prompt.id: r.prompt for r in store.requests()}
    old = rows.get(rid)
    if old is None:
        raise ConfigError(f"no prompt {rid!r} in {store.path}")
    if text == old.prompt:
        raise ConfigError(f"the edited prompt for {rid!r} is unchanged: {text!r}")
    new = PromptRow(_edit_id(rid, set(rows)), store.next_index(), text, old.base_seed,
                    dict(old.spec), rid, REVIEW_PRIORITY)  # fmt: skip
    return store.decide(rid, "edit", reviewer, resubmit=new)


def _edit_id(rid: str, taken: set[str]) -> str:
    """``p7`` -> ``p7-r1``; an edit of ``p7-r1`` -> ``p7-r2`` (skipping ids in use)."""
    m = re.fullmatch(r"(.+)-r(\d+)", rid)
    base, n = (m[1], int(m[2]) + 1) if m else (rid, 1)
    while f"{base}-r{n}" in taken:
        n += 1
    return f"{base}-r{n}"
