"""The simulator replay of a real run: the engine's hand-offs, measured and replayed."""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from renderq.bench.fidelity import Fidelity, Overheads, calibrated_profile, replay
from renderq.bench.harness import Scenario
from renderq.bench.real import RealBench, Recording
from renderq.bench.report import fidelity_table
from renderq.core.policies import Window
from renderq.core.types import Batch, BatchResult, ItemResult
from renderq.profiles import load_profile
from tests.run.test_realtime import KEY, SlowScorer


@dataclass
class UnderReporting:
    """Holds the worker ``wall`` seconds per batch but reports ``booked`` device-seconds."""

    wall: float
    booked: float
    device_class: str = "cpu"

    def run(self, batch: Batch) -> BatchResult:
        time.sleep(self.wall)
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, self.booked, self.device_class)


def test_overheads_are_the_median_gap_and_never_negative() -> None:
    rec = Recording(
        render_held=[(1.0, 1.2), (1.0, 1.05), (2.0, 2.1)],
        score_held=[(0.5, 0.4), (0.5, 0.45), (0.5, 0.52)],
    )
    over = Overheads.of(rec)
    assert over.render_s == pytest.approx(0.1)
    assert over.score_s == 0.0  # median gap -0.05: a clock's noise, not a negative cost
    assert Overheads.of(Recording()) == Overheads()


def test_a_real_run_measures_what_device_seconds_leave_out_and_the_replay_holds_it() -> None:
    # Each batch holds the worker 60 ms but books 10 ms: 50 ms the engine must account for.
    bench = RealBench(UnderReporting(0.06, 0.01), SlowScorer(0.005), KEY, ["p"], 0.5)
    policy = Window(batch_size=2)
    real = bench.run(policy, Scenario("server", 16, rate=200.0))
    rec = bench.last
    assert rec is not None and len(rec.render_held) == len(real.batch_sizes)
    over = Overheads.of(rec)
    assert 0.045 < over.render_s < 0.5
    assert 0.0 <= over.score_s < 0.5
    profile = calibrated_profile(rec, load_profile("mini-sd-cpu"), "calibrated")
    kw = {"max_attempts": 3, "qa": True, "score_batch_size": 32}
    sim = replay(policy, rec, profile, overheads=over, **kw)  # type: ignore[arg-type]
    bare = replay(policy, rec, profile, **kw)  # type: ignore[arg-type]
    # Booked device-seconds agree either way; only the replay with hand-offs lasts as long.
    assert sim.ledger.seconds["render"] == pytest.approx(real.ledger.seconds["render"])
    assert bare.makespan_s < 0.5 * real.makespan_s < sim.makespan_s
    row = Fidelity("window", real, sim, over, bare).to_dict()
    assert row["overheads_s"] == {"render": over.render_s, "score": over.score_s}
    assert row["p99_s"]["sim_without_overheads"] == bare.percentile(99)
    assert abs(row["p99_s"]["rel_error"]) < abs(row["p99_s"]["rel_error_without_overheads"])
    assert f"{over.render_s * 1e3:.1f} / " in fidelity_table([row])
