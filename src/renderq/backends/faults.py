"""Fault injection: a pipeline and a scorer that fail on purpose, for fault tests and drills.

``FaultyPipeline`` wraps a real diffusers pipeline and, before or after calling it, raises
an out-of-memory error for batches of ``oom_at`` or more, turns the images of chosen
seeds into NaN, or raises for chosen seeds. ``FlakyScorer`` wraps a scorer and raises on
chosen calls. Both count what they did, so a test can check the fault really fired.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from renderq.backends.diffusers import import_torch
from renderq.core.protocols import Scorer
from renderq.core.types import ScoreResult


@dataclass(slots=True)
class FaultyPipeline:
    """A pipeline wrapper that injects out-of-memory errors, NaN images and exceptions.

    Seeds are read from the generators the executor passes (``initial_seed``), so faults
    follow a request's attempt, not its position in a batch.
    """

    inner: Any
    oom_at: int | None = None
    nan_seeds: frozenset[int] = frozenset()
    raise_seeds: frozenset[int] = frozenset()
    calls: list[int] = field(default_factory=list)
    ooms: int = 0
    nans: int = 0

    def __getattr__(self, name: str) -> Any:
        # Only reached for names the wrapper does not define: scheduler, unet, vae ...
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def __call__(self, **kwargs: Any) -> Any:
        """Call the inner pipeline, injecting the configured faults."""
        seeds = [g.initial_seed() for g in kwargs["generator"]]
        self.calls.append(len(seeds))
        if self.oom_at is not None and len(seeds) >= self.oom_at:
            self.ooms += 1
            raise import_torch().OutOfMemoryError(
                f"injected: CUDA out of memory at batch size {len(seeds)}"
            )
        bad = [s for s in seeds if s in self.raise_seeds]
        if bad:
            raise RuntimeError(f"injected failure for seed {bad[0]}")
        result = self.inner(**kwargs)
        for i, s in enumerate(seeds):
            if s in self.nan_seeds:
                result.images[i][...] = float("nan")
                self.nans += 1
        return result


@dataclass(slots=True)
class FlakyScorer:
    """A scorer wrapper that raises on the call numbers in ``fail_calls`` (0-based)."""

    inner: Scorer
    fail_calls: frozenset[int] = frozenset({0})
    calls: int = 0
    failures: int = 0

    @property
    def device_class(self) -> str:
        """The wrapped scorer's device class."""
        return self.inner.device_class

    def score(self, images: Sequence[Any], prompts: Sequence[str]) -> ScoreResult:
        """Score with the inner scorer, unless this call is one that should fail."""
        n = self.calls
        self.calls += 1
        if n in self.fail_calls:
            self.failures += 1
            raise RuntimeError(f"injected scorer failure on call {n}")
        return self.inner.score(images, prompts)
