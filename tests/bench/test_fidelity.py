"""The simulator replay of a real run: calibrated from the run's batches, speed and hand-offs."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest

from renderq.backends.step_loop import StepTrace
from renderq.bench.fidelity import (
    SPEED_WINDOW,
    Calibration,
    Fidelity,
    calibrated_profile,
    replay,
    speed_trace,
    step_handoff,
    step_speed_trace,
)
from renderq.bench.harness import Scenario
from renderq.bench.real import RealBench, Recording
from renderq.bench.report import fidelity_table
from renderq.core.errors import ConfigError
from renderq.core.policies import Dynamic, Window
from renderq.core.settings import QASettings
from renderq.core.stats import quantile_ci_ranks
from renderq.core.types import Batch, BatchResult, ItemResult, ScoreResult, Stage
from renderq.profiles import load_profile
from renderq.runtime.sim import profile_key, render_cost
from tests.run.test_realtime import KEY

REPLAY = {"qa": QASettings(max_attempts=3), "score_batch_size": 32}


class JumpClock:
    """Monotonic seconds plus every jump the fake stages made: a stage "takes" its seconds
    by jumping the clock, not by sleeping, so a loaded machine cannot stretch them (the
    real part, the engine's own milliseconds, is small against seconds-long jumps)."""

    def __init__(self) -> None:
        self.skipped = 0.0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        with self.lock:
            return time.monotonic() + self.skipped

    def jump(self, seconds: float) -> None:
        with self.lock:
            self.skipped += seconds


@dataclass
class UnderReporting:
    """Books ``booked`` device-seconds per batch (``slow`` times that from batch
    ``slow_from`` on) but holds the worker ``hand_off`` seconds longer, on ``clock``."""

    clock: JumpClock
    booked: float
    hand_off: float
    slow: float = 1.0
    slow_from: int = 1 << 30
    device_class: str = "cpu"
    seen: list[int] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        seconds = self.booked * (self.slow if len(self.seen) >= self.slow_from else 1.0)
        self.seen.append(batch.size)
        self.clock.jump(seconds + self.hand_off)
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, seconds, self.device_class)


@dataclass
class JumpScorer:
    """Passes every image, taking ``seconds`` per score batch on ``clock``."""

    clock: JumpClock
    seconds: float
    device_class: str = "cpu"

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        self.clock.jump(self.seconds)
        return ScoreResult(tuple(1.0 for _ in images), self.seconds, self.device_class)


def test_hand_offs_are_the_median_gap_and_never_negative() -> None:
    rec = Recording(
        batches=[(2, 1.0), (2, 1.0), (4, 2.0)],
        render_held=[1.2, 1.05, 2.1],
        render_started=[0.0, 1.2, 2.3],
        scores=[(2, 0.5), (2, 0.5), (4, 0.5)],
        score_held=[0.4, 0.45, 0.52],
    )
    cal = Calibration.of(rec)
    assert cal.render_overhead_s == pytest.approx(0.1)
    assert cal.score_overhead_s == 0.0  # median gap -0.05: a clock's noise, not a cost
    assert Calibration.of(Recording()) == Calibration()


def test_the_speed_trace_is_each_batch_over_its_sizes_median_by_start_time() -> None:
    rec = Recording(
        batches=[(2, 1.0), (2, 1.0), (4, 2.0), (2, 1.5), (4, 3.0)],
        render_started=[0.0, 1.0, 2.0, 4.0, 5.5],
    )
    # Medians: size 2 -> 1.0, size 4 -> 2.5.
    trace = speed_trace(rec, window=1)
    assert [t for t, _ in trace] == [0.0, 1.0, 2.0, 4.0, 5.5]
    assert [f for _, f in trace] == pytest.approx([1.0, 1.0, 0.8, 1.5, 1.2])
    # A running mean of three: [1, 1], [1, 1, .8], [1, .8, 1.5], [.8, 1.5, 1.2], [1.5, 1.2].
    assert [f for _, f in speed_trace(rec, window=3)] == pytest.approx(
        [1, 2.8 / 3, 1.1, 3.5 / 3, 1.35]
    )
    with pytest.raises(ConfigError, match="speed window must be >= 1 batch, got 0"):
        speed_trace(rec, window=0)


