"""Whole jobs through the real-time engine on tiny models: faults, resume, refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from renderq.backends.clip import ClipScorer
from renderq.backends.diffusers import DiffusersExecutor
from renderq.backends.faults import FaultyPipeline, FlakyScorer
from renderq.core.errors import ConfigError
from renderq.jobs.runner import RunSettings, run_job
from renderq.store.lock import FolderLock, JobLocked
from renderq.store.sqlite import JobStore

from .conftest import PROMPTS, run_settings, write_prompts

pytestmark = pytest.mark.slow


def _meta(out: Path) -> dict[str, dict[str, object]]:
    rows = [json.loads(line) for line in (out / "metadata.jsonl").read_text().splitlines()]
    return {str(r["id"]): r for r in rows}


def _settings(tmp_path: Path, tiny_model: Path, tiny_clip: Path, **over: object) -> RunSettings:
    prompts = write_prompts(tmp_path / "prompts.txt")
    return run_settings(prompts, tmp_path / "out", tiny_model, tiny_clip, **over)


def test_oom_at_batch_8_bisected_all_delivered(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip, max_batch_size=8, threshold=-1.0)
    pipe = FaultyPipeline(executor.pipeline, oom_at=8)
    ex = DiffusersExecutor(pipe, s.spec.model)
    summary = run_job(s, executor=ex, scorer=scorer)
    assert summary.accepted == len(PROMPTS) and summary.escalated == 0
    assert pipe.ooms == 1 and pipe.calls == [8, 4, 4]
    meta = _meta(s.out)
    assert len(meta) == len(PROMPTS) and all(r["attempt"] == 0 for r in meta.values())
    assert sorted(p.name for p in (s.out / "images").iterdir()) == sorted(f"{i}.png" for i in meta)


def test_oom_lowers_the_cap_for_the_rest_of_the_run(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip, max_batch_size=4, threshold=-0.2)
    pipe = FaultyPipeline(executor.pipeline, oom_at=4)
    summary = run_job(s, executor=DiffusersExecutor(pipe, s.spec.model), scorer=scorer)
    assert summary.accepted + summary.escalated == len(PROMPTS)
    # After the first OOM at 4 the key's cap is 2: no later call is 4 wide.
    assert pipe.calls[:3] == [4, 2, 2] and max(pipe.calls[3:]) <= 2 and pipe.ooms == 1


def test_nan_item_only_that_item_regenerated(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip, threshold=-1.0)
    # Prompt 3's first seed is seed + 3 = 3: its first render comes back NaN.
    pipe = FaultyPipeline(executor.pipeline, nan_seeds=frozenset({3}))
    summary = run_job(s, executor=DiffusersExecutor(pipe, s.spec.model), scorer=scorer)
    assert pipe.nans == 1 and summary.accepted == len(PROMPTS)
    meta = _meta(s.out)
    assert {i: r["attempt"] for i, r in meta.items() if r["attempt"] != 0} == {"p000003": 1}
    store = JobStore.open(s.out / "renderq.sqlite")
    try:
        tries = store.attempts()["p000003"]
        assert tries[0].error is not None and "NaN" in tries[0].error and tries[1].score is not None
        scores = {(r, a): (sc, x) for r, a, sc, x in store.scores()}
        assert ("p000003", 0) not in scores and len(scores) == len(PROMPTS)
        assert scores[("p000003", 1)] == (s.spec.scorer, tries[1].score)
    finally:
        store.close()


def test_scorer_exception_retried_no_loss(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip, threshold=-1.0)
    flaky = FlakyScorer(scorer, fail_calls=frozenset({0, 2}))
    summary = run_job(s, executor=executor, scorer=flaky)
    assert flaky.failures == 2 and summary.accepted == len(PROMPTS)
    assert all(r["attempt"] == 0 for r in _meta(s.out).values())


def test_rerun_resumes_without_rendering_again(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip)
    first = run_job(s, executor=executor, scorer=scorer)
    assert first.accepted > 0 and first.escalated > 0  # the threshold splits the tiny scores
    before = (s.out / "metadata.jsonl").read_text()
    pipe = FaultyPipeline(executor.pipeline)
    again = run_job(s, executor=DiffusersExecutor(pipe, s.spec.model), scorer=scorer)
    assert pipe.calls == [] and again.submitted == 0 and again.runs == 2
    assert (s.out / "metadata.jsonl").read_text() == before
    assert again.ledger.total_seconds == pytest.approx(first.ledger.total_seconds)
    ledger = json.loads((s.out / "ledger.json").read_text())
    assert ledger["accepted"] == first.accepted
    review = [json.loads(x) for x in (s.out / "review.jsonl").read_text().splitlines()]
    assert len(review) == first.escalated
    assert all(len(r["attempts"]) == s.qa.max_attempts for r in review)
    assert all(a["clip_score"] < s.qa.threshold for r in review for a in r["attempts"])


def test_different_settings_refused(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip, threshold=-1.0)
    run_job(s, executor=executor, scorer=scorer)
    other = _settings(tmp_path, tiny_model, tiny_clip, threshold=-1.0, steps=4)
    with pytest.raises(ConfigError, match=r"holds a different job.*steps"):
        run_job(other, executor=executor, scorer=scorer)


def test_second_process_refused(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    s = _settings(tmp_path, tiny_model, tiny_clip)
    s.out.mkdir()
    with FolderLock(s.out), pytest.raises(JobLocked, match="another renderq process"):
        run_job(s, executor=executor, scorer=scorer)


def test_every_mode_accepts_the_same_images(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    """Batching changes cost, not results: each prompt ends the same way in every mode."""
    outcomes = {}
    for mode in ("adhoc", "dynamic", "window"):
        (tmp_path / mode).mkdir()
        s = _settings(tmp_path / mode, tiny_model, tiny_clip, mode=mode, max_queue_delay_s=0.05)
        summary = run_job(s, executor=executor, scorer=scorer)
        meta = _meta(s.out)
        outcomes[mode] = {i: (r["attempt"], r["seed"]) for i, r in meta.items()}
        if mode == "adhoc":
            assert summary.mean_batch_size == 1.0
        else:
            assert summary.mean_batch_size > 1.0
    assert outcomes["adhoc"] == outcomes["dynamic"] == outcomes["window"]
    assert any(attempt > 0 for attempt, _ in outcomes["window"].values())


def test_jsonl_sizes_seeds_and_steps_make_their_own_batches(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    lines = [
        {"prompt": PROMPTS[0], "seed": 1234},
        {"prompt": PROMPTS[1], "size": "48x32", "negative_prompt": "blurry"},
        {"prompt": PROMPTS[2], "steps": 2},
        {"prompt": PROMPTS[3], "width": 48, "height": 32},
        {"prompt": PROMPTS[4]},
    ]
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = run_settings(prompts, tmp_path / "out", tiny_model, tiny_clip, threshold=-1.0)
    pipe = FaultyPipeline(executor.pipeline)
    summary = run_job(s, executor=DiffusersExecutor(pipe, s.spec.model), scorer=scorer)
    assert summary.accepted == 5
    meta = _meta(s.out)
    assert meta["p000000"]["seed"] == 1234 and meta["p000004"]["seed"] == 4
    assert (meta["p000001"]["width"], meta["p000001"]["height"]) == (48, 32)
    assert meta["p000001"]["negative_prompt"] == "blurry" and meta["p000002"]["steps"] == 2
    # Three keys: 32x32 at 3 steps (p0, p4), 48x32 (p1, p3), 32x32 at 2 steps (p2).
    assert sorted(pipe.calls) == [1, 2, 2]
    store = JobStore.open(s.out / "renderq.sqlite")
    try:
        batches = {a.request_id: a.batch_id for rows in store.attempts().values() for a in rows}
    finally:
        store.close()
    assert batches["p000001"] == batches["p000003"] != batches["p000000"]
    from PIL import Image

    with Image.open(s.out / str(meta["p000003"]["file_name"])) as im:
        assert im.size == (48, 32)
