"""The shared settings: one set of defaults, one mode-to-policy map, one key rule."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from renderq.core.errors import ConfigError
from renderq.core.policies import AdHoc, Dynamic, Window, Windows
from renderq.core.seeds import MAX_SEED
from renderq.core.settings import (
    DEFAULT_MAX_ATTEMPTS,
    FALLBACK_THRESHOLD,
    INTERACTIVE,
    MODES,
    Batching,
    ModelSpec,
    QASettings,
    key_for,
    make_policy,
    request_seeds,
    uses_cfg,
)


def test_each_mode_makes_its_policy_with_the_shared_knobs() -> None:
    assert isinstance(make_policy(Batching("adhoc")), AdHoc)
    dyn = make_policy(Batching("dynamic", 8, 0.25, preferred=(4,)))
    assert isinstance(dyn, Dynamic) and dyn.max_batch_size == 8
    assert (dyn.max_queue_delay_s, tuple(dyn.preferred_sizes)) == (0.25, (4,))
    win = make_policy(Batching("window", 12), Windows(explicit=((0.0, 5.0),)))
    assert isinstance(win, Window) and win.max_batch_size == 12
    assert {p.name for p in (make_policy(Batching(m)) for m in MODES)} == set(MODES)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "fastest"}, "--mode must be one of adhoc, dynamic, window, step, got 'fastest'"),
        ({"max_batch_size": 0}, "--max-batch-size must be >= 1, got 0"),
        ({"score_batch_size": -2}, "--score-batch-size must be >= 1, got -2"),
        ({"max_queue_delay_s": -0.1}, "--max-queue-delay must be >= 0, got -0.1"),
        ({"max_queue_delay_s": float("nan")}, "--max-queue-delay must be >= 0, got nan"),
    ],
)
def test_bad_batching_names_the_value(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        Batching(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


@given(st.floats(min_value=0.0, max_value=30.0))
def test_the_key_carries_cfg_on_or_off_by_the_one_rule(guidance: float) -> None:
    key = key_for("m", 64, 64, 20, guidance, "ddim", "fp32", "cpu")
    assert key.guidance is uses_cfg(guidance) is (guidance > 1.0)


def test_request_seeds_count_up_from_the_base_unless_given() -> None:
    assert request_seeds(10, 4, (None, 7, None)) == [10, 7, 12, 13]
    with pytest.raises(ConfigError, match="seed of prompt 1"):
        request_seeds(MAX_SEED, 2)
    with pytest.raises(ConfigError, match="seed must be from 0"):
        request_seeds(-1, 1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"model": ""}, "--model must name a model, got ''"),
        ({"scorer": ""}, "--scorer must name a model, got ''"),
        ({"device": "tpu"}, "--device must be cpu, cuda or cuda:N, got 'tpu'"),
        ({"device": "cuda:x"}, "--device must be cpu, cuda or cuda:N, got 'cuda:x'"),
        ({"precision": "fp8"}, "--precision must be one of fp32, fp16, bf16, got 'fp8'"),
        ({"steps": 0}, "--steps must be >= 1, got 0"),
        ({"guidance": -1.0}, "--guidance must be a number >= 0, got -1.0"),
        ({"guidance": float("nan")}, "--guidance must be a number >= 0, got nan"),
    ],
)
def test_a_bad_model_spec_names_the_flag_and_the_value(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        ModelSpec(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_attempts": 0}, "--max-attempts must be >= 1, got 0"),
        ({"threshold": float("inf")}, "--threshold must be a finite number, got inf"),
        ({"threshold": float("nan")}, "--threshold must be a finite number, got nan"),
    ],
)
def test_bad_qa_settings_name_the_flag_and_the_value(
    kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError) as info:
        QASettings(**kwargs)  # type: ignore[arg-type]
    assert message in str(info.value)


_thresholds = st.one_of(st.none(), st.floats(-1.0, 100.0))


@given(_thresholds, _thresholds, st.integers(1, 5), st.booleans())
def test_the_threshold_rule_is_given_then_calibrated_then_the_fallback(
    given_t: float | None, calibrated: float | None, attempts: int, enabled: bool
) -> None:
    qa = QASettings(given_t, attempts, enabled)
    policy = qa.policy(calibrated)
    expected = given_t if given_t is not None else calibrated
    assert policy.threshold == (FALLBACK_THRESHOLD if expected is None else expected)
    assert (policy.max_attempts, policy.enabled) == (attempts, enabled)
    assert qa.with_threshold(calibrated).threshold == policy.threshold


def test_unset_steps_and_guidance_are_the_pipelines_own_and_set_ones_stay() -> None:
    assert ModelSpec().resolve(30, 5.0) == (30, 5.0)
    assert ModelSpec(steps=4).resolve(30, 5.0) == (4, 5.0)
    assert ModelSpec(steps=4, guidance=0.0).resolve(30, 5.0) == (4, 0.0)  # 0.0 is set


def _default(command: Callable[..., object], name: str) -> object:
    """A typer command's default for one option (``typer.Option(...)`` or plain)."""
    value = inspect.signature(command).parameters[name].default
    return getattr(value, "default", value)


def test_every_shell_built_without_arguments_carries_the_one_set_of_defaults() -> None:
    from renderq.bench.model_profile import ProfileSettings
    from renderq.bench.realrun import RealSettings
    from renderq.cli.bench import bench_command
    from renderq.cli.profile import profile_command
    from renderq.cli.run import run
    from renderq.cli.simulate import simulate_command
    from renderq.jobs.runner import RunSettings
    from renderq.profiles import load_profile
    from renderq.runtime.sim import SimConfig
    from renderq.service.config import ServiceConfig, load_config

    run_s, real, served = RunSettings(Path("p"), Path("o")), RealSettings(), ServiceConfig()
    specs = {run_s.spec, real.spec, served.spec, ProfileSettings().spec}
    assert specs == {ModelSpec()}
    assert ModelSpec().steps is None and ModelSpec().guidance is None  # the pipeline's own
    sim = SimConfig(load_profile("mini-sd-cpu"), ())
    assert {run_s.qa, real.qa, served.qa, sim.qa} == {QASettings()}
    assert QASettings().threshold is None and QASettings().max_attempts == DEFAULT_MAX_ATTEMPTS
    assert run_s.batching == real.batching == Batching()
    # The service's one difference, named in core/settings.py: interactive batching.
    assert served.batching == load_config(None, env={}).batching == INTERACTIVE
    assert INTERACTIVE.mode == "dynamic"
    # The command lines read the same defaults.
    for command in (run, simulate_command, bench_command):
        assert _default(command, "max_attempts") == DEFAULT_MAX_ATTEMPTS
        assert _default(command, "max_queue_delay") == Batching().max_queue_delay_s
    for command in (run, bench_command, profile_command):
        given = {n: _default(command, n) for n in ("model", "scorer", "device", "precision")}
        spec = ModelSpec()
        assert given == {n: getattr(spec, n) for n in given}
    assert _default(run, "max_batch_size") == Batching().max_batch_size
    assert _default(run, "mode") == Batching().mode
    assert _default(run, "threshold") is _default(bench_command, "threshold") is None
    assert _default(profile_command, "steps") is _default(bench_command, "steps") is None
    assert _default(run, "steps") is None
