"""Bulk jobs inside the service: each one a ``renderq run``-style folder, resumable.

A job lives in ``DATA/jobs/<id>/``: ``job.json`` (tenant, state, options), the job store
(``renderq.sqlite``), ``images/``, ``metadata.jsonl``, ``review.jsonl``. Its prompts share
the service's scheduler with everything else; each engine step is split per job (events,
images, and the job's head-count share of the batch's device-seconds) and handed to the
same listener ``renderq run`` uses, which writes images atomically, then commits. Every
method here runs on the service's jobs thread (SQLite connections stay on one thread).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
import uuid
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from renderq.core.events import Event
from renderq.core.ledger import LedgerRow, shares_by
from renderq.core.seeds import seed_for
from renderq.core.settings import DEFAULT_SCORER
from renderq.core.types import Batch, BatchKey, BatchKind, Request
from renderq.core.windows import Windows
from renderq.jobs.runner import STORE_NAME, JobListener, restore_ledger, resume_points
from renderq.jobs.summary import Progress
from renderq.output.dataset import DatasetWriter, atomic_write_text
from renderq.runtime.realtime import Step
from renderq.store.sqlite import NOT_ACCEPTED, JobStore, PromptRow, PromptState

SEP = ":"


def not_accepted(counts: Mapping[str, int]) -> int:
    """Prompts the gate escalated and no reviewer accepted (rejected and edited included)."""
    return sum(counts.get(s, 0) for s in NOT_ACCEPTED)


class JobNotFound(KeyError):
    """No such job for this tenant (another tenant's jobs are invisible, not forbidden)."""


class ServiceJob:
    """One bulk job: its folder, store, dataset writer and listener."""

    def __init__(self, folder: Path, meta: dict[str, Any], key: BatchKey, max_attempts: int):
        self.folder = folder
        self.meta = meta
        self.id: str = meta["id"]
        self.tenant: str = meta["tenant"]
        self.key = key
        self.max_attempts = max_attempts
        self.store = JobStore.open(folder / STORE_NAME)
        self.rows = {r.prompt.id: r.prompt for r in self.store.requests()}
        counts = self.store.counts()
        config = self.store.job_config() or {}
        self.listener = JobListener(
            self.store,
            DatasetWriter(folder),
            self.store.start_run(os.getpid(), "service"),
            str(config.get("scorer", DEFAULT_SCORER)),
            dict(self.rows),
            Progress(len(self.rows), counts.get("accepted", 0), not_accepted(counts)),
            config,
        )

    @property
    def state(self) -> str:
        """queued, running, done or cancelled."""
        if self.meta["state"] == "cancelled":
            return "cancelled"
        counts = self.store.counts()
        if counts.get("pending", 0) == 0:
            return "done"
        return "running" if counts.get("accepted", 0) + not_accepted(counts) else "queued"

    def pending_requests(self, clock_offset: float = 0.0) -> list[Request]:
        """A request for every prompt not yet ended, at the attempt it resumes from.

        A window-mode job's requests carry its windows, moved from Unix time onto the
        scheduler's clock by ``clock_offset`` (scheduler now - Unix now).
        """
        if self.meta["state"] == "cancelled":
            return []
        spec = self.meta.get("windows")
        window = None if spec is None else Windows.parse(spec).shifted(clock_offset)
        todo, _ = resume_points(self.store, self.max_attempts)
        out = []
        for pid, attempt in todo.items():
            row = self.rows[pid]
            bucket = int(row.spec.get("prompt_bucket", 0))
            key = dataclasses.replace(self.key, prompt_bucket=bucket)
            out.append(
                Request(
                    id=f"{self.id}{SEP}{pid}",
                    prompt=row.prompt,
                    key=key,
                    base_seed=row.base_seed,
                    attempt=attempt,
                    priority=int(self.meta["priority"]),
                    guidance_scale=float(self.meta["guidance"]),
                    negative_prompt=row.spec.get("negative_prompt", ""),
                    tenant=self.tenant,
                    job=self.id,
                    window=window,
                )
            )
        return out

    def mark_cancelled(self) -> None:
        """Record the cancel; queued prompts stay pending in the store and never resume."""
        self.meta["state"] = "cancelled"
        write_meta(self.folder, self.meta)

    def started(self, batch: Batch, requests: Sequence[Request]) -> None:
        """Hand the job's part of a started batch to its listener."""
        self.listener.started(dataclasses.replace(batch, requests=tuple(map(_local, requests))))

    def step(self, step: Step) -> None:
        """Commit the job's part of one engine step."""
        self.listener.step(step)

    def status(self) -> dict[str, Any]:
        """The job's counts and ledger.

        ``escalated`` counts every prompt the gate escalated and no reviewer accepted, a
        reviewer's rejections and edits included (``rejected`` and ``edited`` say how many of
        them), so that ``accepted + escalated + pending == total``.
        """
        counts = self.store.counts()
        report = restore_ledger(self.store).report()
        accepted = counts.get("accepted", 0)
        return {
            "id": self.id,
            "state": self.state,
            "created": float(self.meta["created"]),
            "total": len(self.rows),
            "accepted": accepted,
            "escalated": not_accepted(counts),
            "rejected": counts.get(PromptState.REJECTED, 0),
            "edited": counts.get(PromptState.EDITED, 0),
            "pending": counts.get("pending", 0),
            "mode": str(self.meta["mode"]),
            "windows": self.meta.get("windows"),
            "ledger": {
                "device_seconds": {s.value: v for s, v in report.seconds.items()},
                "total_device_seconds": report.total_seconds,
                "gpu_hours_per_10k_accepted": report.per_10k_accepted_hours(),
            },
        }

    def images(
        self, offset: int, limit: int, with_images: bool
    ) -> tuple[list[dict[str, Any]], int]:
        """A page of accepted images (with base64 PNG data when asked)."""
        rows = self.store.requests(PromptState.ACCEPTED)
        page = []
        for r in rows[offset : offset + limit]:
            item: dict[str, Any] = {
                "id": r.prompt.id,
                "file_name": r.file_name,
                "prompt": r.prompt.prompt,
                "seed": _seed(r.prompt.base_seed, r.attempt or 0),
                "attempt": r.attempt or 0,
                "clip_score": r.score,
            }
            if with_images and r.file_name:
                item["b64_json"] = base64.b64encode(
                    (self.folder / r.file_name).read_bytes()
                ).decode()
            page.append(item)
        return page, len(rows)

    def close(self) -> None:
        """Close the store."""
        self.store.close()


class JobBook:
    """Every job of the service, by id."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.jobs: dict[str, ServiceJob] = {}

    def create(
        self,
        tenant: str,
        prompts: Sequence[tuple[str, int, str]],
        *,
        key: BatchKey,
        guidance: float,
        priority: int,
        mode: str,
        config: dict[str, Any],
        windows: str | None = None,
        max_attempts: int,
        lengths: Sequence[Mapping[str, Any]] = (),
    ) -> ServiceJob:
        """Write the job folder and store, and open it.

        ``lengths``: each prompt's ``prompt_bucket`` and ``truncated`` (as ``renderq run``
        records them); its requests ride in ``key`` with their own bucket.
        """
        job_id = "job-" + uuid.uuid4().hex[:12]
        folder = self.root / job_id
        folder.mkdir(parents=True)
        (folder / "prompts.txt").write_text("".join(p + "\n" for p, _, _ in prompts))
        meta: dict[str, Any] = {
            "id": job_id,
            "tenant": tenant,
            "state": "active",
            "created": time.time(),
            "priority": priority,
            "mode": mode,
            "windows": windows,
            "guidance": guidance,
            "key": {k: v for k, v in dataclasses.asdict(key).items() if k != "_hash"},
            "max_attempts": max_attempts,
        }
        spec = {"width": key.width, "height": key.height, "steps": key.steps}
        rows = [
            PromptRow(
                f"p{i:06d}", i, text, seed,
                {**spec, "negative_prompt": neg, **(lengths[i] if lengths else {})},
            )
            for i, (text, seed, neg) in enumerate(prompts)
        ]  # fmt: skip
        store = JobStore.open(folder / STORE_NAME)
        try:
            store.create_job({**config, "tenant": tenant, "job": job_id}, rows)
        finally:
            store.close()
        write_meta(folder, meta)
        job = self.jobs[job_id] = ServiceJob(folder, meta, key, max_attempts)
        return job

    def get(self, tenant: str, job_id: str) -> ServiceJob:
        """The tenant's job, or JobNotFound."""
        job = self.jobs.get(job_id)
        if job is None or job.tenant != tenant:
            raise JobNotFound(job_id)
        return job

    def resume(self) -> list[ServiceJob]:
        """Open every job folder that is neither cancelled nor done (after a restart)."""
        out = []
        for meta_path in sorted(self.root.glob("job-*/job.json")):
            meta = json.loads(meta_path.read_text())
            if meta["id"] in self.jobs:
                continue
            key = BatchKey(**meta["key"])
            job = ServiceJob(meta_path.parent, meta, key, int(meta["max_attempts"]))
            self.jobs[job.id] = job
            if job.state not in ("done", "cancelled"):
                out.append(job)
        return out

    def split(self, requests: Iterable[Request]) -> dict[ServiceJob, list[Request]]:
        """Requests grouped by the job they belong to (interactive ones left out)."""
        out: dict[ServiceJob, list[Request]] = {}
        for r in requests:
            job = self.jobs.get(r.job) if r.job else None
            if job is not None:
                out.setdefault(job, []).append(r)
        return out

    def split_step(
        self, step: Step, shares: dict[str, tuple[LedgerRow, ...]]
    ) -> dict[ServiceJob, Step]:
        """One engine step cut into each job's part, with request ids made job-local."""
        events: dict[str, list[Event]] = {}
        for ev in step.events:
            if ev.request.job in self.jobs:
                local = dataclasses.replace(ev, request=_local(ev.request))
                events.setdefault(ev.request.job, []).append(local)
        out = {}
        for job_id in set(events) | set(shares):
            job = self.jobs.get(job_id)
            if job is None:
                continue
            prefix = job_id + SEP
            images = {k[len(prefix) :]: v for k, v in step.images.items() if k.startswith(prefix)}
            out[job] = dataclasses.replace(
                step,
                events=tuple(events.get(job_id, ())),
                ledger=shares.get(job_id, ()),
                images=images,
            )
        return out

    def close(self) -> None:
        """Close every store."""
        for job in self.jobs.values():
            job.close()


def job_shares(
    requests: Sequence[Request], seconds: float, kind: BatchKind, device_class: str
) -> dict[str, tuple[LedgerRow, ...]]:
    """Each job's share of a render or score batch's device-seconds, as ledger rows.

    The split is the ledger's own (``core.ledger.shares_by``): by head count, first
    attempts and retries apart; interactive requests count but belong to no job.
    """
    if not requests or seconds <= 0 or kind is BatchKind.LOST:
        return {}
    split = shares_by(((r.job or None, r.attempt) for r in requests), seconds, kind)
    return {
        job: tuple(LedgerRow(stage, device_class, s) for stage, s in stages.items())
        for job, stages in split.items()
    }


def write_meta(folder: Path, meta: dict[str, Any]) -> None:
    """Write ``job.json`` atomically."""
    atomic_write_text(folder / "job.json", json.dumps(meta, indent=2, sort_keys=True))


def _local(r: Request) -> Request:
    return dataclasses.replace(r, id=r.id.split(SEP, 1)[1]) if SEP in r.id else r


def _seed(base: int, attempt: int) -> int:
    return seed_for(base, attempt)
