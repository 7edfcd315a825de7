"""``renderq bench --executor real --compare-sim`` on tiny real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from renderq.cli.main import app

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    from renderq.testing.tiny import build_tiny_clip, build_tiny_pipeline

    root = tmp_path_factory.mktemp("bench-models")
    return build_tiny_pipeline(root / "sd", sample_size=16), build_tiny_clip(root / "clip")


def test_real_offline_bench_and_its_simulator_replay(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    sd, clip = tiny
    # threshold 0.0: the random tiny CLIP fails some attempts, so regenerations happen too.
    args = ["bench", "--executor", "real", "--model", str(sd), "--scorer", str(clip),
            "--steps", "2", "--threshold", "0.0", "--scenario", "offline", "--requests", "12",
            "--modes", "adhoc,window", "--max-batch-size", "4", "--compare-sim", "--repeat", "2",
            "--out", str(tmp_path), "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    assert report["executor"] == "real" and report["limit"]["batch_size"] >= 1
    modes = report["modes"]
    assert modes["adhoc"]["mean_batch_size"] == 1.0 and modes["window"]["mean_batch_size"] > 1
    for m in modes.values():
        assert m["accepted"] + m["escalated"] == 12 and m["efficiency"] > 0
        # The limit's batch size re-timed around the mode, and the mode against it.
        assert m["reference_images_per_second"] > 0
        ratio = m["efficiency_against_reference"] / m["efficiency"]
        limit = report["limit"]["images_per_second"]
        assert ratio == pytest.approx(limit / m["reference_images_per_second"])
        # Two reference batches before, two after, and at least one between its batches.
        assert len(m["reference_batch_s"]) >= 5 and min(m["reference_batch_s"]) > 0
        assert m["efficiency_paired"] > 0
    # Two rounds, the second starting at the next mode, each run with its verdict.
    assert [(r["round"], r["mode"]) for r in report["runs"]] == [
        (0, "adhoc"), (0, "window"), (1, "window"), (1, "adhoc"),
    ]  # fmt: skip
    for r in report["runs"]:
        assert r["stability"]["bound"] == 0.25 and isinstance(r["stability"]["stable"], bool)
    for mode, s in report["summary"].items():
        assert s["rounds"] == 2 and len(s["figures"]["efficiency"]["values"]) == 2
        assert s["stable"] == all(
            r["stability"]["stable"] for r in report["runs"] if r["mode"] == mode
        )
    assert [row["round"] for row in report["compare_sim"]] == [0, 0, 1, 1]
    for row in report["compare_sim"]:
        # Same arrivals and replayed QA outcomes: the simulator renders exactly as much.
        assert row["renders"]["real"] == row["renders"]["sim"]
        assert row["device_seconds"]["rel_error"] is not None
        assert row["p99_s"]["real"] > 0 and row["p99_s"]["sim"] > 0
        # Calibrated from the run: a speed step per render batch, hand-offs measured.
        batches = row["renders"]["real"] / row["mean_batch_size"]["real"]
        assert row["calibration"]["speed_steps"] == round(batches)
        # A running mean of each batch's seconds over its size's median: skewed seconds
        # can put every factor above 1, never at or below 0.
        assert 0 < row["calibration"]["speed_min"] <= row["calibration"]["speed_max"]
        assert row["p99_s"]["sim_medians_only"] > 0
        ci = row["p99_s"]["real_ci"]
        assert ci["low"] is not None and ci["low"] <= row["p99_s"]["real"]
        assert isinstance(row["p99_s"]["sim_in_real_ci"], bool)
    table = (tmp_path / "bench.md").read_text()
    assert "Simulator against the real run" in table and "Against the reference" in table
    assert "p99 medians only" in table and "real p99 95% CI" in table
    assert "Over 2 rounds" in table and "Stability (bound 0.25" in table


def test_step_mode_is_judged_and_replayed_by_its_loop_steps(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    sd, clip = tiny
    args = ["bench", "--executor", "real", "--model", str(sd), "--scorer", str(clip),
            "--steps", "2", "--threshold", "0.0", "--scenario", "offline", "--requests", "12",
            "--modes", "step", "--max-batch-size", "4", "--compare-sim", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    [run] = report["runs"]
    # Drift is read from the loop's steps (by running-batch size), not from each request's
    # share of them: an offline trace of 12 fills the loop, so some size repeats.
    assert run["stability"]["drift"] is not None
    [row] = report["compare_sim"]
    assert row["renders"]["real"] == row["renders"]["sim"]
    # The simulated loop runs on the real loop's own step costs, up to the cap of 4; a
    # slot's hold time (mostly a request's time beside others in the loop) is not a
    # hand-off: only what it held beyond the request's stay in the loop is, well under
    # one step.
    cost = row["step_cost"]
    assert cost["source"].startswith("measured") and cost["step_points"][-1][0] == 4
    assert all(secs > 0 for _, secs in cost["step_points"]) and cost["prepare_s"] > 0
    assert 0.0 <= row["calibration"]["render_overhead_s"] < cost["step_points"][0][1]
    # The machine's speed over the run is read from every step of the loop, as the drift.
    assert row["calibration"]["speed_steps"] == run["batches"] > 0
    assert 0 < row["calibration"]["speed_min"] <= row["calibration"]["speed_max"]
    # The scorer took turns with the loop: its wait for a step boundary is simulated, not
    # added again as a hand-off.
    assert row["calibration"]["score_overhead_s"] == 0.0
    # Priced by its own steps, the simulated loop books the real loop's device time closely.
    assert abs(row["device_seconds"]["rel_error"]) < 0.35, row["device_seconds"]


def test_real_bench_on_a_pool_of_two_workers(
    tiny: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.step_loops import capture_step_loops

    loops = capture_step_loops(monkeypatch)
    sd, clip = tiny
    args = ["bench", "--executor", "real", "--model", str(sd), "--scorer", str(clip),
            "--steps", "2", "--threshold", "0.0", "--scenario", "offline", "--requests", "16",
            "--modes", "adhoc,window,step", "--max-batch-size", "4",
            "--devices", "cpu:1,cpu:1", "--compare-sim", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    # Step mode ran a loop per device, in this process, and both took requests.
    assert len(loops) == 2 and all(loop.trace.steps for loop in loops)
    assert max(n for loop in loops for n, _ in loop.trace.steps) <= 4
    for m in report["modes"].values():
        assert m["accepted"] + m["escalated"] == 16
        # Two references before the mode and two after, all on the pool's first worker
        # (none between: the pool's batches run side by side).
        assert len(m["reference_batch_s"]) == 4 and m["efficiency"] > 0
        # Utilisation counts both workers: the device-seconds of both over twice the time.
        assert 0 < m["utilisation"] <= 1.0
    for row in report["compare_sim"]:
        # Replayed on two simulated workers: the same renders as the real pool.
        assert row["renders"]["real"] == row["renders"]["sim"]


def test_a_step_mix_rides_in_one_running_batch_and_replays_per_request(
    tiny: tuple[Path, Path], tmp_path: Path
) -> None:
    sd, clip = tiny
    args = ["bench", "--executor", "real", "--model", str(sd), "--scorer", str(clip),
            "--threshold", "0.0", "--scenario", "offline", "--requests", "12",
            "--modes", "dynamic,step", "--max-batch-size", "4", "--step-mix", "1,3",
            "--compare-sim", "--json"]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    report = json.loads(res.output[res.output.index("{") :])
    assert report["step_mix"] == [1, 3]
    modes = report["modes"]
    # Dynamic batches one step count at a time (it is part of the batch key); the step loop
    # runs 1- and 3-step requests side by side, so it needs fewer steps than rows.
    assert modes["dynamic"]["mean_batch_size"] <= 4 and modes["step"]["mean_batch_size"] > 1
    for row in report["compare_sim"]:
        # Each request replayed at its own step count: the same renders as the real run,
        # and about its device time (the model's own step count would be far off).
        assert row["renders"]["real"] == row["renders"]["sim"]
        assert abs(row["device_seconds"]["rel_error"]) < 0.5, row["device_seconds"]
