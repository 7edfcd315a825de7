"""The peers bench's floor: a bare FastAPI endpoint beside renderq on the null model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytestmark = pytest.mark.slow

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "peers" / "run.py"


def test_the_null_pass_measures_renderq_against_a_bare_fastapi_floor(tmp_path: Path) -> None:
    saved = tmp_path / "peers.json"
    cmd = [sys.executable, str(BENCH), "--only-null", "--systems", "renderq,fastapi",
           "--null-sweep", "0", "--null-rate", "20", "--null-duration", "2",
           "--save", str(saved)]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    part = json.loads(saved.read_text())["null"]
    rows = {r["system"]: r for r in part["sweep"]}
    assert set(rows) == {"renderq", "fastapi"}
    for r in rows.values():  # both served every request of the same trace
        assert r["served"] == part["requests"] > 10 and r["errors"] == 0
        assert 0 < r["p50_s"] <= r["p99_s"] < 5
    floor = rows["fastapi"]
    ratio = f"p50 {rows['renderq']['p50_s'] / floor['p50_s']:.2f}x"
    assert f"renderq over the bare FastAPI floor: {ratio}" in done.stdout
    # One round: its ratio is the median, and the machine's load is reported beside it.
    [(p50, p99)] = part["over_floor"]["renderq"]["rounds"]
    assert p50 == pytest.approx(rows["renderq"]["p50_s"] / floor["p50_s"])
    assert p99 == pytest.approx(rows["renderq"]["p99_s"] / floor["p99_s"])
    assert len(part["loadavg"]) == 2 and "load average" in done.stdout


PAIRED = BENCH.with_name("paired.py")


def test_the_paired_comparison_serves_every_system_in_turn() -> None:
    repo = BENCH.parents[2]
    cmd = [sys.executable, str(PAIRED), "--systems", f"fastapi,renderq,renderq@{repo}",
           "--turns", "100", "--warmup", "10", "--gap", "0"]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split("|")[1:-1] for line in done.stdout.splitlines() if line.startswith("| 1 ")]
    assert [r[1].strip() for r in rows] == ["fastapi", "renderq", f"renderq@{repo}"]
    for _, _, p50, p99, r50, r99 in rows:
        assert 0 < float(p50) <= float(p99) < 5000
        assert float(r50) > 0 and float(r99) > 0
    assert rows[0][4].strip() == "1.00" and rows[0][5].strip() == "1.00"  # the base


def test_the_paired_comparison_refuses_an_unknown_system() -> None:
    done = subprocess.run(
        [sys.executable, str(PAIRED), "--systems", "fastapi,litserve"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 2 and "litserve" in done.stderr
