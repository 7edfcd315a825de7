"""``renderq run`` on bad output folders, odd prompt files and a store that cannot be written.

Each case must end in one ``error:`` line and exit code 2, and lose nothing committed.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from renderq.backends.clip import ClipScorer
from renderq.backends.diffusers import DiffusersExecutor
from renderq.cli.main import app
from renderq.core.errors import ConfigError, StorageError
from renderq.jobs.prompts import read_prompts
from renderq.jobs.runner import run_job
from renderq.store.sqlite import JobStore

from .conftest import PROMPTS, run_settings, write_prompts

pytestmark = pytest.mark.slow


def _args(prompts: Path, out: Path, model: Path, clip: Path, *extra: str) -> list[str]:
    return [
        "run", str(prompts), "--out", str(out), "--model", str(model), "--scorer", str(clip),
        "--steps", "2", "--threshold", "-1", "--max-attempts", "2", "--max-batch-size", "4",
        "--threads", "1", *extra,
    ]  # fmt: skip


def _one_error_line(result: Any) -> str:
    assert result.exit_code == 2, result.output
    lines = [x for x in result.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.output
    return str(lines[0])


def test_out_that_is_a_file_is_one_clear_error(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path
) -> None:
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:1])
    out = tmp_path / "taken"
    out.write_text("not a folder")
    line = _one_error_line(CliRunner().invoke(app, _args(prompts, out, tiny_model, tiny_clip)))
    assert str(out) in line and "not a folder" in line
    assert out.read_text() == "not a folder"


def test_out_that_cannot_be_created_is_one_clear_error(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path
) -> None:
    prompts = write_prompts(tmp_path / "p.txt", PROMPTS[:1])
    # sysfs refuses new folders even to root, like a read-only mount.
    out = Path("/sys/renderq-test-out")
    line = _one_error_line(CliRunner().invoke(app, _args(prompts, out, tiny_model, tiny_clip)))
    assert "cannot write to /sys/renderq-test-out" in line


@pytest.mark.parametrize(
    ("text", "extra", "message"),
    [
        ('{"prompt": "a red circle", "seed": 100000000000000000000}\n', (), "'seed' must be"),
        ("a red circle\n", ("--seed", str(10**20)), "--seed must be from 0 to"),
        ("a red circle\nb\n", ("--seed", str(2**63 - 1)), "above the largest seed"),
    ],
)
def test_seed_beyond_64_bits_is_one_clear_error(
    tmp_path: Path,
    tiny_model: Path,
    tiny_clip: Path,
    text: str,
    extra: tuple[str, ...],
    message: str,
) -> None:
    prompts = tmp_path / ("p.jsonl" if text.startswith("{") else "p.txt")
    prompts.write_text(text, encoding="utf-8")
    args = _args(prompts, tmp_path / "out", tiny_model, tiny_clip, *extra)
    assert message in _one_error_line(CliRunner().invoke(app, args))


def test_a_byte_order_mark_is_not_part_of_the_first_prompt(tmp_path: Path) -> None:
    p = tmp_path / "p.txt"
    p.write_bytes("\ufeffa small red circle\na blue square\n".encode())
    assert [s.prompt for s in read_prompts(p)] == ["a small red circle", "a blue square"]
    j = tmp_path / "p.jsonl"
    j.write_bytes('\ufeff{"prompt": "a red circle"}\n'.encode())
    assert [s.prompt for s in read_prompts(j)] == ["a red circle"]


def test_jsonl_id_names_the_request_and_its_image(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    prompts = tmp_path / "p.jsonl"
    lines = [{"prompt": PROMPTS[0], "id": "cat-001"}, {"prompt": PROMPTS[1]}]
    prompts.write_text("".join(json.dumps(x) + "\n" for x in lines))
    s = run_settings(prompts, tmp_path / "out", tiny_model, tiny_clip, threshold=-1.0)
    run_job(s, executor=executor, scorer=scorer)
    rows = [json.loads(x) for x in (s.out / "metadata.jsonl").read_text().splitlines()]
    by_id = {r["id"]: r for r in rows}
    assert set(by_id) == {"cat-001", "p000001"}
    assert by_id["cat-001"]["file_name"] == "images/cat-001.png"
    assert (s.out / "images" / "cat-001.png").is_file()


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        ([{"prompt": "a", "id": "x"}, {"prompt": "b", "id": "x"}], "p.jsonl:2: id 'x' is already"),
        ([{"prompt": "a"}, {"prompt": "b", "id": "p000000"}], "id 'p000000' is already used"),
        ([{"prompt": "a", "id": "../etc"}], "p.jsonl:1: 'id' must be"),
        ([{"prompt": "a", "id": 7}], "p.jsonl:1: 'id' must be"),
    ],
)
def test_bad_jsonl_ids_are_refused(
    tmp_path: Path, lines: list[dict[str, object]], message: str
) -> None:
    p = tmp_path / "p.jsonl"
    p.write_text("".join(json.dumps(x) + "\n" for x in lines))
    with pytest.raises(ConfigError) as info:
        read_prompts(p)
    assert message in str(info.value)


def _store_seconds(out: Path) -> float:
    store = JobStore.open(out / "renderq.sqlite")
    try:
        return sum(secs for _, _, secs in store.ledger_entries())
    finally:
        store.close()


def test_ledger_json_is_current_after_every_commit(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer,
) -> None:  # fmt: skip
    """A run killed at any point leaves a ledger.json that agrees with the store."""
    s = run_settings(
        write_prompts(tmp_path / "p.txt"),
        tmp_path / "out",
        tiny_model,
        tiny_clip,
        threshold=-1.0,
        max_batch_size=2,
    )
    seen: list[tuple[float, float]] = []

    def check(_: object) -> None:
        if not (s.out / "ledger.json").is_file():
            return
        ledger = json.loads((s.out / "ledger.json").read_text())
        seen.append((sum(ledger["device_seconds"].values()), _store_seconds(s.out)))

    run_job(s, executor=executor, scorer=scorer, on_progress=check)
    committed = [(a, b) for a, b in seen if b > 0]
    assert len(committed) >= 4  # several render and score steps, each checked
    for in_file, in_store in committed:
        assert in_file == pytest.approx(in_store)


def test_a_full_disk_stops_the_run_clearly_and_loses_nothing_committed(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path, executor: DiffusersExecutor,
    scorer: ClipScorer, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    s = run_settings(
        write_prompts(tmp_path / "p.txt"),
        tmp_path / "out",
        tiny_model,
        tiny_clip,
        threshold=-1.0,
        max_batch_size=2,
    )
    real = JobStore.commit_step
    calls = {"n": 0}

    def full_after_three(self: JobStore, *args: Any, **kwargs: Any) -> None:
        calls["n"] += 1
        if calls["n"] > 3:
            raise sqlite3.OperationalError("database or disk is full")
        real(self, *args, **kwargs)

    monkeypatch.setattr(JobStore, "commit_step", full_after_three)
    with pytest.raises(StorageError) as info:
        run_job(s, executor=executor, scorer=scorer)
    message = str(info.value)
    assert "database or disk is full" in message and "not in the ledger" in message
    assert " s render on " in message or " s score on " in message
    kept = _store_seconds(s.out)
    assert kept > 0
    ledger = json.loads((s.out / "ledger.json").read_text())
    assert sum(ledger["device_seconds"].values()) == pytest.approx(kept)

    monkeypatch.setattr(JobStore, "commit_step", real)
    again = run_job(s, executor=executor, scorer=scorer)
    assert again.accepted == len(PROMPTS) and again.runs == 2
    rows = [json.loads(x) for x in (s.out / "metadata.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"p{i:06d}" for i in range(len(PROMPTS))]
    assert len(list((s.out / "images").iterdir())) == len(PROMPTS)
