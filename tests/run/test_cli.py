"""``renderq run`` end to end through the CLI on tiny models, and its input errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from renderq.cli.main import app

from .conftest import PROMPTS, write_prompts

pytestmark = pytest.mark.slow


def _args(prompts: Path, out: Path, model: Path, clip: Path, *extra: str) -> list[str]:
    return [
        "run", str(prompts), "--out", str(out), "--model", str(model), "--scorer", str(clip),
        "--steps", "3", "--threshold", "-0.2", "--max-attempts", "2", "--max-batch-size", "4",
        *extra,
    ]  # fmt: skip


def test_run_writes_an_imagefolder_dataset(
    tmp_path: Path, tiny_model: Path, tiny_clip: Path
) -> None:
    prompts = write_prompts(tmp_path / "prompts.txt")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, _args(prompts, out, tiny_model, tiny_clip, "--json"))
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["prompts"] == len(PROMPTS)
    assert summary["accepted"] + summary["escalated"] == len(PROMPTS)
    assert summary["accepted"] > 0
    assert summary["device_seconds"]["total"] > 0 and summary["mean_batch_size"] > 1
    rows = [json.loads(x) for x in (out / "metadata.jsonl").read_text().splitlines()]
    assert len(rows) == summary["accepted"]
    fields = {"file_name", "prompt", "seed", "attempt", "clip_score", "model", "steps",
              "guidance", "batch_id", "batch_size"}  # fmt: skip
    for row in rows:
        assert fields <= set(row)
        assert (out / row["file_name"]).is_file()
        assert row["clip_score"] >= -0.2 and row["prompt"] in PROMPTS and row["steps"] == 3
    assert len(list((out / "images").iterdir())) == len(rows)
    ledger = json.loads((out / "ledger.json").read_text())
    assert ledger["accepted"] == summary["accepted"]
    assert sum(ledger["device_seconds"].values()) == pytest.approx(
        summary["device_seconds"]["total"]
    )
    datasets = pytest.importorskip("datasets")
    ds = datasets.load_dataset("imagefolder", data_dir=str(out), split="train")
    assert len(ds) == len(rows)
    assert sorted(ds["prompt"]) == sorted(r["prompt"] for r in rows)
    assert ds[0]["image"].size == (32, 32)


def test_summary_table_without_json(tmp_path: Path, tiny_model: Path, tiny_clip: Path) -> None:
    prompts = write_prompts(tmp_path / "prompts.txt", PROMPTS[:2])
    result = CliRunner().invoke(app, _args(prompts, tmp_path / "o", tiny_model, tiny_clip))
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert "GPU-hours" in text and "GPU-hours per 10k accepted" in text


@pytest.mark.parametrize(
    ("name", "text", "override", "message"),
    [
        ("p.txt", "a red circle\n\na blue square\n", {}, "p.txt:2: empty prompt"),
        ("p.jsonl", '{"prompt": "a"}\n{"prompt": \n', {}, "p.jsonl:2: malformed JSON"),
        ("p.jsonl", '{"prompt": "a", "size": "33x32"}\n', {}, "size 33x32 is not possible"),
        ("p.txt", "a red circle\n", {"--model": "missing-dir/"}, "not a diffusers pipeline"),
        ("p.txt", "a red circle\n", {"--mode": "fastest"}, "--mode must be one of"),
    ],
)
def test_bad_input_fails_before_rendering(
    tmp_path: Path,
    tiny_model: Path,
    tiny_clip: Path,
    name: str,
    text: str,
    override: dict[str, str],
    message: str,
) -> None:
    prompts = tmp_path / name
    prompts.write_text(text, encoding="utf-8")
    out = tmp_path / "out"
    args = _args(prompts, out, tiny_model, tiny_clip)
    for flag, value in override.items():
        args += [flag, value]  # a repeated option: the last one wins
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert not (out / "images").exists()
