"""``benchmarks/ab_run.py`` runs both modes through the CLI and prints the comparison."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import write_prompts

pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "ab_run.py"


def test_ab_bench_on_tiny_models(tmp_path: Path) -> None:
    prompts = write_prompts(tmp_path / "p.txt")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(BENCH), "--tiny", "--prompts", str(prompts), "--steps", "2",
           "--threshold", "-1", "--threads", "1", "--max-batch-size", "8"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    table = [line.split() for line in done.stdout.splitlines()]
    rows = {r[0]: r for r in table if len(r) == 9 and "/" in r[1]}
    assert rows["adhoc"][1] == rows["window"][1] == "8/8"  # every prompt accepted in both
    assert float(rows["adhoc"][3]) == 1.0 and float(rows["window"][3]) == 8.0
    assert "of adhoc's device-seconds per accepted image" in done.stdout
