"""The shared settings: one set of defaults, one mode-to-policy map, one key rule."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from renderq.core.errors import ConfigError
from renderq.core.policies import AdHoc, Dynamic, Window, Windows
from renderq.core.seeds import MAX_SEED
from renderq.core.settings import MODES, Batching, key_for, make_policy, request_seeds, uses_cfg


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
        ({"mode": "fastest"}, "--mode must be one of adhoc, dynamic, window, got 'fastest'"),
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
