"""The dataset's two views, ``metadata.jsonl`` and ``review.jsonl``, written from the store.

The store is the truth: :func:`refresh_views` rewrites both files from it (after a crash,
a resume or a reviewer's decision), and the job listener appends the rows of each step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from renderq.core.seeds import seed_for
from renderq.output.dataset import METADATA, REVIEW, DatasetWriter, attempt_file_name
from renderq.store.sqlite import (
    NOT_ACCEPTED,
    AttemptRow,
    Decision,
    JobStore,
    PromptRow,
    PromptState,
)


def metadata_row(
    prompt: PromptRow,
    attempt: int,
    score: float | None,
    file_name: str | None,
    run: int | None,
    batch_id: int | None,
    batch_size: int | None,
    config: dict[str, Any],
    accepted_by: str = "gate",
) -> dict[str, Any]:
    """One ``metadata.jsonl`` row (Hugging Face ImageFolder: ``file_name`` first).

    ``accepted_by`` is ``gate`` (the score passed) or ``review`` (a reviewer chose this
    attempt of an escalated prompt); ``parent`` names the prompt an edited one came from.
    """
    spec = prompt.spec
    return {
        "file_name": file_name,
        "id": prompt.id,
        "prompt": prompt.prompt,
        "seed": seed_for(prompt.base_seed, attempt),
        "attempt": attempt,
        "clip_score": score,
        "model": config.get("model"),
        "scorer": config.get("scorer"),
        "steps": spec["steps"],
        "guidance": config.get("guidance"),
        "width": spec["width"],
        "height": spec["height"],
        "negative_prompt": spec["negative_prompt"],
        "prompt_bucket": spec.get("prompt_bucket", 0),
        "truncated": spec.get("truncated", []),
        "lora": spec.get("adapter", ""),
        "batch_id": f"{run}-{batch_id}",
        "batch_size": batch_size,
        "accepted_by": accepted_by,
        "parent": prompt.parent,
    }


def review_row(
    prompt: PromptRow, attempts: Sequence[AttemptRow], decision: Decision | None = None
) -> dict[str, Any]:
    """One ``review.jsonl`` row: the prompt, every attempt's seed, score, error and image.

    ``review`` is None while the prompt awaits a reviewer; once rejected or edited it says
    so, who decided and when (and for an edit, the request it was resubmitted as).
    """
    return {
        "id": prompt.id,
        "prompt": prompt.prompt,
        "parent": prompt.parent,
        "review": None if decision is None else _review_field(decision),
        "attempts": [
            {
                "attempt": a.attempt,
                "seed": a.seed,
                "clip_score": a.score,
                "error": a.error,
                "batch_id": f"{a.run}-{a.batch_id}",
                "batch_size": a.batch_size,
                "image": attempt_file_name(prompt.id, a.attempt) if a.error is None else None,
            }
            for a in attempts
        ],
    }


def _review_field(d: Decision) -> dict[str, Any]:
    done = {"accept": "accepted", "reject": "rejected", "edit": "edited"}[d.action]
    out: dict[str, Any] = {"decision": done, "reviewer": d.reviewer, "at": d.at}
    if d.action == "edit":
        out.update(new_prompt=d.prompt, resubmitted_as=d.new_request_id)
    return out


def refresh_views(store: JobStore, writer: DatasetWriter) -> None:
    """Rewrite metadata/review from the store and delete images the store does not know.

    ``review.jsonl`` lists the escalated prompts and those a reviewer rejected or edited;
    one a reviewer accepted is in ``metadata.jsonl``, marked ``accepted_by: review``.
    """
    config = store.job_config() or {}
    accepted = store.requests(PromptState.ACCEPTED)
    decided = {d.request_id: d for d in store.decisions()}
    writer.prune({r.file_name for r in accepted if r.file_name})
    writer.prune_attempts(
        {
            r.prompt.id
            for r in store.requests()
            if r.state != PromptState.ACCEPTED or r.prompt.id in decided
        }
    )
    writer.rewrite(
        METADATA,
        [
            metadata_row(
                r.prompt,
                r.attempt or 0,
                r.score,
                r.file_name,
                r.run,
                r.batch_id,
                r.batch_size,
                config,
                "review" if r.prompt.id in decided else "gate",
            )
            for r in accepted
        ],
    )
    ended = store.attempts()
    writer.rewrite(
        REVIEW,
        [
            review_row(r.prompt, ended.get(r.prompt.id, []), decided.get(r.prompt.id))
            for r in store.requests()
            if r.state in NOT_ACCEPTED
        ],
    )
