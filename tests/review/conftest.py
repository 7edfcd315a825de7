"""A run folder whose prompts all escalated, built once by the job runner on tiny models."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from renderq.backends.clip import ClipScorer
from renderq.backends.diffusers import DiffusersExecutor
from renderq.jobs.runner import RunSettings, run_job
from tests.run import conftest as run_fixtures
from tests.run.conftest import settings_kwargs, write_prompts

# The tiny models' session fixtures, shared with tests/run.
tiny_model = run_fixtures.tiny_model
tiny_clip = run_fixtures.tiny_clip
executor = run_fixtures.executor
scorer = run_fixtures.scorer

REVIEW_PROMPTS = [
    "a small red circle on a blue background",
    "a large green square on a black background",
    "a small yellow triangle on a white background",
    "a large purple circle on a green background",
]


def escalating_settings(folder: Path, tiny_model: Path, tiny_clip: Path) -> RunSettings:
    """Settings under which every prompt escalates: no cosine reaches 1.0."""
    prompts = write_prompts(folder / "prompts.txt", REVIEW_PROMPTS)
    kw = settings_kwargs(tiny_model, tiny_clip, threshold=1.0, max_attempts=2, steps=2)
    return RunSettings(prompts, folder / "out", **kw)


@pytest.fixture(scope="session")
def escalated_template(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_clip: Path,
    executor: DiffusersExecutor, scorer: ClipScorer,
) -> Path:  # fmt: skip
    """The folder (prompts file and output) after one run; copy it before changing it."""
    folder = tmp_path_factory.mktemp("escalated")
    summary = run_job(escalating_settings(folder, tiny_model, tiny_clip),
                      executor=executor, scorer=scorer)  # fmt: skip
    assert summary.escalated == len(REVIEW_PROMPTS) and summary.accepted == 0
    return folder


@pytest.fixture
def escalated(escalated_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the escalated run folder (the folder holding prompts.txt and out/)."""
    dest = tmp_path / "job"
    shutil.copytree(escalated_template, dest)
    return dest
