"""The real bench's stability verdict and its rounds, on an executor scripted to slow down."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from typer.testing import CliRunner

from renderq.bench.harness import Limit, Scenario, summarise
from renderq.bench.real import RealBench
from renderq.bench.realrun import check_real_options, run_real
from renderq.bench.report import markdown
from renderq.bench.stability import Stability, drift, round_order, spread
from renderq.cli.main import app
from renderq.core.errors import ConfigError
from renderq.core.policies import AdHoc, Policy, Window
from renderq.core.settings import QASettings
from renderq.core.types import Batch, BatchResult, ItemResult
from renderq.profiles import load_profile
from tests.run.test_realtime import KEY, SlowScorer

LIMIT = Limit(4, 4 / 1.5)
BOUND = 1e9  # a p99 bound every run meets: only the verdict can withhold "met"


@dataclass
class Scripted:
    """Books ``0.5 + 0.25 n`` seconds for a batch of ``n``, times ``slow`` from its
    ``slow_after``-th batch on (every batch it runs counts, the reference ones too). It
    never sleeps: the bench's figures are the booked seconds."""

    slow: float = 1.0
    slow_after: int = 1 << 30
    device_class: str = "cpu"
    calls: int = 0

    def run(self, batch: Batch) -> BatchResult:
        factor = self.slow if self.calls >= self.slow_after else 1.0
        self.calls += 1
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, (0.5 + 0.25 * batch.size) * factor, "cpu")


@dataclass
class Bench:
    executor: Scripted
    policies: dict[str, Policy] = field(
        default_factory=lambda: {"window": Window(batch_size=4), "adhoc": AdHoc()}
    )

    def run(self, repeat: int = 1, requests: int = 40) -> list:  # type: ignore[type-arg]
        bench = RealBench(
            self.executor, SlowScorer(0.0), KEY, ["p"], QASettings(enabled=False), 7.5
        )
        scen = Scenario("offline", requests, p99_bound_s=BOUND)
        runs, _ = run_real(
            bench, load_profile("mini-sd-cpu"), self.policies, scen, LIMIT, False, repeat=repeat
        )
        return runs


def test_a_steady_executor_gives_a_stable_run_and_its_target_is_judged() -> None:
    runs = Bench(Scripted()).run()
    for r in runs:
        assert r.stability is not None and r.stability.stable, r.stability
        assert r.stability.reference_spread == pytest.approx(1.0)
        assert r.meets_p99 is True
    by = {r.mode: r for r in runs}
    assert by["window"].efficiency_reference == pytest.approx(1.0)
    assert by["adhoc"].efficiency_reference == pytest.approx(0.5)  # 0.75 s an image vs 0.375
    table = markdown(runs, LIMIT, "steady", BOUND)
    assert "| window | 1 | stable |" in table and "UNSTABLE" not in table


def test_a_limit_off_this_machines_speed_is_said_beside_the_figures() -> None:
    # Twice as slow as the limit from the start (a profile from a faster machine): steady,
    # so stable, but a load given as a share of the limit offers twice that share here.
    runs = Bench(Scripted(slow=2.0, slow_after=0)).run()
    assert all(r.stability is not None and r.stability.stable for r in runs)
    table = markdown(runs, LIMIT, "slower machine", BOUND)
    assert "The limit is not this machine's speed" in table
    assert "1.333 images/s, 0.50x the limit's 2.667" in table and "offered 2.00x" in table
    steady = markdown(Bench(Scripted()).run(), LIMIT, "steady", BOUND)
    assert "not this machine's speed" not in steady


def test_an_executor_that_slows_mid_run_is_marked_unstable_and_no_target_is_met() -> None:
    # Three times slower from its 8th batch: two reference batches before, then the
    # window mode's batches of 4 with a reference batch after each 8 images.
    runs = Bench(Scripted(slow=3.0, slow_after=7)).run()
    window = next(r for r in runs if r.mode == "window")
    st = window.stability
    assert st is not None and not st.stable
    assert st.reference_spread == pytest.approx(3.0)
    assert st.drift == pytest.approx(3.0)
    assert any("reference batches" in x for x in st.reasons)
    assert any("window's batches drifted 3.00x" in x for x in st.reasons)
    # Every run after the slowdown sees slow reference batches only and steady batches.
    adhoc = next(r for r in runs if r.mode == "adhoc")
    assert adhoc.stability is not None and adhoc.stability.stable
    assert window.meets_p99 is None and adhoc.meets_p99 is True
    table = markdown(runs, LIMIT, "slowed", BOUND)
    assert "| window | 1 | UNSTABLE |" in table
    assert "not judged (unstable)" in table and "window round 1 is unstable" in table


