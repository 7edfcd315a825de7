"""Crash safety: ``renderq run`` killed with SIGKILL at several points, then re-run.

The re-run must end with the same accepted prompts (same attempt, same seed) as a run
that was never interrupted, every accepted image on disk exactly once, and no
metadata line missing or doubled.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from renderq.backends.clip import ClipScorer
from renderq.backends.diffusers import DiffusersExecutor
from renderq.jobs.runner import run_job
from renderq.store.lock import FolderLock

from .conftest import PROMPTS, run_settings, settings_kwargs, write_prompts

pytestmark = pytest.mark.slow

_PROMPTS = PROMPTS + [p.replace("small", "large") for p in PROMPTS[:4]]
_CLI = "from renderq.cli.main import app; app()"


def _cli(prompts: Path, out: Path, model: Path, clip: Path) -> list[str]:
    kw = settings_kwargs(model, clip)
    return [
        sys.executable, "-c", _CLI, "run", str(prompts), "--out", str(out),
        "--model", kw["model"], "--scorer", kw["scorer"], "--steps", str(kw["steps"]),
        "--threshold", str(kw["threshold"]), "--max-attempts", str(kw["max_attempts"]),
        "--max-batch-size", str(kw["max_batch_size"]), "--json",
    ]  # fmt: skip


def _ended_attempts(db: Path) -> int:
    if not db.exists():
        return -1
    try:
        with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=1) as conn:
            return int(conn.execute("SELECT COUNT(*) FROM attempts").fetchone()[0])
    except sqlite3.Error:
        return -1


def _kill_when(proc: subprocess.Popen[bytes], db: Path, attempts: int, rng: random.Random) -> bool:
    """SIGKILL ``proc`` once ``attempts`` attempts have ended (plus a random delay)."""
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if _ended_attempts(db) >= attempts:
            time.sleep(rng.uniform(0.0, 0.3))
            break
        time.sleep(0.02)
    if proc.poll() is not None:
        return False
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return True


def _accepted(out: Path) -> dict[str, tuple[int, int, str]]:
    lines = (out / "metadata.jsonl").read_text().splitlines()
    rows = [json.loads(x) for x in lines]
    ids = [r["id"] for r in rows]
    assert len(ids) == len(set(ids)), "a metadata line is doubled"
    files = sorted(p.name for p in (out / "images").iterdir())
    assert files == sorted(f"{i}.png" for i in ids), "images on disk differ from metadata"
    return {r["id"]: (r["attempt"], r["seed"], r["file_name"]) for r in rows}


def test_sigkill_at_several_points_then_resume(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    prompts = write_prompts(tmp_path / "prompts.txt", _PROMPTS)
    reference = run_settings(prompts, tmp_path / "ref", tiny_model, tiny_clip)
    ref = run_job(reference, executor=executor, scorer=scorer)
    expected = _accepted(reference.out)
    assert 0 < len(expected) < len(_PROMPTS) and ref.escalated > 0

    out = tmp_path / "out"
    db = out / "renderq.sqlite"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    rng = random.Random(4)
    out.mkdir()
    with FolderLock(out):
        # A second process on a folder that a live process holds is refused at once.
        second = subprocess.run(
            _cli(prompts, out, tiny_model, tiny_clip), env=env, capture_output=True
        )
    assert second.returncode == 2
    assert b"another renderq process" in second.stderr
    kills = 0
    for point in (0, 5, 11):
        proc = subprocess.Popen(
            _cli(prompts, out, tiny_model, tiny_clip), env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            kills += _kill_when(proc, db, point, rng)
        finally:
            if proc.poll() is None:  # the test failed while it ran: do not leave it behind
                proc.kill()
                proc.wait()
    assert kills >= 2, "the runs finished before they could be killed"
    final = subprocess.run(_cli(prompts, out, tiny_model, tiny_clip), env=env, capture_output=True)
    assert final.returncode == 0, final.stderr.decode()
    summary = json.loads(final.stdout)
    # A kill during model loading happens before the run is recorded.
    assert summary["runs"] >= 3 and summary["pending"] == 0
    assert _accepted(out) == expected
    assert summary["escalated"] == ref.escalated
