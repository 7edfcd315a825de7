"""Step mode's out-of-memory path: a step that runs out of memory halves the running batch
for its key, and every request goes on from the step it is at (nothing lost or repeated)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest

from renderq.backends.step_loop import StepLoop
from renderq.core.settings import key_for
from renderq.core.step import StepKey
from renderq.core.types import ItemResult, Request
from renderq.testing.fakes import FakeStepExecutor, FakeStepState

pytest.importorskip("torch")  # the loop tells out-of-memory errors apart through torch


@dataclass(slots=True)
class TightMemory(FakeStepExecutor):
    """A fake step executor whose device holds ``fits`` rows in a step, ``decode_fits`` in
    a decode; past that it raises what torch raises."""

    fits: int = 2
    decode_fits: int = 8
    decodes: list[int] = field(default_factory=list)
    failed: int = 0

    def step(self, running: Sequence[FakeStepState]) -> float:
        if len(running) > self.fits:
            self.failed += 1
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return FakeStepExecutor.step(self, running)

    def decode(self, finished: Sequence[FakeStepState]) -> list[ItemResult]:
        if len(finished) > self.decode_fits:
            raise RuntimeError("CUDA out of memory. Tried to allocate 1.00 GiB")
        self.decodes.append(len(finished))
        return FakeStepExecutor.decode(self, finished)


def _requests(n: int, steps: int = 4) -> list[Request]:
    key = key_for("m", 64, 64, steps, 7.5, "ddim", "fp32", "cpu")
    return [Request(f"r{i}", "a red circle", key, i, guidance_scale=7.5) for i in range(n)]


def test_an_out_of_memory_step_halves_the_batch_and_loses_and_repeats_nothing() -> None:
    runner = TightMemory(fits=2, decode_fits=1)
    loop = StepLoop(runner, cap=4)
    reqs = _requests(5)
    try:
        answers = [loop.submit(r) for r in reqs]
        results = [a.result(timeout=30) for a in answers]
    finally:
        loop.close()
    assert [item.image for item, _ in results] == [(r.id, 0) for r in reqs]
    assert all(item.ok for item, _ in results)
    # The first step of 4 ran out of memory (no state moved); from then on 2 at a time.
    assert runner.failed == 1 and runner.steps and max(len(s) for s in runner.steps) == 2
    assert loop.fitted_caps == {StepKey.of(reqs[0].key): 2}
    # Every request stepped exactly its 4 steps.
    for r in reqs:
        assert sum(r.id in s for s in runner.steps) == 4
    # Decodes that ran out of memory went in halves, down to one at a time.
    assert runner.decodes and max(runner.decodes) == 1 and sum(runner.decodes) == 5
    assert all(seconds > 0 for _, seconds in results)


def test_a_single_request_that_does_not_fit_fails_alone() -> None:
    runner = TightMemory(fits=0)
    loop = StepLoop(runner, cap=4)
    try:
        [(item, _)] = [loop.submit(r).result(timeout=30) for r in _requests(1)]
    finally:
        loop.close()
    assert not item.ok and "out of memory" in (item.error or "")
