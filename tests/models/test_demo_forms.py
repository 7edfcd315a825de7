"""``benchmarks/demo_forms.py`` splits a run's accepted share by the prompts' caption form."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "demo_forms.py"


def _lines(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def test_demo_forms_counts_accepted_and_escalated_prompts_by_form(tmp_path: Path) -> None:
    _lines(tmp_path / "metadata.jsonl", [
        {"id": "a", "prompt": "a small red circle on a blue background"},
        {"id": "b", "prompt": "a red circle"},
        {"id": "c", "prompt": "a red circle and a blue square"},
    ])  # fmt: skip
    _lines(tmp_path / "review.jsonl", [
        {"id": "d", "prompt": "a large red circle and a small blue square on a white background"},
        {"id": "e", "prompt": "a green circle"},
    ])  # fmt: skip
    done = subprocess.run(
        [sys.executable, str(BENCH), str(tmp_path)], capture_output=True, text=True, check=True
    )
    rows = {r.split("|")[1].strip(): r.split("|")[2:5] for r in done.stdout.splitlines()[2:]}
    got = {name: tuple(x.strip() for x in cells) for name, cells in rows.items()}
    assert got["full, 1 shape(s)"] == ("1", "1", "100.0%")
    assert got["full, 2 shape(s)"] == ("0", "1", "0.0%")
    assert got["full, all"] == ("1", "2", "50.0%")
    assert got["short, all"] == ("2", "3", "66.7%")
    assert got["short, 2 shape(s)"] == ("1", "1", "100.0%")


def test_demo_forms_names_a_folder_without_rows(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(BENCH), str(tmp_path)], capture_output=True, text=True
    )
    assert done.returncode != 0 and str(tmp_path) in done.stderr
