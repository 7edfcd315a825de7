"""``renderq simulate`` through the real console script and through typer's runner."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from typer.testing import CliRunner

from renderq.cli.main import app

ARTICLE = ["--profile", "article-sdxl-a100", "--renders", "10000", "--failure-rate", "0.08",
           "--modes", "adhoc,dynamic,window", "--json"]  # fmt: skip


def renderq_cmd() -> list[str]:
    exe = Path(sys.executable).with_name("renderq")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "renderq"]


def test_article_case_json_through_the_console_script() -> None:
    out = subprocess.run(
        [*renderq_cmd(), "simulate", *ARTICLE], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    modes = data["modes"]
    assert set(modes) == {"adhoc", "dynamic", "window"}
    for m in modes.values():
        assert set(m["gpu_hours"]) == {"render", "score", "regen", "rescore", "total"}
        assert m["accepted"] + m["escalated"] == 10_000
        assert set(m["latency_s"]) == {"p50", "p99"} and m["mean_batch_size"] >= 1
        parts = sum(m["gpu_hours"][k] for k in ("render", "score", "regen", "rescore"))
        assert abs(parts - m["gpu_hours"]["total"]) < 1e-9
    assert modes["window"]["gpu_hours"]["total"] < 0.7 * modes["adhoc"]["gpu_hours"]["total"]
    assert data["profile"]["source"]["kind"] == "claim"


def test_table_output_shows_every_mode_and_the_saving() -> None:
    res = CliRunner().invoke(
        app, ["simulate", "--profile", "article-sdxl-a100", "--renders", "300"]
    )
    assert res.exit_code == 0, res.output
    for word in ("adhoc", "dynamic", "window", "total GPU-h", "total vs adhoc", "p99 latency"):
        assert word in res.output


def test_bad_input_names_the_bad_value() -> None:
    runner = CliRunner()
    res = runner.invoke(
        app, ["simulate", "--profile", "article-sdxl-a100", "--modes", "adhoc,turbo"]
    )
    assert res.exit_code != 0 and "turbo" in res.output
    res = runner.invoke(app, ["simulate", "--profile", "no-such-profile"])
    assert res.exit_code != 0 and "no-such-profile" in res.output
    res = runner.invoke(
        app, ["simulate", "--profile", "article-sdxl-a100", "--failure-rate", "1.5"]
    )
    assert res.exit_code != 0 and "1.5" in res.output
    res = runner.invoke(
        app, ["simulate", "--profile", "article-sdxl-a100", "--arrival", "poisson:x"]
    )
    assert res.exit_code != 0 and "poisson:x" in res.output


def test_a_measured_fix_curve_decides_which_retries_pass() -> None:
    """Of the prompts still failing, attempt k passes at the curve's k-th chance."""
    args = ["simulate", "--profile", "mini-sd-cpu", "--renders", "20000", "--modes", "window",
            "--failure-rate", "0.4", "--fix-curve", "0.5,0.25", "--max-attempts", "4",
            "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    data = json.loads(res.output)
    run = data["modes"]["window"]
    assert data["fix_curve"] == [0.5, 0.25]
    # 40% fail first; half of those pass at attempt 2; a quarter of the rest at 3 and 4
    # (past the curve its last chance holds): 20000 * 0.4 * 0.5 * 0.75 * 0.75 escalate.
    expected = 20_000 * 0.4 * 0.5 * 0.75 * 0.75
    assert abs(run["escalated"] - expected) < 4 * (expected * (1 - expected / 20_000)) ** 0.5
    rerenders = 20_000 * 0.4 * (1 + 0.5 + 0.5 * 0.75)
    assert abs(run["rerenders"] - rerenders) < 0.03 * rerenders


def test_the_embedded_fix_curve_is_the_model_cards_and_bad_curves_are_named() -> None:
    from renderq.backends.registry import fix_curve

    curve = fix_curve("embedded")
    assert len(curve) >= 3 and all(0 <= c <= 1 for c in curve)
    res = CliRunner().invoke(app, ["simulate", "--profile", "mini-sd-cpu", "--fix-curve", "0.5,x"])
    assert res.exit_code == 2 and "0.5,x" in res.output
    res = CliRunner().invoke(app, ["simulate", "--profile", "mini-sd-cpu", "--fix-curve", "1.5"])
    assert res.exit_code == 2 and "1.5" in res.output