def test_the_speed_trace_charges_a_slow_batchs_excess_in_full() -> None:
    # Nine batches of one size at 1 s and one at 3 s: the median is 1 s, so a replay
    # that prices batches by it is short 2 s unless the speed trace carries them. A
    # running median smoothed the slow batch away (every factor 1); the running mean
    # charges what the run spent, spread over the batch's neighbours.
    secs = [1.0] * 4 + [3.0] + [1.0] * 5
    rec = Recording(batches=[(4, s) for s in secs], render_started=[float(i) for i in range(10)])
    factors = [f for _, f in speed_trace(rec, window=5)]
    assert sum(factors) == pytest.approx(sum(secs))  # every batch is priced at 1 s
    assert factors[4] == pytest.approx(1.4)
    assert factors[0] == factors[9] == 1.0


def test_a_step_loops_speed_is_each_step_over_its_running_sizes_median() -> None:
    trace = StepTrace(
        steps=[(2, 0.1), (2, 0.1), (4, 0.2), (2, 0.2), (4, 0.4)],
        started=[0.0, 0.1, 0.2, 0.4, 0.6],
    )
    # Medians: 2 -> 0.1, 4 -> 0.3.
    got = step_speed_trace(trace, window=1)
    assert [t for t, _ in got] == [0.0, 0.1, 0.2, 0.4, 0.6]
    assert [f for _, f in got] == pytest.approx([1.0, 1.0, 2 / 3, 2.0, 4 / 3])
    # A trace without step times (a loop that did not record them) gives no speed.
    assert step_speed_trace(StepTrace(steps=[(1, 0.1)]), window=1) == ()


def test_step_modes_hand_off_is_a_slots_hold_beyond_its_requests_stay_in_the_loop() -> None:
    rec = Recording(
        render_requests=[(("a", 0),), (("b", 0),), (("a", 1),), (("c", 0),), (("d", 0), ("e", 0))],
        render_held=[1.0, 2.0, 0.5, 9.0, 9.0],
    )
    # c was never answered by the loop and d+e is no single request: neither counts.
    trace = StepTrace(stays=[(("a", 0), 0.9), (("b", 0), 1.95), (("a", 1), 0.3), (("d", 0), 1.0)])
    assert step_handoff(rec, trace) == pytest.approx(0.1)  # median of 0.1, 0.05, 0.2
    # Clocks read on two threads can put a stay past its hold: never a negative hand-off.
    assert step_handoff(rec, StepTrace(stays=[(("a", 0), 1.2)])) == 0.0
    assert step_handoff(rec, StepTrace()) == 0.0


def test_the_default_trace_drops_a_lone_slow_batch_but_keeps_a_slow_spell() -> None:
    lone = [1.0] * 5 + [3.0] + [1.0] * 5
    spell = [1.0] * 5 + [2.0] * 4 + [1.0] * 5
    for secs, slow in ((lone, []), (spell, [5, 6, 7, 8])):
        rec = Recording(batches=[(1, s) for s in secs], render_started=list(range(len(secs))))
        factors = [f for _, f in speed_trace(rec)]
        assert [i for i, f in enumerate(factors) if f > 1.5] == slow


@dataclass
class ProfiledExecutor:
    """Takes what ``profile`` says a batch of its size and steps takes, on ``clock``."""

    clock: JumpClock
    profile: Any
    device_class: str = "cpu"

    def run(self, batch: Batch) -> BatchResult:
        cost = render_cost(self.profile, batch.key)
        assert cost is not None
        seconds = cost.latency(batch.size)
        self.clock.jump(seconds)
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, seconds, self.device_class)


def test_a_replay_serves_a_step_mixs_keys_in_the_runs_order() -> None:
    # Three keys (10, 20 and 30 steps) compete for one worker: which goes next is the fair
    # share across keys, by what each was charged. The bench's scheduler has no cost model
    # and charges a batch its images, so the keys take equal turns; a replay whose
    # scheduler priced batches by its profile charged seconds and gave the 10-step key
    # three turns for the 30-step key's one (at load it then cut other, smaller batches).
    profile = load_profile("mini-sd-cpu")
    clock = JumpClock()
    bench = RealBench(
        ProfiledExecutor(clock, profile), JumpScorer(clock, 0.01), profile_key(profile), ["p"],
        QASettings(0.5), 7.5, clock=clock,
    )  # fmt: skip
    policy = Dynamic(0.0, 4)
    bench.run(policy, Scenario("offline", 30, step_mix=(10, 20, 30)))
    rec = bench.last
    assert rec is not None and rec.batch_steps[:6] == [10, 20, 30, 10, 20, 30]
    cal = calibrated_profile(rec, profile, "calibrated")

    def renders(priced: bool) -> list[Any]:
        sim = replay(policy, rec, cal, priced=priced, **REPLAY)  # type: ignore[arg-type]
        return [ids for kind, ids in sim.log if kind == "render"]

    assert renders(priced=False) == rec.render_requests
    assert renders(priced=True) != rec.render_requests