def test_rounds_alternate_the_modes_and_report_median_and_range() -> None:
    assert round_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert round_order(["a", "b", "c"], 1) == ["b", "c", "a"]
    assert round_order(["a", "b", "c"], 5) == ["c", "a", "b"]
    # Slows from its 30th batch on: during the second round, under adhoc.
    runs = Bench(Scripted(slow=3.0, slow_after=29)).run(repeat=3, requests=12)
    assert [(r.round, r.mode) for r in runs] == [
        (0, "window"), (0, "adhoc"), (1, "adhoc"), (1, "window"), (2, "window"), (2, "adhoc"),
    ]  # fmt: skip
    summary = summarise(runs, BOUND)
    assert summary["adhoc"]["rounds"] == 3 and summary["adhoc"]["rounds_stable"] == 2
    assert summary["adhoc"]["stable"] is False and summary["adhoc"]["meets_p99_bound"] is None
    assert summary["window"]["stable"] is True and summary["window"]["meets_p99_bound"] is True
    dev = summary["window"]["figures"]["device_seconds"]
    # Window's device-seconds: fast in round one, three times that in rounds two and three.
    assert dev["min"] == pytest.approx(dev["max"] / 3) and dev["median"] == dev["max"]
    table = markdown(runs, LIMIT, "rounds", BOUND)
    assert "Over 3 rounds" in table and "| adhoc | 2/3 |" in table


def test_the_checks_and_their_bound() -> None:
    assert spread([2.0, 2.2, 2.5]) == pytest.approx(1.25) and spread([1.0]) is None
    # A lone slow batch is smoothed away; a slow spell is drift.
    assert drift([(4, 1.0)] * 5 + [(4, 3.0)] + [(4, 1.0)] * 5) == pytest.approx(1.0)
    assert drift([(4, 1.0)] * 5 + [(4, 2.0)] * 5) == pytest.approx(2.0)
    assert drift([(1, 1.0), (2, 5.0)]) is None  # no size seen twice
    ok = Stability.check("m", [2.0, 2.4], [(4, 1.0)] * 6, (("paired", 1.2),), bound=0.25)
    assert ok.stable and ok.verdict() == "stable"
    high = Stability.check("m", [2.0, 2.0], [], (("paired", 1.605),))
    assert high.reasons == ("paired efficiency 1.605 above the best static batch",)
    with pytest.raises(ConfigError, match="bound must be > 0, got 0"):
        Stability.check("m", [], [], bound=0.0)


def test_real_only_options_are_refused_by_value() -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["bench", "--executor", "real", "--workers", "3"])
    assert res.exit_code != 0 and "--workers 3 is for the simulator" in res.output
    res = runner.invoke(app, ["bench", "--repeat", "2"])
    assert res.exit_code != 0 and "--repeat 2 needs --executor real" in res.output
    res = runner.invoke(app, ["bench", "--executor", "real", "--repeat", "0"])
    assert res.exit_code != 0 and "--repeat must be >= 1, got 0" in res.output
    with pytest.raises(ConfigError, match="--workers 2"):
        check_real_options(1, 2, 0, 0.25)
    check_real_options(1, 2, 0, 0.25, pool=2)  # --workers may repeat what --devices says
    res = runner.invoke(app, ["bench", "--devices", "cpu:1,cpu:1"])
    assert res.exit_code != 0 and "--devices needs --executor real" in res.output
    res = runner.invoke(app, ["bench", "--executor", "real", "--devices", "gpu:0"])
    assert res.exit_code != 0 and "'gpu:0'" in res.output


def test_drift_compares_batches_of_the_same_work_only() -> None:
    # A step mix: 10-step batches take a third of 30-step ones of the same size. By size
    # alone that reads as the machine changing speed; by size and steps it is steady.
    batches = [(4, 1.0), (4, 3.0)] * 6
    steps = [10, 30] * 6
    assert (drift(batches) or 0.0) > 1.25
    assert drift([((n, st), s) for (n, s), st in zip(batches, steps, strict=True)]) == 1.0


def test_a_step_loops_drift_is_smoothed_over_requests_worth_of_steps() -> None:
    # 20-step requests: 1,000 steps of 17 ms with one stall of ten steps at 1.3x (about
    # 0.2 s), then the same with the second half 1.4x slower throughout.
    stall = [(1, 0.017)] * 400 + [(1, 0.017 * 1.3)] * 10 + [(1, 0.017)] * 590
    slowed = [(1, 0.017)] * 500 + [(1, 0.017 * 1.4)] * 500
    by_steps = 5 * 20  # five requests' worth of steps, as the bench passes for step mode
    # Five steps alone read the stall as the machine slowing; five requests' steps do not.
    assert not Stability.check("step", [], stall).stable
    assert Stability.check("step", [], stall, window=by_steps).stable
    # A machine that really slowed is caught with either window.
    for window in (5, by_steps):
        verdict = Stability.check("step", [], slowed, window=window)
        assert not verdict.stable and verdict.drift == pytest.approx(1.4)
