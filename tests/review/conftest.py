"""A run folder whose prompts all escalated, made by ``renderq run`` on tiny models."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.run import conftest as run_fixtures
from tests.run.conftest import write_prompts

# The tiny models' session fixtures, shared with tests/run.
tiny_model = run_fixtures.tiny_model
tiny_clip = run_fixtures.tiny_clip

REVIEW_PROMPTS = [
    "a small red circle on a blue background",
    "a large green square on a black background",
    "a small yellow triangle on a white background",
    "a large purple circle on a green background",
]
MAX_ATTEMPTS = 2


def run_escalating(folder: Path, model: Path, clip: Path, *extra: str) -> dict[str, Any]:
    """``renderq run`` on ``folder/prompts.txt`` into ``folder/out`` (a resume if it exists)
    under settings every prompt escalates with: no cosine reaches 1.0. Returns its summary."""
    prompts = folder / "prompts.txt"
    if not prompts.exists():
        write_prompts(prompts, REVIEW_PROMPTS)
    cmd = [sys.executable, "-m", "renderq", "run", str(prompts), "--out", str(folder / "out"),
           "--model", str(model), "--scorer", str(clip), "--steps", "2", "--threshold", "1.0",
           "--max-attempts", str(MAX_ATTEMPTS), "--max-batch-size", "4", "--threads", "1",
           "--json", *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return dict(json.loads(done.stdout))


@pytest.fixture(scope="session")
def escalated_template(
    tmp_path_factory: pytest.TempPathFactory, tiny_model: Path, tiny_clip: Path
) -> Path:
    """The folder (prompts file and output) after one run; copy it before changing it."""
    folder = tmp_path_factory.mktemp("escalated")
    summary = run_escalating(folder, tiny_model, tiny_clip)
    assert summary["escalated"] == len(REVIEW_PROMPTS) and summary["accepted"] == 0
    return folder


@pytest.fixture
def escalated(escalated_template: Path, tmp_path: Path) -> Path:
    """A fresh copy of the escalated run folder (the folder holding prompts.txt and out/)."""
    dest = tmp_path / "job"
    shutil.copytree(escalated_template, dest)
    return dest
