"""Tests of the small pure pieces: seeds, QA, buckets, cost model, policies, ledger."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from renderq.core.buckets import PromptBuckets
from renderq.core.cost import LatencyCurve, MemoryModel, Profile, StageCost
from renderq.core.errors import ConfigError, ProfileError
from renderq.core.ledger import Ledger, shares_by
from renderq.core.policies import Dynamic, QueueView, Windows
from renderq.core.qa import QAPolicy, Verdict
from renderq.core.seeds import seed_for, splitmix64
from renderq.core.types import BatchKey, Request, Stage
from renderq.profiles import load_profile, shipped


def test_seed_schedule_is_documented_and_deterministic() -> None:
    assert seed_for(42, 0) == 42
    assert seed_for(42, 1) == splitmix64(42 + 0x9E3779B97F4A7C15) & (2**63 - 1)
    assert [seed_for(7, k) for k in range(5)] == [seed_for(7, k) for k in range(5)]
    with pytest.raises(ValueError, match="-1"):
        seed_for(1, -1)


@given(st.integers(0, 2**40), st.integers(1, 50))
def test_retry_seeds_fit_generators_and_differ_from_the_base(base: int, k: int) -> None:
    s = seed_for(base, k)
    assert 0 <= s < 2**63 and s != seed_for(base, k + 1)


def test_qa_decisions() -> None:
    qa = QAPolicy(threshold=0.3, max_attempts=3)
    assert qa.decide(0.3, 0) is Verdict.ACCEPT
    assert qa.decide(0.29, 0) is Verdict.REGENERATE
    assert qa.decide(0.29, 1) is Verdict.REGENERATE
    assert qa.decide(0.29, 2) is Verdict.ESCALATE
    assert qa.decide(None, 0) is Verdict.REGENERATE
    assert QAPolicy(enabled=False).decide(-5.0, 0) is Verdict.ACCEPT
    with pytest.raises(ConfigError, match="0"):
        QAPolicy(max_attempts=0)


def test_prompt_buckets() -> None:
    b = PromptBuckets()
    assert [b.bucket(n) for n in (1, 64, 65, 128, 129, 256)] == [0, 0, 1, 1, 2, 2]
    assert b.bounds() == [(1, 64), (65, 128), (129, 256)]
    with pytest.raises(ConfigError, match="257"):
        b.bucket(257)
    assert PromptBuckets.parse("fixed").bucket(500) == 0
    assert PromptBuckets.parse("10,20").bucket(15) == 1
    with pytest.raises(ConfigError, match="x"):
        PromptBuckets.parse("10,x")
    with pytest.raises(ConfigError, match="increasing"):
        PromptBuckets((20, 10))


def test_request_and_key_validation_names_the_value() -> None:
    k = BatchKey("m", 64, 64, 20, True, "ddim", "fp32", "cpu")
    with pytest.raises(ConfigError, match="prompt is empty"):
        Request("a", "   ", k)
    with pytest.raises(ConfigError, match="0x64"):
        BatchKey("m", 0, 64, 20, True, "ddim", "fp32", "cpu")


def test_latency_curve_interpolates_and_refuses_extrapolation() -> None:
    c = LatencyCurve.from_points([[64, 43.52], [1, 1.12]])
    assert c.latency(1) == 1.12 and c.latency(64) == 43.52
    assert c.latency(32) == pytest.approx(1.12 + (43.52 - 1.12) * 31 / 63)
    assert c.best_size(64) == 64
    with pytest.raises(ProfileError, match="65"):
        c.latency(65)
    half = LatencyCurve((2, 4), (1.0, 1.5))
    assert half.latency(1) == 0.5
    with pytest.raises(ProfileError, match="increasing"):
        LatencyCurve((4, 2), (1.0, 1.0))


def test_memory_model_caps_batches() -> None:
    gib = 1024**3
    mem = MemoryModel(10 * gib, 1 * gib, 24 * gib)
    assert mem.max_fit() == 14
    stage = StageCost(LatencyCurve((1, 64), (1.0, 40.0)), mem)
    assert stage.cap() == 14
    assert MemoryModel(30 * gib, gib, 24 * gib).max_fit() == 0


def test_shipped_article_profile_is_labelled_a_claim() -> None:
    assert "article-sdxl-a100" in shipped()
    p = load_profile("article-sdxl-a100")
    assert p.source["kind"] == "claim" and "claim" in p.source["note"]
    assert p.render.latency(1) == 1.12 and p.render.latency(64) / 64 == pytest.approx(0.68)
    assert p.render_cap == 64 and (p.width, p.height) == (1024, 1024)


def test_profile_errors_name_the_problem(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ProfileError, match="nope"):
        load_profile("nope")
    bad = tmp_path / "p.json"
    bad.write_text('{"name": "x"}')
    with pytest.raises(ProfileError, match="'source'"):
        load_profile(str(bad))
    data = load_profile("article-sdxl-a100")
    assert data.name == "article-sdxl-a100"
    with pytest.raises(ProfileError, match="measured, claim or assumption"):
        Profile.from_dict({"source": {"kind": "rumour"}})


def test_dynamic_and_window_validation() -> None:
    with pytest.raises(ConfigError, match="-1"):
        Dynamic(max_queue_delay_s=-1)
    with pytest.raises(ConfigError, match="0"):
        Dynamic(batch_size=0)
    with pytest.raises(ConfigError, match="overlap"):
        Windows(explicit=((0, 10), (5, 15)))
    with pytest.raises(ConfigError, match="bogus"):
        Windows.parse("bogus")
    view = QueueView(size=3, oldest=1.0, inflight=0, cap=8)
    assert Dynamic(0.5).cut(view, 1.49) == 0 and Dynamic(0.5).cut(view, 1.5) == 3


def test_window_cadence() -> None:
    w = Windows.parse("every=10,length=2,offset=1")
    assert w.active(0.5) is None and w.active(1.0) == (1.0, 3.0) and w.active(3.0) is None
    assert w.next_start(3.0) == 11.0 and w.active(12.5) == (11.0, 13.0)
    e = Windows.parse("0-5,10-20")
    assert e.active(5) is None and e.next_start(5) == 10 and e.next_start(15) is None
    assert Windows.parse("always").active(1e9) is not None


def test_ledger_splits_mixed_batches_and_prices_them() -> None:
    led = Ledger()
    led.book_batch("render", [0, 0, 0, 1], 8.0, "a100")
    led.book_batch("score", [1, 2], 1.0, "a100")
    led.count_accepted(2)
    rep = led.report(price_per_hour=3.6)
    assert rep.seconds[Stage.RENDER] == 6.0 and rep.seconds[Stage.REGEN] == 2.0
    assert rep.seconds[Stage.RESCORE] == 1.0 and rep.seconds.get(Stage.SCORE, 0.0) == 0.0
    assert rep.total_seconds == 9.0 == rep.batch_seconds
    assert rep.cost() == pytest.approx(9.0 / 3600 * 3.6)
    assert rep.per_10k_accepted_hours() == pytest.approx(9.0 / 3600 / 2 * 10_000)
    assert math.isclose(rep.gpu_hours()["total"], 9.0 / 3600)
    with pytest.raises(ValueError, match="kind"):
        led.book_batch("paint", [0], 1.0, "a100")
    with pytest.raises(ValueError, match="-1"):
        led.book_batch("render", [0], -1.0, "a100")
    assert Ledger().report().per_10k_accepted_hours() is None


def test_a_batch_of_first_attempts_books_no_negative_retry_time() -> None:
    # 0.1 * 3 / 3 is not 0.1 in floats: the remainder booked to regen went below zero.
    led = Ledger()
    led.book_batch("render", [0, 0, 0], 0.1, "cpu")
    assert led.report().seconds[Stage.REGEN] == 0.0
    assert led.report().seconds[Stage.RENDER] == 0.1


@given(
    st.lists(st.tuples(st.sampled_from(["a", "b", None]), st.integers(0, 3)), min_size=1),
    # Zero, or a time a clock can read: a subnormal share rounds to nothing.
    st.one_of(st.just(0.0), st.floats(1e-9, 1e4)),
    st.sampled_from(["render", "score"]),
)
def test_shares_by_group_are_the_ledgers_split_by_head_count(
    items: list[tuple[str | None, int]], seconds: float, kind: str
) -> None:
    shares = shares_by(items, seconds, kind)
    assert set(shares) == {g for g, _ in items if g is not None}
    for group, stages in shares.items():
        mine = [a for g, a in items if g == group]
        assert math.isclose(
            sum(stages.values()), seconds * len(mine) / len(items), rel_tol=1e-9, abs_tol=1e-12
        )
        retries = stages.get(Stage.REGEN if kind == "render" else Stage.RESCORE, 0.0)
        assert (retries > 0) == (seconds > 0 and any(a > 0 for a in mine))
    # What the groups get plus the share of the ungrouped is the whole batch.
    loose = sum(1 for g, _ in items if g is None)
    total = sum(sum(s.values()) for s in shares.values()) + seconds * loose / len(items)
    assert math.isclose(total, seconds, rel_tol=1e-9, abs_tol=1e-9)


def test_shipped_mini_sd_profile_is_a_measurement() -> None:
    p = load_profile("mini-sd-cpu")
    assert p.source["kind"] == "measured" and p.model == "embedded:mini-sd"
    assert p.render_cap == 16 and (p.width, p.height) == (64, 64)
    # Batching pays on this model: per-image cost falls with batch size.
    assert p.render.latency(16) / 16 < p.render.latency(1)