def test_a_replay_holds_hand_offs_and_slow_spells_the_medians_cannot_know() -> None:
    # Every batch books 1 s and holds the worker 1 s more; from the 5th batch on it books
    # twice as much. The stages jump the bench's clock instead of sleeping.
    clock = JumpClock()
    ex = UnderReporting(clock, 1.0, 1.0, slow=2.0, slow_from=4)
    bench = RealBench(ex, JumpScorer(clock, 0.1), KEY, ["p"], QASettings(0.5), 7.5, clock=clock)
    policy = Window(batch_size=2)
    real = bench.run(policy, Scenario("offline", 16))
    rec = bench.last
    assert rec is not None and len(rec.render_held) == len(real.batch_sizes) == 8
    cal = Calibration.of(rec)
    assert cal.render_overhead_s == pytest.approx(1.0, abs=0.05)
    assert 0.0 <= cal.score_overhead_s < 0.05
    # A batch of the slow spell is twice as slow as an early one of the same size (away
    # from the spell's edge, where the running mean blends the two speeds).
    edge = SPEED_WINDOW // 2
    for size in {n for n, _ in rec.batches}:
        steps = [
            (i, f)
            for i, ((n, _), (_, f)) in enumerate(zip(rec.batches, cal.speed, strict=True))
            if n == size
        ]
        early = [f for i, f in steps if i < 4 - edge]
        late = [f for i, f in steps if i >= 4 + edge]
        assert early and late
        assert min(late) / max(early) == pytest.approx(2.0, rel=0.01)
    profile = calibrated_profile(rec, load_profile("mini-sd-cpu"), "calibrated")
    sim = replay(policy, rec, profile, calibration=cal, **REPLAY)  # type: ignore[arg-type]
    plain = replay(policy, rec, profile, **REPLAY)  # type: ignore[arg-type]
    # With the speed trace the booked device-seconds come out near the run's own (a trace
    # of eight batches is coarse: one batch cut at the spell's edge gets the other speed)...
    assert sim.ledger.seconds[Stage.RENDER] == pytest.approx(
        real.ledger.seconds[Stage.RENDER], rel=0.1
    )
    # ...and the replay lasts as long as the run (about 21 s on the jumped clock); on
    # medians alone (12 s of rendering), much less.
    assert sim.makespan_s == pytest.approx(real.makespan_s, rel=0.05)
    assert plain.makespan_s < 0.7 * real.makespan_s
    row = Fidelity("window", real, sim, cal, plain).to_dict()
    assert row["calibration"]["render_overhead_s"] == cal.render_overhead_s
    assert row["calibration"]["speed_steps"] == len(real.batch_sizes)
    assert row["p99_s"]["sim_medians_only"] == plain.percentile(99)
    p99 = row["p99_s"]
    assert abs(p99["rel_error"]) < 0.05 and p99["rel_error_medians_only"] < -0.25
    # Sixteen requests bound the real p99 from below only (its 15th of 16 latencies).
    ci = p99["real_ci"]
    lo, hi = quantile_ci_ranks(16, 0.99)
    assert (lo, hi) == (15, None) and ci["confidence"] == 0.95 and ci["high"] is None
    assert lo is not None and ci["low"] == sorted(real.latencies)[lo - 1]
    assert p99["sim_in_real_ci"] == (p99["sim"] >= ci["low"])
    table = fidelity_table([row])
    assert f"{cal.render_overhead_s * 1e3:.1f} / " in table and "p99 medians only" in table
    assert f"| {ci['low']:.2f}-open |" in table and "real p99 95% CI" in table


def test_a_calibrated_profile_covers_sizes_the_run_never_made() -> None:
    from renderq.bench.real import Recording

    like = load_profile("mini-sd-cpu")
    rec = Recording(batches=[(1, 0.5), (3, 1.0), (3, 1.2)])
    profile = calibrated_profile(rec, like, "calibrated")
    curve, top = profile.render.curve, like.render.curve.max_size
    # Its own medians where it measured, then the reference curve's shape from size 3 up.
    assert curve.sizes == (1, 3, top)
    assert curve.seconds[:2] == (0.5, 1.1)
    want = 1.1 * like.render.curve.latency(top) / like.render.curve.latency(3)
    assert curve.seconds[2] == pytest.approx(want)
