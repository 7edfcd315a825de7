"""Reference batches interleaved with a real mode's own, kept off the engine's clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

import pytest

from renderq.bench.harness import Scenario, paired_efficiency
from renderq.bench.real import RealBench, _Interleaved
from renderq.core.errors import ConfigError
from renderq.core.policies import Window
from renderq.core.settings import QASettings
from renderq.core.types import Batch, BatchResult, ItemResult, Request
from tests.run.test_realtime import KEY, SlowScorer


@dataclass
class LoggingExecutor:
    """Sleeps ``per_image`` per image of a reference batch (none for the mode's); logs ids."""

    per_image: float
    device_class: str = "cpu"
    log: list[tuple[str, ...]] = field(default_factory=list)

    def run(self, batch: Batch) -> BatchResult:
        ids = tuple(r.id for r in batch.requests)
        if int(ids[0][1:]) >= 1_000_000:  # the bench's direct batches use these ids
            time.sleep(self.per_image * batch.size)
        self.log.append(ids)
        items = tuple(ItemResult(r.id, image=(r.id, r.attempt)) for r in batch.requests)
        return BatchResult(batch.id, items, 0.001 * batch.size, self.device_class)


@dataclass
class _Noop:
    device_class: str = "cpu"

    def run(self, batch: Batch) -> BatchResult:
        return BatchResult(batch.id, (), 0.0, self.device_class)


def _bench(executor: LoggingExecutor) -> RealBench:
    return RealBench(executor, SlowScorer(0.0), KEY, ["a prompt"], QASettings(0.5), 7.5)


def test_a_reference_batch_follows_each_interval_of_images_and_stays_off_the_clock() -> None:
    ex = LoggingExecutor(per_image=0.02)
    bench = _bench(ex)
    result = bench.run(Window(batch_size=2), Scenario("offline", 12), interleave=(4, 1))
    assert bench.last is not None
    is_ref = [int(ids[0][1:]) >= 1_000_000 for ids in ex.log]
    # Six batches of two; each four images rendered are followed by a direct batch of four.
    assert is_ref == [False, False, True] * 3
    assert [len(ids) for ids in ex.log] == [2, 2, 4] * 3
    assert len(bench.last.reference_s) == 3
    # What the mode rendered before each reference batch (0.001 s per image here).
    assert bench.last.stretches == [(4, pytest.approx(0.004))] * 3  # type: ignore[comparison-overlap]
    # Each reference batch is new requests, never one of the mode's.
    refs = [ids for ids, r in zip(ex.log, is_ref, strict=True) if r]
    assert len({i for ids in refs for i in ids}) == 12
    assert result.accepted == 12
    # The three reference batches slept 0.24 s; the mode's own timeline does not hold them.
    assert result.makespan_s < 0.24


def test_without_interleave_no_reference_batches_run() -> None:
    ex = LoggingExecutor(per_image=0.02)
    bench = _bench(ex)
    bench.run(Window(batch_size=2), Scenario("offline", 8))
    assert bench.last is not None and bench.last.reference_s == []
    assert all(int(ids[0][1:]) < 1_000_000 for ids in ex.log)


def test_the_clock_freezes_while_a_reference_batch_runs() -> None:
    seen: list[float] = []
    started = threading.Event()

    def reference() -> float:
        started.set()
        time.sleep(0.2)
        return 0.2

    inter = _Interleaved(_Noop(), 1, reference)

    def read_midway() -> None:
        started.wait(5.0)
        time.sleep(0.1)
        seen.append(inter.clock())

    reader = threading.Thread(target=read_midway)
    reader.start()
    before = inter.clock()
    wall = time.monotonic()
    inter.run(Batch(1, KEY, (Request("r1", "a prompt", KEY),), 0.0, 1))
    reader.join()
    assert time.monotonic() - wall >= 0.2
    assert inter.clock() - before < 0.1
    # Read 0.1 s into the reference batch: frozen where it started.
    assert seen[0] - before < 0.05


def test_bad_interleave_settings_are_refused_by_name() -> None:
    bench = _bench(LoggingExecutor(0.0))
    with pytest.raises(ConfigError, match="server"):
        bench.run(Window(batch_size=2), Scenario("server", 4, rate=1.0), interleave=(4, 2))
    with pytest.raises(ConfigError, match="interval >= 1 image, got 0"):
        _Interleaved(LoggingExecutor(0.0), 0, lambda: 0.0)


def test_the_interval_counts_images_not_batches() -> None:
    ex = LoggingExecutor(per_image=0.0)
    bench = _bench(ex)
    bench.run(Window(batch_size=3), Scenario("offline", 12), interleave=(2, 2))
    # Batches of 3 against an interval of 4 images: references at 6, 9 and 12 images
    # (4, 8 and 12 crossed), never a batch count.
    sizes = [len(ids) for ids in ex.log]
    assert sizes == [3, 3, 2, 3, 2, 3, 2]
    assert bench.last is not None
    assert [images for images, _ in bench.last.stretches] == [6, 3, 3]


def test_a_tail_after_the_last_reference_is_its_own_stretch() -> None:
    bench = _bench(LoggingExecutor(per_image=0.0))
    bench.run(Window(batch_size=2), Scenario("offline", 10), interleave=(4, 1))
    assert bench.last is not None
    assert [images for images, _ in bench.last.stretches] == [4, 4, 2]
    assert len(bench.last.reference_s) == 2


def test_paired_efficiency_cancels_a_slow_spell_but_not_small_batches() -> None:
    # Two stretches of 32 images; the second ran in a spell twice as slow, and so did the
    # reference batch next to it: full batches all along, efficiency 1.
    assert paired_efficiency([(32, 4.0), (32, 8.0)], [2.0, 4.0], 16) == pytest.approx(1.0)
    # A tail of small batches (8 images in 2 s where full batches take 1 s) still costs.
    assert paired_efficiency([(32, 4.0), (8, 2.0)], [2.0, 2.0], 16) == pytest.approx(5 / 6)
    # References beyond the stretches are ignored; nothing to pair gives None.
    assert paired_efficiency([(16, 2.0)], [2.0, 9.0], 16) == pytest.approx(1.0)
    assert paired_efficiency([], [2.0], 16) is None
