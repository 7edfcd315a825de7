"""The A/B harness on the simulator: limits, efficiency, scenarios, reports and plots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from renderq.bench.harness import Limit, Scenario, efficiency, run_bench, sim_backend
from renderq.cli.main import app
from renderq.core.cost import Profile
from renderq.core.errors import ConfigError
from renderq.core.policies import AdHoc, Dynamic, Window
from renderq.core.settings import QASettings
from renderq.profiles import load_profile

# A curve with a real optimum: per-image cost falls to batch 8, then rises.
CURVED = Profile.from_dict(
    {
        "name": "curved", "model": "m", "device_class": "gpu", "precision": "fp16",
        "resolution": [512, 512], "steps": 20, "device_memory_gib": 80,
        "source": {"kind": "assumption", "note": "a test curve"},
        "render": {"points": [[1, 1.0], [8, 4.0], [16, 9.6]]},
        "score": {"points": [[1, 0.01], [16, 0.08]]},
    }
)  # fmt: skip


def test_limit_is_the_best_static_batch() -> None:
    lim = Limit.of(CURVED)
    assert lim.batch_size == 8 and lim.images_per_second == pytest.approx(2.0)
    assert Limit.of(CURVED, cap=4).batch_size == 4
    art = Limit.of(load_profile("article-sdxl-a100"))
    assert art.batch_size == 64 and art.images_per_second == pytest.approx(1 / 0.68)


def test_offline_efficiency_of_adhoc_and_window_against_the_limit() -> None:
    backend = sim_backend(CURVED, qa=QASettings(enabled=False))
    runs = run_bench(
        backend,
        {"adhoc": AdHoc(), "window": Window(batch_size=8)},
        Scenario("offline", 800),
        Limit.of(CURVED),
    )
    by = {r.mode: r for r in runs}
    assert by["adhoc"].efficiency == pytest.approx(0.5)  # 1 image/s against 2
    assert by["window"].efficiency == pytest.approx(1.0)  # every batch at the best size
    assert by["window"].utilisation == pytest.approx(1.0, abs=0.01)
    assert by["window"].result.renders == 800 and by["window"].result.rerenders == 0


def test_server_scenario_checks_the_p99_bound_and_single_stream_runs_one_at_a_time() -> None:
    backend = sim_backend(CURVED, qa=QASettings(max_attempts=4))
    scen = Scenario("server", 500, rate=1.0, p99_bound_s=30.0)
    runs = run_bench(backend, {"dynamic": Dynamic(0.5, 8)}, scen, Limit.of(CURVED), [0.1])
    assert runs[0].meets_p99 is True and runs[0].result.accepted == 500
    [single] = run_bench(backend, {"dynamic": Dynamic(0.5, 8)}, Scenario("single-stream", 50),
                         Limit.of(CURVED), [0.0])  # fmt: skip
    assert set(single.result.batch_sizes) == {1}
    assert efficiency(single.result, Limit.of(CURVED)) == pytest.approx(0.5)


def test_scenario_validation_names_the_value() -> None:
    with pytest.raises(ConfigError, match="burst"):
        Scenario("burst", 10)
    with pytest.raises(ConfigError, match="rate"):
        Scenario("server", 10)


def test_bench_command_writes_json_markdown_and_plots(tmp_path: Path) -> None:
    args = ["bench", "--scenario", "offline", "--requests", "3000", "--failure-rates",
            "0.08,0.16", "--out", str(tmp_path), "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert len(report["runs"]) == 6
    for mode in ("adhoc", "dynamic", "window"):
        assert "efficiency" in report["modes"][mode]
    assert report["modes"]["window"]["efficiency"] >= 0.95
    regen = {(r["mode"], r["failure_rate"]): r["gpu_hours"]["regen"] for r in report["runs"]}
    assert regen[("adhoc", 0.16)] > 1.8 * regen[("adhoc", 0.08)]
    assert (tmp_path / "bench.md").read_text().startswith("### offline")
    for png in ("latency_cdf.png", "device_seconds_by_stage.png", "batch_size_curve.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_command_refuses_a_negative_reference_interval_by_value() -> None:
    res = CliRunner().invoke(app, ["bench", "--executor", "real", "--reference-every", "-3"])
    assert res.exit_code != 0 and "--reference-every must be >= 0, got -3" in res.output
