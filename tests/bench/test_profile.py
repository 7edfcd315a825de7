"""``renderq profile``: the measurement logic on fakes, and the command on tiny real models."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from renderq.bench.profiling import Point, doubling_sizes, fit_memory, measure
from renderq.cli.main import app
from renderq.core.cost import Profile
from renderq.core.errors import ConfigError


def test_doubling_sizes() -> None:
    assert doubling_sizes(1) == [1]
    assert doubling_sizes(16) == [1, 2, 4, 8, 16]
    assert doubling_sizes(12) == [1, 2, 4, 8, 12]
    with pytest.raises(ConfigError, match="0"):
        doubling_sizes(0)


def test_measure_takes_medians_of_rounds_and_stops_at_out_of_memory() -> None:
    calls: list[int] = []
    fake = {1: [1.0, 3.0, 2.0, 9.0], 2: [2.0, 2.5, 3.0, 2.0]}

    def run(n: int) -> float:
        calls.append(n)
        if n >= 4:
            raise MemoryError("oom")
        return fake[n].pop(0)

    pts = measure(
        run, [1, 2, 4, 8], repeats=3, warmup=1, is_oom=lambda e: isinstance(e, MemoryError)
    )
    assert [(p.batch_size, p.seconds) for p in pts] == [(1, 3.0), (2, 2.5)]
    # One warm-up round over every size (4 runs out of memory there), then 3 timed rounds.
    assert calls == [1, 2, 4, 1, 2, 1, 2, 1, 2]
    with pytest.raises(MemoryError):  # out of memory at the very first size is an error
        measure(run, [4], is_oom=lambda e: True)


def test_measure_runs_sizes_in_rounds_and_keeps_each_sizes_largest_peak() -> None:
    calls: list[int] = []
    peak = [0.0]

    def run(n: int) -> float:
        calls.append(n)
        peak[0] = 10.0 * n + len(calls)  # grows run by run
        return float(n)

    pts = measure(run, [1, 2, 4], repeats=2, warmup=2, peak_memory=lambda: peak[0])
    assert calls == [1, 2, 4] * 4
    assert [p.repeats for p in pts] == [(1.0, 1.0), (2.0, 2.0), (4.0, 4.0)]
    # The last round's readings are the largest: 10 n + its position in the calls.
    assert [p.peak_bytes for p in pts] == [20.0, 31.0, 52.0]
    with pytest.raises(ConfigError, match="-1"):
        measure(run, [1], warmup=-1)


def test_fit_memory_recovers_a_linear_model() -> None:
    pts = [Point(n, 1.0, (1.0,), 100.0 + 10.0 * n) for n in (1, 2, 4, 8)]
    base, per = fit_memory(pts)  # type: ignore[misc]
    assert base == pytest.approx(100.0) and per == pytest.approx(10.0)
    assert fit_memory(pts[:1]) is None


@pytest.mark.slow
def test_profile_command_on_tiny_models_writes_a_loadable_measured_profile(tmp_path: Path) -> None:
    from renderq.testing.tiny import build_tiny_clip, build_tiny_pipeline

    pipe = build_tiny_pipeline(tmp_path / "pipe")
    clip = build_tiny_clip(tmp_path / "clip")
    out = tmp_path / "prof.json"
    args = ["profile", "--model", str(pipe), "--scorer", str(clip), "--steps", "2",
            "--max-batch", "4", "--repeats", "2", "--name", "tiny-cpu",
            "--out", str(out)]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    prof = Profile.from_dict(doc)
    assert prof.name == "tiny-cpu" and prof.source["kind"] == "measured"
    assert [p[0] for p in doc["render"]["points"]] == [1, 2, 4]
    assert all(s > 0 for _, s in doc["render"]["points"])
    assert prof.render_cap == 4 and (prof.width, prof.height) == (64, 64)
    assert prof.score.latency(4) > 0
    assert "cpu" in doc["source"]["note"]


@pytest.mark.slow
def test_profile_with_adapters_measures_the_switch_into_the_cost_model(tmp_path: Path) -> None:
    pytest.importorskip("peft")
    from renderq.testing.tiny import build_tiny_clip, build_tiny_lora, build_tiny_pipeline

    pipe = build_tiny_pipeline(tmp_path / "pipe")
    clip = build_tiny_clip(tmp_path / "clip")
    loras = [f"{n}={build_tiny_lora(tmp_path / n, pipe, seed=i)}" for i, n in enumerate("ab")]
    out = tmp_path / "prof.json"
    args = ["profile", "--model", str(pipe), "--scorer", str(clip), "--steps", "2",
            "--max-batch", "2", "--repeats", "2", "--warmup", "1", "--out", str(out),
            "--lora", loras[0], "--lora", loras[1]]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(out.read_text())
    # Three timed rounds (at least) over a, b and none.
    assert len(doc["render"]["switch_repeats"]) == 9
    assert doc["render"]["switch_s"] > 0
    assert Profile.from_dict(doc).render.switch_s == doc["render"]["switch_s"]
    # A batch with an adapter active against one with none, each timed round a ratio.
    factors = doc["render"]["adapter_factor_repeats"]
    assert len(factors) == 3 and all(f > 0 for f in factors)
    render = Profile.from_dict(doc).render
    assert (
        render.adapter_factor
        == doc["render"]["adapter_factor"]
        == pytest.approx(sorted(factors)[1], abs=1e-4)
    )
    assert render.for_adapter("a").latency(2) == pytest.approx(
        render.latency(2) * render.adapter_factor
    )
    res = CliRunner().invoke(app, ["profile", "--lora", "nopath"])
    assert res.exit_code == 2 and "nopath" in res.output


def test_profile_threads_are_checked_and_set_as_run_sets_them() -> None:
    import torch

    res = CliRunner().invoke(app, ["profile", "--threads", "-1"])
    assert res.exit_code == 2 and "-1" in res.output
    before = torch.get_num_threads()
    try:
        # A model that cannot load stops the command after the threads are set.
        res = CliRunner().invoke(app, ["profile", "--threads", "1", "--model", "/nonexistent"])
        assert res.exit_code != 0 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_the_real_bench_leaves_a_core_to_its_engine_threads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import torch

    from renderq.backends import diffusers

    res = CliRunner().invoke(app, ["bench", "--executor", "real", "--threads", "-1"])
    assert res.exit_code == 2 and "-1" in res.output
    before = torch.get_num_threads()
    monkeypatch.setattr(diffusers, "free_cores", lambda: 2)
    try:
        # Unset: the free cores less one; a model that cannot load ends the command after.
        args = ["bench", "--executor", "real", "--model", "/nonexistent"]
        res = CliRunner().invoke(app, args)
        assert res.exit_code != 0 and torch.get_num_threads() == 1
        res = CliRunner().invoke(app, [*args, "--threads", "2"])
        assert res.exit_code != 0 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
